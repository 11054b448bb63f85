"""The GPU check's first step: are the engine's tokens on the GPU right, before they are timed?

A card with random weights in f32, greedy, through a few shared rows (packed prompts, prompts
joining decode steps, a prompt asked twice, a long shared prefix), on torch (its decode step
replayed as a CUDA graph) and on JAX:
- exact numerics (f32 throughout): every request gives the tokens it gives run alone, the two
  backends give the same tokens, and nothing compiles or is captured after warmup;
- fast numerics in f32 and in bf16 (what the benchmarks run: SDPA, on CUDA flash attention's
  variable-length kernel for bf16 decode steps, XLA's default precision, which may be TF32 on a
  GPU; and torch's again with Linnet's Triton kernels: decode steps' attention, every pass's small
  ops): the tokens agree with exact numerics' for most of their length. Rounding makes a greedy
  pick flip now and then, bf16's more often; a wrong mask, row or replayed buffer makes most
  requests differ from their first tokens.
Prints one line per check and exits 1 if any fails.

    python benchmarks/gpu_parity.py [--card tiny-llama] [--requests 16] [--rows 6] [--device cuda]
"""

import argparse
import random
import sys
import tempfile
import time
from unittest import mock

from bench_args import count  # this folder's
from cuda_needed import require_cuda  # this folder's
from linnet import nest
from linnet.cli import _number  # the command line's own bounded number
from linnet.serve import Engine, Request

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--card", default=None, help="a card with random weights (default: a small Llama saved by "
                    "transformers, with weights large enough that attention moves the logits)")
# (at least 6: the load asks prompt 1 again as prompt 3, and prompt 5 is a prefix of it and more)
parser.add_argument("--requests", type=_number(6, None, "must be at least 6, not {}"), default=16,
                    help="requests run (16; at least 6)")
parser.add_argument("--rows", type=count, default=6, help="cache rows: requests in flight (6)")
parser.add_argument("--new", type=count, default=24, help="tokens each request generates (24)")
parser.add_argument("--device", default="cuda", help="torch's device (cpu: to try the check itself)")
args = parser.parse_args()
require_cuda("gpu_parity.py", args.device)

rng = random.Random(0)
prompts = [[rng.randrange(100) for _ in range(rng.randint(8, 96))] for _ in range(args.requests)]
prompts[3] = list(prompts[1])  # a prompt asked twice: prefilled once, its cache row copied
prompts[5] = prompts[1][:-4] + prompts[5][:10]  # a prefix of a cached prompt: only the rest is prefilled
generics = {"Batch": args.rows, "MaxSeq": 96 + args.new}
AGREEING = {"f32": 0.75, "bf16": 0.5}  # fast's least share of exact's tokens, before a request's first difference
passed = True


def small_llama(folder: str) -> str:
    """A transformers Llama with GQA, saved to `folder`: weights of std 0.15, not the usual 0.02,
    under which a random model's logits barely depend on attention (a wrong mask would pass)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.15, tie_word_embeddings=False)
    path = f"{folder}/Small-Llama"
    LlamaForCausalLM(config).float().save_pretrained(path)
    return path


def check(name: str, ok: bool, detail: str = "") -> None:
    global passed
    passed &= ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def differences(a: list, b: list) -> tuple:
    """(whether a == b, which requests differ and at which token: a rounding flip comes late and
    alone, a wrong mask or row early and in many)."""
    bad = [f"{i} at token {common_prefix(x, y)}" for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return not bad, "requests " + ", ".join(bad) + " differ" if bad else ""


def common_prefix(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run(backend: str, numerics: str, dtype: str = "f32") -> list:
    """Each request's tokens, run together through the rows; for exact numerics, also checked
    against each request run alone."""
    start = time.perf_counter()
    extra = {"device": args.device, "compile": True} if backend == "torch" else {}
    weights = "random" if args.card else None
    model = nest.load(args.card or checkpoint, backend=backend, numerics=numerics, generics={**generics, "T": dtype},
                      weights=weights, tokenizer=False, cast_dtype=True, **extra)
    # prompts still packed and joining decode steps, few shapes to compile; prompt 5 copies prompt 1's prefix
    engine = Engine(model, token_budget=128, prefix_min=16)
    engine.warmup(len(p) for p in prompts)
    make = lambda: [Request(prompt=p, max_new_tokens=args.new, ignore_eos=True) for p in prompts]
    done, stats = engine.run(make())
    together = [c.tokens if c.finish_reason != "error" else c.error for c in done]
    name = f"{backend}, {numerics}" + ("" if dtype == "f32" else f" {dtype}")
    if numerics == "exact":
        alone = []
        for r in make():
            model.reset()  # each alone from an empty cache: none of the batched run's rows reused
            alone.append(engine.run([r])[0][0].tokens)
        check(f"{name}: {len(prompts)} requests through {args.rows} rows = each alone", *differences(together, alone))
    if backend == "torch" and args.device.startswith("cuda"):
        check(f"{name}: decode replayed as a CUDA graph", engine.runner.replays, str(engine.runner.not_replayed or ""))
    check(f"{name}: nothing compiled or captured after warmup", stats.compiles == 0,
          f"{stats.compiles} compiles: {stats.compiled}")
    print(f"     passes {stats.passes}, prompt tokens {stats.prompt_tokens}, computed {stats.prefill_tokens}, "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return together


def fast_agrees(backend: str, exact: list, label: str = "") -> None:
    """Fast numerics in each of AGREEING's types, against exact's tokens."""
    for dtype, least in AGREEING.items():
        fast = run(backend, "fast", dtype)
        shared = [common_prefix(a, b) for a, b in zip(exact, fast)]
        same = sum(shared) / (len(shared) * args.new)
        check(f"{backend}{label}, fast {dtype} = exact for most tokens", same >= least,
              f"{same:.0%} of the tokens before a request's first difference (at least {least:.0%}); "
              f"identical requests {sum(n == args.new for n in shared)}/{len(shared)}")


checkpoint = None if args.card else small_llama(tempfile.mkdtemp())
for backend in ("torch", "jax"):
    exact = run(backend, "exact")
    if backend == "torch":
        torch_exact = exact
    else:
        check("torch = jax, exact", *differences(torch_exact, exact))
    fast_agrees(backend, exact)
    if backend == "torch" and args.device.startswith("cuda"):
        from linnet.codegen_torch import runtime as rt
        from linnet.kernels import triton_attention

        if triton_attention.available():  # Linnet's Triton kernels, all of them (LINNET_TRITON_DECODE=1 LINNET_TRITON_OPS=1)
            with mock.patch.object(rt, "TRITON_ASKED", rt.TritonKernels(attention=True, ops=True)):
                fast_agrees(backend, exact, " (Triton kernels)")
sys.exit(0 if passed else 1)
