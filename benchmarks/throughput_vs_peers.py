"""Throughput on this machine: Linnet (torch and JAX, f32 and bf16) against transformers and llama.cpp, one run.

The load: 64 requests of 32 to 128 random prompt tokens (random.Random(0)), 16 in
flight, 32 new tokens each, no end token, on SmolLM2-135M-Instruct (the
embedded GGUF's weights, dequantized; "torch-gguf": its Q4_1 / Q8_0 linears run in
their blocks, quantization="gguf"). transformers runs the same prompts with
batched `generate` in f32, 16 at a time, left-padded. llama.cpp (when
llama-cpp-python is installed) runs them with continuous batching over 16
sequences, on F16 and F32 GGUFs written from the same weights and on the
embedded Q4_1 file as it is (llamacpp_peer.py). Then one request (128 prompt tokens, 128 new) for the
single-stream rate. Prints tokens/s and the ratios. Each system runs in a process of its own
(`--in-process`: all in this one), as a user runs one: threads and allocators of one never slow
another.

`--card` runs another card (Qwen, Mistral, ...) on the same load: its own weights when Nest finds
them, else random ones (`--weights random`), which transformers then holds too; llama.cpp runs
only SmolLM2, whose GGUF this folder writes.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from linnet import nest
from linnet.ir.specialize import specialize
from linnet.nest.bind import unbind_weights
from linnet.serve import Engine, Request

# this folder's; llamacpp_peer imports llama_cpp only inside its functions
from bench_args import count
from peers_installed import installed, not_installed
from llamacpp_peer import cached_gguf, run_batched, run_single

DEFAULT_CARD = "smollm2-135m-instruct"


class Chosen:
    """The card and weights this run measures (set from the command line)."""
    card = DEFAULT_CARD
    weights = None  # the card's own (None), or "random"

    @classmethod
    def load(cls, dtype: str, generics: dict, **kwargs):
        """The card for a system's type: "f32", "bf16", or "gguf" (bf16, the GGUF's Q8_0 / Q4_1 linears
        in their blocks: quantization="gguf")."""
        quantization = "gguf" if dtype == "gguf" else None
        return nest.load(cls.card, weights=cls.weights, seed=0, tokenizer=False, quantization=quantization,
                         generics={**generics, "T": "bf16" if quantization else dtype}, **kwargs)


def load_prompts(n: int, lo: int, hi: int, vocab: int) -> list:
    rng = random.Random(0)
    return [[rng.randrange(100, min(vocab, 20000)) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def linnet_single(backend: str, dtype: str, prompt: list, new: int, repeats: int) -> float:
    """Decode tokens/s of one request: tokens after the first over the time after the first."""
    model = Chosen.load(dtype, {"Batch": 1, "MaxSeq": len(prompt) + new}, backend=backend, numerics="fast",
                        compile=True, cast_dtype=True)
    engine = Engine(model)
    engine.warmup([len(prompt)])
    rates = []
    for _ in range(repeats):
        model.reset()
        done, stats = engine.run([Request(prompt=prompt, max_new_tokens=new, ignore_eos=True)])
        c = done[0]
        rates.append((len(c.tokens) - 1) / (c.token_times[-1] - c.first_token_at))
    return statistics.median(rates)


def transformers_single(ref, prompt: list, new: int, repeats: int) -> float:
    """Decode tokens/s of one request: `new` tokens' time less one token's (the prompt's pass), over new - 1."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():  # warmup, untimed as Linnet's and llama.cpp's: its first call's setup
        ref.generate(input_ids=ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    rates = []
    for _ in range(repeats):
        with torch.inference_mode():
            start = time.perf_counter()
            ref.generate(input_ids=ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
            first = time.perf_counter() - start
            start = time.perf_counter()
            ref.generate(input_ids=ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
            total = time.perf_counter() - start
        rates.append((new - 1) / (total - first))
    return statistics.median(rates)


def linnet_run(backend: str, dtype: str, prompts: list, rows: int, new: int, repeats: int) -> tuple[float, float]:
    """(generated tokens/s, seconds to load and warm up): median over `repeats` runs."""
    start = time.perf_counter()
    model = Chosen.load(dtype, {"Batch": rows, "MaxSeq": max(len(p) for p in prompts) + new}, backend=backend,
                        numerics="fast", compile=True, cast_dtype=True)
    engine = Engine(model)
    engine.warmup(len(p) for p in prompts)
    setup = time.perf_counter() - start
    rates = []
    for _ in range(repeats):
        model.reset()
        _, stats = engine.run([Request(prompt=p, max_new_tokens=new, ignore_eos=True) for p in prompts])
        assert stats.compiles == 0, f"the run compiled after warmup: {stats.compiled}"
        rates.append(stats.generated_tokens / stats.seconds)
    return statistics.median(rates), setup


@functools.cache  # built once, for the load and the one request; a later main() in this process may change card
def transformers_model(card: str, weights: str | None):
    """transformers' model of the card's family (config.json as `linnet export` writes it) holding
    the very weights Linnet loads (Chosen's: `card` and `weights` key the cache)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from linnet.export.hf_config import hf_config

    model = Chosen.load("f32", {"Batch": 1, "MaxSeq": 16}, backend="torch", cast_dtype=True)  # transformers' f32
    config = hf_config(model.module)
    config.pop("torch_dtype")
    cfg = AutoConfig.for_model(config.pop("model_type"), **config)
    ref = AutoModelForCausalLM.from_config(cfg).float().eval()
    params = {name: getattr(model.runner, name) for name in model.module.params}
    state = dict(unbind_weights(model.module, params, "hf"))
    if config["tie_word_embeddings"]:  # the head is the embedding, under the family's name for it (GPT-2's wte)
        embedding = ref.get_input_embeddings().weight
        state["lm_head.weight"] = state[next(n for n, p in ref.named_parameters() if p is embedding)]
    try:
        ref.load_state_dict(state, strict=True)
    except RuntimeError:  # names of another layout (transformers 5 fuses Mixtral's experts): its loader converts
        return _transformers_from_export(card, weights)
    return ref


def _transformers_from_export(card: str, weights: str | None):
    """transformers' model read by its own `from_pretrained` from the card's `linnet export --to vllm` directory
    (the same weights: tiny-mixtral's 65 tensors equal unbind_weights' bit for bit), for a family whose
    transformers names differ from those Linnet writes."""
    from transformers import AutoModelForCausalLM

    from linnet.export import export

    with tempfile.TemporaryDirectory(prefix="linnet-peer-") as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*: no tokenizer written")  # for vLLM's sake; transformers gets token ids
        path = export(card, "vllm", Path(tmp) / "hf", weights=weights, seed=0, dtype="f32")
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def transformers_run(ref, prompts: list, rows: int, new: int, repeats: int) -> float:
    """Generated tokens/s of the load, `rows` prompts a batched `generate` (median over `repeats` runs)."""
    _transformers_batch(ref, prompts[:rows], 2)  # warmup, untimed as Linnet's and llama.cpp's (2.5 s on a tiny card)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        generated = 0
        for i in range(0, len(prompts), rows):
            generated += _transformers_batch(ref, prompts[i:i + rows], new)
        rates.append(generated / (time.perf_counter() - start))
    return statistics.median(rates)


def _transformers_batch(ref, group: list, new: int) -> int:
    """One batched greedy `generate` of `group`, left-padded; returns the tokens it generated."""
    width = max(len(p) for p in group)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
    with torch.inference_mode():
        out = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
    return (out.shape[1] - width) * len(group)


# torch-gguf: bf16, SmolLM2's embedded GGUF's Q4_1 / Q8_0 linears in their blocks (quantization="gguf")
LINNET = ["torch-f32", "torch-bf16", "jax-f32", "jax-bf16", "torch-gguf"]
LLAMACPP = ["llamacpp-f16", "llamacpp-f32", "llamacpp-q4_1"]  # q4_1: the embedded file as it is


def llamacpp_gguf(system: str) -> str:
    """The GGUF for "llamacpp-f16" / "llamacpp-f32", written (and cached) on first use; "llamacpp-q4_1": the
    embedded file (Q4_1 / Q8_0) as it is."""
    return cached_gguf(system.split("-")[1])


def label(system: str) -> str:
    """The name printed for a system: "linnet torch f32", "llama.cpp f16", "transformers f32"."""
    if system == "transformers":
        return "transformers f32"
    kind, dtype = system.split("-")
    return f"llama.cpp {dtype}" if kind == "llamacpp" else f"linnet {kind} {dtype}"


def chosen_systems(only: list | None) -> list:
    """The systems to run: --only's, or every one; a peer dropped, with a line, when it is not installed,
    and llama.cpp's when the card is not SmolLM2."""
    systems = only or LINNET + ["transformers"] + LLAMACPP
    if "transformers" in systems and not installed("transformers"):
        print(f"transformers: {not_installed('transformers')}, skipped")
        systems = [s for s in systems if s != "transformers"]
    if any(s in LLAMACPP for s in systems) and (Chosen.card != DEFAULT_CARD or not installed("llama_cpp")):
        print("llama.cpp: " + ("runs SmolLM2's GGUF only" if Chosen.card != DEFAULT_CARD else
                               not_installed("llama_cpp")) + ", skipped")
        systems = [s for s in systems if s not in LLAMACPP]
    if "torch-gguf" in systems and (Chosen.card != DEFAULT_CARD or Chosen.weights == "random"):
        print("linnet torch gguf: runs SmolLM2's GGUF file only, skipped")
        systems.remove("torch-gguf")
    return systems


def measure(system: str, prompts: list, args, vocab: int) -> dict:
    """One system's figures: {"load": tokens/s, "note": its setup time, "single": one request's
    decode tokens/s}, each left out where the command line skips it."""
    threads = torch.get_num_threads()
    out = {}
    if not args.no_load:
        start = time.perf_counter()
        if system == "transformers":
            ref = transformers_model(Chosen.card, Chosen.weights)
            out["load"] = transformers_run(ref, prompts, args.rows, args.new, args.repeats)
            out["note"] = ""
        elif system in LLAMACPP:
            path = llamacpp_gguf(system)
            ready = time.perf_counter() - start
            out["load"] = run_batched(path, prompts, args.rows, args.new, threads, args.repeats)
            out["note"] = f"(GGUF ready in {ready:.0f} s)"
        else:
            backend, dtype = system.split("-")
            out["load"], setup = linnet_run(backend, dtype, prompts, args.rows, args.new, args.repeats)
            out["note"] = f"(load + warmup {setup:.0f} s)"
    if not args.no_single:
        prompt = load_prompts(1, 128, 128, vocab)[0]
        if system == "transformers":
            ref = transformers_model(Chosen.card, Chosen.weights)
            out["single"] = transformers_single(ref, prompt, 128, args.repeats)
        elif system in LLAMACPP:
            out["single"] = run_single(llamacpp_gguf(system), prompt, 128, threads, args.repeats)
        else:
            backend, dtype = system.split("-")
            out["single"] = linnet_single(backend, dtype, prompt, 128, args.repeats)
    return out


def measure_apart(system: str, argv: list) -> dict | None:
    """`measure` in a process of its own: one system's threads, caches and allocator never share a
    process with another's (JAX's load ran 20% slower after torch's in the same process). None, with
    a line, where that process failed (its error above): the other systems still run."""
    done = subprocess.run([sys.executable, __file__, *_without_only(argv), "--only", system, "--report-json"],
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(f"  {label(system):19s} failed (exit status {done.returncode}), left out", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _without_only(argv: list) -> list:
    """The command line less its --only and the systems after it."""
    out, skipping = [], False
    for a in argv:
        if a == "--only":
            skipping = True
        elif skipping and not a.startswith("--"):
            continue
        else:
            skipping = False
            out.append(a)
    return out


def print_ratios(results: dict) -> None:
    base = results.get("transformers f32")
    if base:
        print("ratios against transformers f32:")
        for name, rate in results.items():
            print(f"  {name:20s} {rate / base:5.2f}x")
    pairs = [(dtype, results.get(f"linnet jax {dtype}"), results.get(f"linnet torch {dtype}"))
             for dtype in ("f32", "bf16")]
    pairs = [(dtype, jax_rate, torch_rate) for dtype, jax_rate, torch_rate in pairs if jax_rate and torch_rate]
    if pairs and not base:  # a heading of their own: indented under the rates they would read as a system's
        print("ratios:")
    for dtype, jax_rate, torch_rate in pairs:
        print(f"  jax / torch ({dtype}): {jax_rate / torch_rate:.2f}x")


def main(argv: list | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="throughput_vs_peers.py", description=__doc__)
    parser.add_argument("--requests", type=count, default=64, help="requests in the load (64)")
    parser.add_argument("--rows", type=count, default=16, help="requests in flight (16)")
    parser.add_argument("--new", type=count, default=32, help="tokens each request generates (32)")
    parser.add_argument("--repeats", type=count, default=3, help="runs per system; the median is printed")
    parser.add_argument("--no-single", action="store_true", help="skip the one-request measurement")
    parser.add_argument("--no-load", action="store_true", help="skip the load; measure one request only")
    parser.add_argument("--only", nargs="*", choices=LINNET + ["transformers"] + LLAMACPP, metavar="SYSTEM",
                        help="subset: " + " ".join(LINNET + ["transformers"] + LLAMACPP))
    parser.add_argument("--card", default=DEFAULT_CARD, help="the card to run (default: %(default)s)")
    parser.add_argument("--weights", choices=["random"],
                        help="random weights instead of the card's own (the default when Nest finds none)")
    parser.add_argument("--threads", type=count, default=None,
                        help="threads for every system (default: torch's, the cores); on a host other work keeps "
                             "busy, llama.cpp's OpenMP barriers wait on a thread the OS has not scheduled")
    parser.add_argument("--in-process", action="store_true",
                        help="run every system in this one process (by default each runs in a process of its own)")
    parser.add_argument("--report-json", action="store_true", help=argparse.SUPPRESS)  # a child's figures, as JSON
    args = parser.parse_args(argv)
    if args.no_load and args.no_single:
        parser.error("--no-load and --no-single leave nothing to measure")
    if args.threads:
        torch.set_num_threads(args.threads)
    Chosen.card = args.card
    try:
        info = nest.card(args.card)
    except nest.CardError as err:
        parser.exit(1, f"{parser.prog}: error: {err.args[0]}\n")
    Chosen.weights = args.weights or (None if info.weights()[0] else "random")
    vocab = specialize(info.module()).bindings["vocab"]
    prompts = load_prompts(args.requests, 32, 128, vocab)
    if args.report_json:
        print(json.dumps(measure(args.only[0], prompts, args, vocab)))
        return
    systems = chosen_systems(args.only)
    # transformers first: every ratio is against it
    systems = sorted(systems, key=lambda s: s != "transformers")
    if not args.no_load:
        print(f"load: {args.card} ({Chosen.weights or 'its'} weights), {args.requests} requests, 32-128 prompt "
              f"tokens, {args.rows} in flight, {args.new} new tokens; {torch.get_num_threads()} threads; "
              f"median of {args.repeats}; {'one process' if args.in_process else 'a process per system'}")
    figures = {}
    for system in systems:
        figure = measure(system, prompts, args, vocab) if args.in_process else measure_apart(system, argv)
        if figure is None:
            continue
        figures[system] = figure
        if "load" in figures[system]:
            print(f"  {label(system):19s} {figures[system]['load']:8.1f} tokens/s   {figures[system]['note']}".rstrip(),
                  flush=True)
    if not args.no_load:
        print_ratios({label(s): f["load"] for s, f in figures.items()})
    if not args.no_single:
        print("one request, 128 prompt tokens, 128 new: decode tokens/s")
        for system, f in figures.items():
            print(f"  {label(system):19s} {f['single']:8.1f} tokens/s")


if __name__ == "__main__":
    main()
