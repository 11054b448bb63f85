"""Loading streams: a random ~200 MB f32 Llama checkpoint loaded as bf16 stays under 1.3x the model's
bf16 size in anonymous resident memory.

The work is benchmarks/load_memory.py's (run it for the ~1 GB version): it writes the checkpoint one
tensor at a time, then loads it with nest.load in a fresh process that polls its own RssAnon every
20 ms. RssAnon is measured *above the loading process's baseline, taken after its imports* (torch,
linnet, the code generator): the interpreter and libraries are not the model. Memory-mapped file pages
(RssFile) are not counted: the kernel can drop them, and they are the checkpoint, not a copy of it.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "load_memory.py"


@pytest.fixture(scope="module")
def bench():
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs Linux's /proc/self/status")
    spec = importlib.util.spec_from_file_location("load_memory", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["load_memory"] = module
    spec.loader.exec_module(module)
    return module


def test_written_checkpoint_is_what_transformers_would_read(bench, tmp_path):
    """The hand-written safetensors files are valid: safetensors reads them back."""
    from safetensors import safe_open

    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=48)
    params = bench.write_checkpoint(tmp_path, cfg, shards=3)
    files = sorted(tmp_path.glob("*.safetensors"))
    assert len(files) == 3
    seen = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                seen += h.get_tensor(name).numel()
    assert seen == params


@pytest.fixture(scope="module")
def measured(bench):
    return bench.run(bench.SMALL, backends=("torch", "jax"))


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_peak_rss_anon_below_1_3x_bf16_size(measured, backend):
    # JAX: the checkpoint read through its memory map, arrays placed without a copy, linear weights
    # packed in their own memory or a layer at a time (it had peaked at 2.4x and kept 1.7x)
    r = measured[backend]
    mb = 1 / 1e6
    print(f"\n{backend}: RssAnon above baseline: {r['peak_above_baseline'] * mb:.0f} MB for a "
          f"{r['bf16_bytes'] * mb:.0f} MB bf16 model ({r['f32_bytes'] * mb:.0f} MB f32 on disk): {r['ratio']:.3f}x")
    assert r["dtype"] == "bf16" and r["weights_bytes"] == r["bf16_bytes"]
    assert r["peak_above_baseline"] >= 0.9 * r["bf16_bytes"]  # the poller saw the model arrive
    assert r["ratio"] < 1.3
    assert r["after"] - r["baseline"] < 1.15 * r["bf16_bytes"]  # and nothing but the model is kept
