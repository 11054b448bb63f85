"""`cpu_graph`: a step captured once and replayed with new inputs gives what torch computes on
those inputs eagerly: elementwise ops, dtype copies, an embedding gather and Linnet's kernels,
in every type; a step with an op the replay lacks says which, and is not replayed."""

import threading
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.codegen_torch import runtime as rt
from linnet.kernels import cpu_graph, cpu_linear
from tests.conftest import imports_dynamo

pytestmark = pytest.mark.skipif(not cpu_graph.available(), reason="Linnet's CPU kernels do not run here")

TYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def step(table, ids, w, norm):
    """A little decode-like step: gather, norm, linear, SiLU-gated product, residual, widen."""
    x = rt.gather_rows(table, ids)
    h = rt.rmsnorm(x, norm, 1e-5)
    gate, up = rt.linear(h, w), rt.linear(h, w)
    return (x + torch.nn.functional.silu(gate) * up).to(torch.float32)


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(dtype=st.sampled_from(TYPES), n=st.integers(1, 5), dim=st.sampled_from([8, 24, 40]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_a_replay_computes_what_torch_computes_on_the_new_inputs(dtype, n, dim, seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(50, dim, generator=g).to(dtype)
    w = cpu_linear.pack(torch.randn(dim, dim, generator=g).to(dtype) / dim ** 0.5)
    norm = torch.randn(dim, generator=g).to(dtype)
    ids = torch.randint(0, 50, (n,), generator=g, dtype=torch.int32)
    with cpu_graph.capture() as graph:
        out = step(table, ids, w, norm)
    assert graph.unsupported is None and len(graph) > 0
    for _ in range(3):
        ids.copy_(torch.randint(0, 50, (n,), generator=g, dtype=torch.int32))
        graph.replay()
        want = step(table, ids, w, norm)
        tol = TOL[dtype]
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=tol, atol=tol * float(want.abs().max()))


def test_an_id_outside_the_table_gathers_zeros():
    table, ids = torch.randn(4, 8), torch.tensor([1, 2], dtype=torch.int32)
    with cpu_graph.capture() as graph:
        out = rt.gather_rows(table, ids)
    assert graph.unsupported is None
    ids.copy_(torch.tensor([3, 4], dtype=torch.int32))
    graph.replay()
    assert torch.equal(out[0], table[3]) and torch.equal(out[1], torch.zeros(8))
    # and so does the step run eagerly (a padding token's position, one past a learned table), not raising
    assert torch.equal(rt.gather_rows(table, torch.tensor([3, 4], dtype=torch.int32)), out)


def test_an_op_the_replay_lacks_is_named_and_the_step_still_runs():
    x = torch.randn(3, 8)
    with cpu_graph.capture() as graph:
        y = torch.softmax(x, -1)
    assert graph.unsupported is not None and "softmax" in graph.unsupported
    assert torch.allclose(y, torch.softmax(x, -1))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
def test_a_linear_on_onednns_packed_weight_is_named_and_the_step_still_runs():
    # the runtime packs a weight its kernel cannot take (bf16 of odd K on an AVX-512 BF16 CPU) in
    # oneDNN's layout: an opaque tensor, with no storage whose address a replay could hold
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 3)
    with cpu_graph.capture() as graph:
        y = rt.linear(x, packed)
    assert graph.unsupported is not None and "linear" in graph.unsupported
    torch.testing.assert_close(y, x @ w.T)


def test_a_python_number_in_an_op_the_replay_lacks_is_named():
    x = torch.randn(3)
    with cpu_graph.capture() as graph:
        x * 2.0  # replayed: a multiply by the number's row (test_cpu_number_ops)
        x - 2.0  # the replay has no subtraction
    assert graph.unsupported is not None and "sub" in graph.unsupported


def test_an_in_place_write_is_replayed_or_refused_never_dropped():
    state, value = torch.zeros(4, 3), torch.ones(2, 3)
    idx, bias = torch.tensor([0, 2]), torch.randn(2, 3)
    with cpu_graph.capture() as graph:
        value.add_(bias)  # replayed: an elementwise op writing its first operand
    assert graph.unsupported is None
    value.copy_(torch.ones(2, 3))
    graph.replay()
    assert torch.equal(value, torch.ones(2, 3) + bias)
    with cpu_graph.capture() as graph:
        state.index_put_((idx,), value)  # its output is its input: not a view to skip
    assert graph.unsupported is not None and "index_put" in graph.unsupported


def test_a_value_read_on_the_host_is_not_replayable():
    x = torch.randn(3)
    with cpu_graph.capture() as graph:
        int(x.argmax())
    assert graph.unsupported is not None


@pytest.mark.parametrize("dtype", TYPES)
def test_a_concatenation_is_replayed_as_a_copy_of_each_part(dtype):
    """Phi-2's partial rotary: a head's rotated part beside the rest, a view whose rows lie apart; and
    a join along the first axis."""
    g = torch.Generator().manual_seed(4)
    x, r = torch.randn(3, 4, 10, generator=g).to(dtype), torch.randn(3, 4, 6, generator=g).to(dtype)
    with cpu_graph.capture() as graph:
        heads = torch.cat([r + r, x[:, :, 6:]], dim=-1)
        rows = torch.cat([x[:1], x[1:] + x[1:]], dim=0)
    assert graph.unsupported is None
    for _ in range(2):
        x.copy_(torch.randn(3, 4, 10, generator=g))
        r.copy_(torch.randn(3, 4, 6, generator=g))
        graph.replay()
        assert torch.equal(heads, torch.cat([r + r, x[:, :, 6:]], dim=-1))
        assert torch.equal(rows, torch.cat([x[:1], x[1:] + x[1:]], dim=0))


def test_a_concatenation_whose_rows_do_not_merge_is_not_replayed():
    x = torch.randn(4, 6, 8)
    with cpu_graph.capture() as graph:
        torch.cat([x.transpose(0, 1)[:, :, :3], x.transpose(0, 1)[:, :, 3:]], dim=-1)
    assert graph.unsupported is not None and "cat" in graph.unsupported


def test_outside_a_capture_nothing_is_recorded():
    x, w = torch.randn(2, 16), cpu_linear.pack(torch.randn(16, 16))
    with cpu_graph.capture() as graph:
        pass
    rt.linear(x, w)
    assert len(graph) == 0 and cpu_graph._recording.graph is None


def test_a_capture_records_its_own_thread_only():
    x, w = torch.randn(2, 16), cpu_linear.pack(torch.randn(16, 16))
    other = threading.Thread(target=lambda: [rt.linear(x, w) for _ in range(20)])
    with cpu_graph.capture() as graph:
        other.start()
        other.join()
        rt.linear(x, w)
    assert len(graph) == 1


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
                                  "tiny-phi2", "tiny-gpt2", "tiny-gemma2", "tiny-gemma3"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_a_replayed_decode_step_equals_the_eager_step(card, dtype):
    """The torch runner's captured step against the model's own eager decode, step after step from
    the same cache: rows at different positions, idle rows (padding), the logits, the tokens they
    choose and the cache. Qwen2's biases are added over rows (a broadcast the replay reads with a
    row stride of 0); Qwen3's per-head norms read q and k through a copy of the fused output's
    columns; Phi-2 and GPT-2 take LayerNorm and GELU's tanh form, and Phi-2 joins each head's rotated
    part to the rest (a concatenation); Gemma 2 and 3 scale the embedding by a number, add 1 to each norm's
    weight, and Gemma 2 caps its logits (tanh(x / cap) * cap)."""
    from linnet import nest
    from linnet.serve.runners import TorchRunner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # f16 on a CPU without f16 instructions: nest.load says it is slow
        model = nest.load(card, backend="torch", weights="random", seed=2, numerics="fast", compile=True,
                          generics={"Batch": 6, "MaxSeq": 40, "T": dtype})
    runner = TorchRunner(model)
    rng = np.random.default_rng(0)
    padding = np.full(6, 40, np.int32)
    runner.decode(np.zeros(6, np.int32), padding)  # the capture, on idle rows: it writes nothing
    assert isinstance(runner._graph, cpu_graph.CpuGraph), runner.not_replayed
    state = model.runner.state
    start = np.array([0, 3, 40, 7, 40, 1], np.int32)  # rows 2 and 4 idle
    tol = 1e-5 if dtype == "f32" else 2e-2
    for step in range(5):
        tokens = rng.integers(0, model.vocab, 6).astype(np.int32)
        positions = np.where(start < 40, start + step, 40).astype(np.int32)
        before = {name: getattr(model.runner, name).clone() for name in state}
        want = np.asarray(model.decode(tokens, positions).float())
        want_state = {name: getattr(model.runner, name).clone() for name in state}
        for name in state:
            getattr(model.runner, name).copy_(before[name])
        got = np.asarray(runner.decode(tokens, positions).float())
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
        for name in state:
            torch.testing.assert_close(getattr(model.runner, name), want_state[name], rtol=tol, atol=tol)


def test_a_step_the_replay_cannot_take_stays_eager_and_right(monkeypatch):
    """With the small ops on aten's path (pow, mean, rsqrt: nothing the replay runs), the runner's
    capture says which op stopped it, and every step runs eagerly, as the model's own decode."""
    from linnet import nest
    from linnet.kernels import cpu_ops
    from linnet.serve.runners import TorchRunner

    monkeypatch.setattr(cpu_ops, "serves", lambda *tensors: False)
    model = nest.load("tiny-llama", backend="torch", weights="random", seed=3, numerics="fast", compile=True,
                      generics={"Batch": 2, "MaxSeq": 16})
    runner = TorchRunner(model)
    tokens, positions = np.array([3, 4], np.int32), np.array([0, 16], np.int32)
    got = np.asarray(runner.decode(tokens, positions)).copy()
    assert runner._graph == "eager" and runner.not_replayed is not None
    model.reset()
    np.testing.assert_allclose(got, np.asarray(model.decode(tokens, positions)), rtol=1e-6, atol=1e-6)
    again = np.asarray(runner.decode(tokens, positions))  # eager from now on: the same step, the same logits
    np.testing.assert_allclose(again, got, rtol=1e-6, atol=1e-6)
    assert runner.compiles == 1


def test_a_capture_does_not_import_dynamo():
    """A dispatch mode's first call would import torch._dynamo (2.3 s of an eager process's start on
    this CPU) unless the mode opts out; a fresh process shows whether it did."""
    script = (
        "import torch\n"
        "from linnet.kernels import cpu_graph\n"
        "with cpu_graph.capture() as graph:\n"
        "    torch.ones(3) + torch.ones(3)\n"
        "assert graph.unsupported is None, graph.unsupported\n"
    )
    assert not imports_dynamo(script)
