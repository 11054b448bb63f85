"""`upload`: host arrays onto the model's device, asynchronously to a GPU."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.serve.torch_upload import upload

arrays = st.sampled_from([np.int32, np.int64, np.float32, np.float64, np.bool_]).flatmap(
    lambda dtype: st.lists(st.integers(-5, 5), min_size=0, max_size=40).map(lambda xs: np.asarray(xs, dtype)))


@settings(max_examples=30, deadline=None)
@given(arrays)
def test_the_cpu_gets_the_array_itself(a):
    t = upload(a, torch.device("cpu"))
    assert t.dtype == torch.from_numpy(a).dtype and np.array_equal(t.numpy(), a)
    if a.size:
        assert t.data_ptr() == a.__array_interface__["data"][0]  # shared, not copied


def test_a_non_contiguous_array_and_a_list_arrive_whole():
    a = np.arange(20, dtype=np.int32)[::3]
    assert upload(a, torch.device("cpu")).tolist() == a.tolist()
    assert upload([1.5, 2.5], torch.device("cpu")).tolist() == [1.5, 2.5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_gets_it_from_a_pinned_copy_and_the_next_op_sees_it():
    device = torch.device("cuda")
    busy = torch.randn(4096, 4096, device=device)
    for _ in range(20):  # a queue of work the upload must not wait for
        busy = busy @ busy / 64
    a = np.arange(1000, dtype=np.int64)
    t = upload(a, device)
    a[:] = -1  # the host array may change at once: the copy came from pinned memory
    assert t.sum().item() == sum(range(1000))


def test_scalars_and_python_numbers_come_as_torch_as_tensor_has_them():
    cpu = torch.device("cpu")
    for value in (3, 1.5, np.float32(2.5), np.int64(7), True):
        got, want = upload(value, cpu), torch.as_tensor(value)
        assert got.shape == want.shape == () and got.dtype == want.dtype and got.item() == want.item()
