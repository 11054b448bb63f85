"""The GPU check's first step: are the engine's tokens on the GPU right, before they are timed?

A small card with random weights in f32, greedy, on torch (decode replayed as a CUDA graph) and on
JAX: every request run through a few shared rows (packed prompts, prompts joining decode steps,
shared prompts copied) must give the tokens it gives run alone, and the two backends must agree.
Prints one line per check and exits 1 if any fails.

    python benchmarks/gpu_parity.py [--card smollm2-135m-instruct] [--requests 24] [--rows 6]
"""

import argparse
import os
import random
import sys
import time

# Both backends multiply f32 in f32 here (JAX's GPU default is TF32): the check compares them.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

from linnet import nest  # noqa: E402
from linnet.serve import Engine, Request  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--card", default="smollm2-135m-instruct")
parser.add_argument("--requests", type=int, default=16)
parser.add_argument("--rows", type=int, default=6)
parser.add_argument("--new", type=int, default=24)
parser.add_argument("--device", default="cuda", help="torch's device (cpu: to try the check itself)")
args = parser.parse_args()

rng = random.Random(0)
prompts = [[rng.randrange(100, 20000) for _ in range(rng.randint(8, 96))] for _ in range(args.requests)]
prompts[3] = list(prompts[1])  # a prompt asked twice: prefilled once, its cache row copied
prompts[5] = prompts[1][:80] + prompts[5][:10]  # a long prefix of a cached prompt: only the rest is prefilled
generics = {"Batch": args.rows, "MaxSeq": 96 + args.new, "T": "f32"}


def tokens_of(engine, requests):
    done, stats = engine.run(requests)
    return [c.tokens if c.finish_reason != "error" else c.error for c in done], stats


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def differing(a: list, b: list) -> list:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


results, passed = {}, True
for backend in ("torch", "jax_model"):
    start = time.perf_counter()
    extra = {"device": args.device, "compile": True} if backend == "torch" else {}
    model = nest.load(args.card, backend=backend, numerics="fast", generics=generics, weights="random",
                      tokenizer=False, **extra)
    engine = Engine(model, token_budget=128)  # prompts still packed and joining decode steps; few shapes to compile
    engine.warmup(len(p) for p in prompts)
    make = lambda: [Request(prompt=p, max_new_tokens=args.new, ignore_eos=True) for p in prompts]
    together, stats = tokens_of(engine, make())
    alone = [tokens_of(engine, [r])[0][0] for r in make()]
    results[backend] = together
    bad = differing(together, alone)
    passed &= check(f"{backend}: {len(prompts)} requests through {args.rows} rows = each alone", not bad,
                    f"requests {bad} differ" if bad else f"{time.perf_counter() - start:.0f} s")
    if backend == "torch" and args.device.startswith("cuda"):
        replayed = engine.runner._graph not in (None, "eager")
        passed &= check("torch: decode replayed as a CUDA graph", replayed, str(engine.runner.not_replayed or ""))
    passed &= check(f"{backend}: nothing compiled or captured after warmup", stats.compiles == 0,
                    f"{stats.compiles} compiles")
    print(f"     passes {stats.passes}, prompt tokens {stats.prompt_tokens}, computed {stats.prefill_tokens}",
          flush=True)
    del engine, model

bad = differing(results["torch"], results["jax_model"])
passed &= check("torch = jax", not bad, f"requests {bad} differ" if bad else "")
sys.exit(0 if passed else 1)
