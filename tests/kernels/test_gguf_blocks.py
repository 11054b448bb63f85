"""Linnet's C decoders of GGUF's quantized blocks against gguf's numpy decoders, the reference
transformers and llama.cpp's own Python tools share: bit for bit, on random block bytes (any
scale, NaN and infinity included) and on blocks gguf's quantizers write."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402
from gguf.constants import GGMLQuantizationType as Q  # noqa: E402

from linnet.kernels import gguf_blocks  # noqa: E402

DECODED = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]

pytestmark = [
    pytest.mark.skipif(not gguf_blocks.decodes(Q.Q8_0), reason="Linnet's C decoders are not built here"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # gguf's numpy on NaN and infinite scales
]


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


@pytest.mark.parametrize("qtype", DECODED, ids=lambda q: q.name)
def test_each_type_decodes_as_gguf_does(qtype):
    """Every bit pattern a block's scales and values can take turns up among 4096 random blocks."""
    values, nbytes = GGML_QUANT_SIZES[qtype]
    rows = np.random.default_rng(int(qtype)).integers(0, 256, (256, 16 * nbytes), dtype=np.uint8)
    got = gguf_blocks.decode(rows, qtype)
    assert got.shape == (256, 16 * values) and got.dtype == np.float32
    np.testing.assert_array_equal(bits(got), bits(gguf.quants.dequantize(rows, qtype)))


@pytest.mark.parametrize("qtype", DECODED, ids=lambda q: q.name)
def test_each_type_decodes_to_bf16_as_torch_rounds_gguf_s_values(qtype):
    """Decoded straight to bf16 (loading a bf16 model): torch's `.to(bfloat16)` of gguf's float32
    values, bit for bit, NaN's payload apart (a NaN stays NaN); on random blocks, NaN and infinite
    scales included."""
    torch = pytest.importorskip("torch")
    values, nbytes = GGML_QUANT_SIZES[qtype]
    rows = np.random.default_rng(int(qtype) + 7).integers(0, 256, (256, 16 * nbytes), dtype=np.uint8)
    got = gguf_blocks.decode(rows, qtype, bf16=True)
    assert got.shape == (256, 16 * values) and got.dtype == np.uint16
    ref = gguf.quants.dequantize(rows, qtype)
    want = torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.where(nan, 0, got), np.where(nan, 0, want))
    assert np.isnan((got[nan].astype(np.uint32) << 16).view(np.float32)).all()
    apart = np.empty_like(got)  # the two passes it stands for: decode, then round
    assert gguf_blocks.round_to_bf16(gguf_blocks.decode(rows, qtype), apart)
    np.testing.assert_array_equal(got, apart)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(qtype=st.sampled_from(DECODED), seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 9),
       blocks=st.integers(1, 4))
def test_any_rows_decode_as_gguf_does(qtype, seed, rows, blocks):
    values, nbytes = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, blocks * nbytes), dtype=np.uint8)
    out = np.full((rows, blocks * values), np.nan, np.float32)
    assert gguf_blocks.decode(raw, qtype, out) is out
    np.testing.assert_array_equal(bits(out), bits(gguf.quants.dequantize(raw, qtype)))


@pytest.mark.parametrize("qtype", [q for q in DECODED if q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)],
                         ids=lambda q: q.name)
def test_blocks_gguf_writes_decode_near_their_weights(qtype):
    """Quantized by gguf from real-looking weights, decoded here: as gguf decodes them, and near
    the weights (the round trip the file format promises)."""
    w = np.random.default_rng(1).normal(0, 0.02, (8, 256)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)
    got = gguf_blocks.decode(raw, qtype)
    np.testing.assert_array_equal(bits(got), bits(gguf.quants.dequantize(raw, qtype)))
    assert np.abs(got - w).max() < 0.2 * np.abs(w).max()


def test_other_types_are_left_to_gguf():
    for qtype in (Q.F16, Q.BF16, Q.IQ2_XXS, Q.TQ1_0):
        assert not gguf_blocks.decodes(qtype)
        assert gguf_blocks.decode(np.zeros((1, 64), np.uint8), qtype) is None


def test_misshapen_rows_are_refused():
    with pytest.raises(ValueError, match=r"Q8_0 rows must be uint8 \[n, a multiple of 34 bytes\]"):
        gguf_blocks.decode(np.zeros((2, 35), np.uint8), Q.Q8_0)
    with pytest.raises(ValueError, match=r"out must be C-contiguous float32 \[2, 32\]"):
        gguf_blocks.decode(np.zeros((2, 34), np.uint8), Q.Q8_0, np.zeros((2, 64), np.float32)[:, ::2])


def test_turned_off_by_the_kernels_switch(monkeypatch):
    monkeypatch.setenv("LINNET_CPU_KERNELS", "0")
    gguf_blocks._library.cache_clear()
    gguf_blocks.decodes.cache_clear()
    try:
        assert gguf_blocks.decode(np.zeros((1, 34), np.uint8), Q.Q8_0) is None
    finally:
        gguf_blocks._library.cache_clear()
        gguf_blocks.decodes.cache_clear()
