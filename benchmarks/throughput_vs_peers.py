"""Throughput on this machine: Linnet (torch and JAX, f32 and bf16) against transformers, one run.

The load: 64 requests of 32 to 128 random prompt tokens (random.Random(0)), 16 in
flight, 32 new tokens each, no end token, on SmolLM2-135M-Instruct (the
embedded GGUF's weights, dequantized). transformers runs the same prompts with
batched `generate` in f32, 16 at a time, left-padded. Then one request (128
prompt tokens, 128 new) for the single-stream rate. Prints tokens/s and the
ratios. (llama.cpp, the issue's other peer, is not wired in yet.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from linnet import nest
from linnet.nest.bind import checkpoint_names
from linnet.serve import Engine, Request

CARD = "smollm2-135m-instruct"


def load_prompts(n: int, lo: int, hi: int, vocab: int) -> list:
    rng = random.Random(0)
    return [[rng.randrange(100, min(vocab, 20000)) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def linnet_single(backend: str, dtype: str, prompt: list, new: int, repeats: int) -> float:
    """Decode tokens/s of one request: tokens after the first over the time after the first."""
    model = nest.load(CARD, backend=backend, numerics="fast", cast_dtype=True, tokenizer=False,
                      generics={"Batch": 1, "MaxSeq": len(prompt) + new, "T": dtype})
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
    ids = torch.tensor([prompt])
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
    model = nest.load(CARD, backend=backend, numerics="fast", cast_dtype=True, tokenizer=False,
                      generics={"Batch": rows, "MaxSeq": max(len(p) for p in prompts) + new, "T": dtype})
    engine = Engine(model)
    engine.warmup(len(p) for p in prompts)
    setup = time.perf_counter() - start
    rates = []
    for _ in range(repeats):
        model.reset()
        _, stats = engine.run([Request(prompt=p, max_new_tokens=new, ignore_eos=True) for p in prompts])
        assert stats.compiles == 0, "the run compiled after warmup"
        rates.append(stats.generated_tokens / stats.seconds)
    return statistics.median(rates), setup


def transformers_model():
    """transformers' LlamaForCausalLM holding the very weights Linnet loads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = nest.load(CARD, backend="torch", tokenizer=False, generics={"Batch": 1, "MaxSeq": 16})
    b = model.module.bindings
    cfg = LlamaConfig(vocab_size=b["vocab"], hidden_size=b["dim"], intermediate_size=b["ffn"],
                      num_hidden_layers=b["layers"], num_attention_heads=b["heads"],
                      num_key_value_heads=b["kv_heads"], rms_norm_eps=b["norm_eps"], rope_theta=b["rope_theta"],
                      tie_word_embeddings=b["tie_embeddings"], max_position_embeddings=8192)
    ref = LlamaForCausalLM(cfg).eval()
    state = {}
    for param, names in checkpoint_names(model.module, "hf").items():
        value = getattr(model.runner, param)
        for i, name in enumerate(names):
            state[name] = value[i] if len(names) > 1 or model.module.params[param].loop_var else value
    if b["tie_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    ref.load_state_dict(state, strict=True)
    return ref


def transformers_run(ref, prompts: list, rows: int, new: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        generated = 0
        for i in range(0, len(prompts), rows):
            group = prompts[i:i + rows]
            width = max(len(p) for p in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            with torch.inference_mode():
                out = ref.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, pad_token_id=0)
            generated += (out.shape[1] - width) * len(group)
        rates.append(generated / (time.perf_counter() - start))
    return statistics.median(rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs per system; the median is printed")
    parser.add_argument("--no-single", action="store_true", help="skip the one-request measurement")
    parser.add_argument("--only", nargs="*", help="subset: torch-f32 torch-bf16 jax-f32 jax-bf16 transformers")
    args = parser.parse_args()
    prompts = load_prompts(args.requests, 32, 128, 49152)
    systems = args.only or ["torch-f32", "torch-bf16", "jax-f32", "jax-bf16", "transformers"]
    results = {}
    print(f"load: {args.requests} requests, 32-128 prompt tokens, {args.rows} in flight, {args.new} new tokens; "
          f"{torch.get_num_threads()} threads; median of {args.repeats}")
    if "transformers" in systems:
        ref = transformers_model()
        results["transformers f32"] = transformers_run(ref, prompts, args.rows, args.new, args.repeats)
        print(f"  transformers f32    {results['transformers f32']:8.1f} tokens/s", flush=True)
    for system in systems:
        if system == "transformers":
            continue
        backend, dtype = system.split("-")
        rate, setup = linnet_run(backend, dtype, prompts, args.rows, args.new, args.repeats)
        results[f"linnet {backend} {dtype}"] = rate
        print(f"  linnet {backend:5s} {dtype:4s}  {rate:8.1f} tokens/s   (load + warmup {setup:.0f} s)", flush=True)
    base = results.get("transformers f32")
    if base:
        print("ratios against transformers f32:")
        for name, rate in results.items():
            print(f"  {name:20s} {rate / base:5.2f}x")
    if "linnet torch f32" in results and "linnet jax f32" in results:
        print(f"  jax / torch (f32): {results['linnet jax f32'] / results['linnet torch f32']:.2f}x")
    if args.no_single:
        return
    prompt = load_prompts(1, 128, 128, 49152)[0]
    print("one request, 128 prompt tokens, 128 new: decode tokens/s")
    single = {}
    if "transformers" in systems:
        single["transformers f32"] = transformers_single(ref, prompt, 128, args.repeats)
        print(f"  transformers f32    {single['transformers f32']:8.1f} tokens/s", flush=True)
    for system in systems:
        if system == "transformers":
            continue
        backend, dtype = system.split("-")
        single[system] = linnet_single(backend, dtype, prompt, 128, args.repeats)
        print(f"  linnet {backend:5s} {dtype:4s}  {single[system]:8.1f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
