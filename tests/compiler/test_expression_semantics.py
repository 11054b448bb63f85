"""Expressions whose Python spelling could differ from what the source says (comparisons that
Python would chain, a static bool beside a bool tensor, ties in `topk`, an int tensor's sum, a
static sigmoid far below zero), run in both backends and checked against numpy."""

import numpy as np
import pytest
import torch

from linnet.compiler import build
from linnet.frontend import load_source

SOURCE = """
arch expressions
config {
  vocab: int = 16
  dim: int = 4
  layers: int = 4
  gate: float = sigmoid(-800.0) + silu(-1000.0)
}
params {
  embed: f32[vocab, dim] from hf "embed.weight"
}
entry chained(tokens: i32[Batch]) -> f32[Batch, dim] {
  x = embed[tokens]
  for l in layers {
    x = x * (if (l > 0) == (l < 3) then 2.0 else 1.0)
  }
  return x
}
entry compared(tokens: i32[Batch]) -> bool[Batch] {
  return (tokens > 3) == (tokens > 4)
}
entry logical(tokens: i32[Batch]) -> bool[3, Batch] {
  return concat([((tokens > 3) and true).unsqueeze(0), ((tokens > 4) or false).unsqueeze(0),
                 (false or (tokens < 2) == (tokens < 4)).unsqueeze(0)], axis=0)
}
entry summed(tokens: i32[Batch]) -> i32[Batch] {
  return sum(concat([tokens.unsqueeze(1), tokens.unsqueeze(1) * 3], axis=1), axis=1)
}
entry ranked(tokens: i32[Batch]) -> i32[Batch, 3] {
  x = embed[tokens]
  values, indices = topk(concat([x, x], axis=1), 3)
  return indices
}
entry gated(tokens: i32[Batch]) -> f32[Batch, dim] {
  return embed[tokens] * (sigmoid(-800.0) + silu(-1000.0) + gate)
}
"""

TOKENS = np.array([1, 3, 4, 5, 9], np.int32)
# rows with ties: each row of the table holds two values twice over
EMBED = np.array([[(i % 3), (i % 3), -1.0, (i % 3)] for i in range(16)], np.float32)


@pytest.fixture(scope="module", params=["torch", "jax"])
def run(request):
    backend = request.param
    mod = build(load_source(SOURCE, "expressions.linnet"), backend, {"Batch": len(TOKENS)})
    weights = {"embed.weight": EMBED}
    model = mod.Model({k.split(".")[0]: torch.from_numpy(v) if backend == "torch" else v for k, v in weights.items()})

    def call(entry: str):
        out = getattr(model, entry)(torch.from_numpy(TOKENS) if backend == "torch" else TOKENS)
        return np.asarray(out)

    call.module = mod
    return call


def test_a_comparison_of_comparisons_is_not_chained(run):
    # Python reads `l > 0 == (l < 3)` as `l > 0 and 0 == (l < 3)`: false for every layer, no doubling
    doublings = sum((l > 0) == (l < 3) for l in range(4))
    np.testing.assert_array_equal(run("chained"), EMBED[TOKENS] * 2.0 ** doublings)
    np.testing.assert_array_equal(run("compared"), (TOKENS > 3) == (TOKENS > 4))


def test_a_static_bool_beside_a_bool_tensor(run):
    want = np.stack([TOKENS > 3, TOKENS > 4, (TOKENS < 2) == (TOKENS < 4)])
    np.testing.assert_array_equal(run("logical"), want)


def test_an_int_tensors_sum_keeps_its_type(run):
    got = run("summed")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, TOKENS * 4)


def test_topk_takes_ties_lower_index_first(run):
    rows = np.concatenate([EMBED[TOKENS], EMBED[TOKENS]], axis=1)
    want = np.argsort(-rows, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(run("ranked"), want)


def test_sigmoid_and_silu_of_a_static_number_far_below_zero(run):
    assert run.module.gate == 0.0
    np.testing.assert_array_equal(run("gated"), EMBED[TOKENS] * 0.0)
