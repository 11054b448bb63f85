"""The runtimes' attention against a plain numpy loop: packed rows, GQA, sliding window, sinks, soft-capped scores."""

import numpy as np
import pytest
import torch

from linnet.codegen_jax import runtime as jrt
from linnet.codegen_torch import runtime as trt


def reference(q, kc, vc, positions, rows, window, sinks, scale, softcap=0.0):
    n, heads, d = q.shape
    kvh = kc.shape[2]
    out = np.zeros((n, heads, vc.shape[-1]))
    for i in range(n):
        r, p = rows[i], positions[i]
        lo = max(0, p - window + 1) if window else 0
        for h in range(heads):
            g = h // (heads // kvh)
            s = kc[r, lo:p + 1, g] @ q[i, h] * scale
            if softcap:  # Gemma 2's: softcap * tanh(s / softcap)
                s = softcap * np.tanh(s / softcap)
            m = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - m)
            denom = e.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
            out[i, h] = (e / denom) @ vc[r, lo:p + 1, g]
    return out


def case(seed, seq=24):
    rng = np.random.default_rng(seed)
    batch, heads, kvh, d = 3, 4, 2, 8
    kc = rng.normal(size=(batch, seq, kvh, d)).astype(np.float32)
    vc = rng.normal(size=(batch, seq, kvh, d)).astype(np.float32)
    # A pack: a 9-token prompt in row 2, one decode token in row 0, a 6-token chunk in row 1 from position 5.
    # Past two key chunks: the prompt after a 140-token prefix, the chunk across a chunk's edge.
    rows = np.array([2] * 9 + [0] + [1] * 6, np.int32)
    prompt, decode, chunk = (0, 17, 5) if seq < 2 * jrt.KEY_CHUNK else (140, seq - 10, jrt.KEY_CHUNK - 3)
    positions = np.array(list(range(prompt, prompt + 9)) + [decode] + list(range(chunk, chunk + 6)), np.int32)
    q = rng.normal(size=(len(rows), heads, d)).astype(np.float32)
    sinks = rng.normal(size=heads).astype(np.float32)
    return q, kc, vc, positions, rows, sinks


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("window,use_sinks", [(0, False), (4, False), (0, True), (5, True)])
def test_attention_matches_the_definition(backend, fast, window, use_sinks):
    q, kc, vc, positions, rows, sinks = case(0)
    s = sinks if use_sinks else None
    want = reference(q, kc, vc, positions, rows, window, s, 1 / np.sqrt(q.shape[-1]))
    if backend == "torch":
        t = torch.from_numpy
        trt.as_tensors("cpu")  # a new entry call: per-pass caches start empty
        got = trt.attention(t(q), t(kc), t(vc), t(positions), rows=t(rows), window=window,
                            sinks=None if s is None else t(s), fast=fast).numpy()
    else:
        got = np.asarray(jrt.attention(q, kc, vc, positions, rows=rows, window=window, sinks=s, fast=fast))
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("seq", [24, 300])
@pytest.mark.parametrize("window,use_sinks", [(0, False), (4, True)])
def test_soft_capped_scores_match_the_definition(backend, fast, seq, window, use_sinks):
    """A cap of 2 on scores scaled by 2: most of them reach it, so a cap left out or applied after the
    mask or the scale shows. Fast numerics take no fused kernel for it (none caps) on either backend,
    past a key chunk too (300 positions), and agree with the f32 definition."""
    q, kc, vc, positions, rows, sinks = case(3, seq)
    s, scale, cap = (sinks if use_sinks else None), 2.0, 2.0
    want = reference(q, kc, vc, positions, rows, window, s, scale, softcap=cap)
    assert np.abs(want - reference(q, kc, vc, positions, rows, window, s, scale)).max() > 0.1
    if backend == "torch":
        t = torch.from_numpy
        trt.as_tensors("cpu")
        got = trt.attention(t(q), t(kc), t(vc), t(positions), rows=t(rows), window=window,
                            sinks=None if s is None else t(s), scale=scale, softcap=cap, fast=fast).numpy()
        alone = trt.attention(t(q[:3]), t(kc), t(vc), t(positions[:3]), window=window,
                              sinks=None if s is None else t(s), scale=scale, softcap=cap, fast=fast).numpy()
    else:
        got = np.asarray(jrt.attention(q, kc, vc, positions, rows=rows, window=window, sinks=s, scale=scale,
                                       softcap=cap, fast=fast))
        alone = np.asarray(jrt.attention(q[:3], kc, vc, positions[:3], window=window, sinks=s, scale=scale,
                                         softcap=cap, fast=fast))
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(alone, reference(q[:3], kc, vc, positions[:3], np.arange(3), window, s, scale,
                                                softcap=cap), atol=2e-5)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_rows_omitted_means_token_i_is_row_i(backend):
    q, kc, vc, positions, rows, sinks = case(1)
    q, positions = q[:3], np.array([4, 0, 23], np.int32)
    want = reference(q, kc, vc, positions, np.arange(3), 3, sinks, 0.3)
    if backend == "torch":
        t = torch.from_numpy
        got = trt.attention(t(q), t(kc), t(vc), t(positions), window=3, sinks=t(sinks), scale=0.3).numpy()
    else:
        got = np.asarray(jrt.attention(q, kc, vc, positions, window=3, sinks=sinks, scale=0.3))
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("window,use_sinks", [(0, False), (4, True)])
@pytest.mark.parametrize("seq,pad", [(24, "last"), (24, "past"), (300, "last"), (300, "past")])
def test_jax_block_layout_matches_the_definition(fast, window, use_sinks, seq, pad):
    """The engine's JAX layout: one-token segments first (padded to head_tokens), then BLOCK-aligned
    runs; padding at the last cache position or one past it (where its writes are dropped). At 300
    positions fast numerics walk the keys in chunks, gathering each block's row a chunk at a time."""
    q, kc, vc, positions, rows, sinks = case(2, seq)
    assert jrt._walks_keys(seq) == (seq == 300)
    s = sinks if use_sinks else None
    head, block, scratch = jrt.head_tokens(kc.shape[0]), jrt.BLOCK, seq - 1 if pad == "last" else seq
    order, lay_rows, lay_pos = [], [], []

    def put(indices, row, size):
        order.extend(indices + [-1] * (size - len(indices)))
        lay_rows.extend([row] * size)
        lay_pos.extend([positions[i] for i in indices] + [scratch] * (size - len(indices)))

    put([9], 0, head)  # the decode token
    put(list(range(9)), 2, -(-9 // block) * block)
    put(list(range(10, 16)), 1, -(-6 // block) * block)
    order = np.array(order)
    lay_q = np.where(order[:, None, None] >= 0, q[np.maximum(order, 0)], 0).astype(np.float32)
    got = np.asarray(jrt.attention(lay_q, kc, vc, np.array(lay_pos, np.int32), rows=np.array(lay_rows, np.int32),
                                   window=window, sinks=s, fast=fast))
    want = reference(q, kc, vc, positions, rows, window, s, 1 / np.sqrt(q.shape[-1]))
    np.testing.assert_allclose(got[order >= 0], want[order[order >= 0]], atol=2e-5)


@pytest.mark.parametrize("window,use_sinks", [(0, False), (50, False), (0, True), (7, True)])
def test_jax_decode_walking_the_keys_in_chunks_matches_the_definition(window, use_sinks):
    """Past KEY_CHUNK positions, JAX's CPU decode reads keys a chunk at a time up to the furthest
    position; tokens in the first chunk, on a chunk's edges and at the last position agree."""
    rng = np.random.default_rng(3)
    n, seq, heads, kvh, d = 6, 300, 6, 2, 8
    assert jrt._walks_keys(seq) and seq > 2 * jrt.KEY_CHUNK
    kc = rng.normal(size=(n, seq, kvh, d)).astype(np.float32)
    vc = rng.normal(size=(n, seq, kvh, d)).astype(np.float32)
    q = rng.normal(size=(n, heads, d)).astype(np.float32)
    positions = np.array([0, 5, seq - 1, 127, 128, 200], np.int32)
    sinks = rng.normal(size=heads).astype(np.float32) if use_sinks else None
    want = reference(q, kc, vc, positions, np.arange(n), window, sinks, 0.3)
    got = np.asarray(jrt.attention(q, kc, vc, positions, window=window, sinks=sinks, scale=0.3, fast=True))
    np.testing.assert_allclose(got, want, atol=2e-5)
    # Idle rows at the padding position (MaxSeq) neither widen the walk nor disturb the others.
    idle = np.array([0, 5, seq, 127, seq, 100], np.int32)
    got = np.asarray(jrt.attention(q, kc, vc, idle, window=window, sinks=sinks, scale=0.3, fast=True))
    real = idle < seq
    want = reference(q[real], kc[real], vc[real], idle[real], np.arange(real.sum()), window, sinks, 0.3)
    np.testing.assert_allclose(got[real], want, atol=2e-5)
    assert np.isfinite(got).all()


def test_jax_decode_past_a_key_chunk_agrees_with_exact_numerics():
    """The same model, fast (walking the keys) against exact (all MaxSeq keys), rows at 200+ positions."""
    from linnet import nest

    models = [nest.load("tiny-llama", backend="jax", weights="random", seed=2, numerics=numerics,
                        tokenizer=False, generics={"Batch": 2, "MaxSeq": 288, "T": "f32"})
              for numerics in ("fast", "exact")]
    rng = np.random.default_rng(4)
    lengths = [200, 9]
    tokens = rng.integers(1, 128, sum(lengths)).astype(np.int32)
    positions = np.concatenate([np.arange(k) for k in lengths]).astype(np.int32)
    rows = np.repeat(np.arange(2), lengths).astype(np.int32)
    last = (np.cumsum(lengths) - 1).astype(np.int32)
    outs = [[np.asarray(m.prefill(tokens, positions, rows, last))] for m in models]
    for step in range(3):
        for m, out in zip(models, outs):
            out.append(np.asarray(m.decode(np.array([5 + step, 7], np.int32),
                                           np.array([200 + step, 9 + step], np.int32))))
    for fast, exact in zip(*outs):
        np.testing.assert_allclose(fast, exact, atol=1e-4 * np.abs(exact).max())
