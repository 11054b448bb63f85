"""The quantized CPU linear (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS blocks) against
gguf's own
decoding of the same bytes and a float64 matmul: odd shapes (a last panel narrower than 16, K a few blocks, row
counts around the tiles and the 64-row block of x), x in f32 and bf16, joined weights, and batch invariance;
rows gathered from the panels (a tied embedding's) against gguf's decoding of those rows."""

import gguf
import numpy as np
import pytest
import torch

from linnet.kernels import cpu_linear, cpu_qlinear

pytestmark = pytest.mark.skipif(not cpu_linear.available(torch.float32), reason="Linnet's CPU kernels do not run here")

Q = gguf.GGMLQuantizationType
QTYPES = [Q.Q8_0, Q.Q4_1]
K_QUANTS = [Q.Q4_K, Q.Q6_K]
# types run in another's panels (`PANEL_TYPES`: Q4_0 as Q4_K, Q5_1 as Q5_K, Q3_K as Q6_K, IQ4_XS as IQ4_NL),
# Q5_0 (f16 d, nibbles and a plane of fifth bits, q - 16), Q5_K (Q4_K's nibbles and minimums, a plane of fifth bits)
# and IQ4_NL (nibbles looked up in its table), each with a K of a few blocks and a last panel of one
# row; fewer cases than the types above, whose kernels they share (the suite's time is counted: these run again
# under each older CPU's cap)
OTHERS = [(Q.Q4_0, 17, 96), (Q.Q5_0, 17, 96), (Q.Q5_1, 17, 64), (Q.Q5_K, 17, 512), (Q.Q3_K, 17, 512),
          (Q.IQ4_NL, 17, 96), (Q.IQ4_XS, 17, 512)]
# the quants of the types summed with a minimum (Q4_0's, -8 d, in its panels)
QUANTS_AT = {Q.Q4_0: slice(2, 18), Q.Q4_1: slice(4, 20), Q.Q5_1: slice(4, 24),
             Q.Q4_K: slice(16, 144), Q.Q5_K: slice(16, 176)}


def random_blocks(qtype, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """n * k / (its values) blocks of random bytes, but for finite f16 scales (and minimums) of a trained
    weight's size; the K-quants' sub-block scales random too (6-bit, or int8 for Q6_K)."""
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n, k // values, size), dtype=np.uint8)
    for at in cpu_qlinear.HALVES[int(qtype)]:
        scales = (rng.standard_normal((n, k // values, 1)) * (0.02 if values == 32 else 0.001)).astype(np.float16)
        blocks[..., at:at + 2] = scales.view(np.uint8)
    return blocks


def reference(qtype, blocks: np.ndarray, n: int, k: int, x: torch.Tensor):
    """gguf's dequantization of the blocks, times x in float64; and the sums of magnitudes whose f32
    rounding bounds the kernel's error (Q4_1, the K-quants with a minimum and Q4_0: |d q| and |m| apart, as
    the kernel sums them; m is gguf's decoding of the blocks with their quants zero)."""
    def decoded(b):
        return gguf.quants.dequantize(b.reshape(n, -1), qtype).astype(np.float64).reshape(n, k)

    w = decoded(blocks)
    xd = x.double().numpy()
    if qtype in QUANTS_AT:
        zero = blocks.copy()
        zero[..., QUANTS_AT[qtype]] = 0
        m = decoded(zero)
        magnitude = np.abs(w - m) + np.abs(m)
    else:
        magnitude = np.abs(w)
    return xd @ w.T, np.abs(xd) @ magnitude.T


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 3, 16, 100])
@pytest.mark.parametrize("n,k", [(1, 32), (17, 96), (40, 576), (64, 160)])
@pytest.mark.parametrize("x_type", [torch.float32, torch.bfloat16], ids=["x_f32", "x_bf16"])
def test_matmul_is_gguf_dequantized_times_x(qtype, rows, n, k, x_type):
    rng = np.random.default_rng(rows * 1000 + n * 10 + k)
    blocks = random_blocks(qtype, n, k, rng)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32)).to(x_type)
    w = cpu_qlinear.pack(blocks, qtype, n, k)
    assert (w.n, w.k, w.table.count) == (n, k, -(-n // 16))
    got = cpu_qlinear.matmul(x, w)
    assert got.shape == (rows, n) and got.dtype == x_type
    want, scale = reference(qtype, blocks, n, k, x)
    # f32 accumulation over K terms (and the blocks' sums): within K ulps of the magnitudes summed;
    # a bf16 output adds its one rounding
    bound = 4 * k * 2 ** -24 * scale + (2 ** -8 * np.abs(want) if x_type == torch.bfloat16 else 0) + 1e-30
    assert np.all(np.abs(got.double().numpy() - want) <= bound)


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 3, 16, 100])
@pytest.mark.parametrize("n,k", [(1, 256), (17, 512), (40, 768)])
@pytest.mark.parametrize("x_type", [torch.float32, torch.bfloat16], ids=["x_f32", "x_bf16"])
def test_k_quants_are_gguf_dequantized_times_x(qtype, rows, n, k, x_type):
    """Q4_K and Q6_K (a Q4_K_M file's types): super-blocks of 256, their sub-blocks' scales worked out
    at load; random bytes but for finite f16 scales."""
    test_matmul_is_gguf_dequantized_times_x(qtype, rows, n, k, x_type)


@pytest.mark.parametrize("qtype,n,k", OTHERS, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("rows", [1, 3, 100])
@pytest.mark.parametrize("x_type", [torch.float32, torch.bfloat16], ids=["x_f32", "x_bf16"])
def test_types_in_anothers_panels_and_q5_k_are_gguf_dequantized_times_x(qtype, n, k, rows, x_type):
    """Q4_0, Q5_0 and Q5_1 (Q4_K_M's and Q5_K_M's types where a row is not whole super-blocks), Q3_K (Q3_K_M's),
    IQ4_XS (as IQ4_NL) repacked, IQ4_NL (its 4-bit indices looked up in its table) and Q5_K (Q5_K_M's):
    one row, a tile and a part, and more rows than a panel is decoded once for."""
    test_matmul_is_gguf_dequantized_times_x(qtype, rows, n, k, x_type)


@pytest.mark.parametrize("qtype", QTYPES + K_QUANTS + [Q.Q5_0, Q.Q5_K, Q.IQ4_NL], ids=lambda q: q.name)
@pytest.mark.parametrize("x_type", [torch.float32, torch.bfloat16], ids=["x_f32", "x_bf16"])
def test_each_row_is_the_same_alone_as_beside_others(qtype, x_type):
    """Batch invariance: a row's sums are bitwise the same whatever rows its call holds (bf16 x on
    AVX-512 BF16: one tile's rows decode in registers; more, two panels at a time for each 256 rows, the first
    tile keeping them for the others; the last 3 rows of 259, one tile, in registers again)."""
    rng = np.random.default_rng(7)
    n, k = 50, 256
    w = cpu_qlinear.pack(random_blocks(qtype, n, k, rng), qtype, n, k)
    x = torch.from_numpy(rng.standard_normal((259, k)).astype(np.float32)).to(x_type)
    together = cpu_qlinear.matmul(x, w)
    for i in (0, 3, 4, 5, 63, 64, 69, 255, 256, 258):
        assert torch.equal(cpu_qlinear.matmul(x[i:i + 1], w)[0], together[i])
        assert torch.equal(cpu_qlinear.matmul(x[i:i + 5], w)[0], together[i])


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 16])
def test_an_f32_out_keeps_the_sums_a_bf16_x_would_have_rounded(qtype, rows):
    """out_dtype=f32 (a bf16 model's logits from a quantized head): the f32 sums as they are, within f32's
    bound of gguf's decoding times x (no bf16 rounding's), and those sums rounded are the bf16 output."""
    rng = np.random.default_rng(rows)
    n, k = 40, 256
    blocks = random_blocks(qtype, n, k, rng)
    w = cpu_qlinear.pack(blocks, qtype, n, k)
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32)).bfloat16()
    got = cpu_qlinear.matmul(x, w, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    want, scale = reference(qtype, blocks, n, k, x)
    assert np.all(np.abs(got.double().numpy() - want) <= 4 * k * 2 ** -24 * scale + 1e-30)
    assert not torch.equal(got, got.bfloat16().float())
    assert torch.equal(got.bfloat16(), cpu_qlinear.matmul(x, w))


def test_joined_weights_give_their_outputs_side_by_side():
    rng = np.random.default_rng(3)
    k = 64
    parts = [cpu_qlinear.pack(random_blocks(Q.Q4_1, n, k, rng), Q.Q4_1, n, k) for n in (20, 16, 9)]
    x = torch.from_numpy(rng.standard_normal((5, k)).astype(np.float32))
    joined = cpu_qlinear.QuantWeight.join(parts)
    assert joined.n == 45
    assert torch.equal(cpu_qlinear.matmul(x, joined), torch.cat([cpu_qlinear.matmul(x, p) for p in parts], dim=1))
    with pytest.raises(ValueError, match="share K and block type"):
        cpu_qlinear.QuantWeight.join([parts[0], cpu_qlinear.pack(random_blocks(Q.Q8_0, 16, k, rng), Q.Q8_0, 16, k)])
    # Q5_1's panels are Q5_K's: they join (a Q5_K_M's v Q5_K where q and k are Q5_1)
    k = 256
    x = torch.from_numpy(rng.standard_normal((5, k)).astype(np.float32))
    mixed = [cpu_qlinear.pack(random_blocks(qtype, 16, k, rng), qtype, 16, k) for qtype in (Q.Q5_1, Q.Q5_K)]
    assert torch.equal(cpu_qlinear.matmul(x, cpu_qlinear.QuantWeight.join(mixed)),
                       torch.cat([cpu_qlinear.matmul(x, p) for p in mixed], dim=1))


def test_a_bias_and_leading_axes_are_kept():
    rng = np.random.default_rng(5)
    n, k = 24, 64
    blocks = random_blocks(Q.Q8_0, n, k, rng)
    w = cpu_qlinear.pack(blocks, Q.Q8_0, n, k)
    x = torch.from_numpy(rng.standard_normal((2, 3, k)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    got = cpu_qlinear.matmul(x, w, bias)
    assert got.shape == (2, 3, n)
    assert torch.equal(got, (cpu_qlinear.matmul(x.reshape(6, k), w) + bias).reshape(2, 3, n))


@pytest.mark.parametrize("qtype,k", [(Q.Q8_0, 96), (Q.Q4_1, 576), (Q.Q4_K, 512), (Q.Q6_K, 256)],
                         ids=lambda v: getattr(v, "name", f"K_{v}"))
@pytest.mark.parametrize("ids", [[0, 36, 17, 36, 15, 16, 5], list(range(37)) * 60], ids=["rows", "threaded"])
def test_gathered_rows_are_gguf_dequantized(qtype, k, ids):
    """An embedding's rows read from the panels of the head tied to it (`gather`): bit for bit gguf's
    decoding of those rows' blocks (in f32; rounded to a bf16 or f16 table's values, then given in f32 or that type),
    an id outside the table a row of zeros, as the plain gather gives it; enough rows to split over threads."""
    rng = np.random.default_rng(k + len(ids))
    n = 37  # a last panel of 5 rows
    blocks = random_blocks(qtype, n, k, rng)
    w = cpu_qlinear.pack(blocks, qtype, n, k)
    want = torch.from_numpy(gguf.quants.dequantize(blocks.reshape(n, -1), qtype))
    picked = torch.tensor(ids + [n, -1], dtype=torch.int64)  # (past the table: zeros)
    got = cpu_qlinear.gather(cpu_qlinear.QuantTable(w, torch.float32), picked, torch.float32)
    assert got.shape == (len(ids) + 2, k) and got.dtype == torch.float32
    assert torch.equal(got[:len(ids)], want[ids]) and not got[len(ids):].any()
    for dtype in (torch.bfloat16, torch.float16):
        table = cpu_qlinear.QuantTable(w, dtype)
        assert torch.equal(cpu_qlinear.gather(table, picked[:len(ids)], dtype), want[ids].to(dtype))
        assert torch.equal(cpu_qlinear.gather(table, picked[:len(ids)], torch.float32), want[ids].to(dtype).float())


@pytest.mark.parametrize("qtype,k", [(qtype, k) for qtype, _, k in OTHERS], ids=lambda v: getattr(v, "name", f"K_{v}"))
def test_gathered_rows_of_types_in_anothers_panels_and_q5_k_are_gguf_dequantized(qtype, k):
    test_gathered_rows_are_gguf_dequantized(qtype, k, [0, 36, 17, 36, 15, 16, 5])


def test_rows_are_not_gathered_from_a_joined_group():
    rng = np.random.default_rng(4)
    parts = [cpu_qlinear.pack(random_blocks(Q.Q8_0, n, 64, rng), Q.Q8_0, n, 64) for n in (20, 9)]
    with pytest.raises(ValueError, match=r"from one weight's panels, not a joined group's: "
                                         r"QuantWeight\(\[29, 64\], Q8_0\)"):
        cpu_qlinear.gather(cpu_qlinear.QuantTable(cpu_qlinear.QuantWeight.join(parts), torch.float32),
                           torch.tensor([0]), torch.float32)


@pytest.mark.parametrize("qtype,k", [(Q.Q2_K, 256), (Q.Q8_0, 48), (Q.Q5_K, 288), (Q.IQ4_XS, 32)],
                         ids=["Q2_K", "K_48", "Q5_K_288", "IQ4_XS_32"])
def test_a_type_or_k_it_does_not_take_is_refused(qtype, k):
    """Q2_K's sub-blocks of 16 have a scale and a minimum each: no panel type holds two of both a block of 32."""
    names = {**dict.fromkeys(("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"), 32), **dict.fromkeys(("Q3_K", "Q4_K", "Q5_K",
             "Q6_K"), 256), "IQ4_NL": 32, "IQ4_XS": 256}
    taken = ", ".join(rf"{name} \(K a multiple of {values}\)" for name, values in names.items())
    with pytest.raises(ValueError, match=rf"takes {taken} blocks where .*; not {qtype.name} with K = {k}"):
        cpu_qlinear.pack(np.zeros(1000, np.uint8), qtype, 16, k)


def test_the_block_types_are_ggmls_own():
    """The kernel's type codes and block sizes, kept here without importing gguf, are gguf's; a Q4_0 weight's
    panels are Q4_K's (d q - 8 d), a Q5_1 one's Q5_K's (d q + m), a Q3_K one's Q6_K's (a scale a 16 values), an
    IQ4_XS one's IQ4_NL's (d (sc - 32) table[i], d sc as f32 as IQ4_NL's d is); Q5_0's are its own."""
    assert {code: (Q(code).name, *gguf.GGML_QUANT_SIZES[Q(code)]) for code in cpu_qlinear.READS} == \
        {code: (name, cpu_qlinear.BLOCK_VALUES[code], cpu_qlinear.BLOCK_BYTES[code])
         for code, name in cpu_qlinear.READS.items()}
    panels = {Q(code).name: Q(form).name for code, form in cpu_qlinear.PANEL_TYPES.items()}
    assert panels == {"Q4_0": "Q4_K", "Q5_1": "Q5_K", "Q3_K": "Q6_K", "IQ4_XS": "IQ4_NL"}
