"""Which params are only linear weights, which share an input, and torch's CPU packing and fusing of them
under fast numerics.

Packing changes where the weights live, not what the model computes: the packed model is checked
against the same model with plain weights (and the parity tests check fast f32 against transformers).
"""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import linnet
from linnet import nest
from linnet.codegen_common import gathered_tables, linear_groups, linear_weights
from linnet.codegen_torch import runtime as rt
from linnet.compiler import compile_file
from linnet.frontend import load_file
from linnet.ir.passes import inline_calls
from linnet.ir.specialize import specialize
from linnet.kernels import cpu_linear

CARDS = Path(linnet.__file__).parent / "nest" / "cards"
LAYER_WEIGHTS = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}


def module_of(card: str):
    return inline_calls(specialize(load_file(CARDS / f"{card}.linnet"), {"Batch": 2, "MaxSeq": 16, "T": "f32"}))


def weights_of(card: str) -> dict:
    return linear_weights(module_of(card))


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-llama-tied"])
def test_weights_of_one_input_are_grouped(card):
    # q, k, v read the attention norm's output; gate and up the MLP norm's; wo, w_down and the head stand alone
    assert linear_groups(module_of(card)) == [("w_gate", "w_up"), ("wk", "wq", "wv")]


def test_a_reassigned_input_is_not_the_same_input():
    from linnet.frontend import load_source

    source = """
arch two_inputs
config {
  dim: int = 8
}
params {
  a: T[dim, dim] from hf "a"
  b: T[dim, dim] from hf "b"
  c: T[dim, dim] from hf "c"
}
state {
  seen: T[Batch, dim]
}
entry run<N>(x: T[N, dim]) -> T[N, dim] {
  h = x * 2.0
  p = linear(h, a)
  q = linear(h, b)
  h = x * 3.0
  return p + q + linear(h, c)
}
"""
    module = inline_calls(specialize(load_source(source, "two_inputs.linnet"), {"Batch": 1, "T": "f32"}))
    assert linear_groups(module) == [("a", "b")]


@pytest.mark.parametrize("card,tables", [("tiny-llama-tied", ["embed"]), ("tiny-gpt2", ["embed", "positions_embed"])])
def test_params_read_only_as_gathered_rows_are_listed(card, tables):
    # (the tied head is a param of its own, read by linear: the table it is tied to stays listed)
    assert gathered_tables(module_of(card)) == tables


def test_a_table_read_otherwise_too_is_not_listed():
    from linnet.frontend import load_source

    source = """
arch gathered_and_summed
config {
  vocab: int = 16
  dim: int = 8
}
params {
  table: T[vocab, dim] from hf "table"
  other: T[vocab, dim] from hf "other"
}
state {
  seen: T[Batch, dim]
}
entry run<N>(ids: i32[N]) -> T[N, dim] {
  return table[ids] + other[ids] * other[ids]
}
entry scaled<N>(ids: i32[N]) -> T[N, dim] {
  return table[ids] + other[0]
}
"""
    module = inline_calls(specialize(load_source(source, "gathered_and_summed.linnet"), {"Batch": 1, "T": "f32"}))
    assert gathered_tables(module) == ["table"]


def load(card, numerics, dtype="f32"):
    return nest.load(card, backend="torch", numerics=numerics, weights="random", tokenizer=False,
                     generics={"Batch": 3, "MaxSeq": 24, "T": dtype})


def assert_agrees(fast, exact, rtol: float, atol_of_max: float):
    """A packed prefill (two prompts, one row left empty) and a decode step: fast against exact logits."""
    tokens = np.array([5, 9, 13, 2, 7, 1, 100], np.int32)
    positions = np.array([0, 1, 2, 3, 0, 1, 2], np.int32)
    rows = np.array([0, 0, 0, 0, 2, 2, 2], np.int32)
    last = np.array([3, 6], np.int32)
    step = (np.array([3, 4, 8], np.int32), np.array([4, 0, 3], np.int32))
    for call in (lambda m: m.runner.prefill(tokens, positions, rows, last), lambda m: m.runner.decode(*step)):
        want, got = call(exact).float().numpy(), call(fast).float().numpy()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol_of_max * np.abs(want).max())


@pytest.fixture(params=["panels", "onednn"])
def layout(request, monkeypatch):
    """Each packed layout the CPU may use: Linnet's panels where its kernel runs, oneDNN's otherwise."""
    if request.param == "panels" and not cpu_linear.available(torch.float32):
        pytest.skip("Linnet's CPU kernel does not run here")
    if request.param == "onednn":
        monkeypatch.setattr(cpu_linear, "available", lambda dtype: False)
        if not rt.packs_linear_weights(torch.device("cpu"), torch.float32):
            pytest.skip("this torch has no oneDNN linear packing")
    return request.param


def is_packed(w, layout: str) -> bool:
    return isinstance(w, cpu_linear.PanelWeight) if layout == "panels" else isinstance(w, torch.Tensor) and w.is_mkldnn


def test_fast_f32_on_the_cpu_packs_and_computes_the_same(layout):
    fast, exact = load("tiny-llama", "fast"), load("tiny-llama", "exact")
    assert all(isinstance(w, rt.FusedPart) and is_packed(w.fused, layout) for w in fast.runner.wq)
    assert len(fast.runner.wq) == 2
    assert fast.runner.wq[1].fused is fast.runner.wv[1].fused is not fast.runner.wq[0].fused  # one per layer
    assert all(is_packed(w, layout) for w in fast.runner.wo) and is_packed(fast.runner.lm_head, layout)
    assert not is_packed(exact.runner.lm_head, layout) and not is_packed(exact.runner.wq, layout)
    assert fast.runner.weight_bytes() == exact.runner.weight_bytes()  # packing moves, it does not copy

    tied = load("tiny-llama-tied", "fast")
    assert is_packed(tied.runner.lm_head, layout) and not is_packed(tied.runner.embed, layout)  # the head's own copy

    assert_agrees(fast, exact, rtol=1e-4, atol_of_max=1e-4)


def test_fast_joins_each_group_by_rows_where_weights_are_not_packed(monkeypatch):
    # CUDA's way, run on the CPU: cuBLAS reads plain weights, so q/k/v and gate/up are each one plain
    # tensor [layers, sum of N, K], and every member's rows of it are that member's weight
    monkeypatch.setattr(rt, "packs_linear_weights", lambda device, dtype: False)
    fast, exact = load("tiny-llama", "fast"), load("tiny-llama", "exact")
    runner = fast.runner
    for group in type(runner).linear_groups:
        first = getattr(runner, group[0])
        assert len(first) == 2 and first[0].fused is not first[1].fused  # a layer each
        for layer in range(2):
            whole = first[layer].fused
            assert type(whole) is torch.Tensor and whole._base is first[0].fused._base  # views of one tensor
            start = 0
            for name in group:
                part, want = getattr(runner, name)[layer], getattr(exact.runner, name)[layer]
                assert part.fused is whole and (part.start, part.stop) == (start, start + want.shape[0])
                assert torch.equal(whole[part.start:part.stop], want)
                start = part.stop
            assert start == whole.shape[0]
    assert type(runner.wo) is torch.Tensor  # alone: as it was given
    assert runner.weight_bytes() == exact.runner.weight_bytes()
    assert_agrees(fast, exact, rtol=1e-4, atol_of_max=1e-4)
    assert type(exact.runner.wq) is torch.Tensor  # exact numerics: every weight as it was given


def test_linear_takes_packed_and_plain_weights_alike(layout):
    x, w, b = torch.randn(5, 7), torch.randn(6, 7), torch.randn(6)
    np.testing.assert_allclose(rt.linear(x, w, b), x @ w.T + b, rtol=1e-5, atol=1e-5)
    packed = rt.pack_linear_weight(w, rows=16)  # oneDNN's is tuned for 16 rows, right for any
    assert is_packed(packed, layout)
    np.testing.assert_allclose(rt.linear(x, packed, b), x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_fused_parts_give_each_member_its_own_product(layout):
    rt.as_tensors("cpu")
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    a, b = torch.randn(6, 7), torch.randn(3, 7)
    for whole in (rt.pack_linear_weight(torch.cat([a, b]), rows=16), torch.cat([a, b])):  # packed; plain (CUDA's)
        pa, pb = rt.FusedPart(whole, 0, 6, 0), rt.FusedPart(whole, 6, 9, 0)
        for inp in (x, y, x):  # a new input is multiplied afresh, never answered from the last one
            np.testing.assert_allclose(rt.linear(inp, pb), inp @ b.T, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(rt.linear(inp, pa), inp @ a.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5])
def test_low_precision_linear_rounds_an_f32_product(dtype, rows, layout, monkeypatch):
    # Native bf16 / f16 kernels, the widened f32 ones (CPUs without the instructions, several rows)
    # and packed weights all multiply exactly, accumulate in f32 and round once.
    monkeypatch.setattr(rt, "WIDEN_SLICE", 7 * 64)  # a widened weight in slices of 7 rows, the last short
    x, w, b = torch.randn(rows, 64).to(dtype), torch.randn(48, 64).to(dtype), torch.randn(48).to(dtype)
    want = (x.double() @ w.double().T + b.double()).to(dtype).double()
    weights = [w] + ([rt.pack_linear_weight(w, rows=16)] if rt.packs_linear_weights(torch.device("cpu"), dtype) else [])
    for weight in weights:
        got = rt.linear(x, weight, b)
        assert got.dtype == dtype and got.shape == (rows, 48)
        np.testing.assert_allclose(got.double(), want, rtol=2 ** -7, atol=1e-2)


def test_fast_bf16_on_the_cpu_keeps_bf16_weights_and_agrees_with_exact(layout):
    # exact numerics computes in f32 whatever T is: the reference for bf16 within bf16's precision
    slow = not rt.multiplies_natively(torch.bfloat16) and not cpu_linear.available(torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = load("tiny-llama", "fast", "bf16")
    assert any("T=bf16 on the CPU" in str(w.message) for w in caught) == slow
    exact = load("tiny-llama", "exact", "bf16")
    assert fast.runner.weight_bytes() * 2 == exact.runner.weight_bytes()  # bf16 weights: half of f32's
    assert_agrees(fast, exact, rtol=1e-7, atol_of_max=0.05)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_activations_are_f32_on_a_cpu_without_bf16_instructions(native, monkeypatch):
    # There every op computes in f32: the pass carries f32 activations from the embedding's rows on,
    # while the weights and the cache keep bf16. A CPU with the instructions keeps bf16 throughout.
    monkeypatch.setattr(rt, "multiplies_natively", lambda dtype: native or dtype == torch.float32)
    table = torch.randn(10, 4).to(torch.bfloat16)
    rows = rt.gather_rows(table, torch.tensor([3, 3, 7]))
    assert torch.equal(rows.to(torch.bfloat16), table[[3, 3, 7]])
    assert rows.dtype == (torch.bfloat16 if native else torch.float32)
    if native:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load("tiny-llama", "fast", "bf16")
    source = compile_file(CARDS / "tiny-llama.linnet", "torch", {"Batch": 3, "MaxSeq": 24, "T": "bf16"}, "fast")
    assert "x = rt.gather_rows(self.embed, tokens)" in source
    before = fast.runner.k_cache.clone()
    fast.runner.decode(np.array([3, 4, 8], np.int32), np.array([4, 0, 3], np.int32))
    assert fast.runner.k_cache.dtype == torch.bfloat16 and not torch.equal(fast.runner.k_cache, before)
    exact = load("tiny-llama", "exact", "bf16")
    assert_agrees(fast, exact, rtol=1e-7, atol_of_max=0.05)
