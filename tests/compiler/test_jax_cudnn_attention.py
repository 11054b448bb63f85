"""One query a row through cuDNN's fused attention (JAX on a GPU: decode steps, a pack's one-token
segments), each row's keys given as its length. No GPU here: cuDNN is stood in for by JAX's own
implementation of the same call (`jax.nn.dot_product_attention`'s XLA path, which reads the same
`key_value_seq_lengths`), and the generated model on the GPU's branches must give the logits of
its masked path."""

import jax
import numpy as np
import pytest

from linnet import nest
from linnet.codegen_jax import runtime as rt
from linnet.serve.runners import JaxRunner

REAL_ATTENTION = jax.nn.dot_product_attention


def cudnn_stand_in(calls):
    def attention(*args, implementation=None, **kwargs):
        if implementation == "cudnn":
            calls.append(np.asarray(kwargs["key_value_seq_lengths"]).tolist() if not isinstance(
                kwargs["key_value_seq_lengths"], jax.core.Tracer) else "traced")
            implementation = "xla"
        return REAL_ATTENTION(*args, implementation=implementation, **kwargs)
    return attention


@pytest.fixture
def gpu_branches(monkeypatch):
    """The JAX runtime's GPU branches on this CPU: no Linnet CPU kernel, no walk over key chunks."""
    monkeypatch.setattr(rt.xla_kernels, "attends_here", lambda stack, head_dim: False)
    monkeypatch.setattr(rt, "_walks_keys", lambda max_seq: False)


@pytest.mark.parametrize("window", [0, 3])
def test_one_query_a_row_attends_as_the_masked_path(window, gpu_branches, monkeypatch):
    g = np.random.default_rng(0)
    n, seq, heads, kv_heads, d = 5, 12, 4, 2, 8
    q = g.standard_normal((n, heads, d)).astype(np.float32)
    k, v = (g.standard_normal((n, seq, kv_heads, d)).astype(np.float32) for _ in range(2))
    positions = np.array([0, 11, 5, 12, 2], np.int32)  # row 3 idle: padding at MaxSeq
    want = rt._attend(q, k, v, positions, window, None, 0.3, True)
    calls = []
    monkeypatch.setattr(rt, "cudnn_attends", lambda *a: True)
    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn_stand_in(calls))
    got = rt._attend(q, k, v, positions, window, None, 0.3, True)
    busy = [0, 1, 2, 4]
    np.testing.assert_allclose(np.asarray(got)[busy], np.asarray(want)[busy], rtol=1e-5, atol=1e-5)
    # a sliding window keeps the masked path: cuDNN would place it from the query's own index, 0
    assert calls == ([] if window else [[1, 12, 6, 1, 3]])


def test_cudnn_stays_off_the_cpu_and_off_32_bit_floats(monkeypatch):
    assert not rt.cudnn_attends(np.dtype("bfloat16"), 4, 2, 8)  # the CPU
    if jax.default_backend() == "cpu":  # cuDNN's refusal (here: no GPU) is caught, not raised
        assert not rt._cudnn_compiles("bfloat16", 4, 2, 8)
    token = rt._ON_GPU.set(True)  # a model on a GPU being traced
    try:
        assert not rt.cudnn_attends(np.dtype("float32"), 4, 2, 8)
        monkeypatch.setattr(rt, "_cudnn_compiles", lambda *a: True)
        assert rt.cudnn_attends(np.dtype("bfloat16"), 4, 2, 8)
        monkeypatch.setenv("LINNET_JAX_CUDNN", "0")
        assert not rt.cudnn_attends(np.dtype("bfloat16"), 4, 2, 8)
    finally:
        rt._ON_GPU.reset(token)


def test_decode_steps_and_mixed_passes_give_the_masked_paths_logits(gpu_branches, monkeypatch):
    # the generated entries on the GPU's branches from a cache of noise: a decode step with rows at
    # different positions and one idle, and a mixed pass laid out by the engine's runner (rows 3
    # and 0 decode, row 2 takes a 5-token prompt); cuDNN's path against the masked one
    def logits(cudnn: bool) -> list:
        calls = []
        with monkeypatch.context() as m:
            if cudnn:
                m.setattr(rt, "cudnn_attends", lambda *a: True)
                m.setattr(jax.nn, "dot_product_attention", cudnn_stand_in(calls))
            model = nest.load("tiny-llama", backend="jax_model", numerics="fast", weights="random", tokenizer=False,
                              generics={"Batch": 4, "MaxSeq": 32, "T": "f32"})
            runner = JaxRunner(model)
            out = []
            for run in (lambda: model.decode(np.array([3, 9, 0, 27], np.int32), np.array([5, 31, 32, 17], np.int32)),
                        lambda: runner.prefill(np.array([4, 8, 15, 16, 23, 42, 7], np.int32),
                                               np.array([18, 0, 1, 2, 3, 4, 6], np.int32),
                                               np.array([3, 2, 2, 2, 2, 2, 0], np.int32), np.array([0, 5, 6], np.int32))):
                # the same noise before each (an f32 cache, held as it is)
                model.runner.state_bits = {name: jax.device_put(np.random.default_rng(1).standard_normal(a.shape)
                                                                .astype(a.dtype))
                                           for name, a in model.runner.state_bits.items()}
                out.append(np.asarray(run()))
        return out, calls
    (step_want, pack_want), _ = logits(False)
    (step_got, pack_got), calls = logits(True)
    assert calls, "cuDNN's path was not taken"
    busy = [0, 1, 3]
    np.testing.assert_allclose(step_got[busy], step_want[busy], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pack_got[:3], pack_want[:3], rtol=1e-4, atol=1e-4)
