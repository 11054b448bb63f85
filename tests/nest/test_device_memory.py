"""A model too large for its device's free memory is refused before a weight is read, with what the
cache and the weights need and how many rows would fit; `footprint` is checked against the tensors a
loaded model really holds."""

from __future__ import annotations

import pytest

from linnet import nest
from linnet.cli import main
from linnet.nest import memory
from linnet.nest.memory import DeviceMemoryError, footprint


@pytest.mark.parametrize("card, dtype", [("tiny-llama", "f32"), ("tiny-llama-tied", "bf16"), ("tiny-qwen3-moe", "f16")])
def test_the_footprint_is_what_a_loaded_model_holds(card, dtype):
    model = nest.load(card, weights="random", numerics="fast", generics={"Batch": 3, "MaxSeq": 40, "T": dtype})
    runner = model.runner
    held_state = sum(t.numel() * t.element_size() for t in (getattr(runner, n) for n in runner.state))
    # the exact numerics hold each param as declared (fast ones pack and fuse): the declared bytes
    exact = nest.load(card, weights="random", generics={"Batch": 3, "MaxSeq": 40})
    seen, held_weights = set(), 0
    for name in exact.runner.params:
        value = getattr(exact.runner, name)
        for t in value if isinstance(value, list) else [value]:
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                held_weights += t.numel() * t.element_size()
    need = footprint(model.module)
    assert need.state == held_state and need.rows == 3
    assert footprint(exact.module).weights == held_weights  # f32: exact computes in f32
    assert need.weights * {"f32": 1, "bf16": 2, "f16": 2}[dtype] == held_weights


@pytest.mark.parametrize("backend", ["torch", "jax_model"])
def test_a_cache_past_free_memory_is_refused_with_the_rows_that_fit(backend, monkeypatch):
    monkeypatch.setattr(memory, "free_cpu_bytes", lambda: 50_000_000)
    generics = {"Batch": 1000, "MaxSeq": 4096, "T": "f32"}
    with pytest.raises(DeviceMemoryError) as err:
        nest.load("tiny-llama", backend=backend, weights="random", generics=generics)
    message = str(err.value)
    spec = nest.load("tiny-llama", weights="random", generics={"Batch": 1, "MaxSeq": 4096}).module
    one_row = footprint(spec)
    rows = (50_000_000 - one_row.weights) // one_row.state
    assert f"at most {rows} rows of MaxSeq 4096 would fit" in message
    assert "this machine has 50.0 MB free" in message and "tiny-llama with Batch=1000, MaxSeq=4096" in message
    nest.load("tiny-llama", backend=backend, weights="random", generics=dict(generics, Batch=rows))  # and it does


def test_the_command_line_says_it_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(memory, "free_cpu_bytes", lambda: 10_000_000)
    status = main(["serve", "tiny-llama", "--weights", "random", "--batch", "100000", "--max-seq", "64"])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err
    assert err.startswith("linnet: error: tiny-llama with Batch=100000, MaxSeq=64") and "free" in err


def test_free_memory_is_read_from_the_kernel():
    free = memory.free_cpu_bytes()
    if free is None:
        pytest.skip("no /proc/meminfo here")
    assert 0 < free <= _total_bytes()


def _total_bytes() -> int:
    with open("/proc/meminfo") as f:
        return int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
