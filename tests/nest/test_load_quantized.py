"""nest.load(..., quantization="gguf"): a GGUF's Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q3_K / Q4_K / Q5_K / Q6_K /
IQ4_NL / IQ4_XS linears run in their blocks (`kernels.cpu_qlinear`), against the same file decoded at load (the
default); where it does not run, refused with what is supported; types the kernel does not read, decoded with a
notice."""

import ctypes

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.kernels import build, cpu_graph, cpu_linear
from linnet.kernels.cpu_qlinear import QuantTable, QuantWeight
from linnet.nest.quantized import check_quantization
from linnet.serve import Engine, Request

gguf = pytest.importorskip("gguf")
from test_load_gguf import PROMPTS, logits, write_typed_llama  # noqa: E402  (this folder's: tests/nest)

Q = gguf.GGMLQuantizationType
runs_here = pytest.mark.skipif(not cpu_linear.available(torch.float32), reason="Linnet's CPU kernels do not run here")


def load(path, quantization=None, compile=False, **kwargs):
    return nest.load(path, backend="torch", device="cpu", numerics="fast", compile=compile, tokenizer=False,
                     generics={"Batch": 3, "MaxSeq": 32, "T": "f32"}, quantization=quantization, **kwargs)


def greedy(model, new=8):
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=new, ignore_eos=True) for p in PROMPTS])
    return [list(c.tokens) for c in done]


def quant_weights(model) -> list:
    """The linear params that run in their blocks (each layer's weight, or its fused group's, a QuantWeight)."""
    def blocks(w):
        return isinstance(getattr(w, "fused", w), QuantWeight)

    runner = model.runner
    return [name for name in runner.linear_weights
            if all(map(blocks, getattr(runner, name) if runner.linear_weights[name] else [getattr(runner, name)]))]


@runs_here
@pytest.mark.parametrize("tied,qtype", [(tied, qtype) for qtype in (Q.Q8_0, Q.Q4_1, Q.Q4_K, Q.Q6_K)
                                        for tied in (False, True)]
                         # (Q5_K and Q4_0 in the mix below: the suite's time is counted)
                         + [(True, qtype) for qtype in (Q.Q5_0, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS)],
                         ids=lambda v: v.name if isinstance(v, Q) else ["own_head", "tied_head"][v])
def test_greedy_tokens_are_those_of_the_file_decoded_at_load(tied, qtype, tmp_path):
    """Every linear in its blocks (q, k and v, gate and up fused; a tied head from the embedding's
    blocks, and the embedding's rows gathered from the head's), the tokens of Engine.run as the same file decoded to f32
    gives them, and the logits within f32 accumulation's rounding."""
    path = write_typed_llama(tmp_path / f"tiny-{qtype.name}.gguf", qtype, tied=tied)
    decoded, quantized = load(path), load(path, "gguf")
    assert len(quant_weights(quantized)) == len(quantized.runner.linear_weights)
    # a tied embedding is gathered from its head's panels, no decoded copy of it kept
    assert isinstance(quantized.runner.embed, QuantTable) == tied
    assert not tied or quantized.runner.embed.weight is quantized.runner.lm_head
    assert not quant_weights(decoded)
    assert quantized.runner.weight_bytes() < decoded.runner.weight_bytes() / 2
    want, got = logits(decoded), logits(quantized)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    decoded.reset(), quantized.reset()
    assert greedy(quantized) == greedy(decoded)


@runs_here
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "captured"])
def test_a_q4_k_m_files_mix_runs_each_layer_in_its_own_blocks(compile, tmp_path):
    """A Q4_K_M file as llama.cpp's quantize writes one: Q4_K, but Q6_K for the head and for attn_v and ffn_down
    in some layers, and where a row is not whole super-blocks (SmolLM2's 576) Q5_0 for Q4_K and Q8_0 for Q6_K;
    and, for the other types run in their blocks, Q5_K (Q5_K_M's) gate and up in one layer, a Q5_1 (Q5_K_M's
    Q5_K where a row is not whole super-blocks) attn_output in it and a Q4_0 one in the other; Q3_K, IQ4_NL and
    IQ4_XS (Q3_K_M's, IQ4_NL's and IQ4_XS's files), Q3_K in Q6_K's panels and IQ4_XS in IQ4_NL's. Every linear
    runs in its blocks, each layer in its own type: q, k and v three matmuls in the layer whose q is Q4_K, k IQ4_XS
    and v Q6_K, and joined in the one whose q is IQ4_XS and k and v IQ4_NL; gate and up joined where both are Q5_K,
    and in the other layer a Q5_0 gate and a Q8_0 up two matmuls (Q5_0 has panels of its own: SmolLM2's Q4_K_M's q
    and k Q5_0 with v Q8_0 run so), whose down is Q3_K. The logits are the file's tensors as gguf's own `dequantize`
    decodes them (written to an f32 file) give them, and the greedy tokens through Engine.run (a captured decode step
    replaying the per-layer mix) too."""
    mix = {"output.weight": Q.Q6_K, "blk.0.attn_v.weight": Q.Q6_K, "blk.0.ffn_down.weight": Q.Q6_K,
           "blk.1.ffn_gate.weight": Q.Q5_0, "blk.1.ffn_up.weight": Q.Q8_0, "blk.1.ffn_down.weight": Q.Q3_K,
           "blk.0.attn_k.weight": Q.IQ4_XS, "blk.1.attn_q.weight": Q.IQ4_XS, "blk.1.attn_k.weight": Q.IQ4_NL,
           "blk.1.attn_v.weight": Q.IQ4_NL, "blk.0.ffn_gate.weight": Q.Q5_K, "blk.0.ffn_up.weight": Q.Q5_K,
           "blk.1.attn_output.weight": Q.Q4_0, "blk.0.attn_output.weight": Q.Q5_1}
    path = write_typed_llama(tmp_path / "tiny-Q4_K_M.gguf", Q.Q4_K, types=mix)
    reference = load(write_typed_llama(tmp_path / "tiny-Q4_K_M-f32.gguf", Q.Q4_K, types=mix, decoded=True))
    quantized = load(path, "gguf", compile=compile)
    runner = quantized.runner
    assert sorted(quant_weights(quantized)) == sorted(runner.linear_weights)
    assert runner.weight_bytes() < reference.runner.weight_bytes() / 2
    assert [w.qtype for w in runner.w_down] == [Q.Q6_K, Q.Q6_K]  # (Q3_K in Q6_K's panels)
    q, k, v = runner.wq[0], runner.wk[0], runner.wv[0]  # layer 0: three weights of their own
    assert all(isinstance(w, QuantWeight) for w in (q, k, v))
    assert (q.qtype, k.qtype, v.qtype) == (Q.Q4_K, Q.IQ4_NL, Q.Q6_K)  # (IQ4_XS in IQ4_NL's panels)
    q, k, v = runner.wq[1], runner.wk[1], runner.wv[1]  # layer 1: one joined weight in IQ4_NL's panels
    assert q.fused is k.fused is v.fused and q.fused.qtype == Q.IQ4_NL and q.fused.n == v.stop
    assert (runner.w_gate[1].qtype, runner.w_up[1].qtype) == (Q.Q5_0, Q.Q8_0)
    assert runner.w_gate[0].fused is runner.w_up[0].fused and runner.w_gate[0].fused.qtype == Q.Q5_K
    assert [w.qtype for w in runner.wo] == [Q.Q5_K, Q.Q4_K]  # (Q5_1 in Q5_K's panels, Q4_0 in Q4_K's)
    want, got = logits(reference), logits(quantized)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    reference.reset(), quantized.reset()
    assert greedy(quantized, new=12) == greedy(reference, new=12)


@runs_here
def test_a_captured_decode_step_replays_the_quantized_linears(tmp_path):
    """compile=True: the CPU graph records cpu_qlinear's calls (cpu_graph.c's tasks), the tied embedding's
    gather from its head's panels among them, and replays them: the tokens of the file decoded at load."""
    path = write_typed_llama(tmp_path / "tiny-Q4_1.gguf", Q.Q4_1, tied=True)
    model = load(path, "gguf", compile=True)
    assert isinstance(model.runner.embed, QuantTable)
    engine = Engine(model)
    done, _ = engine.run([Request(prompt=p, max_new_tokens=12, ignore_eos=True) for p in PROMPTS])
    graph = engine.runner._graph
    assert isinstance(graph, cpu_graph.CpuGraph), engine.runner.not_replayed
    assert ctypes.cast(build.cpu_kernels().linnet_task_qgather, ctypes.c_void_p).value in graph.tasks
    assert [list(c.tokens) for c in done] == greedy(load(path), new=12)


@runs_here
def test_types_the_kernel_does_not_read_are_decoded_with_a_notice(tmp_path):
    path = write_typed_llama(tmp_path / "tiny-Q2_K.gguf", Q.Q2_K)
    with pytest.warns(UserWarning, match=r"quantization='gguf' keeps Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, "
                                         r"Q6_K, IQ4_NL and IQ4_XS blocks; its Q2_K tensors are decoded to T"):
        quantized = load(path, "gguf")
    assert not quant_weights(quantized)
    np.testing.assert_array_equal(logits(quantized), logits(load(path)))


@pytest.mark.parametrize("kind,device,numerics,says", [
    ("jax", "cpu", "fast", "not with the jax backend"),
    ("torch", "cuda", "fast", "not with device 'cuda'"),
    ("torch", "cpu", "exact", "not with numerics='exact'"),
])
def test_where_it_does_not_run_it_is_refused_saying_where_it_does(kind, device, numerics, says):
    with pytest.raises(ValueError, match="quantization='gguf' runs on the torch backend on the CPU, with "
                                         "numerics='fast', reading a GGUF file; " + says):
        check_quantization("gguf", kind, device, numerics)


def test_an_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="quantization='awq': Linnet takes 'gguf'"):
        check_quantization("awq", "torch", "cpu", "fast")


def test_weights_that_are_not_a_gguf_are_refused(tiny_hf):
    _, directory = tiny_hf
    with pytest.raises(ValueError, match=r"reading a GGUF file; not with .*Tiny-Llama \(a safetensors checkpoint\)"):
        nest.load(directory, numerics="fast", tokenizer=False, quantization="gguf")
    with pytest.raises(ValueError, match="reading a GGUF file; not with random weights"):
        nest.load("smollm2-135m-instruct", weights="random", numerics="fast", tokenizer=False,
                  generics={"MaxSeq": 16}, quantization="gguf")
    with pytest.raises(ValueError, match="not with the jax backend, numerics='exact'"):
        nest.load("smollm2-135m-instruct", backend="jax", tokenizer=False, quantization="gguf")


@runs_here
def test_without_the_cpu_kernels_the_blocks_are_decoded_with_a_warning(tmp_path, monkeypatch):
    path = write_typed_llama(tmp_path / "tiny-Q8_0.gguf", Q.Q8_0)
    monkeypatch.setattr(cpu_linear, "library", lambda: None)
    with pytest.warns(UserWarning, match="Linnet's CPU kernels do not run here .* the GGUF's blocks are decoded to T"):
        model = load(path, "gguf")
    assert not quant_weights(model)


@runs_here
def test_smollm2_runs_in_its_blocks_as_decoded_within_quantization(gguf_path):
    """The embedded Q4_1 file: the first greedy tokens as its bf16 load (decoded) gives them, and
    the logits no farther from the file decoded to f32 than that bf16 load is (its weights rounded
    to bf16; here they stay as the blocks hold them, the activations bf16 in both)."""
    loaded = {name: nest.load("smollm2-135m-instruct", numerics="fast", tokenizer=False, cast_dtype=True,
                              generics={"Batch": 1, "MaxSeq": 64, "T": t}, quantization=quantization)
              for name, t, quantization in [("f32", "f32", None), ("bf16", "bf16", None), ("gguf", "bf16", "gguf")]}
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712]
    n = len(prompt)
    scores = {}
    for name, model in loaded.items():
        scores[name] = np.asarray(model.prefill(np.array(prompt, np.int32), np.arange(n, dtype=np.int32),
                                                np.zeros(n, np.int32), np.array([n - 1], np.int32)))[0]
        model.reset()
    bf16_error, gguf_error = (np.abs(scores[name] - scores["f32"]).max() for name in ("bf16", "gguf"))
    assert gguf_error <= 1.5 * bf16_error, (gguf_error, bf16_error)
    runs = {name: Engine(model).run([Request(prompt=prompt, max_new_tokens=8, ignore_eos=True)])[0][0].tokens
            for name, model in loaded.items()}
    assert runs["gguf"] == runs["bf16"]
