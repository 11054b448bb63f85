"""unpermute_rope undoes llama.cpp's q/k row permutation, exactly."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from linnet.nest.transforms import permute_rope, unpermute_rope


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
