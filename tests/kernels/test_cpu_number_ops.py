"""The replayed step's elementwise ops that Gemma's decode takes (`cpu_graph`, linnet_elementwise): a
tensor and a Python number added, multiplied or divided (the embedding's sqrt(dim), the norms' 1 + w,
the soft caps' x / cap and * cap), two tensors divided, and tanh. Each is captured, replayed on new
inputs and compared with torch's eager op on them: the arithmetic bit for bit (torch computes a 16-bit
tensor's op with a number in f32, the number not rounded to the tensor's type), tanh within a few
units in the last place (torch's is Sleef's); any row count, widths off the kernel's eight lanes,
rows that lie apart, every type."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.kernels import cpu_graph, cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops.library() is None, reason="Linnet's CPU kernels do not run here")

TYPES = [torch.float32, torch.bfloat16, torch.float16]
OPS = {"add": lambda x, c: x + c, "mul": lambda x, c: x * c, "div": lambda x, c: x / c,
       "radd": lambda x, c: c + x, "rmul": lambda x, c: c * x}


def replayed(fn, inputs: list, fresh) -> tuple:
    """fn(*inputs) captured, then replayed after `fresh` refills the inputs: (replayed, eager on them)."""
    with cpu_graph.capture() as graph:
        out = fn(*inputs)
    assert graph.unsupported is None, graph.unsupported
    fresh()
    graph.replay()
    return out, fn(*inputs)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(op=st.sampled_from(list(OPS)), dtype=st.sampled_from(TYPES), n=st.integers(1, 9), d=st.integers(1, 70),
       gap=st.integers(0, 5), number=st.sampled_from([30.0, 50.0, 2304 ** 0.5, 640 ** 0.5, 1.0, 0.1, 3, -7.5]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_a_tensor_op_a_number_is_torchs_bit_for_bit(op, dtype, n, d, gap, number, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d + gap, generator=g) * 8).to(dtype)[:, :d]
    got, want = replayed(lambda t: OPS[op](t, number), [x],
                         lambda: x.copy_(torch.randn(n, d, generator=g) * 8))
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", TYPES)
def test_a_number_is_not_rounded_to_a_16_bit_tensors_type(dtype):
    """sqrt(640) is 25.25 in bf16: x * 25.25 and x * 25.298 differ in most of bf16's values."""
    x = torch.linspace(-4, 4, 203).to(dtype)[None]
    number = 640 ** 0.5
    got, want = replayed(lambda t: t * number, [x], lambda: x.copy_(torch.linspace(-3, 5, 203)[None]))
    assert torch.equal(got, want)
    if dtype == torch.bfloat16:
        assert not torch.equal(want, x * torch.tensor(number, dtype=dtype))  # the case the test is about


def test_a_one_axis_tensor_and_a_number_replay_as_one_row():
    """A Gemma norm's 1 + w: the weight alone, in f32, one row of 37 (not 37 rows of one value); a
    strided one, rows of one value."""
    w = torch.randn(37)
    with cpu_graph.capture() as graph:
        out = 1.0 + w
    rows, cols = graph.words[0][10:12]  # linnet_elementwise's rows and columns
    assert (rows, cols) == (1, 37)
    w.copy_(torch.randn(37))
    graph.replay()
    assert torch.equal(out, 1.0 + w)
    apart = torch.randn(74)
    got, want = replayed(lambda t: t[::2] * 3.0, [apart], lambda: apart.copy_(torch.randn(74)))
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", TYPES)
def test_two_tensors_divided_are_torchs_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 19, generator=g).to(dtype), torch.randn(19, generator=g).to(dtype)
    got, want = replayed(lambda x, y: x / y, [a, b], lambda: (a.copy_(torch.randn(5, 19, generator=g)),
                                                             b.copy_(torch.randn(19, generator=g))))
    assert torch.equal(got, want)


@pytest.mark.parametrize("op", ["add", "mul", "div"])
def test_an_f32_tensor_and_a_16_bit_one_are_torchs_bit_for_bit(op):
    """(tiny-gemma2's f16 step adds an f16 tensor to an f32 residual)"""
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(3, 21, generator=g), torch.randn(3, 21, generator=g).half()
    fn = {"add": torch.add, "mul": torch.mul, "div": torch.div}[op]
    got, want = replayed(lambda x, y: fn(x, y), [a, b], lambda: (a.copy_(torch.randn(3, 21, generator=g)),
                                                                b.copy_(torch.randn(3, 21, generator=g))))
    assert got.dtype == torch.float32 and torch.equal(got, want)
    got, want = replayed(lambda x, y: fn(y, x), [a, b], lambda: a.copy_(torch.randn(3, 21, generator=g)))
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_an_op_with_a_number_and_another_argument_is_not_replayed():
    x = torch.randn(3, 8)
    with cpu_graph.capture() as graph:
        torch.add(x, 2.0, alpha=3)  # alpha: not the kernel's add
    assert graph.unsupported is not None and "add" in graph.unsupported


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(dtype=st.sampled_from(TYPES), n=st.integers(1, 9), d=st.integers(1, 70), gap=st.integers(0, 5),
       spread=st.sampled_from([1e-3, 0.3, 1.0, 4.0, 30.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_tanh_is_torchs(dtype, n, d, gap, spread, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d + gap, generator=g) * spread).to(dtype)[:, :d]
    got, want = replayed(torch.tanh, [x], lambda: x.copy_(torch.randn(n, d, generator=g) * spread))
    if dtype != torch.float32:  # computed in f32, rounded once: torch's, but for a rounding's tie
        ulp = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}[dtype]
        np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), rtol=2 * ulp, atol=1e-30)
        return
    # against tanh in f64 of the same x: within 4 units in f32's last place, relative (torch's Sleef: 1)
    truth = torch.tanh(x.double())
    np.testing.assert_allclose(got.double().numpy(), truth.numpy(), rtol=4 * 2 ** -24, atol=1e-40)


def test_tanh_keeps_nan_signed_zero_and_the_limits():
    edges = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 9.5, -9.5, 1e30, -1e30, 0.625, -0.625, 1e-30]
    x = torch.tensor([edges])
    got, want = replayed(torch.tanh, [x], lambda: None)
    assert torch.isnan(got[0, 0]) and torch.isnan(want[0, 0])
    # the limits and the zeros exactly, their signs too; 0.625 (where the two forms meet) and 1e-30 within 4 ulp
    assert torch.equal(got[0, 1:9], want[0, 1:9])
    assert [math.copysign(1.0, float(v)) for v in got[0, 1:]] == [math.copysign(1.0, float(v)) for v in want[0, 1:]]
    np.testing.assert_allclose(got[0, 9:].numpy(), want[0, 9:].numpy(), rtol=4 * 2 ** -24, atol=0)
