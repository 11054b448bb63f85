"""unpermute_rope undoes llama.cpp's q/k row permutation, exactly."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from linnet.nest.transforms import permute_rope, split_heads, unpermute_rope


def llama_cpp_permute(w, heads):
    # llama.cpp convert_hf_to_gguf's permutation, restated independently
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(heads=st.integers(1, 6), half=st.integers(1, 8), cols=st.integers(0, 5))
def test_unpermute_inverts_llama_cpp_permute(heads, half, cols):
    rows = heads * half * 2
    shape = (rows, cols) if cols else (rows,)  # weights and biases
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    stored = llama_cpp_permute(w, heads)
    np.testing.assert_array_equal(unpermute_rope(stored, heads), w)
    np.testing.assert_array_equal(permute_rope(w, heads), stored)
    np.testing.assert_array_equal(permute_rope(unpermute_rope(w, heads), heads), w)


def test_row_mapping_within_a_head():
    # one head of 8 rows: HF row s*4 + i is stored at row 2*i + s
    hf = np.arange(8)
    stored = permute_rope(hf, 1)
    assert stored.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert unpermute_rope(stored, 1).tolist() == list(range(8))
    # heads are permuted independently
    assert permute_rope(np.arange(8), 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_torch_tensors():
    w = torch.randn(3 * 8, 5)
    assert torch.equal(unpermute_rope(permute_rope(w, 3), 3), w)
    assert torch.equal(torch.as_tensor(permute_rope(w.numpy(), 3)), permute_rope(w, 3))


def test_bad_head_count():
    with pytest.raises(ValueError, match="heads"):
        unpermute_rope(np.zeros((12, 4)), 5)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(heads=st.integers(1, 4), kept=st.integers(0, 6), half=st.integers(1, 4), cols=st.integers(0, 3))
def test_a_rotated_tail_is_unpermuted_alone(heads, kept, half, cols):
    """`unpermute_rope(w, heads, rotated)`: in each head the first rows stay, the last `rotated` go
    from adjacent pairs to halves (restated here index by index), and `permute_rope` undoes it."""
    d = kept + 2 * half
    shape = (heads * d, cols) if cols else (heads * d,)
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    want = w.copy()
    for h in range(heads):
        tail = h * d + kept
        for s in range(2):
            for i in range(half):
                want[tail + s * half + i] = w[tail + 2 * i + s]
    np.testing.assert_array_equal(unpermute_rope(w, heads, 2 * half), want)
    np.testing.assert_array_equal(permute_rope(want, heads, 2 * half), w)
    if kept == 0:  # the whole head rotated: the one-argument form's
        np.testing.assert_array_equal(unpermute_rope(w, heads, 2 * half), unpermute_rope(w, heads))


def test_deepseeks_pairs_rotated_as_halves_give_its_scores():
    """DeepSeek-V2 rotates the last qk_rope rows of each query head and of its shared key as complex
    pairs (transformers' `apply_rotary_emb`); rows put into halves at load and rotated as Llama's
    halves (transformers' `apply_rotary_pos_emb`) give the same query-key products."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(0)
    heads, nope, rope, dim, n = 3, 4, 8, 16, 5
    wq = torch.randn(heads * (nope + rope), dim, generator=g)
    wk = torch.randn(rope, dim, generator=g)
    x = torch.randn(n, dim, generator=g)
    angles = torch.outer(torch.arange(n, dtype=torch.float32), 1.0 / 10000 ** (torch.arange(0, rope, 2) / rope))

    q = (x @ wq.T).reshape(1, n, heads, nope + rope).transpose(1, 2)
    k = (x @ wk.T).reshape(1, 1, n, rope)
    q_pe, k_pe = apply_rotary_emb(q[..., nope:], k, torch.polar(torch.ones_like(angles), angles)[None])
    want = torch.cat([q[..., :nope] @ q[..., :nope].transpose(-1, -2), q_pe @ k_pe.transpose(-1, -2)], dim=-1)

    q = (x @ unpermute_rope(wq, heads, rope).T).reshape(1, n, heads, nope + rope).transpose(1, 2)
    k = (x @ unpermute_rope(wk, 1, rope).T).reshape(1, 1, n, rope)
    cos, sin = torch.cat([angles, angles], -1).cos()[None], torch.cat([angles, angles], -1).sin()[None]
    q_pe, k_pe = apply_rotary_pos_emb(q[..., nope:], k, cos, sin)
    got = torch.cat([q[..., :nope] @ q[..., :nope].transpose(-1, -2), q_pe @ k_pe.transpose(-1, -2)], dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_rotated_tail_longer_than_a_head_is_refused():
    with pytest.raises(ValueError, match="last 10 rows"):
        unpermute_rope(np.zeros((16, 4)), 2, 10)
    with pytest.raises(ValueError, match="even"):
        unpermute_rope(np.zeros((16, 4)), 2, 3)


def test_split_heads_takes_each_heads_rows():
    """[heads * head_rows, ...] -> [heads, stop - start, ...], rows start..stop-1 of each head (numpy's
    reshape and slice restated as a loop), in numpy and torch alike."""
    heads, head_rows, cols = 3, 5, 4
    w = np.arange(heads * head_rows * cols, dtype=np.float32).reshape(heads * head_rows, cols)
    want = np.stack([w[h * head_rows + 1:h * head_rows + 4] for h in range(heads)])
    np.testing.assert_array_equal(split_heads(w, heads, head_rows, 1, 4), want)
    assert torch.equal(split_heads(torch.from_numpy(w), heads, head_rows, 1, 4), torch.from_numpy(want))
    with pytest.raises(ValueError, match="rows 2 to 6 of each of 3 heads of 5 rows"):
        split_heads(w, heads, head_rows, 2, 6)
    with pytest.raises(ValueError, match="of 15 rows"):
        split_heads(w, 4, head_rows, 0, 1)
