"""Batch invariance of the CPU kernels: a row's result is bitwise the same whatever else is in
its call. Each op computes a probe row alone, then at every position 0..M-1 among random other
rows, M in {1, 2, 3, 4, 8, 16, 17, 64} (one row, the pair and AMX kernels' row counts, the 6-
and 12-row tiles, a 16-row AMX block and one past it), and the two must be torch.equal. The
shapes are small but take each kernel's paths: the linear's K a multiple of 32 (AMX tiles, where
this CPU has them), even (bf16 pairs) and odd (f32 FMAs), a last panel narrower than 16; f32
outputs, whose sums show a difference in the last bits that a bf16 rounding would mostly hide.
tests/kernels/test_older_cpus.py runs this file again under the older CPUs' instruction caps."""

import numpy as np
import pytest
import torch

from linnet.kernels import cpu_attention, cpu_linear, cpu_ops, cpu_qlinear

pytestmark = pytest.mark.skipif(cpu_linear.library() is None, reason="Linnet's CPU kernels do not run here")

ROW_COUNTS = [1, 2, 3, 4, 8, 16, 17, 64]
TYPES = [torch.bfloat16, torch.float16, torch.float32]


def assert_rows_invariant(op, make_rows, seed: int = 0):
    """op(rows) [M, ...] gives the probe row (make_rows(1)) the same bits at each of its positions
    among make_rows(M - 1) others."""
    g = torch.Generator().manual_seed(seed)
    probe = make_rows(1, g)
    alone = op(probe)[0]
    differ = []
    for m in ROW_COUNTS:
        others = make_rows(m - 1, g) if m > 1 else probe[:0]
        for at in range(m):
            got = op(torch.cat([others[:at], probe, others[at:]]))[at]
            if not torch.equal(got, alone):
                differ.append((m, at))
    assert not differ, f"(rows, position) where the probe row's result differs from its own alone: {differ}"


@pytest.mark.parametrize("k", [128, 70, 71], ids=["K%32", "K_even", "K_odd"])
@pytest.mark.parametrize("n", [48, 40], ids=["whole_panels", "narrow_last_panel"])
@pytest.mark.parametrize("w_type", TYPES)
@pytest.mark.parametrize("x_type", [torch.float32, torch.bfloat16])
def test_linear_rows_are_batch_invariant(x_type, w_type, n, k):
    w = cpu_linear.pack(torch.randn(n, k, generator=torch.Generator().manual_seed(1)).to(w_type))
    # x's values bf16's, so that f32 x and bf16 x give a pair kernel the same operand
    assert_rows_invariant(lambda x: cpu_linear.matmul(x, w),
                          lambda m, g: torch.randn(m, k, generator=g).bfloat16().to(x_type))


@pytest.mark.parametrize("k", [256, 768], ids=["K_256", "K_768"])  # whole K-quant super-blocks
@pytest.mark.parametrize("qtype", sorted(cpu_qlinear.READS), ids=lambda q: cpu_qlinear.READS[q])
@pytest.mark.parametrize("x_type", [torch.float32, torch.bfloat16])
def test_quantized_linear_rows_are_batch_invariant(x_type, qtype, k):
    """A GGUF's blocks (`cpu_qlinear`): up to a tile of rows decodes the blocks in registers, more
    decode each panel once into a buffer; a row sums the same either way."""
    from tests.kernels.test_cpu_qlinear import random_blocks  # gguf's block sizes

    n = 40
    w = cpu_qlinear.pack(random_blocks(qtype, n, k, np.random.default_rng(1)), qtype, n, k)
    assert_rows_invariant(lambda x: cpu_qlinear.matmul(x, w),
                          lambda m, g: torch.randn(m, k, generator=g).bfloat16().to(x_type))


@pytest.mark.parametrize("dtype", TYPES)
def test_rmsnorm_rows_are_batch_invariant(dtype):
    weight = torch.randn(72, generator=torch.Generator().manual_seed(1)).to(dtype)
    assert_rows_invariant(lambda x: cpu_ops.rmsnorm(x, weight, 1e-5),
                          lambda m, g: (torch.randn(m, 72, generator=g) * 3).to(dtype))


@pytest.mark.parametrize("dtype", TYPES)
def test_silu_mul_rows_are_batch_invariant(dtype):
    # a fused matmul's output: gate and up halves, read where they lie
    assert_rows_invariant(lambda x: cpu_ops.silu_mul(x[:, :72], x[:, 72:]),
                          lambda m, g: (torch.randn(m, 144, generator=g) * 3).to(dtype))


@pytest.mark.parametrize("dtype", TYPES)
def test_rope_rows_are_batch_invariant(dtype):
    from linnet.codegen_torch.runtime import rope_table

    table = rope_table(32, 64, 10000.0)
    # a token's row: its position then its heads, the position a value that rounds exactly in each type
    assert_rows_invariant(lambda x: cpu_ops.rope(x[:, 1:].reshape(-1, 3, 32), x[:, 0].long(), table),
                          lambda m, g: torch.cat([torch.randint(0, 64, (m, 1), generator=g).float(),
                                                  torch.randn(m, 96, generator=g)], 1).to(dtype))


# Spans from 600 positions: a token's span is computed in parts of 256 positions and merged (the
# kernel's `token_parts`), spread over the threads when the call's units are few (the probe alone:
# 2 KV heads) and taken in turn by one thread when they are many. Positions are multiples of 8,
# which bf16 holds exactly up to 2048 (the rows carry them in the queries' type).
@pytest.mark.parametrize("window, softcap, shortest, max_seq", [(0, 0.0, 0, 40), (5, 0.0, 0, 40), (5, 2.0, 0, 40),
                                                                (0, 0.0, 600, 1500), (700, 2.0, 600, 1500)],
                         ids=["whole", "window", "window_softcap", "long_spans", "long_window_softcap"])
@pytest.mark.parametrize("dtype", TYPES)
def test_attention_rows_are_batch_invariant(dtype, window, softcap, shortest, max_seq):
    g = torch.Generator().manual_seed(1)
    rows, kv_heads, group, head_dim = 6, 2, 3, 32
    k = torch.randn(rows, max_seq, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(rows, max_seq, kv_heads, head_dim, generator=g).to(dtype)
    sinks = torch.randn(kv_heads * group, generator=g)

    def attend(x):  # a token's row: its cache row, its position, then its query heads
        q = x[:, 2:].reshape(-1, kv_heads * group, head_dim)
        return cpu_attention.attend_rows(q, k, v, x[:, 0].long(), x[:, 1].long(), window, sinks, head_dim ** -0.5,
                                         softcap)

    def make_rows(m, g):
        return torch.cat([torch.randint(0, rows, (m, 1), generator=g).float(),
                          8 * torch.randint(shortest // 8, max_seq // 8, (m, 1), generator=g).float(),
                          torch.randn(m, kv_heads * group * head_dim, generator=g)],
                         1).to(torch.float32 if dtype == torch.float16 else dtype)

    assert_rows_invariant(attend, make_rows)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", TYPES)
def test_expert_linear_rows_are_batch_invariant(dtype, with_bias):
    """A MoE layer's expert matmuls, each expert's matrix packed as `TorchModel.pack_expert_weights`
    packs it: a token's outputs whatever other tokens go to its experts (f32: MKL's and torch's
    grouped matmul summed them otherwise with the expert's row count)."""
    from linnet.codegen_torch.runtime import expert_linear

    g = torch.Generator().manual_seed(1)
    experts, k, n, d_in = 5, 2, 40, 70
    w = torch.randn(experts, n, d_in, generator=g).to(dtype)
    packed = [cpu_linear.pack(e) for e in w]
    bias = torch.randn(experts, n, generator=g).to(dtype) if with_bias else None

    def moe(x):  # a token's row: its k experts, then its features
        return expert_linear(x[:, k:], packed, x[:, :k].int(), bias).reshape(len(x), -1)

    assert_rows_invariant(moe, lambda m, g: torch.cat([torch.randint(0, experts, (m, k), generator=g).float(),
                                                       torch.randn(m, d_in, generator=g)], 1).to(dtype))
