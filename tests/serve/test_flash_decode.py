"""The decode step's attention through flash attention's variable-length kernel, CUDA's path. No GPU
here: the kernel is stood in for by a statement of what it computes (Flash-Attention 2's varlen
forward: each sequence's queries bottom-right aligned to its keys, `seqused_k` keys used, grouped
heads, a left window), and the runtime's arguments to it must give what SDPA's path gives."""

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.codegen_torch import runtime as rt


def varlen_reference(q, k, v, starts_q, starts_k, max_q, max_k, dropout, is_causal, debug, *, scale,
                     window_size_left=None, window_size_right=None, seqused_k=None):
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[:2] + v.shape[-1:], dtype=q.dtype)
    for b in range(len(starts_q) - 1):
        q0, q1, k0 = int(starts_q[b]), int(starts_q[b + 1]), int(starts_k[b])
        length = int(seqused_k[b]) if seqused_k is not None else int(starts_k[b + 1]) - k0
        m = q1 - q0
        assert m <= max_q and length <= max_k and dropout == 0.0
        if m == 0 or length == 0:  # no keys: zeros
            continue
        keys = k[k0:k0 + length].double().repeat_interleave(heads // kv_heads, dim=1)
        values = v[k0:k0 + length].double().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("mhd,shd->hms", q[q0:q1].double(), keys) * scale
        i = torch.arange(m)[:, None] + (length - m)  # each query's place among the keys
        j = torch.arange(length)[None, :]
        seen = torch.ones(m, length, dtype=torch.bool)
        if is_causal:
            seen &= j <= i
        if window_size_left is not None and window_size_left >= 0:
            seen &= j >= i - window_size_left
        if window_size_right is not None and window_size_right >= 0:
            seen &= j <= i + window_size_right
        probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
        out[q0:q1] = torch.einsum("hms,shd->mhd", probs, values).to(q.dtype)
    return out, None, None, None, None


@pytest.mark.parametrize("window", [0, 3])
def test_each_row_attends_to_its_keys_up_to_its_position(window, monkeypatch):
    g = torch.Generator().manual_seed(0)
    rows, seq, heads, kv_heads, d = 5, 12, 4, 2, 8
    q = torch.randn(rows, heads, d, generator=g)
    k_cache, v_cache = torch.randn(rows, seq, kv_heads, d, generator=g), torch.randn(rows, seq, kv_heads, d, generator=g)
    positions = torch.tensor([0, 11, 5, 12, 2], dtype=torch.int32)  # row 3 idle: padding at MaxSeq
    monkeypatch.setattr(rt.cpu_attention, "available", lambda cache, head_dim: False)
    rt.as_tensors("cpu")
    want = rt.attention(q, k_cache, v_cache, positions, window=window, scale=0.3, fast=True)
    monkeypatch.setattr(rt, "flash_decodes", lambda q, k_cache: True)
    monkeypatch.setattr(rt, "_flash_varlen", varlen_reference)
    rt.as_tensors("cpu")
    got = rt.attention(q, k_cache, v_cache, positions, window=window, scale=0.3, fast=True)
    busy = [0, 1, 2, 4]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-5, atol=1e-5)
    assert not got[3].any()  # the idle row used no keys


def test_flash_serves_16_bit_cuda_tensors_only():
    q = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    assert not rt.flash_decodes(q, torch.zeros(2, 3, 2, 8, dtype=torch.bfloat16))  # the CPU
    if torch.cuda.is_available():
        cuda = q.cuda()
        assert rt.flash_decodes(cuda, torch.zeros(2, 3, 2, 8, dtype=torch.bfloat16, device="cuda")) == \
            rt._flash_takes_used_keys()
        assert not rt.flash_decodes(cuda.float(), torch.zeros(2, 3, 2, 8, device="cuda"))


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-mistral"])  # tiny-mistral: a sliding window
def test_a_decode_step_through_the_kernel_gives_sdpas_logits(card, monkeypatch):
    # the generated step on a GPU's branches (plain weights, SDPA, no Linnet CPU kernel), with rows
    # at different positions and one idle: the kernel's path against SDPA's
    monkeypatch.setattr(rt, "_put_inside", rt._put_clamped)
    monkeypatch.setattr(rt, "_key_span", lambda positions, max_seq: max_seq)
    monkeypatch.setattr(rt, "packs_linear_weights", lambda device, dtype: False)
    monkeypatch.setattr(rt.cpu_ops, "serves", lambda *tensors: False)
    monkeypatch.setattr(rt.cpu_attention, "available", lambda cache, head_dim: False)
    model = nest.load(card, backend="torch", numerics="fast", weights="random", tokenizer=False,
                      generics={"Batch": 4, "MaxSeq": 32, "T": "f32"})
    runner = model.runner
    g = torch.Generator().manual_seed(1)
    for name in runner.state:  # a cache of noise, as rows that hold prompts
        getattr(runner, name).normal_(generator=g)
    start = {name: getattr(runner, name).clone() for name in runner.state}
    tokens = np.array([3, 9, 0, 27], np.int32)
    positions = np.array([5, 31, 32, 17], np.int32)  # row 2 idle
    want = model.decode(tokens, positions).clone()
    for name, value in start.items():
        getattr(runner, name).copy_(value)
    monkeypatch.setattr(rt, "flash_decodes", lambda q, k_cache: True)
    monkeypatch.setattr(rt, "_flash_varlen", varlen_reference)
    got = model.decode(tokens, positions)
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-4, atol=1e-4)
