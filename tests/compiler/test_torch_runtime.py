"""torch runtime pieces the parity tests reach only as a whole: rope's written form, the per-pass memo,
the cache store that drops padding."""

import types

import numpy as np
import pytest
import torch

from linnet.codegen_torch import runtime as rt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("generic", [False, True])  # the generic ops (a GPU's), or the CPU's kernel where it runs
def test_rope_rotates_halves_as_the_llama_reference_does(dtype, generic, monkeypatch):
    if generic:
        monkeypatch.setattr(rt.cpu_ops, "serves", lambda *tensors: False)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(5, 3, 8)).astype(np.float32)).to(dtype)
    positions = np.array([0, 1, 7, 3, 15], np.int32)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)
    angles = positions[:, None] * inv_freq[None, :]  # [n, 4]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x.double().numpy()[..., :4], x.double().numpy()[..., 4:]
    want = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    rt.as_tensors("cpu")
    table = rt.rope_table(8, 16, 10000.0)
    got = rt.rope(x, torch.from_numpy(positions), table)
    assert got.dtype == dtype
    ulp = {torch.float32: 1e-6, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]  # computed in f32, rounded once
    np.testing.assert_allclose(got.double().numpy(), want, rtol=ulp, atol=4 * ulp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rmsnorms_generic_path_is_hugging_faces_bit_for_bit(dtype, monkeypatch):
    # (a GPU's path: the CPU's kernel stood aside) normalized in f32, rounded to x's type, then the weight
    monkeypatch.setattr(rt.cpu_ops, "serves", lambda *tensors: False)
    g = torch.Generator().manual_seed(0)
    for n, d in ((1, 4096), (64, 576), (7, 2048)):
        x = (torch.randn(n, d, generator=g) * 3).to(dtype)
        weight = (1 + torch.randn(d, generator=g) / 10).to(dtype)
        h = x.float()
        want = weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
        got = rt.rmsnorm(x, weight, 1e-5)
        assert got.dtype == dtype and torch.equal(got, want)


def test_per_pass_computes_once_per_entry_call_and_per_tensor():
    calls = []
    a, b = torch.arange(4), torch.arange(4)  # equal values, different tensors

    def compute(t):
        calls.append(t)
        return t * 2

    rt.as_tensors("cpu")
    first = rt.per_pass("double", (a,), lambda: compute(a))
    assert rt.per_pass("double", (a,), lambda: compute(a)) is first  # every layer after the first hits
    rt.per_pass("double", (b,), lambda: compute(b))  # another tensor is another key
    rt.per_pass("triple", (a,), lambda: compute(a))  # and so is another question
    assert len(calls) == 3
    rt.as_tensors("cpu")  # the next entry call starts empty
    rt.per_pass("double", (a,), lambda: compute(a))
    assert len(calls) == 4


@pytest.mark.parametrize("put", ["put_", "_put_clamped"])
def test_put_drops_entries_past_the_state(put):
    """Padding tokens at position MaxSeq write nothing, on the CPU's path and the GPU's (clamped)."""
    rng = np.random.default_rng(5)
    cache = rng.normal(size=(2, 3, 6, 4)).astype(np.float32)  # [layers, rows, MaxSeq, dim]
    rows = np.array([0, 2, 1, 2, 0])
    positions = np.array([1, 6, 5, 3, 6])  # two at MaxSeq
    value = rng.normal(size=(5, 4)).astype(np.float32)
    want = cache.copy()
    for r, p, v in zip(rows, positions, value):
        if p < 6:
            want[1, r, p] = v
    got = torch.from_numpy(cache.copy())
    index = (1, torch.from_numpy(rows), torch.from_numpy(positions))
    rt.as_tensors("cpu")  # a new pass for the per-pass memo
    if put == "put_":
        rt.put_(got, index, torch.from_numpy(value))
    else:
        rt._put_clamped(got, index, torch.from_numpy(value), [(1, index[1]), (2, index[2])])
    np.testing.assert_array_equal(got.numpy(), want)


def test_clamped_puts_of_one_pass_share_their_indices_only_where_the_state_is_as_long():
    """The GPU's clamped write works out its clamped indices once a pass (every layer's k and v take
    the same): a state of another length along those axes gets its own."""
    rng = np.random.default_rng(6)
    rows, positions = torch.tensor([0, 1, 2, 1]), torch.tensor([3, 5, 6, 0])
    rt.as_tensors("cpu")
    for max_seq in (6, 4, 6, 7):  # 6 twice: the memo's; 4 and 7 their own
        cache = rng.normal(size=(2, 3, max_seq, 4)).astype(np.float32)
        value = rng.normal(size=(4, 4)).astype(np.float32)
        want = cache.copy()
        for r, p, v in zip(rows.tolist(), positions.tolist(), value):
            if p < max_seq:
                want[0, r, p] = v
        got = torch.from_numpy(cache.copy())
        rt._put_clamped(got, (0, rows, positions), torch.from_numpy(value), [(1, rows), (2, positions)])
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("heads, kv_heads, b, m", [(8, 2, 3, 1), (6, 3, 1, 5), (4, 4, 1, 3), (12, 1, 4, 1), (8, 2, 1, 1)])
def test_sdpa_folds_grouped_heads_into_queries_exactly(heads, kv_heads, b, m):
    """`rt._sdpa` runs grouped query heads as extra queries of their KV head (so CUDA's fused kernels
    take the call): the result is SDPA's own grouped attention, on masks that differ by token, for
    a token a row (b rows, m = 1) and one row's queries (b = 1); the mask made once a pass serves
    every layer's call, and a call of another grouping gets its own."""
    g = torch.Generator().manual_seed(heads * 7 + m + b)
    length, d = 11, 16
    visible = torch.rand(max(b, m), length, generator=g) < 0.6
    visible[..., 0] = True  # every query sees a key
    mask = visible[None, None] if b == 1 else visible[:, None, None, :]
    rt.as_tensors("cpu")
    for heads_now in (heads, heads, kv_heads):  # two layers, then another grouping of the same pass
        q = torch.randn(b, heads_now, m, d, generator=g)
        k, v = torch.randn(b, kv_heads, length, d, generator=g), torch.randn(b, kv_heads, length, d, generator=g)
        got = rt._sdpa(q, k, v, visible, 0.3)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_eager_sdpa_on_cuda_leaves_cudnn_out_and_a_capture_keeps_torchs_choice(monkeypatch):
    # cuDNN's attention builds a plan per new shape (packed passes change shape with every prompt);
    # no GPU here: a stand-in for a CUDA tensor, and for torch's capture state
    from torch.nn.attention import SDPBackend

    cuda_q = types.SimpleNamespace(is_cuda=True)
    assert rt._sdpa_backends(torch.zeros(1)) is None  # the CPU: torch's choice
    for capturing, want in ((False, True), (True, False)):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda capturing=capturing: capturing)
        got = rt._sdpa_backends(cuda_q)
        assert (got is not None) == want
        assert got is None or (SDPBackend.CUDNN_ATTENTION not in got and SDPBackend.EFFICIENT_ATTENTION in got)


def test_a_step_to_be_captured_chooses_its_kernels_alike_in_its_warm_up_and_its_capture(monkeypatch):
    # a warm-up that left cuDNN out made the capture build cuDNN's plan inside it, which failed the
    # capture (the GPU check's SDPA decode step ran eagerly); no GPU here: stand-ins, as above
    cuda_q = types.SimpleNamespace(is_cuda=True)
    chosen = {}
    for capturing in (False, True):  # the runner's warm-up runs, then its capture
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda capturing=capturing: capturing)
        with rt.graph_step():
            chosen[capturing] = rt._sdpa_backends(cuda_q)
    assert chosen[False] == chosen[True] is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert rt._sdpa_backends(cuda_q) is not None  # an eager pass after it leaves cuDNN out again


def test_a_linear_widened_to_f32_keeps_its_sums_where_a_kernel_does_and_a_fused_member_its_groups():
    # `linear(x, lm_head) as f32` in bf16 (rt.linear's out_dtype): a packed weight's kernel gives the f32 sums
    # with the bias (within f32's bound of the product, which a bf16 rounding is not); a fused group's member
    # (q of q/k/v) reads the group's one product, in bf16, widened; every path gives f32
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 64, generator=g).bfloat16(), torch.randn(48, 64, generator=g).bfloat16()
    b = torch.randn(48, generator=g).bfloat16()
    xd, wd, bd = x.double(), w.double(), b.double()
    bound = 4 * 64 * 2 ** -24 * (xd.abs() @ wd.abs().T + bd.abs())
    for rows in (1, 5):
        got = rt.linear(x[:rows], rt.pack_linear_weight(w, rows), b, out_dtype=torch.float32)
        assert got.dtype == torch.float32
        assert torch.all((got.double() - (xd[:rows] @ wd.T + bd)).abs() <= bound[:rows])
        assert not torch.equal(got, got.bfloat16().float())
        plain = rt.linear(x[:rows], w, b, out_dtype=torch.float32)  # torch's own matmul: at most bf16's rounding
        assert plain.dtype == torch.float32
        torch.testing.assert_close(plain, got, rtol=2 ** -8, atol=2 ** -8 * got.abs().max().item())
    fused = torch.cat([w, w.flip(0)])
    member = rt.FusedPart(fused, 0, 48, group=-7)
    got = rt.linear(x, member, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, rt.linear(x, fused)[:, :48].float())
    rt._FUSED.pop(-7)
