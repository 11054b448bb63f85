"""The CPU kernels that LayerNorm models (Phi-2, GPT-2) decode through: `cpu_ops.layer_norm` against
torch's F.layer_norm and `cpu_ops.gelu_tanh` against F.gelu(x, approximate="tanh"), which compute
in f32 and round once, as these do: any row count, widths that are not multiples of the kernels'
eight lanes, every activation / weight type, rows that lie apart, the weight and bias each given or
not; and both replayed from a captured step with new inputs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.codegen_torch import runtime as rt
from linnet.kernels import cpu_graph, cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops.library() is None, reason="Linnet's CPU kernels do not run here")

TYPES = [torch.float32, torch.bfloat16, torch.float16]
# one unit in the last place of the output type at most, relative (f32: four, for the order of the f32 sums)
ULP = {torch.float32: 2 ** -21, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def near(got: torch.Tensor, want: torch.Tensor, scale: float = 1.0):
    """got equals want within one rounding of their type, relative to each value and to `scale`
    (a LayerNorm's outputs are all of the order of its weight and bias)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = ULP[want.dtype]
    np.testing.assert_allclose(got.double().numpy(), want.double().numpy(), rtol=tol, atol=tol * scale)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 40), d=st.integers(1, 90), x_type=st.sampled_from(TYPES), w_type=st.sampled_from(TYPES),
       gap=st.integers(0, 9), weight=st.booleans(), bias=st.booleans(), offset=st.sampled_from([0.0, 30.0]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_layer_norm_is_torchs(n, d, x_type, w_type, gap, weight, bias, offset, seed):
    g = torch.Generator().manual_seed(seed)
    # rows `gap` apart; an offset as large as the spread's tenfold: a variance as mean(x^2) - mean^2 would cancel
    x = (torch.randn(n, d + gap, generator=g) * 3 + offset).to(x_type)[:, :d]
    w = torch.randn(d, generator=g).to(w_type) if weight else None
    b = torch.randn(d, generator=g).to(w_type) if bias else None
    got = cpu_ops.layer_norm(x, w, b, 1e-5)
    if w_type == x_type:
        want = F.layer_norm(x, (d,), w, b, 1e-5)
    else:  # torch takes a weight of another type only in f32 (for a 16-bit x): what it computes then, in any
        want = F.layer_norm(x.float(), (d,), *(None if t is None else t.float() for t in (w, b)), 1e-5).to(x_type)
    scale = max((float(t.abs().max()) for t in (w, b) if t is not None), default=1.0) * 4
    near(got, want, scale)


def test_layer_norm_keeps_leading_axes_and_runs_on_the_threads():
    x, w, b = torch.randn(3, 300, 100), torch.randn(100), torch.randn(100)  # past the kernel's single-thread size
    near(cpu_ops.layer_norm(x, w, b, 1e-6), F.layer_norm(x, (100,), w, b, 1e-6), 4 * float(w.abs().max()))


@pytest.mark.parametrize("dtype", TYPES)
def test_the_runtimes_layer_norm_takes_the_kernel_and_gives_torchs_values(dtype):
    x, w, b = torch.randn(5, 2560).to(dtype), torch.randn(2560).to(dtype), torch.randn(2560).to(dtype)
    with cpu_graph.capture() as graph:
        got = rt.layer_norm(x, w, b, 1e-5, fast=True)
    assert graph.unsupported is None and len(graph) == 1  # one C call, recorded
    near(got, F.layer_norm(x, (2560,), w, b, 1e-5), 4 * float(w.abs().max()))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 30), d=st.integers(1, 90), dtype=st.sampled_from(TYPES), gap=st.integers(0, 5),
       spread=st.sampled_from([1.0, 6.0, 40.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_gelu_tanh_is_torchs(n, d, dtype, gap, spread, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d + gap, generator=g) * spread).to(dtype)[:, :d]  # large negative x: 1 + tanh near 0
    got = cpu_ops.gelu_tanh(x)
    want = F.gelu(x, approximate="tanh")
    if dtype != torch.float32:  # f32's last bits below the rounding: the same values, but for a rounding's tie
        near(got, want, scale=1e-3)
        return
    # GELU of a negative x is ill-conditioned in f32 (its tail amplifies u's rounding): against the value
    # in f64 of the same x, ours strays no further than twice torch's f32 kernel does, or a few units
    # (torch's 1 + tanh(u) cancels to 0 from x = -5, to f64's too from -7: the truth is x sigmoid(2u) in f64)
    xd = x.double()
    truth = xd * torch.sigmoid(2 * np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3))
    stray = lambda t: float(((t.double() - truth).abs() / truth.abs().clamp_min(1e-20)).max())
    assert stray(got) <= max(2 * stray(want), 2 ** -21), (stray(got), stray(want))


@pytest.mark.parametrize("width", [6, 8, 13])  # the kernel's tail, one vector of eight, both
def test_gelu_tanh_keeps_nan_and_the_limits(width):
    x = torch.tensor([float("nan"), float("inf"), 0.0, -1e4, 1e4, -20.0, -float("inf")] * 2)[:width]
    got, want = cpu_ops.gelu_tanh(x[None])[0], F.gelu(x, approximate="tanh")
    assert torch.isnan(got[0]) and got[1] == float("inf") and got[2] == 0 and got[4] == 1e4
    assert got[3] <= 0 and got[5] <= 0 and -1e-30 < got[3] and -1e-30 < got[5]  # x e^-2u: 0, where torch's cancels
    # -inf: -inf * (1 + tanh(-inf)) = -inf * 0, NaN, as torch's (not x / (1 + e^-2u)'s -inf)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_runtimes_gelu_tanh_is_transformers_where_exact_and_one_rounding_where_fast(fast, dtype):
    """Exact numerics compute transformers' NewGELUActivation op by op, the same values bit for bit;
    fast ones compute in f32 and round once: within a unit in the last place of the formula in f64,
    where transformers' bf16 ops, rounding at each step, stray further."""
    from transformers.activations import NewGELUActivation

    x = (torch.randn(64, 257, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    got, theirs = rt.gelu_tanh(x, fast=fast), NewGELUActivation()(x)
    if not fast:
        assert torch.equal(got, theirs)
        return
    xd = x.double()
    truth = 0.5 * xd * (1.0 + torch.tanh(np.sqrt(2.0 / np.pi) * (xd + 0.044715 * xd ** 3)))
    ours, transformers = (float(((t.double() - truth).abs() / truth.abs().clamp_min(1e-3)).max())
                          for t in (got, theirs))
    assert ours <= ULP[dtype] * 2 and ours <= transformers


@pytest.mark.parametrize("dtype", TYPES)
def test_a_replay_runs_layer_norm_and_gelu_tanh_on_new_inputs(dtype):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(4, 37, generator=g).to(dtype), torch.randn(37).to(dtype), torch.randn(37).to(dtype)
    with cpu_graph.capture() as graph:
        out = rt.gelu_tanh(rt.layer_norm(x, w, b, 1e-5, fast=True), fast=True)
    assert graph.unsupported is None and len(graph) == 2
    for _ in range(3):
        x.copy_(torch.randn(4, 37, generator=g) * 5)
        graph.replay()
        near(out, F.gelu(F.layer_norm(x, (37,), w, b, 1e-5), approximate="tanh"), 4 * float(w.abs().max()))
