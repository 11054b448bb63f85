"""A GGUF that is not in the registry: the tiny transformers Llama converted as llama.cpp's converter
does (GGUF names, q/k rows permuted, llama.* metadata) loads through nest.load(path), with a card
written from the GGUF's metadata, and gives transformers' logits. A truncated GGUF is an error that
names the file and the tensor cut short."""

from pathlib import Path

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.nest.checkpoint import GGUFCheckpoint
from linnet.nest.errors import WeightsError

gguf = pytest.importorskip("gguf")

PROMPTS = [[5, 17, 200, 3, 99, 41, 7], [250, 1, 64, 128, 9]]


def logits(model):
    tokens = np.concatenate([np.array(p, np.int32) for p in PROMPTS])
    positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in PROMPTS])
    rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(PROMPTS)])
    last = np.cumsum([len(p) for p in PROMPTS]).astype(np.int32) - 1
    return np.asarray(model.prefill(tokens, positions, rows, last))


@pytest.mark.parametrize("qtype,tolerance", [(None, 1e-4), (gguf.GGMLQuantizationType.Q8_0, 2e-2)])
def test_gguf_without_a_card_matches_transformers(tiny_hf, tmp_path, qtype, tolerance, to_gguf):
    hf_model, _ = tiny_hf
    path = to_gguf(hf_model, tmp_path / "tiny.gguf", qtype)
    model = nest.load(path, backend="torch", generics={"Batch": 2, "MaxSeq": 16}, tokenizer=False)
    assert model.card == "tiny" and model.weights == str(path)
    ours = logits(model)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ref = hf_model(input_ids=torch.tensor([p])).logits[0, -1].numpy()
            assert np.abs(ours[i] - ref).max() / np.abs(ref).max() <= tolerance


def test_truncated_gguf_names_the_tensor(tiny_hf, tmp_path, to_gguf):
    hf_model, _ = tiny_hf
    path = to_gguf(hf_model, tmp_path / "tiny.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-5000])
    with pytest.raises(WeightsError) as e:
        nest.load(path, tokenizer=False)
    msg = str(e.value)
    assert msg.startswith(f"{path}: cannot read GGUF file") and "truncated or corrupt" in msg
    assert "tensor '" in msg and f"but the file has {len(data) - 5000}" in msg


# --------------------------------------------- each type llama.cpp users have, against llama.cpp

Q = gguf.GGMLQuantizationType
DIM, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 264  # rows of 256: whole K-quant blocks
# the block types gguf cannot quantize (the K-quants, IQ4_NL, IQ4_XS): a block's f16 scale d, where it is
# (gguf.quants' layouts), and for the types that subtract a minimum, the levels of a value: dmin (after d)
# is set to center the values on 0, as a quantizer's are (Q2_K: 4 levels times a 4-bit scale, less a 4-bit
# minimum times dmin)
K_SCALES = {Q.Q2_K: (80, 4), Q.Q3_K: (108, None), Q.Q4_K: (0, 16), Q.Q5_K: (0, 32), Q.Q6_K: (208, None),
            Q.IQ4_NL: (0, None), Q.IQ4_XS: (0, None)}


def k_quant_blocks(rng, shape, qtype) -> np.ndarray:
    """Random blocks of a K-quant type (or IQ4_NL, IQ4_XS) with scales that give weights of the size and sign a
    model's have (the gguf package has no quantizer for them; its decoder is the reference, whatever the bytes)."""
    values, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (shape[0], shape[1] // values, nbytes), dtype=np.uint8)
    if qtype == Q.Q6_K:  # signed 8-bit sub-block scales, kept to 64..127: sub-blocks of like size, as in a model
        raw[..., 192:208] = rng.integers(64, 128, raw[..., 192:208].shape).astype(np.uint8)
    offset, levels = K_SCALES[qtype]
    d = rng.uniform(2e-5, 6e-5, raw.shape[:2]).astype(np.float16)
    raw[..., offset:offset + 2] = d[..., None].view(np.uint8)
    if levels:
        raw[..., offset + 2:offset + 4] = (d * np.float16((levels - 1) / 2))[..., None].view(np.uint8)
    return raw.reshape(shape[0], -1)


def write_typed_llama(path, qtype, seed=0, split_max_tensors=0, tied=False, types=None, decoded=False):
    """A random Llama whose matrices (embeddings and output too) are stored in `qtype`, its norms in
    f32, as llama.cpp's quantize leaves them; a byte vocabulary llama.cpp can load. With
    `split_max_tensors`, split as llama.cpp's gguf-split writes it (gguf's writer's own splitting:
    PATH-0000i-of-0000N.gguf, the first returned). `tied`: no output.weight (the head is the
    embedding's, as SmolLM2's). `types`: tensors stored in a type of their own, by name (a Q4_K_M file's mix).
    `decoded`: the same model (same seed, same blocks) with each quantized tensor stored in f32 as gguf's
    own `dequantize` decodes its blocks, a reference for the file with the blocks."""
    rng, default = np.random.default_rng(seed), qtype
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"w{i}" for i in range(VOCAB - 259)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259))
    head_dim = DIM // HEADS
    shapes = {"token_embd.weight": (VOCAB, DIM), "output_norm.weight": (DIM,)}
    if not tied:
        shapes["output.weight"] = (VOCAB, DIM)
    for i in range(LAYERS):
        shapes.update({f"blk.{i}.attn_norm.weight": (DIM,), f"blk.{i}.attn_q.weight": (DIM, DIM),
                       f"blk.{i}.attn_k.weight": (KV_HEADS * head_dim, DIM),
                       f"blk.{i}.attn_v.weight": (KV_HEADS * head_dim, DIM), f"blk.{i}.attn_output.weight": (DIM, DIM),
                       f"blk.{i}.ffn_norm.weight": (DIM,), f"blk.{i}.ffn_gate.weight": (FFN, DIM),
                       f"blk.{i}.ffn_up.weight": (FFN, DIM), f"blk.{i}.ffn_down.weight": (DIM, FFN)})
    for name, shape in shapes.items():
        qtype = (types or {}).get(name, default)
        if len(shape) == 1:
            w.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        if qtype in K_SCALES:
            stored = k_quant_blocks(rng, shape, qtype)
        else:
            stored = gguf.quants.quantize((0.05 * rng.standard_normal(shape)).astype(np.float32), qtype)
        if stored.dtype != np.uint8:  # a float type, as it is
            w.add_tensor(name, stored)
        elif decoded:
            w.add_tensor(name, gguf.quants.dequantize(stored, qtype).astype(np.float32))
        else:
            w.add_tensor(name, stored, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(Path(path))[0]


def transformers_reading(path):
    """transformers' own reading of a llama GGUF (gguf's decoders, its un-permuting of q and k) as a
    LlamaForCausalLM in f32."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                      intermediate_size=FFN, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(np.asarray(v, np.float32)) for k, v in tensors.items()})
    return model


# llama.cpp's CPU matmuls round the activations to the weights' kind (f16, bf16) or quantize them to
# 8 bits a block (Q8_0 for the 32-value types, Q8_K for the K-quants): its logits are off by that
# rounding carried through two layers (measured here, in this order: 9e-7, 6e-4, 6e-3, 2e-2, 2e-2,
# 1.4e-2, 1.4e-2, 3.6e-2), which transformers' f32 forward over the same weights shows too (Linnet is
# within 1.2e-6 of that)
LLAMA_CPP_ROUNDING = {Q.F32: 1e-5, Q.F16: 3e-3, Q.BF16: 2e-2, Q.Q8_0: 6e-2, Q.Q4_0: 6e-2,
                      Q.Q4_K: 6e-2, Q.Q5_K: 6e-2, Q.Q6_K: 6e-2}


def llama_cpp_reading(path, monkeypatch):
    """llama.cpp (llama-cpp-python) holding the file, on one thread, its cache in f32."""
    llama_cpp = pytest.importorskip("llama_cpp")
    # llama.cpp's AMX and repacked kernels (these types, on a CPU with AMX) crash on this machine; its plain
    # CPU kernels compute the same numbers
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def plain_kernels():
        params = defaults()
        params.use_extra_bufts = False
        return params

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", plain_kernels)
    return llama_cpp.Llama(model_path=str(path), n_ctx=16, logits_all=True, verbose=False, n_threads=1,
                           type_k=0, type_v=0)


@pytest.mark.parametrize("qtype", list(LLAMA_CPP_ROUNDING), ids=lambda q: q.name)
def test_each_common_type_reads_as_gguf_decodes_it_and_runs_as_llama_cpp(qtype, tmp_path, monkeypatch):
    """Every tensor as gguf's own decoder gives it, bit for bit; the model's logits as transformers'
    reading of the file gives them, and as llama.cpp's, within its rounding of activations."""
    path = write_typed_llama(tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    reader, ckpt = gguf.GGUFReader(str(path)), GGUFCheckpoint(path)
    for t in reader.tensors:
        want = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(ckpt.shape(t.name))
        np.testing.assert_array_equal(ckpt.load(t.name).view(np.uint32), want.view(np.uint32), err_msg=t.name)
    model = nest.load(path, backend="torch", generics={"Batch": 2, "MaxSeq": 16}, tokenizer=False)
    ours = logits(model)
    reference = transformers_reading(path)
    llm = llama_cpp_reading(path, monkeypatch)
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            want = reference(input_ids=torch.tensor([prompt])).logits[0, -1].numpy()
        scale = np.abs(want).max()
        assert np.abs(ours[i] - want).max() / scale <= 1e-5
        llm.reset()
        llm.eval(prompt)
        assert np.abs(ours[i] - np.array(llm.scores[len(prompt) - 1])).max() / scale <= LLAMA_CPP_ROUNDING[qtype]


def test_a_split_gguf_loads_from_its_first_file_as_llama_cpp_loads_it(tmp_path, monkeypatch):
    """A GGUF in three files (gguf's writer splits as llama.cpp's gguf-split): its first file loads the
    whole model, as llama.cpp loads it, with the logits of the same model in one file. Before, only the
    first file's tensors were read, and the rest were named missing."""
    (tmp_path / "one").mkdir()
    whole = write_typed_llama(tmp_path / "one" / "tiny.gguf", Q.Q8_0)
    first = write_typed_llama(tmp_path / "tiny.gguf", Q.Q8_0, split_max_tensors=8)
    assert first.name == "tiny-00001-of-00003.gguf"
    ckpt = GGUFCheckpoint(first)
    assert ckpt.file_of("blk.1.ffn_down.weight") == str(tmp_path / "tiny-00003-of-00003.gguf")
    model = nest.load(first, backend="torch", generics={"Batch": 2, "MaxSeq": 16}, tokenizer=False)
    assert model.info["unused_tensors"] == []
    ours = logits(model)
    np.testing.assert_array_equal(ours, logits(nest.load(whole, backend="torch", generics={"Batch": 2, "MaxSeq": 16},
                                                         tokenizer=False)))
    llm = llama_cpp_reading(first, monkeypatch)
    for i, prompt in enumerate(PROMPTS):
        llm.reset()
        llm.eval(prompt)
        want = np.array(llm.scores[len(prompt) - 1])
        assert np.abs(ours[i] - want).max() / np.abs(want).max() <= LLAMA_CPP_ROUNDING[Q.Q8_0]


def test_a_split_gguf_missing_a_file_or_passed_by_another_is_named(tmp_path):
    first = write_typed_llama(tmp_path / "tiny.gguf", Q.F16, split_max_tensors=8)
    second, third = (tmp_path / f"tiny-0000{i}-of-00003.gguf" for i in (2, 3))
    with pytest.raises(WeightsError, match=rf"{second}: split 2 of 3 of a split GGUF; pass its first file, {first}"):
        GGUFCheckpoint(second)
    renamed = tmp_path / "model.gguf"
    first.rename(renamed)
    with pytest.raises(WeightsError, match=r"model.gguf: split 1 of 3 of a split GGUF, whose files must be named"):
        GGUFCheckpoint(renamed)
    renamed.rename(first)
    third_bytes = third.read_bytes()
    third.write_bytes(second.read_bytes())  # split 2 under split 3's name
    with pytest.raises(WeightsError, match=rf"{third}: says it is split 2 of 3, not 3 of 3 as its name does"):
        GGUFCheckpoint(first)
    held = gguf.GGUFReader(str(second)).tensors[0].name
    w = gguf.GGUFWriter(str(third), "llama")  # split 3, holding a tensor split 2 holds
    w.add_uint16("split.no", 2)
    w.add_uint16("split.count", 3)
    w.add_int32("split.tensors.count", 99)
    w.add_tensor(held, np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match=rf"{third}: holds tensor '{held}', which {second} holds too"):
        GGUFCheckpoint(first)
    third.write_bytes(third_bytes)
    kept = tmp_path / "kept.gguf"  # split 3's own tensors, and one more: more than the first file counts
    kept.write_bytes(third_bytes)
    w = gguf.GGUFWriter(str(third), "llama")
    w.add_uint16("split.no", 2)
    w.add_uint16("split.count", 3)
    for t in gguf.GGUFReader(str(kept)).tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("extra.weight", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    total = gguf.GGUFReader(str(first)).fields["split.tensors.count"].contents()
    with pytest.raises(WeightsError, match=rf"{first}: its 3 splits hold {total + 1} tensors, and the first says "
                                           rf"{total}$"):
        GGUFCheckpoint(first)
    third.write_bytes(third_bytes)
    GGUFCheckpoint(first)  # whole again
    third.unlink()
    with pytest.raises(WeightsError, match=rf"{third}: missing; split 3 of 3 of {first}"):
        nest.load(first, tokenizer=False)
