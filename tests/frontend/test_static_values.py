"""Static values in a body are computed when the model is specialized, where an error can name them,
and a static int beside a tensor is one JAX takes: what the generated code would otherwise raise as
the model runs (`1 // 0`, `log(0.0)`, an int JAX refuses) is an error at its place in the source.

The references are Python's own arithmetic (what the generated Python would do with the expression),
JAX's own refusal of a Python int beside a traced array, and numpy's product for what runs.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import torch

from linnet.compiler import build, generate
from linnet.errors import LinnetError
from linnet.frontend.load import load_source

from test_specialize_checks import BIGRAM  # the doc's first model

# where the statements go: before the return, on its line
STATEMENT_LINE = BIGRAM.splitlines().index("  return linear(x, head) as f32      # x @ head.T, as f32") + 1


def with_statements(*lines: str) -> str:
    return BIGRAM.replace("  return linear", "".join(f"  {line}\n" for line in lines) + "  return linear", 1)


def refusal(source: str) -> LinnetError:
    with pytest.raises(LinnetError) as err:
        generate(load_source(source, "bigram.linnet"), "torch")
    return err.value


def jax_takes(value: int, dtype) -> bool:
    """Whether JAX takes the Python int `value` beside an array of `dtype` in a jitted function."""
    try:
        jax.jit(lambda x: x * value)(np.ones(2, dtype)).block_until_ready()
    except OverflowError:
        return False
    return True


def run_decode(source: str, backend: str):
    """(decode's logits, embed, head) with random weights, tokens 1 and 3."""
    rng = np.random.default_rng(0)
    embed, head = (rng.standard_normal((256, 32)).astype(np.float32) * 0.1 for _ in range(2))
    module = build(load_source(source, "bigram.linnet"), backend, {"Batch": 2})
    tokens, positions = np.array([1, 3], np.int32), np.array([0, 0], np.int32)
    if backend == "torch":
        model = module.Model({"embed": torch.from_numpy(embed), "head": torch.from_numpy(head)})
        out = model.decode(torch.from_numpy(tokens), torch.from_numpy(positions)).numpy()
    else:
        out = np.asarray(module.Model({"embed": embed, "head": head}).decode(tokens, positions))
    return out, embed[tokens], head


@pytest.mark.parametrize("value", [2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 63, 10 ** 30])
def test_a_static_int_beside_a_float_tensor_is_taken_as_jax_takes_it(value):
    source = with_statements(f"x = x * {value}")
    if jax_takes(value, np.float32):
        for backend in ("torch", "jax"):
            got, x, head = run_decode(source, backend)
            want = (x.astype(np.float64) * value) @ head.T.astype(np.float64)
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), backend
        return
    err = refusal(source)
    assert (err.loc.line, err.loc.col) == (STATEMENT_LINE, len("  x = x * ") + 1)
    if value >= 2 ** 63:  # no static int at all: refused where it is read
        assert err.message == f"{value} is too large for a static int"
        return
    assert f"{value} is outside its range" in err.message
    assert f"for a float, write {value}.0" in err.notes


@pytest.mark.parametrize("value", [2 ** 31 - 1, 2 ** 31, -2 ** 31 - 1])
def test_a_static_int_beside_an_integer_tensor_is_taken_as_jax_takes_it(value):
    source = with_statements(f"p = positions + {value}")
    if jax_takes(value, np.int32):
        generate(load_source(source, "bigram.linnet"), "jax")
        return
    err = refusal(source)
    assert (err.loc.line, err.loc.col) == (STATEMENT_LINE, len("  p = positions + ") + 1)
    assert not any("for a float" in note for note in err.notes)  # the tensor holds ints


def test_a_static_local_is_followed_to_where_it_meets_a_tensor():
    err = refusal(with_statements("s = 3000000000", "x = x * s"))
    assert (err.loc.line, err.loc.col) == (STATEMENT_LINE + 1, len("  x = x * ") + 1)
    assert "`s` is 3000000000" in err.notes
    # rebound before it is read: the value read is the last one bound
    generate(load_source(with_statements("s = 3000000000", "s = 2", "x = x * s"), "bigram.linnet"), "jax")


@pytest.mark.parametrize("expression, python", [
    ("1 // 0", "1 // 0"),
    ("7 % 0", "7 % 0"),
    ("log(0.0)", "math.log(0.0)"),
    ("sqrt(0.0 - 1.0)", "math.sqrt(0.0 - 1.0)"),
    ("exp(1000.0)", "math.exp(1000.0)"),
    ("2 ** 64", None),  # Python computes it; the generated code could not use it beside a tensor
])
def test_a_static_value_that_cannot_be_computed_is_an_error_at_it(expression, python):
    if python is not None:  # the generated Python would raise with it, as the model runs
        with pytest.raises((ArithmeticError, ValueError)):
            eval(python, {"math": math})
    err = refusal(with_statements(f"x = x * ({expression})"))
    assert (err.loc.line, err.loc.col) == (STATEMENT_LINE, len("  x = x * (") + 1)
    assert err.loc.end_col == err.loc.col + len(expression)


def test_a_branch_not_taken_is_not_computed():
    # Python's conditional computes the branch it takes only, and so does the generated code
    assert eval("1.0 if 32 > 0 else math.log(0.0)", {"math": math}) == 1.0
    source = with_statements("x = x * (if dim > 0 then 1.0 else log(0.0))")
    for backend in ("torch", "jax"):
        got, x, head = run_decode(source, backend)
        want = x.astype(np.float64) @ head.T.astype(np.float64)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), backend


@pytest.mark.parametrize("condition, factor", [("dim > 0", 2), ("dim > 100", 0.5)])
def test_an_if_between_an_int_and_a_float_is_the_number_either_branch_is(condition, factor):
    """`if c then 2 else 0.5` is a float, whichever branch is taken, as Python's `2 if c else 0.5` is
    the number itself; here it is given by keyword to a fn's float argument."""
    assert eval(f"2 if {condition.replace('dim', '32')} else 0.5") == factor  # the bigram's dim is 32
    source = with_statements(f"x = scaled(x, by=if {condition} then 2 else 0.5)") + """
fn scaled<n>(x: T[n, dim], by: float) -> T[n, dim] {
  return x * by
}
"""
    got, x, head = run_decode(source, "torch")
    want = (x.astype(np.float64) * factor) @ head.T.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_sizes_known_only_per_call_are_left_to_the_call():
    """A fn's own sizes (`m` here) have no number until it is called: the slice, the topks and the loop
    over them are checked where numbers are, and the model runs as numpy's sort says."""
    source = with_statements("x = sorted_rows(x)") + """
fn sorted_rows<n, m>(x: T[n, m]) -> T[n, m] {
  v, i = topk(x, m)
  top, at = topk(x, 1)
  y = v[:, 0:m] + (top - top)
  for j in m {
    y = y * (m / dim)  # a size read as a number: here m is dim, so 1
  }
  return y
}
"""
    got, x, head = run_decode(source, "torch")
    want = -np.sort(-x.astype(np.float64), axis=-1) @ head.T.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_rope_in_a_fn_of_its_own_sizes_rotates_as_transformers_does():
    """rope's head_dim is the fn's own size `d` (its number known only at the call): checked there, and
    the rotation is transformers' rotate-half one (Llama's), at positions 1 and 3 (the tokens)."""
    source = with_statements("x = rotated(x.reshape(Batch, 1, dim), tokens).reshape(Batch, dim)") + """
fn rotated<n, h, d>(x: T[n, h, d], p: i32[n]) -> T[n, h, d] {
  return rope(x, p, theta=10000.0)
}
"""
    got, x, head = run_decode(source, "torch")
    d = x.shape[-1]
    angles = np.array([1.0, 3.0])[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = x[:, :d // 2].astype(np.float64), x[:, d // 2:].astype(np.float64)
    rotated = np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    want = rotated @ head.T.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
