"""Layer loops that the JAX backend compiles once (`codegen_jax.loops`, `rt.loop`).

A loop whose index only picks layers of params and states is written as a function of that index;
where the weights are held a stack per param (Linnet's CPU kernels), XLA runs it as one while loop.
Any other use of the index keeps the loop Python's, unrolled. The reference is numpy running the
card's arithmetic by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from linnet.compiler import generate, import_source
from linnet.frontend import load_source
from linnet.kernels import xla_kernels

CARD = """
arch looped

config {
  vocab: int = 32
  dim: int = 16
  layers: int = 3
}

params {
  embed: T[vocab, dim] from hf "embed"
  for l in layers {
    w: T[dim, dim] from hf "w.{l}"
    g: T[dim] from hf "g.{l}"
  }
}

state {
  cache: T[layers, Batch, dim]
}

entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {
  x = embed[tokens]
  s = 1.0
  for l in layers {
    h = linear(x, w[l]) * g[l]
    cache[l, iota(Batch)] = h
    SCALED
  }
  return RESULT as f32
}
"""
GENERICS = {"Batch": 2, "MaxSeq": 8, "T": "f32"}


def source(scaled: str = "x = x + h", result: str = "x") -> str:
    module = load_source(CARD.replace("SCALED", scaled).replace("RESULT", result), "looped.linnet")
    return generate(module, "jax", GENERICS, "fast")


def test_a_loop_whose_index_picks_layers_is_a_function_of_it():
    text = source()
    assert "def loop_l(l, carry):  # one turn of the loop" in text and "cache, x = carry" in text
    assert "cache, x = rt.loop(layers, loop_l, (cache, x))" in text
    assert "for l in range(" not in text


@pytest.mark.parametrize("scaled, result", [
    ("x = x + h * (if l == 0 then 1.0 else 0.5)", "x"),  # the index in arithmetic: each turn's is static
    ("s = s * 0.5\n    x = x + h * s", "x"),  # a number carried: each turn's is static
])
def test_other_loops_stay_pythons(scaled, result):
    text = source(scaled, result)
    assert "rt.loop(" not in text and "for l in range(layers):" in text


def test_gpt_oss_keeps_its_loop_and_llama_compiles_its():
    from linnet.compiler import check_file
    from linnet.nest.registry import cards_dir

    generics = {"Batch": 2, "MaxSeq": 16, "T": "f32"}
    assert "for l in range(layers):" in generate(check_file(cards_dir() / "tiny-gpt-oss.linnet"), "jax", generics)  # l % 2
    llama = generate(check_file(cards_dir() / "tiny-llama.linnet"), "jax", generics)
    assert llama.count("= rt.loop(layers, loop_l, (k_cache, v_cache, x))") == 2  # prefill and decode


@pytest.mark.parametrize("kernels", [True, False])
def test_the_compiled_loop_computes_what_the_card_says(kernels, monkeypatch):
    if kernels and not xla_kernels.available(np.float32, "cpu"):
        pytest.skip("Linnet's CPU kernels do not run here")
    if not kernels:  # weights held a layer per array: the loop is unrolled
        monkeypatch.setattr(xla_kernels, "available", lambda dtype, platform: False)
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((32, 16)).astype(np.float32)
    w = rng.standard_normal((3, 16, 16)).astype(np.float32) / 4
    g = rng.standard_normal((3, 16)).astype(np.float32)
    model = import_source(source()).Model({"embed": embed, "w": w, "g": g})
    assert model.compiles_loops == kernels
    tokens = np.array([5, 9], np.int32)
    hlo = model.compiled["decode"].lower(model.weights, model.state_bits, tokens).as_text()
    assert (" while" in hlo or "stablehlo.while" in hlo) == kernels
    got = np.asarray(model.decode(tokens))

    x, cache = embed[tokens].astype(np.float64), np.zeros((3, 2, 16))
    for layer in range(3):
        h = x @ w[layer].T * g[layer]
        cache[layer] = h
        x = x + h
    np.testing.assert_allclose(got, x, rtol=1e-5, atol=1e-5 * np.abs(x).max())
    np.testing.assert_allclose(np.asarray(model.cache["cache"]), cache, rtol=1e-5, atol=1e-5 * np.abs(cache).max())
