"""JAX runtime pieces the parity tests reach only as a whole: the cache store that drops padding and
writes 16-bit floats as their bits, and bf16 linears that read their weight as it is."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linnet.codegen_jax import runtime as rt


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_put_drops_entries_past_the_state(dtype):
    """Padding tokens at position MaxSeq write nothing; written values land bit for bit."""
    rng = np.random.default_rng(5)
    cache = rng.normal(size=(2, 3, 6, 4)).astype(dtype)  # [layers, rows, MaxSeq, dim]
    rows = np.array([0, 2, 1, 2, 0])
    positions = np.array([1, 6, 5, 3, 6])  # two at MaxSeq
    value = rng.normal(size=(5, 4)).astype(dtype)
    want = cache.copy()
    for r, p, v in zip(rows, positions, value):
        if p < 6:
            want[1, r, p] = v
    got = jax.jit(rt.put)(jnp.asarray(cache), (1, jnp.asarray(rows), jnp.asarray(positions)), jnp.asarray(value))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def test_a_bf16_put_widens_nothing():
    # XLA's CPU backend widens a bf16 scatter's whole operand to f32 and back: put must not let it.
    cache = jnp.zeros((2, 3, 6, 4), jnp.bfloat16)
    index = (1, jnp.array([0, 2]), jnp.array([1, 6]))
    hlo = jax.jit(rt.put).lower(cache, index, jnp.ones((2, 4), jnp.bfloat16)).compile().as_text()
    assert "f32[2,3,6,4]" not in hlo


@pytest.mark.parametrize("lead", [(1,), (3,), (2, 5), (80,)])
def test_low_precision_linear_is_the_f32_product_rounded(lead):
    # 1, 3 and 10 rows take the multiply-and-sum on the CPU, 80 the dot: all round the f32 product once
    rng = np.random.default_rng(len(lead) * 10 + lead[0])
    x = rng.normal(size=lead + (64,)).astype(jnp.bfloat16)
    w = rng.normal(size=(48, 64)).astype(jnp.bfloat16)
    b = rng.normal(size=(48,)).astype(jnp.bfloat16)
    got = jax.jit(rt.linear)(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b))
    assert got.dtype == jnp.bfloat16 and got.shape == lead + (48,)
    product = (x.astype(np.float64) @ w.astype(np.float64).T).astype(jnp.bfloat16).astype(np.float64)
    want = (product + b.astype(np.float64)).astype(jnp.bfloat16).astype(np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2 ** -6, atol=2e-2)


def entry_buffers(fn, *args) -> str:
    """The optimized HLO's entry computation: the buffers a call materializes (fusion bodies excluded)."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return hlo[hlo.index("ENTRY"):]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the multiply-and-sum is the CPU's")
@pytest.mark.parametrize("rows", [1, 16])
def test_a_decode_steps_bf16_linear_widens_no_weight(rows):
    # XLA's CPU dot widens a bf16 weight to an f32 buffer at every call (SmolLM2's down projection
    # shape here); a decode step's linear must read it as it is
    x, w = jnp.zeros((rows, 576), jnp.bfloat16), jnp.zeros((1536, 576), jnp.bfloat16)
    assert "f32[1536,576]" not in entry_buffers(rt.linear, x, w)
    dot = lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())))
    assert "f32[1536,576]" in entry_buffers(dot, x, w)  # what it avoids


def test_a_bf16_cache_is_held_as_bits_and_never_copied_whole():
    # State is donated as uint16 bits: the bf16 views inside the program fold away, where a bf16
    # state met `put`'s bits with a copy of the whole cache at each boundary.
    from linnet import nest

    model = nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                      generics={"Batch": 2, "MaxSeq": 16, "T": "bf16"}).runner
    assert model.state_bits["k_cache"].dtype == jnp.uint16 and model.cache["k_cache"].dtype == jnp.bfloat16
    step = (np.array([3, 4], np.int32), np.array([0, 16], np.int32))  # row 1 idle, at MaxSeq
    hlo = model.compiled["decode"].lower(model.weights, model.state_bits, *step).compile().as_text()
    whole = "[" + ",".join(map(str, model.state_bits["k_cache"].shape)) + "]"
    # every computation: the entry's and a compiled layer loop's body (rt.loop)
    defined = [line.strip().split(" = ", 1) for line in hlo.splitlines() if " = " in line]
    copies = [name for name, op in defined if ("bitcast-convert" in name or name.startswith("copy"))
              and op.split("{")[0].endswith(whole)]
    assert not copies
    model.decode(*step)
    k = np.asarray(model.cache["k_cache"], np.float32)
    assert np.abs(k[:, 0, 0]).sum() > 0 and not k[:, 1].any() and not k[:, 0, 1:].any()  # row 0 at 0 only


def _memory_status() -> dict:
    """This process's resident memory now and at its peak since the peak was last reset (bytes)."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_reset_zeroes_the_cache_in_the_buffers_it_has(dtype):
    # Engine.warmup ends in model.reset(): a cache made anew beside the old one held both at once
    # (SmolLM2 bf16, 16 rows of 8192: a 3.0 GB cache peaked at 6.9 GB after a warmup, where torch held 3.7)
    from linnet import nest

    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak")
    model = nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                      generics={"Batch": 4, "MaxSeq": 65536, "T": dtype}).runner
    cache_bytes = sum(a.nbytes for a in model.state_bits.values())  # 134 MB in f32
    step = (np.array([3, 4, 5, 6], np.int32), np.array([0, 1000, 65535, 9], np.int32))
    first = np.asarray(model.decode(*step))
    assert any(np.asarray(a).any() for a in model.state_bits.values())  # the step wrote the cache
    buffers = [a.unsafe_buffer_pointer() for a in model.state_bits.values()]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # (the kernel's reset of this process's peak resident memory)
    before = _memory_status()["VmRSS"]
    model.reset_state()
    jax.block_until_ready(model.state_bits)
    assert _memory_status()["VmHWM"] - before < cache_bytes / 2
    assert [a.unsafe_buffer_pointer() for a in model.state_bits.values()] == buffers
    for name, a in model.state_bits.items():
        np.testing.assert_array_equal(np.asarray(a), np.zeros(a.shape, a.dtype), err_msg=name)
    np.testing.assert_array_equal(np.asarray(model.decode(*step)), first)  # as on the cache it was loaded with


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_fused_linear_groups_are_one_matmul_and_change_no_value(dtype, monkeypatch):
    # q/k/v and gate/up are held as one array per layer; their members' matmuls merge into one op.
    # The logits and the cache equal those of the model whose groups are left apart: bit for bit on
    # the CPUs measured, and to rounding here, since another CPU's kernel may block a wider product
    # differently.
    from linnet import nest

    def load():
        return nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                         generics={"Batch": 3, "MaxSeq": 16, "T": dtype}).runner

    fused = load()
    groups = type(fused).linear_groups
    assert groups == [("w_gate", "w_up"), ("wk", "wq", "wv")]
    assert {"w_gate+w_up", "wk+wq+wv"} <= set(fused.weights) and "wq" not in fused.weights
    monkeypatch.setattr(type(fused), "linear_groups", [])
    apart = load()
    pack = (np.array([5, 6, 7, 8, 9], np.int32), np.array([0, 1, 2, 0, 1], np.int32),
            np.array([0, 0, 0, 2, 2], np.int32), np.array([2, 4, 0], np.int32))
    step = (np.array([3, 4, 5], np.int32), np.array([3, 16, 2], np.int32))  # row 1 idle
    logits = {id(m): [np.asarray(m.prefill(*pack)), np.asarray(m.decode(*step))] for m in (fused, apart)}
    tol = 1e-6 if dtype == "f32" else 2 ** -6  # bf16: a few roundings of the activations may differ
    for got, want in zip(logits[id(fused)], logits[id(apart)]):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    for name in ("k_cache", "v_cache"):
        want = np.asarray(apart.cache[name], np.float32)
        np.testing.assert_allclose(np.asarray(fused.cache[name], np.float32), want, rtol=tol, atol=tol * np.abs(want).max())
    if dtype == "f32":  # the matmuls of a decode step: per layer 2 groups + wo + w_down + attention's 2, and the head
        # one layer's body where the layer loop is compiled as a loop (rt.loop), else every layer's
        layers = 1 if fused.compiles_loops else len(fused.weights["wo"])
        assert fused.compiles_loops == apart.compiles_loops

        def count(m):  # XLA's dots and calls of Linnet's CPU kernel (`xla_kernels`), where it holds the weights
            text = m.compiled["decode"].lower(m.weights, m.state_bits, *step).compile().as_text()
            return text.count(" dot(") + text.count('custom_call_target="linnet_linear"')
        assert count(fused) == count(apart) - 3 * layers


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_linear_weights_held_as_panels_change_no_value(dtype, monkeypatch):
    # On an AVX2 CPU, fast numerics hold every linear weight (and fused group) as Linnet's panels and
    # run them through the kernel's XLA handler; XLA's own dot / multiply-and-sum is the reference.
    from linnet import nest
    from linnet.kernels import xla_kernels

    if not xla_kernels.available(np.float32, "cpu"):
        pytest.skip("Linnet's CPU kernel does not run here")

    def load(card):
        return nest.load(card, backend="jax", numerics="fast", weights="random", tokenizer=False,
                         generics={"Batch": 3, "MaxSeq": 16, "T": dtype}).runner

    panels = load("tiny-llama")
    w = panels.weights
    assert w["wk+wq+wv"][0].shape == (8, 64, 16) and w["wo"][0].shape == (4, 64, 16) and w["lm_head"].shape == (8, 64, 16)
    tied = load("tiny-llama-tied")
    assert tied.weights["lm_head"].shape == (8, 48, 16) and tied.weights["embed"].shape == (128, 48)  # its own panels
    monkeypatch.setattr(xla_kernels, "available", lambda dtype, platform: False)
    plain = load("tiny-llama")
    assert plain.weights["wo"][0].shape == (64, 64)
    pack = (np.array([5, 6, 7, 8, 9], np.int32), np.array([0, 1, 2, 0, 1], np.int32),
            np.array([0, 0, 0, 2, 2], np.int32), np.array([2, 4, 0], np.int32))
    step = (np.array([3, 4, 5], np.int32), np.array([3, 16, 2], np.int32))  # row 1 idle
    tol = 1e-5 if dtype == "f32" else 2 ** -6  # another summation order; bf16 rounds activations
    for m in (panels, plain):
        m.logits = [np.asarray(m.prefill(*pack), np.float32), np.asarray(m.decode(*step), np.float32)]
    for got, want in zip(panels.logits, plain.logits):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_jax_arrays_handed_over_are_packed_as_copies():
    # consume=True with JAX arrays (a caller's model, not nest.load's host arrays): their host views
    # are JAX's, so the panels are copies, and the model computes what one loaded from numpy does
    from linnet import nest
    from linnet.kernels import xla_kernels

    if not xla_kernels.available(np.float32, "cpu"):
        pytest.skip("Linnet's CPU kernel does not run here")
    loaded = nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                       generics={"Batch": 3, "MaxSeq": 16, "T": "f32"}).runner
    model_class = type(loaded)
    plain = nest.load("tiny-llama", backend="jax", numerics="exact", weights="random", tokenizer=False,
                      generics={"Batch": 3, "MaxSeq": 16, "T": "f32"}).runner
    given = {name: jnp.asarray(np.stack(a) if isinstance(a, list) else a) for name, a in plain.weights.items()
             if name not in model_class.tied}
    before = {name: np.array(a) for name, a in given.items()}
    model = model_class(dict(given), consume=True)
    step = (np.array([3, 4, 5], np.int32), np.array([3, 16, 2], np.int32))
    np.testing.assert_allclose(np.asarray(model.decode(*step)), np.asarray(loaded.decode(*step)), rtol=1e-6, atol=1e-6)
    for name, a in given.items():
        np.testing.assert_array_equal(np.asarray(a), before[name])


def test_a_bf16_prefill_converts_no_whole_cache_to_f32():
    # A prompt's keys are gathered from the stacked cache and widened; gathered as bf16, XLA moved the
    # convert in front of the gather and widened every layer's whole stack, twice a layer.
    from linnet import nest

    model = nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                      generics={"Batch": 2, "MaxSeq": 32, "T": "bf16"}).runner
    cache_elements = int(np.prod(model.state_bits["k_cache"].shape))
    head = rt.head_tokens(2)
    tokens = np.arange(head + 16, dtype=np.int32) % 100
    positions = np.r_[np.full(head, 32), np.arange(16)].astype(np.int32)  # one 16-token prompt in row 1
    rows = np.r_[np.zeros(head), np.ones(16)].astype(np.int32)
    last = np.array([head + 15, 0], np.int32)
    hlo = model.compiled["prefill"].lower(model.weights, model.state_bits, tokens, positions, rows, last)
    text = hlo.compile().as_text()
    widened = [line for line in text.splitlines() if " = f32[" in line  # any computation: the entry's, a loop body's
               and int(np.prod([int(d) for d in line.split(" = f32[", 1)[1].split("]")[0].split(",") if d])) == cache_elements]
    assert not widened, widened[:2]


def test_passes_compiled_ahead_run_as_the_jitted_ones_and_compile_no_more(compiles_counted):
    # compile_ahead compiles a pass's shapes at once, on threads; those calls then run its executables
    # (XLA compiles nothing more for them), with the logits and the cache a model without them gives
    from linnet import nest
    from linnet.serve.runners import _xla_compiles

    def load():
        return nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                         generics={"Batch": 3, "MaxSeq": 32, "T": "f32"}).runner

    def pack(n):  # n tokens of prompts in rows 0 and 2, the logits of the last of each
        rows = np.repeat(np.array([0, 2], np.int32), [n // 2, n - n // 2])
        positions = np.r_[np.arange(n // 2), np.arange(n - n // 2)].astype(np.int32)
        return (np.arange(5, 5 + n, dtype=np.int32) % 50, positions, rows, np.array([n // 2 - 1, n - 1, 0], np.int32))

    ahead, plain = load(), load()
    ahead.compile_ahead("prefill", [pack(8), pack(16), pack(8)])  # (the same shapes twice: compiled once)
    assert [len(table) for table in ahead.ahead.values()] == [2]
    before = _xla_compiles()
    ahead.compile_ahead("prefill", [pack(16)])  # nothing new
    for n in (16, 8):
        got = np.asarray(ahead.prefill(*pack(n)))
        np.testing.assert_array_equal(got, np.asarray(plain.prefill(*pack(n))))
    assert _xla_compiles() - before == 2  # the plain model's two; none of the model's compiled ahead
    np.testing.assert_array_equal(np.asarray(ahead.cache["k_cache"]), np.asarray(plain.cache["k_cache"]))
    got = np.asarray(ahead.prefill(*pack(12)))  # a shape not compiled ahead: jitted as ever
    np.testing.assert_array_equal(got, np.asarray(plain.prefill(*pack(12))))
    placed = tuple(jax.device_put(a, jax.devices()[0]) for a in pack(8))  # arrays already on a device
    np.testing.assert_array_equal(np.asarray(ahead.prefill(*placed)), np.asarray(plain.prefill(*pack(8))))


def test_gpu_compiles_take_the_xla_options_jaxlib_knows_and_xla_flags_leaves_unset(monkeypatch):
    # An option this jaxlib lacks would fail every compile, and a user's own XLA_FLAGS wins
    monkeypatch.setattr(rt, "GPU_COMPILER_OPTIONS", {"xla_gpu_enable_triton_gemm": False, "xla_gpu_no_such_option": 1})
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert rt.compiler_options("cpu") == {}
    assert rt.compiler_options("gpu") == {"xla_gpu_enable_triton_gemm": False}
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_gpu_enable_triton_gemm=true")
    assert rt.compiler_options("gpu") == {}
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm_any=true")  # another flag of a longer name
    assert rt.compiler_options("gpu") == {"xla_gpu_enable_triton_gemm": False}


def test_a_models_entries_and_compiles_ahead_are_given_the_devices_options(monkeypatch):
    # what reaches XLA: an option it does not know fails the compile, naming it
    from linnet import nest

    asked = []
    monkeypatch.setattr(rt, "compiler_options", lambda platform: asked.append(platform) or {"xla_no_such_option": 1})
    model = nest.load("tiny-llama", backend="jax", numerics="fast", weights="random", tokenizer=False,
                      generics={"Batch": 2, "MaxSeq": 16, "T": "f32"}).runner
    assert asked and set(asked) == {"cpu"}
    step = (np.array([3, 4], np.int32), np.array([0, 16], np.int32))
    with pytest.raises(Exception, match="xla_no_such_option"):
        model.decode(*step)
    pack = (np.array([5, 6], np.int32), np.array([0, 1], np.int32), np.array([0, 0], np.int32), np.array([1, 0], np.int32))
    with pytest.raises(Exception, match="xla_no_such_option"):
        model.compile_ahead("prefill", [pack])


@pytest.mark.parametrize("weight", ["plain", "panels"])
@pytest.mark.parametrize("lead", [(1,), (3,), (80,)])
def test_a_linear_widened_to_f32_is_the_f32_product(lead, weight):
    # `linear(x, lm_head) as f32` in bf16 (rt.linear's out_dtype): the product's f32 sums with the bias, not
    # rounded to bf16 on the way, whether the multiply-and-sum (1 and 3 rows on the CPU), the dot (80) or
    # Linnet's kernel (panels) computes it

    from linnet.kernels import xla_kernels

    rng = np.random.default_rng(lead[0])
    x = rng.normal(size=lead + (64,)).astype(jnp.bfloat16)
    w = rng.normal(size=(48, 64)).astype(jnp.bfloat16)
    b = rng.normal(size=(48,)).astype(jnp.bfloat16)
    if weight == "panels" and not xla_kernels.available(jnp.bfloat16, "cpu"):
        pytest.skip("Linnet's CPU kernel does not run here")
    weight_arg = jnp.asarray(w) if weight == "plain" else xla_kernels.pack(w)
    as_weight = (lambda a: a) if weight == "plain" else (lambda a: xla_kernels.Panels(a, 48))
    widened = jax.jit(lambda x, a, b: rt.linear(x, as_weight(a), b, out_dtype=jnp.float32))
    got = np.asarray(widened(jnp.asarray(x), weight_arg, jnp.asarray(b)))
    assert got.dtype == np.float32 and got.shape == lead + (48,)
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    want = xd @ wd.T + b.astype(np.float64)
    bound = 4 * 64 * 2 ** -24 * (np.abs(xd) @ np.abs(wd).T + np.abs(b.astype(np.float64)))
    assert np.all(np.abs(got - want) <= bound)
    assert not np.array_equal(got, got.astype(jnp.bfloat16).astype(np.float32))
