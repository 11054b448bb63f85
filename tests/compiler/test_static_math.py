"""Math on static numbers and tensor-with-number extrema run in both backends, checked against numpy."""

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
