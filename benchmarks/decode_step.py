"""One decode step of the compiled SmolLM2-135M-sized model against transformers, on the CPU.

Batch 16, random weights, f32. Each of the 16 rows first holds a 64-token
prompt; then every step decodes one token per row. transformers runs
`LlamaForCausalLM` with its own cache on the same inputs. Prints the median
milliseconds per step of each and the ratios. `--card` runs another Llama-family card's shapes
(tiny-llama: the script itself, in seconds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from bench_args import count  # this folder's
from peers_installed import installed, not_installed
from linnet.compiler import build
from linnet.frontend import load_file
from linnet.ir.specialize import specialize
from linnet.nest.bind import bind_weights

CARDS = Path(__file__).resolve().parent.parent / "linnet/nest/cards"


def reference_model(module):
    from transformers import LlamaConfig, LlamaForCausalLM

    b = module.bindings
    cfg = LlamaConfig(vocab_size=b["vocab"], hidden_size=b["dim"], intermediate_size=b["ffn"],
                      num_hidden_layers=b["layers"], num_attention_heads=b["heads"],
                      num_key_value_heads=b["kv_heads"], rms_norm_eps=b["norm_eps"], rope_theta=b["rope_theta"],
                      tie_word_embeddings=b["tie_embeddings"], max_position_embeddings=8192)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def timed(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(prog="decode_step.py", description=__doc__)
    parser.add_argument("--batch", type=count, default=16, help="rows decoded in each step (16)")
    parser.add_argument("--prompt", type=count, default=64, help="prompt tokens each row holds first (64)")
    parser.add_argument("--steps", type=count, default=20, help="steps timed; the median is printed (20)")
    parser.add_argument("--threads", type=count, default=torch.get_num_threads(),
                        help="torch's threads (default: torch's own count, %(default)s here)")
    parser.add_argument("--card", default="smollm2-135m-instruct",
                        help="a Llama-family card whose shapes are run, random weights (%(default)s)")
    args = parser.parse_args(argv)
    if not installed("transformers"):  # its LlamaForCausalLM draws the weights both run
        parser.exit(1, f"{parser.prog}: error: transformers {not_installed('transformers')}\n")
    card = CARDS / f"{args.card}.linnet"
    if not card.is_file():
        parser.error(f"no card {args.card!r}: no {card}")
    torch.set_num_threads(args.threads)
    max_seq = args.prompt + args.steps * 2 + 8
    generics = {"Batch": args.batch, "MaxSeq": max_seq, "T": "f32"}
    module = specialize(load_file(card), generics)
    ref = reference_model(module)
    weights = bind_weights(module, ref.state_dict().__getitem__)

    rng = np.random.default_rng(0)
    prompts = rng.integers(0, module.bindings["vocab"], size=(args.batch, args.prompt)).astype(np.int32)
    tokens = prompts.reshape(-1)
    positions = np.tile(np.arange(args.prompt, dtype=np.int32), args.batch)
    rows = np.repeat(np.arange(args.batch, dtype=np.int32), args.prompt)
    last = (np.arange(args.batch, dtype=np.int32) + 1) * args.prompt - 1

    results = {}
    for backend in ("torch", "jax"):
        model = build(module, backend, generics).Model(weights)
        model.prefill(*(torch.from_numpy(a) if backend == "torch" else a for a in (tokens, positions, rows, last)))
        pos = [args.prompt]
        tok = np.full(args.batch, 7, dtype=np.int32)

        def step(model=model, backend=backend, pos=pos, tok=tok):
            p = np.full(args.batch, pos[0], dtype=np.int32)
            if backend == "torch":
                model.decode(torch.from_numpy(tok), torch.from_numpy(p))
            else:
                np.asarray(model.decode(tok, p))  # waits for the result
            pos[0] += 1

        step()  # compile / warm up
        results[f"linnet {backend}"] = timed(step, args.steps)

    with torch.inference_mode():
        out = ref(torch.from_numpy(prompts).long(), use_cache=True)
        cache = out.past_key_values
        tok = torch.full((args.batch, 1), 7, dtype=torch.long)
        state = {"cache": cache, "pos": args.prompt}

        def ref_step():
            o = ref(tok, past_key_values=state["cache"], use_cache=True,
                    cache_position=torch.tensor([state["pos"]]))
            state["cache"] = o.past_key_values
            state["pos"] += 1

        ref_step()
        results["transformers"] = timed(ref_step, args.steps)

    base = results["transformers"]
    print(f"decode step, batch {args.batch}, {args.prompt}-token prompts, {args.card}'s shapes, f32, "
          f"{args.threads} threads (median of {args.steps})")
    for name, ms in results.items():
        print(f"  {name:14s} {ms:8.2f} ms/step   {base / ms:5.2f}x transformers")


if __name__ == "__main__":
    main()
