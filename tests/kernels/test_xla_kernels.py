"""Linnet's CPU linear kernel as an XLA FFI handler, inside jitted programs, against float64."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from attention_reference import reference  # noqa: E402
from linnet.kernels import xla_kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not xla_kernels.available(np.float32, "cpu") or jax.default_backend() != "cpu",
                                reason="Linnet's CPU kernel does not run here")


@settings(max_examples=40, deadline=None)
@given(lead=st.sampled_from([(1,), (5,), (13,), (2, 7), (250,)]), n=st.integers(1, 60), k=st.integers(1, 70),
       dtype=st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]), seed=st.integers(0, 2 ** 31 - 1))
def test_the_handler_is_the_product_for_any_shape_and_type(lead, n, k, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(lead + (k,)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(dtype)
    panels = xla_kernels.pack(w)
    assert panels.shape == (-(-n // 16), k, 16) and panels.dtype == w.dtype
    got = jax.jit(lambda x, p: xla_kernels.linear(x, xla_kernels.Panels(p, n)))(x, panels)
    assert got.shape == lead + (n,) and got.dtype == jnp.float32
    wd = w.astype(np.float64)
    if xla_kernels.pairs(dtype, k):  # AVX-512 BF16 multiplies bf16 by bf16: x is rounded first
        x = x.astype(jnp.bfloat16)
    want = x.astype(np.float64) @ wd.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(wd).T + 1e-30
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= 4 * k * 2 ** -24 * scale)


def test_a_bf16_input_comes_back_rounded_to_bf16():
    x = jnp.asarray(np.linspace(-1, 1, 3 * 32, dtype=np.float32).reshape(3, 32), jnp.bfloat16)
    w = np.linspace(-2, 2, 20 * 32, dtype=np.float32).reshape(20, 32).astype(jnp.bfloat16)
    got = jax.jit(lambda x, p: xla_kernels.linear(x, xla_kernels.Panels(p, 20)))(x, xla_kernels.pack(w))
    want = (np.asarray(x, np.float64) @ w.astype(np.float64).T).astype(np.float32)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2 ** -8, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), kv_heads=st.integers(1, 3), group=st.sampled_from([1, 3, 4]),
       head_dim=st.sampled_from([8, 64]), max_seq=st.integers(1, 30), window=st.sampled_from([0, 4]),
       with_sinks=st.booleans(), dtype=st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
       layer=st.integers(0, 1), softcap=st.sampled_from([0.0, 2.0, 5.0, 50.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_the_attention_handler_reads_a_layer_of_the_stack(n, kv_heads, group, head_dim, max_seq, window, with_sinks,
                                                          dtype, layer, softcap, seed):
    rng = np.random.default_rng(seed)
    heads, batch = kv_heads * group, 3
    k = rng.standard_normal((2, batch, max_seq, kv_heads, head_dim)).astype(dtype)
    v = rng.standard_normal((2, batch, max_seq, kv_heads, head_dim)).astype(dtype)
    q = rng.standard_normal((n, heads, head_dim)).astype(np.float32) * 3  # scores a cap of 2 saturates
    rows = rng.integers(0, batch, n).astype(np.int32)
    positions = rng.integers(0, max_seq + 2, n).astype(np.int32)  # some are padding
    sinks = rng.standard_normal(heads).astype(np.float32) if with_sinks else None
    scale = head_dim ** -0.5
    got = jax.jit(lambda q, k, v, r, p, s: xla_kernels.attention_rows(q, k, v, layer, r, p, window, s, scale,
                                                                      softcap))(q, k, v, rows, positions, sinks)
    want = reference(q, k[layer].astype(np.float32), v[layer].astype(np.float32), rows, positions, window, sinks, scale,
                     softcap)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2), kv_heads=st.integers(1, 2), group=st.sampled_from([1, 3]), head_dim=st.sampled_from([8, 64]),
       span=st.integers(520, 1100), window=st.sampled_from([0, 600]), with_sinks=st.booleans(),
       padding=st.booleans(), softcap=st.sampled_from([0.0, 2.0, 5.0, 50.0]), seed=st.integers(0, 2 ** 31 - 1))
def test_a_long_span_is_attended_in_parts_on_the_pool(n, kv_heads, group, head_dim, span, window, with_sinks, padding,
                                                       softcap, seed):
    """Fewer units (a token's KV heads) than twice XLA's threads: each span in parts (on the pool where
    the call reads ATTENTION_ALONE_BYTES or more, else on the calling thread), merged after
    (`linnet_attention_span_parts`), as torch's OpenMP path does; a padding token among them."""
    rng = np.random.default_rng(seed)
    heads, batch, max_seq = kv_heads * group, 2, span + 4
    k, v = (rng.standard_normal((1, batch, max_seq, kv_heads, head_dim)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((n, heads, head_dim)).astype(np.float32) * 2
    rows = (np.arange(n) % batch).astype(np.int32)
    positions = np.array([span - 1 - 5 * i for i in range(n)], np.int32)
    if padding and n > 1:
        positions[-1] = max_seq  # padding: zeros, and no part of its own to wait for
    sinks = rng.standard_normal(heads).astype(np.float32) if with_sinks else None
    scale = head_dim ** -0.5
    got = jax.jit(lambda q, k, v, r, p, s: xla_kernels.attention_rows(q, k, v, 0, r, p, window, s, scale, softcap))(
        q, k, v, rows, positions, sinks)
    want = reference(q, k[0], v[0], rows, positions, window, sinks, scale, softcap)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_an_attention_call_too_small_for_a_helper_gives_the_pools_bits(dtype):
    """A call reading under xla_kernels.c's ATTENTION_ALONE_BYTES (512 KB) of keys and values runs on
    the calling thread alone, a larger one on XLA's pool: a token's output is bitwise the same in
    either, and the reference's."""
    rng = np.random.default_rng(0)
    kv_heads, group, head_dim, span = 2, 3, 64, 400  # 400 positions: 400 KB (f32) or 200 KB (bf16) a token
    k, v = (rng.standard_normal((1, 4, span, kv_heads, head_dim)).astype(dtype) for _ in range(2))
    q = rng.standard_normal((4, kv_heads * group, head_dim)).astype(np.float32)
    rows = np.arange(4, dtype=np.int32)
    positions = np.full(4, span - 1, np.int32)
    call = jax.jit(lambda q, r, p: xla_kernels.attention_rows(q, k, v, 0, r, p, 0, None, head_dim ** -0.5))
    token_bytes = span * kv_heads * head_dim * 2 * np.dtype(dtype).itemsize
    pooled = np.asarray(call(q, rows, positions))  # 4 tokens: 1.6 MB or 800 KB, on the pool
    assert 4 * token_bytes >= 512 << 10 > token_bytes
    for i in range(4):
        alone = np.asarray(call(q[i:i + 1], rows[i:i + 1], positions[i:i + 1]))[0]
        assert np.array_equal(alone, pooled[i]), f"token {i}: alone and on the pool differ"
    want = reference(q, k[0].astype(np.float32), v[0].astype(np.float32), rows, positions, 0, None, head_dim ** -0.5)
    np.testing.assert_allclose(pooled.astype(np.float64), want, rtol=1e-5, atol=1e-5)


def test_a_stacked_weight_is_read_at_its_layer():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    ws = rng.standard_normal((3, 21, 24)).astype(np.float32)
    stack = np.stack([xla_kernels.pack(w) for w in ws])  # [3, 2, 24, 16]
    run = jax.jit(lambda x, s: [xla_kernels.linear(x, xla_kernels.Panels(s, 21, layer)) for layer in range(3)])
    for got, w in zip(run(x, stack), ws):
        np.testing.assert_allclose(np.asarray(got), x @ w.T, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(n=st.integers(1, 70), k=st.integers(1, 80), dtype=st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_pack_lays_panels_out_as_the_layout_says(n, k, dtype, seed):
    """The library's in-place packer against `panels.arranged`, the layout written out in numpy:
    zero-padded to whole panels, each K rows of 16, in this CPU's order of places (or pairs)."""
    from linnet.kernels.panels import PANEL, arranged

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(dtype)
    padded = np.concatenate([w, np.zeros((-n % PANEL, k), w.dtype)])
    want = arranged(padded.reshape(-1, PANEL, k).transpose(0, 2, 1), w.dtype, xla_kernels.pairs(w.dtype, k))
    out = np.full((-(-n // PANEL), k, PANEL), 7, w.dtype)
    assert xla_kernels.pack(w, out=out) is out
    np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    np.testing.assert_array_equal(xla_kernels.pack(w).view(np.uint8), out.view(np.uint8))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        xla_kernels.pack(w, out=np.empty((1, k, PANEL), np.float64))


@settings(max_examples=30, deadline=None)
@given(ns=st.lists(st.integers(1, 40), min_size=1, max_size=3), k=st.integers(1, 40), layers=st.sampled_from([None, 1, 3]),
       dtype=st.sampled_from(["float32", "bfloat16", "float16"]), owned=st.booleans())
def test_members_side_by_side_are_the_panels_of_their_rows_joined(ns, k, layers, dtype, owned):
    """A fused group's panels, packed from its members (in place, or a layer at a time giving the
    members' pages back), against `pack` of the joined weight."""
    import jax.numpy as jnp

    rng = np.random.default_rng(len(ns) * 1000 + k)
    lead = () if layers is None else (layers,)
    members = [rng.standard_normal((*lead, n, k)).astype(jnp.dtype(dtype)) for n in ns]
    joined = np.concatenate(members, axis=-2)
    want = np.stack([xla_kernels.pack(w) for w in joined]) if layers else xla_kernels.pack(joined)
    lone = owned and len(ns) == 1 and ns[0] % 16 == 0
    address = members[0].ctypes.data
    got = xla_kernels.pack_side_by_side(members, owned=owned)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert (got.ctypes.data == address) == lone  # a lone owned member of whole panels: its own memory
    if not owned:
        np.testing.assert_array_equal(np.concatenate(members, axis=-2).view(np.uint8), joined.view(np.uint8))


def test_only_memory_of_its_own_is_packed_in_place_or_given_back(tmp_path):
    """A file's map, a read-only array or a JAX array's host view is copied, never rearranged or
    given back, even when the caller gives it up: the file, or JAX's array, stays as it was."""
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    want = xla_kernels.pack(w)
    path = tmp_path / "w.bin"
    w.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r+", shape=(32, 64))
    on_jax = jnp.asarray(w)
    for member in (mapped, mapped[:16], w.copy().view(), on_jax):
        owned = xla_kernels.owns_its_memory(member)
        assert not owned or member.base is not None  # (only the plain copy's view is the model's)
        got = xla_kernels.pack_side_by_side([member], owned=True)  # given up: still only its own memory moves
        np.testing.assert_array_equal(got[: member.shape[0] // 16], want[: member.shape[0] // 16])
    assert not xla_kernels.owns_its_memory(mapped) and not xla_kernels.owns_its_memory(on_jax)
    np.testing.assert_array_equal(np.fromfile(path, dtype=np.float32).reshape(32, 64), w)
    np.testing.assert_array_equal(np.asarray(on_jax), w)


def test_attention_off_the_cpu_builds_nothing(monkeypatch):
    # JAX on a GPU asks whether the CPU kernels attend its cache: no, without building them (a
    # compiler there may not take them, and a build is seconds spent for nothing)
    monkeypatch.setattr(xla_kernels, "_on_cpu", lambda: False)
    monkeypatch.setattr(xla_kernels, "registered", lambda: pytest.fail("built off the CPU"))
    assert not xla_kernels.attends_here(jnp.zeros((2, 1, 4, 1, 8), jnp.float32), 8)


@pytest.mark.parametrize("k", [128, 70, 71], ids=["K%32", "K_even", "K_odd"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_the_handlers_rows_are_batch_invariant(dtype, k):
    """A row's f32 sums are bitwise its own alone at each position among 0..M-1 others
    (tests/kernels/test_batch_invariance.py does the same for the torch runtime's calls)."""
    rng = np.random.default_rng(0)
    n = 40  # a last panel of 8 columns
    panels = xla_kernels.pack(rng.standard_normal((n, k)).astype(dtype))
    product = jax.jit(lambda x, p: xla_kernels.linear(x, xla_kernels.Panels(p, n)))
    bf16_values = lambda m: rng.standard_normal((m, k)).astype(jnp.bfloat16).astype(np.float32)  # noqa: E731
    probe = bf16_values(1)
    alone = np.asarray(product(probe, panels))[0]
    differ = []
    for m in [1, 2, 3, 4, 8, 16, 17, 64]:
        others = bf16_values(m - 1)
        for at in range(m):
            got = np.asarray(product(np.concatenate([others[:at], probe, others[at:]]), panels))[at]
            if not np.array_equal(got, alone):
                differ.append((m, at))
    assert not differ, f"(rows, position) where the probe row's sums differ from its own alone: {differ}"
