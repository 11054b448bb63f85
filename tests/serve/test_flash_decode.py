"""Attention through flash attention's variable-length kernel (a decode step's decoding tokens, and
every segment of a packed or mixed pass), CUDA's path. No GPU
here: the kernel is stood in for by a statement of what it computes (Flash-Attention 2's varlen
forward: each sequence's queries bottom-right aligned to its keys, `seqused_k` keys used, grouped
heads, a left window), and the runtime's arguments to it must give what SDPA's path gives."""

import numpy as np
import pytest
import torch

from linnet.codegen_torch import runtime as rt
from tests.serve.conftest import noisy_cache, restore_cache, torch_on_gpu_branches


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


@pytest.mark.parametrize("rows, positions", [
    ([4, 1, 3, 3, 3, 0, 2], [6, 0, 2, 3, 4, 12, 9]),  # decoding rows around a prompt's chunk (from 2)
    ([4, 1, 3, 3, 1, 0, 2], [6, 0, 7, 8, 4, 12, 9]),  # two one-token segments of row 1; a chunk from 7
    ([3, 3, 3, 1, 1, 1, 1], [0, 1, 2, 0, 1, 2, 3]),  # a prefill: two prompts, end to end
    ([4, 1, 3, 3, 3, 0, 2], [6, 0, 2, 5, 4, 12, 9]),  # a run out of order: SDPA's path
])
def test_a_pack_attends_through_the_kernel_as_through_sdpa(rows, positions, monkeypatch):
    # each run of a row's tokens one sequence of the kernel's (its queries at the end of its keys,
    # causal), in pack order; a padding token (at MaxSeq) uses no keys; a pack whose run is not of
    # consecutive positions keeps SDPA's path
    g = torch.Generator().manual_seed(2)
    batch, seq, heads, kv_heads, d = 5, 12, 4, 2, 8
    rows = torch.tensor(rows, dtype=torch.int32)
    positions = torch.tensor(positions, dtype=torch.int32)
    q = torch.randn(len(rows), heads, d, generator=g)
    k_cache, v_cache = torch.randn(batch, seq, kv_heads, d, generator=g), torch.randn(batch, seq, kv_heads, d, generator=g)
    monkeypatch.setattr(rt.cpu_attention, "available", lambda cache, head_dim: False)
    rt.as_tensors("cpu")
    want = rt.attention(q, k_cache, v_cache, positions, rows=rows, window=3, scale=0.3, fast=True)
    monkeypatch.setattr(rt, "flash_decodes", lambda q, k_cache: True)
    calls = []
    monkeypatch.setattr(rt, "_flash_varlen", lambda *a, **k: calls.append((a[3].tolist(), a[4].tolist(), a[5], a[8]))
                        or varlen_reference(*a, **k))
    rt.as_tensors("cpu")
    got = rt.attention(q, k_cache, v_cache, positions, rows=rows, window=3, scale=0.3, fast=True)
    real = [i for i in range(len(rows)) if positions[i] < seq]
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    segments = [i for i in range(1, len(rows) + 1) if i == len(rows) or rows[i] != rows[i - 1]]
    in_order = all(positions[i] == positions[i - 1] + 1 for i in range(1, len(rows)) if rows[i] == rows[i - 1])
    if not in_order:
        assert calls == []
        return
    longest = max(b - a for a, b in zip([0] + segments, segments))
    starts_k = [int(rows[i - 1]) * seq for i in segments]
    assert calls == [([0] + segments, starts_k + [starts_k[-1] + seq], longest, longest > 1)]  # one call a pass
    assert not got[[i for i in range(len(rows)) if positions[i] >= seq]].any()  # padding: no keys


def test_linnet_flash_decode_0_keeps_sdpa(monkeypatch):
    monkeypatch.setenv("LINNET_FLASH_DECODE", "0")
    assert not rt._flash_takes_used_keys()
    monkeypatch.setenv("LINNET_FLASH_DECODE", "1")
    assert rt._flash_takes_used_keys() == (torch.version.hip is None and "seqused_k" in str(
        torch.ops.aten._flash_attention_forward.default._schema))


def test_flash_serves_16_bit_cuda_tensors_only():
    q = torch.zeros(2, 4, 8, dtype=torch.bfloat16)
    assert not rt.flash_decodes(q, torch.zeros(2, 3, 2, 8, dtype=torch.bfloat16))  # the CPU
    if torch.cuda.is_available():
        cuda = q.cuda()
        assert rt.flash_decodes(cuda, torch.zeros(2, 3, 2, 8, dtype=torch.bfloat16, device="cuda")) == \
            rt._flash_takes_used_keys()
        assert not rt.flash_decodes(cuda.float(), torch.zeros(2, 3, 2, 8, device="cuda"))


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-mistral"])  # tiny-mistral: a sliding window
def test_decode_steps_and_mixed_passes_through_the_kernel_give_sdpas_logits(card, monkeypatch):
    # the generated entries on a GPU's branches (plain weights, SDPA, no Linnet CPU kernel), from a
    # cache of noise: a decode step with rows at different positions and one idle, and a mixed pass
    # (rows 3 and 0 decode, row 2 takes a 5-token prompt); the kernel's path against SDPA's
    model = torch_on_gpu_branches(monkeypatch, card)
    start = noisy_cache(model, seed=1)
    step = (np.array([3, 9, 0, 27], np.int32), np.array([5, 31, 32, 17], np.int32))  # row 2 idle
    pack = (np.array([4, 8, 15, 16, 23, 42, 7], np.int32), np.array([18, 0, 1, 2, 3, 4, 6], np.int32),
            np.array([3, 2, 2, 2, 2, 2, 0], np.int32), np.array([0, 5, 6], np.int32))
    # a prompt's later chunk (row 1, positions 20-25: its keys before them are the cache's) beside a prompt
    chunk = (np.arange(9, dtype=np.int32) + 3, np.r_[np.arange(20, 26), np.arange(3)].astype(np.int32),
             np.r_[[1] * 6, [3] * 3].astype(np.int32), np.array([5, 8], np.int32))

    def logits(flash: bool) -> list:
        out = []
        for call in (lambda: model.decode(*step), lambda: model.prefill(*pack), lambda: model.prefill(*chunk)):
            restore_cache(model, start)
            with monkeypatch.context() as m:
                if flash:
                    m.setattr(rt, "flash_decodes", lambda q, k_cache: True)
                    m.setattr(rt, "_flash_varlen", varlen_reference)
                out.append(call().clone())
        return out
    (step_want, pack_want, chunk_want), (step_got, pack_got, chunk_got) = logits(False), logits(True)
    busy = [0, 1, 3]
    torch.testing.assert_close(step_got[busy], step_want[busy], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pack_got, pack_want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunk_got[:2], chunk_want[:2], rtol=1e-4, atol=1e-4)
