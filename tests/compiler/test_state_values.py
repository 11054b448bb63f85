"""A local, an argument and an entry's result are values, whatever later writes the state.

torch writes state in place, and a local bound to a state buffer or a view of one (`keys =
k_cache[0]`) shares its memory; JAX's arrays are values. Each entry below reads something bound
before a write to the state it came from, and both backends must give what the language says
(a numpy model of the same steps, with copies), while the cards' hot paths copy nothing.
Stores whose index holds a slice are held against numpy's assignment of the same index.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from linnet.compiler import BACKENDS, check_file, generate, import_source
from linnet.frontend import load_source

ALIASES = """
arch aliases

config {
  dim: int = 4
}

params {
  w: f32[dim]
    from hf "w"
}

state {
  s: f32[dim]
  c: f32[2, dim]
  kc: f32[2, Batch, MaxSeq, 1, dim]
}

# a local bound to the whole buffer, read after the buffer is replaced
entry replaced(x: f32[dim]) -> f32[dim] {
  a = s
  s = s + x
  return a + s
}

# a view (one row), read after a store into it
entry row(x: f32[dim]) -> f32[dim] {
  a = c[0]
  c[0] = x
  return a + c[0]
}

# views of views and a multi-assign, read after stores
entry chain(x: f32[dim]) -> f32[2, dim] {
  a, b = [c, c[1].reshape(1, dim)]
  t = a.transpose(1, 0)
  c[1] = x
  c[0, 1:3] = x[0:2]
  return concat([t.transpose(1, 0)[0:1], b], axis=0)
}

# the cache of a layer taken before it is written, then attended over (the audit's kv case)
entry stale_keys(q: f32[Batch, 1, dim], k: f32[Batch, 1, dim], positions: i32[Batch]) -> f32[Batch, 1, dim] {
  keys = kc[0]
  kc[0, iota(Batch), positions] = k
  return attention(q, keys, keys, positions)
}

# the hot path: write the cache, then read it; nothing is copied
entry fresh_keys(q: f32[Batch, 1, dim], k: f32[Batch, 1, dim], positions: i32[Batch]) -> f32[Batch, 1, dim] {
  kc[0, iota(Batch), positions] = k
  return attention(q, kc[0], kc[0], positions)
}

# a local carried round a loop whose body writes the state it views
entry looped(x: f32[dim]) -> f32[dim] {
  a = s
  y = x
  for l in 3 {
    y = y + a
    s = s + x
  }
  return y
}

# a result that is the state itself, which the next call changes
entry result(x: f32[dim]) -> f32[dim] {
  s = s + x
  return s
}

# fn arguments are values: `bump(s, ...)` sees s as it was at the call
fn bump(a: f32[dim], b: f32[dim]) -> f32[dim] {
  s = s + 1.0
  return a + b + s
}

entry by_value(x: f32[dim]) -> f32[dim] {
  return bump(s, s * 1.0)
}
"""

X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
Y = np.array([5.0, 6.0, 7.0, 8.0], np.float32)


@pytest.fixture(scope="module")
def module():
    return load_source(ALIASES, "aliases.linnet")


def model(module, backend, generics=None):
    source = generate(module, backend, generics or {"Batch": 2, "MaxSeq": 4})
    return import_source(source).Model({"w": np.ones(4, np.float32)})


def out(x) -> np.ndarray:
    return np.array(x.detach().numpy() if isinstance(x, torch.Tensor) else x, np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_locals_keep_their_values(module, backend):
    m = model(module, backend)
    np.testing.assert_array_equal(out(m.replaced(X)), 0 + X)  # a = old s (0), s = x
    np.testing.assert_array_equal(out(m.row(X)), 0 + X)
    np.testing.assert_array_equal(out(m.row(Y)), X + Y)
    m = model(module, backend)
    m.row(X)  # c = [x, 0]
    c = np.stack([X, np.zeros(4, np.float32)]).astype(np.float64)
    np.testing.assert_array_equal(out(m.chain(Y)), np.stack([c[0], c[1]]))
    m = model(module, backend)
    s, y = np.zeros(4), X.astype(np.float64)
    for _ in range(3):
        y, s = y + 0, s + X  # `a` is s before the loop: zeros
    np.testing.assert_array_equal(out(m.looped(X)), y)
    np.testing.assert_array_equal(out(m.by_value(X)), 3 * X + 3 * X + (3 * X + 1))  # s was 3x: a = b = 3x


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_over_keys_taken_before_the_write(module, backend):
    """`keys = kc[0]` before the write: every key is still zero, so each query's weights are
    uniform over its positions and the values (zeros) give zeros; after the write, the new key."""
    m = model(module, backend)
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 1, 4)).astype(np.float32), rng.normal(size=(2, 1, 4)).astype(np.float32)
    positions = np.array([0, 2], np.int32)
    np.testing.assert_array_equal(out(m.stale_keys(q, k, positions)), np.zeros((2, 1, 4)))
    fresh = out(m.fresh_keys(q, k, positions))
    np.testing.assert_allclose(fresh[0], k[0], rtol=1e-6)  # position 0 sees only its own key as value


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_result_is_not_the_state(module, backend):
    m = model(module, backend)
    first = m.result(X)
    m.result(X)
    np.testing.assert_array_equal(out(first), X)


def test_only_what_needs_it_is_copied(module):
    """torch copies the bindings read after a write to their state, and a result that is state:
    `fresh_keys`, the cache written then read, copies nothing."""
    source = generate(module, "torch", {"Batch": 2, "MaxSeq": 4})
    methods = dict(re.findall(r"\n    def (\w+)\(self.*?\n((?:        .*\n|\n)*)", source))
    copies = {name: re.findall(r"(\S+) = (\S+?)\.clone\(\)|return (.*)\.clone\(\)", body) for name, body in methods.items()}
    assert copies["fresh_keys"] == []
    assert copies["replaced"] == [("a", "self.s", "")]
    assert copies["row"] == [("a", "self.c[0]", "")]
    assert copies["stale_keys"] == [("keys", "self.kc[0]", "")]
    assert copies["looped"] == [("a", "self.s", "")]
    assert copies["result"] == [("", "", "self.s")]
    assert "return self.s.clone()  # a copy: the next call writes this state" in methods["result"]
    assert re.search(r"\n +\w+ = self\.s\.clone\(\)  # copied: self\.s changes before this is read\n",
                     methods["by_value"])  # the argument `a` of `bump`


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
                                  "tiny-mixtral", "tiny-qwen3-moe", "tiny-gpt-oss"])
def test_the_cards_copy_nothing(card, kit):
    """Every architecture's entries write their caches and then read them: no copy in the hot path."""
    source = generate(check_file(kit.CARDS / f"{card}.linnet"), "torch", {"Batch": 2, "MaxSeq": 8})
    assert ".clone()" not in source


# ---------------------------------------------------------------- stores through slices

STORES = """
arch stores

params {
  e: f32[4]
    from hf "e"
}

state {
  cache: f32[2, Batch, MaxSeq, 3]
}

entry part<n>(v: f32[n, 2], rows: i32[n], positions: i32[n]) {
  cache[0, rows, positions, 0:2] = v
}

entry layer(v: f32[Batch, MaxSeq, 3]) {
  cache[1, :] = v
}

entry both_layers<n>(v: f32[2, n, 3], rows: i32[n], positions: i32[n]) -> f32[2, Batch, MaxSeq, 3] {
  cache[:, rows, positions] = v
  cache[1, 0, 1:, 2:] = v[0, 0:MaxSeq - 1, 0:1]
  return cache * 1.0
}
"""


def cache_of(m) -> np.ndarray:
    return np.array(m.cache["cache"] if isinstance(m.cache, dict) else m.cache.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
def test_stores_through_slices_are_numpys(backend):
    """Each store is numpy's assignment of the same index; a position past the cache (a padding
    token) writes nothing, here too."""
    source = generate(load_source(STORES, "stores.linnet"), backend, {"Batch": 2, "MaxSeq": 3})
    compile(source, "stores.py", "exec")
    m = import_source(source).Model({"e": np.zeros(4, np.float32)})
    rng = np.random.default_rng(1)
    want = np.zeros((2, 2, 3, 3), np.float32)
    v, rows, positions = rng.normal(size=(3, 2)).astype(np.float32), np.array([0, 1, 1]), np.array([2, 0, 1])
    m.part(v, rows.astype(np.int32), positions.astype(np.int32))
    want[0, rows, positions, 0:2] = v
    np.testing.assert_array_equal(cache_of(m), want)
    layer = rng.normal(size=(2, 3, 3)).astype(np.float32)
    m.layer(layer)
    want[1, :] = layer
    np.testing.assert_array_equal(cache_of(m), want)
    v = rng.normal(size=(2, 3, 3)).astype(np.float32)
    rows, positions = np.array([1, 0, 1]), np.array([2, 1, 3])  # the last is past MaxSeq: dropped
    got = out(m.both_layers(v, rows.astype(np.int32), positions.astype(np.int32)))
    want[:, rows[:2], positions[:2]] = v[:, :2]
    want[1, 0, 1:, 2:] = v[0, 0:2, 0:1]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cache_of(m), want)


def test_the_clamped_put_keeps_the_gathered_axis_where_numpy_puts_it():
    """The GPU's way of dropping entries past the state (clamp, then write back what is there),
    with a slice before the gathered indices: the mask lines up with the value's gathered axis."""
    from linnet.codegen_torch import runtime as rt

    state = torch.arange(2 * 2 * 3 * 3, dtype=torch.float32).reshape(2, 2, 3, 3)
    want = state.clone().numpy()
    rows, positions = torch.tensor([1, 0, 0]), torch.tensor([2, 1, 3])  # the last lands on (0, 2), written back
    value = -torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3) - 1
    index = (slice(None), rows, positions)
    rt._put_clamped(state, index, value, [(1, rows), (2, positions)])
    want[:, [1, 0], [2, 1]] = value[:, :2].numpy()
    np.testing.assert_array_equal(state.numpy(), want)


# ---------------------------------------------------------------- random programs

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LOCALS = ("a0", "a1", "a2")


def _statement(draw, depth: int) -> list:
    """One statement of a random body over `s: f32[3, 4]`, locals a0..a2 (f32[4]) and `x`, as
    (source line, numpy step)."""
    kind = draw(st.sampled_from(["view", "copy", "math", "store", "replace"] + (["loop"] if depth < 2 else [])))
    a, b, j = draw(st.sampled_from(LOCALS)), draw(st.sampled_from(LOCALS)), draw(st.integers(0, 2))
    if kind == "view":
        return [(f"{a} = s[{j}]", lambda env: env.__setitem__(a, env["s"][j].copy()))]
    if kind == "copy":
        return [(f"{a} = {b}", lambda env: env.__setitem__(a, env[b].copy()))]
    if kind == "math":
        return [(f"{a} = {b} * 2.0 + x", lambda env: env.__setitem__(a, env[b] * 2 + env["x"]))]
    if kind == "store":
        return [(f"s[{j}] = {a} + 1.0", lambda env: env["s"].__setitem__(j, env[a] + 1))]
    if kind == "replace":
        return [("s = s * 0.5 + 1.0", lambda env: env.__setitem__("s", env["s"] * 0.5 + 1))]
    body = [line for _ in range(draw(st.integers(1, 3))) for line in _statement(draw, depth + 1)]
    steps = [step for _, step in body if step is not None]

    def loop(env):
        for _ in range(2):
            for step in steps:
                step(env)
    return [(f"for l{depth} in 2 {{", None)] + [("  " + text, None) for text, _ in body] + [("}", loop)]


@st.composite
def programs(draw):
    lines = [line for _ in range(draw(st.integers(1, 6))) for line in _statement(draw, 0)]
    return lines


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(programs())
def test_random_programs_keep_values_in_torch(program):
    """Locals bound to rows of the state, stores and whole replacements in any order, loops too:
    the torch entry returns what numpy's values give (the state before the call: ones)."""
    body = "\n".join("  " + text for text, _ in program)
    source = (f"arch random_aliases\nparams {{\n  w: f32[4]\n    from hf \"w\"\n}}\nstate {{\n  s: f32[3, 4]\n}}\n"
              f"entry step(x: f32[4]) -> f32[5, 4] {{\n  a0 = x\n  a1 = s[1]\n  a2 = x + 1.0\n{body}\n"
              f"  return concat([a0.unsqueeze(0), a1.unsqueeze(0), a2.unsqueeze(0), s[0:2]], axis=0)\n}}\n")
    m = import_source(generate(load_source(source, "random_aliases.linnet"), "torch", {})).Model({"w": X})
    m.s.fill_(1.0)
    env = {"x": X.astype(np.float64), "s": np.ones((3, 4))}
    env.update(a0=env["x"].copy(), a1=env["s"][1].copy(), a2=env["x"] + 1)
    for _, step in program:
        if step is not None:
            step(env)
    want = np.concatenate([np.stack([env["a0"], env["a1"], env["a2"]]), env["s"][0:2]])
    np.testing.assert_allclose(out(m.step(X)), want, rtol=1e-6)
