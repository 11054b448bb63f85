"""Math on static numbers and tensor-with-number extrema run in both backends, checked against numpy."""

import math

import numpy as np
import pytest

from linnet.compiler import build
from linnet.frontend import load_source

SOURCE = """
arch scaled
config {
  width: int = 6
  floor: float = 0.25
}
params {
  w: T[width] from hf "w"
}
state {
  seen: T[Batch, width]
}
entry run<N>(x: T[N, width]) -> T[N, width] {
  y = maximum(x * w, floor) * (1.0 / sqrt(width))
  return minimum(y, 2.0 * exp(0.0)) + minimum(floor, 1.0)
}
"""


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_static_math_and_scalar_extrema(backend):
    mod = build(load_source(SOURCE, "scaled.linnet"), backend, {"Batch": 1})
    rng = np.random.default_rng(0)
    w = rng.normal(size=6).astype(np.float32)
    x = rng.normal(size=(5, 6)).astype(np.float32) * 3
    model = mod.Model({"w": w}) if backend == "jax" else mod.Model({"w": __import__("torch").from_numpy(w)})
    got = np.asarray(model.run(x))
    want = np.minimum(np.maximum(x * w, 0.25) / np.sqrt(6), 2.0) + 0.25
    np.testing.assert_allclose(got, want, rtol=1e-6)


UNARY = ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "silu", "gelu", "relu", "sin", "cos", "erf", "abs"]

UNARY_SOURCE = """
arch unary
config {
  v: float = 0.7
  n: int = -2
  folded: float = gelu(v) + abs(n) + sqrt(4)
}
params {
  w: f32[1] from hf "w"
}
entry run(x: f32[1]) -> f32[%d] {
  acc = x * 0.0
  for l in 3 {
    acc = acc + exp(l) + abs(l - 1)
  }
  return concat([%s, x * 0.0 + abs(n), x * 0.0 + relu(n), x * 0.0 + folded, acc], axis=0)
}
""" % (len(UNARY) + 4, ", ".join(f"x * 0.0 + {op}(v)" for op in UNARY))


def _reference(op: str, v: float) -> float:
    """Each op's definition in the op table, in numpy."""
    sigmoid = 1 / (1 + np.exp(-v))
    return {"exp": np.exp(v), "log": np.log(v), "sqrt": np.sqrt(v), "rsqrt": 1 / np.sqrt(v), "tanh": np.tanh(v),
            "sigmoid": sigmoid, "silu": v * sigmoid, "gelu": v * (1 + math.erf(v / np.sqrt(2))) / 2,
            "relu": max(v, 0.0), "sin": np.sin(v), "cos": np.cos(v), "erf": math.erf(v), "abs": abs(v)}[op]


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_every_float_op_on_a_static_number(backend):
    """The unary ops take static numbers as the op table says (Python's math at run time, the same
    when a config default is evaluated), in a body, on a loop variable and in a config default."""
    mod = build(load_source(UNARY_SOURCE, "unary.linnet"), backend, {"Batch": 1})
    model = mod.Model({"w": np.zeros(1, np.float32)})
    got = np.asarray(model.run(np.ones(1, np.float32)), np.float64)
    want = [_reference(op, 0.7) for op in UNARY] + [2, 0.0, _reference("gelu", 0.7) + 2 + 2,
                                                    sum(np.exp(l) + abs(l - 1) for l in range(3))]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert mod.folded == pytest.approx(_reference("gelu", 0.7) + 4, rel=1e-12)


GATED_SOURCE = """
arch gated
params {
  w: f32[1] from hf "w"
}
entry run<N>(x: f32[N, 4], y: f32[N, 4], s: f32[N, 1]) -> f32[N, 12] {
  return concat([silu(x) * y, y * silu(x), silu(x) * s], axis=1)
}
"""


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_gated_product_is_silu_of_the_one_times_the_other(backend):
    # the torch generator writes silu(x) * y of one shape as rt.silu_mul (either order); a product
    # that broadcasts stays two ops
    from linnet.compiler import generate

    module = load_source(GATED_SOURCE, "gated.linnet")
    if backend == "torch":
        source = generate(module, "torch", {})
        assert source.count("rt.silu_mul(x, y)") == 2 and "F.silu(x) * s" in source
    mod = build(module, backend, {})
    rng = np.random.default_rng(1)
    x, y, s = (rng.normal(size=shape).astype(np.float32) * 3 for shape in ((5, 4), (5, 4), (5, 1)))
    w = np.zeros(1, np.float32)
    model = mod.Model({"w": w}) if backend == "jax" else mod.Model({"w": __import__("torch").from_numpy(w)})
    silu = x / (1 + np.exp(-x))
    np.testing.assert_allclose(np.asarray(model.run(x, y, s)), np.concatenate([silu * y, silu * y, silu * s], 1),
                               rtol=1e-5, atol=1e-6)
