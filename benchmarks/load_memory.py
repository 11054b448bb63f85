"""Peak memory while loading: a random f32 Llama checkpoint loaded as bf16 by `nest.load`.

    python benchmarks/load_memory.py                # ~1 GB of f32 weights (0.5 GB in bf16)
    python benchmarks/load_memory.py --size small   # ~200 MB, as tests/nest/test_load_memory.py runs it

Writes the checkpoint (safetensors, sharded, with config.json and an index) to a
temporary directory one tensor at a time, so that the writer never holds more
than one tensor; then loads it in a fresh process as T=bf16 with
cast_dtype=True on the torch backend. That process polls its own
/proc/self/status every 20 ms from a background thread and reports the peak
RssAnon (anonymous resident memory: what the process allocated, not the
memory-mapped file pages, which the kernel can drop) above its baseline taken
after every import, against the model's size in bf16.

The issue's bar: peak RssAnon above baseline < 1.3 x the model's size in the target dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# ~246M params: 984 MB in f32, 492 MB in bf16
LARGE = dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
             num_key_value_heads=4, intermediate_size=2816)
# ~46M params: 184 MB in f32, 92 MB in bf16
SMALL = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
             num_key_value_heads=4, intermediate_size=1536)


def llama_tensors(cfg: dict) -> list:
    """[(HF name, shape)] of an untied Llama with this config."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (v, d))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (d, d)),
                (p + "self_attn.k_proj.weight", (kv, d)), (p + "self_attn.v_proj.weight", (kv, d)),
                (p + "self_attn.o_proj.weight", (d, d)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                (p + "mlp.down_proj.weight", (d, f))]
    return out + [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]


def write_checkpoint(path: Path, cfg: dict, shards: int = 4, seed: int = 0) -> int:
    """A random f32 Llama checkpoint in `path`; returns its number of parameters.

    The safetensors format is written by hand (8-byte header length, JSON header, raw
    little-endian data) so that each tensor is generated, written and dropped in turn."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = llama_tensors(cfg)
    total = sum(int(np.prod(s)) for _, s in tensors)
    per_shard, groups, current, size = total / shards, [], [], 0
    for name, shape in tensors:
        current.append((name, shape))
        size += int(np.prod(shape))
        if size >= per_shard * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(current)
            current = []
    groups.append(current)
    rng = np.random.default_rng(seed)
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in group:
            n = 4 * int(np.prod(shape))
            header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(path / file, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name, shape in group:
                if len(shape) == 1:
                    a = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype("<f4")
                else:
                    a = (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype("<f4")
                f.write(a.tobytes())
                del a
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 4 * total}, "weight_map": weight_map}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "max_position_embeddings": 4096, "torch_dtype": "float32", **cfg}
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return total


CHILD = r"""
import gc, json, re, sys, threading, time
import torch
from linnet import nest
import linnet.codegen_torch.emit, linnet.codegen_torch.runtime, linnet.compiler  # imports before the baseline
backend = sys.argv[2]
if backend == "jax":
    import jax, linnet.codegen_jax.emit, linnet.codegen_jax.runtime
    jax.devices()  # the XLA client, made before the baseline

def anon():
    with open("/proc/self/status") as f:
        return int(re.search(r"RssAnon:\s+(\d+) kB", f.read()).group(1)) * 1024

gc.collect()
baseline = anon()
peak = [baseline]
done = threading.Event()

def poll():
    while not done.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.02)

thread = threading.Thread(target=poll, daemon=True)
thread.start()
start = time.perf_counter()
model = nest.load(sys.argv[1], backend=backend, device="cpu", numerics="fast", cast_dtype=True,
                  generics={"Batch": 1, "MaxSeq": 16, "T": "bf16"}, tokenizer=False, progress=False)
seconds = time.perf_counter() - start
done.set()
thread.join()
peak[0] = max(peak[0], anon())
tied = type(model.runner).tied
if backend == "jax":
    weights = sum(a.nbytes for p, a in model.runner.weights.items() if p not in tied)
else:
    weights = model.runner.weight_bytes()
print(json.dumps({"baseline": baseline, "peak": peak[0], "after": anon(), "weights_bytes": weights,
                  "seconds": seconds, "dtype": model.dtype}))
"""


def measure(path: Path, backend: str = "torch") -> dict:
    """Loads `path` as bf16 in a fresh process; its baseline, peak and final RssAnon, and the weights' bytes."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), backend], capture_output=True, text=True, env=env,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the loading process failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(cfg: dict, directory: str | None = None, backends=("torch",)) -> dict:
    """{backend: measurement} for one checkpoint written once."""
    results = {}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "random-llama"
        params = write_checkpoint(path, cfg)
        for backend in backends:
            r = measure(path, backend)
            r.update(backend=backend, params=params, bf16_bytes=2 * params, f32_bytes=4 * params,
                     peak_above_baseline=r["peak"] - r["baseline"])
            r["ratio"] = r["peak_above_baseline"] / r["bf16_bytes"]
            results[backend] = r
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=["large", "small"], default="large", help="the Llama written and loaded: large, about 1 GB in f32; small, 184 MB (large)")
    ap.add_argument("--backend", choices=["torch", "jax", "both"], default="both", help="(both)")
    ap.add_argument("--dir", help="where to write the temporary checkpoint (default: the system's temp dir)")
    args = ap.parse_args()
    backends = ("torch", "jax") if args.backend == "both" else (args.backend,)
    results = run(LARGE if args.size == "large" else SMALL, args.dir, backends)
    mb = 1 / 1e6
    first = next(iter(results.values()))
    print(f"checkpoint: {first['params'] / 1e6:.0f}M params, {first['f32_bytes'] * mb:.0f} MB in f32 "
          f"(safetensors, 4 shards); the model in bf16: {first['bf16_bytes'] * mb:.0f} MB")
    for backend, r in results.items():
        print(f"{backend:5s}: loaded as {r['dtype']} in {r['seconds']:.1f} s (weights held: "
              f"{r['weights_bytes'] * mb:.0f} MB); RssAnon baseline {r['baseline'] * mb:.0f} MB, peak "
              f"{r['peak'] * mb:.0f} MB, after {r['after'] * mb:.0f} MB")
        print(f"       peak RssAnon above baseline: {r['peak_above_baseline'] * mb:.0f} MB = {r['ratio']:.3f} x "
              f"the bf16 model (bar: < 1.3)")
    return 0 if all(r["ratio"] < 1.3 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
