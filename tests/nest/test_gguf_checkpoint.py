"""GGUFCheckpoint: real SmolLM2 tensors against transformers' GGUF loader, and
dequantization accuracy on small tensors written here."""

import re

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from linnet.nest.checkpoint import GGUFCheckpoint, open_checkpoint  # noqa: E402
from linnet.nest.errors import WeightsError  # noqa: E402
from linnet.nest.transforms import unpermute_rope  # noqa: E402

# GGUF -> HF names for llama. The production mapping lives in the .linnet card;
# this one is only the test's, to line our tensors up with transformers'.
_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    stem, suffix = gguf_name.rsplit(".", 1)
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m:
        return f"model.layers.{m[1]}.{_BLOCK[m[2]]}.{suffix}"
    return f"{_TOP[stem]}.{suffix}"


@pytest.fixture(scope="module")
def hf_reference(hf_gguf_reference):
    """transformers' dequantized, un-permuted tensors under HF names, and its config (see conftest)."""
    return hf_gguf_reference


def test_every_tensor_matches_transformers(gguf_ckpt, hf_reference):
    tensors, config = hf_reference
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    names = gguf_ckpt.names()
    assert len(names) == len(tensors) == 272
    for name in names:
        ours = gguf_ckpt.load(name)
        if ".attn_q." in name:
            ours = unpermute_rope(ours, heads)
        elif ".attn_k." in name:
            ours = unpermute_rope(ours, kv_heads)
        ref = tensors[hf_name(name)].numpy()
        assert ours.dtype == np.float32
        assert ours.shape == ref.shape == gguf_ckpt.shape(name), name
        np.testing.assert_array_equal(ours, ref, err_msg=name)


@pytest.mark.parametrize("dtype,framework", [("bf16", "torch"), ("f16", "torch"), ("f32", "torch"),
                                             ("bf16", "numpy")])
def test_bound_params_are_transformers_tensors_rounded_as_torch_rounds(gguf_ckpt, hf_reference, dtype, framework):
    """What nest.load binds on the CPU (read_weights, its first half; numpy: for JAX) is, bit for bit,
    transformers' dequantized, un-permuted tensor of each param converted by torch's `.to(T)`: the
    copy through numpy, Linnet's bf16 rounding (`bind._TorchArrays`) and the blocks decoded straight
    to bf16 (`GGUFCheckpoint.load(dtype="bf16")`) change no weight."""
    from linnet.nest.bind import checkpoint_pieces
    from linnet.nest.load import read_weights

    tensors, _ = hf_reference
    bound = read_weights("smollm2-135m-instruct", {"T": dtype}, "fast", cast_dtype=True, weights=gguf_ckpt,
                         tokenizer=False, framework=framework)
    types = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    bits = {2: torch.int16, 4: torch.int32}[types[dtype].itemsize]
    checked = 0
    for name, pieces in checkpoint_pieces(bound.module, "hf").items():
        for index, hf in pieces:
            got = bound.params[name][index]
            if framework == "numpy":  # (ml_dtypes' bfloat16: viewed as its bits, then as torch's)
                width = {2: np.int16, 4: np.int32}[types[dtype].itemsize]
                got = torch.from_numpy(np.ascontiguousarray(got).view(width)).view(types[dtype])
            want = tensors[hf].to(types[dtype])
            assert got.dtype == want.dtype and got.shape == want.shape, hf
            assert torch.equal(got.view(bits), want.view(bits)), hf
            checked += 1
    assert checked == 272


def test_config_matches_transformers(gguf_ckpt, hf_reference):
    _, ref = hf_reference
    cfg = gguf_ckpt.config()
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "rms_norm_eps", "rope_theta",
                "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "head_dim"):
        assert cfg[key] == ref[key], key
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is True and "output.weight" not in gguf_ckpt
    assert "rope_scaling" not in cfg


def test_shapes_dtypes_and_torch(gguf_ckpt):
    assert gguf_ckpt.format == "gguf"
    assert gguf_ckpt.shape("token_embd.weight") == (49152, 576)
    assert gguf_ckpt.shape("blk.0.attn_k.weight") == (192, 576)
    assert gguf_ckpt.shape("blk.0.ffn_down.weight") == (576, 1536)
    assert gguf_ckpt.stored_dtype("token_embd.weight") == "q8_0"
    assert gguf_ckpt.stored_dtype("blk.0.attn_q.weight") == "q4_1"
    assert gguf_ckpt.stored_dtype("blk.0.attn_norm.weight") == "f32"
    t = gguf_ckpt.load("blk.0.attn_norm.weight", framework="torch")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (576,)
    np.testing.assert_array_equal(t.numpy(), gguf_ckpt.load("blk.0.attn_norm.weight"))
    assert gguf_ckpt.metadata("general.architecture") == "llama"


def test_unknown_tensor_names_close_matches(gguf_ckpt):
    with pytest.raises(WeightsError, match=r"no tensor named 'blk\.0\.attn_qq\.weight'.*blk\.0\.attn_q\.weight"):
        gguf_ckpt.load("blk.0.attn_qq.weight")


# ------------------------------------------------------------ written here


def write_gguf(path, tensors: dict, arch="llama", big_endian=False):
    """tensors: name -> (array to store, GGML type or None for plain float); `big_endian`: as a
    big-endian machine writes it."""
    w = gguf.GGUFWriter(str(path), arch, endianess=gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data.copy(), raw_dtype=qtype)  # a copy: a big-endian writer swaps bytes in place
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def block_error_bound(x: np.ndarray, qtype) -> np.ndarray:
    """Largest error each 32-value block may have after quantizing, per type."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    if qtype == Q.Q8_0:      # scale amax/127, round to nearest
        bound = amax / 127 / 2
    elif qtype == Q.Q4_0:    # scale amax/8, the top value may clip by one step
        bound = amax / 8
    elif qtype == Q.Q4_1:    # 16 levels from min to max, round to nearest
        span = blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)
        bound = span / 15 / 2
    else:
        raise AssertionError(qtype)
    # the scale itself is stored as f16
    return np.broadcast_to(bound * 1.01 + amax * 2e-3, blocks.shape).reshape(x.shape)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_block_quant_round_trip(tmp_path, qtype):
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((6, 4, 64)).astype(np.float32) * rng.uniform(0.01, 3.0, (6, 4, 1)).astype(np.float32)
    path = write_gguf(tmp_path / "q.gguf", {"w": (quantize(x, qtype), qtype)})
    ckpt = GGUFCheckpoint(path)
    assert ckpt.stored_dtype("w") == qtype.name.lower()
    assert ckpt.shape("w") == x.shape
    got = ckpt.load("w")
    assert got.dtype == np.float32 and got.shape == x.shape
    err = np.abs(got - x)
    assert (err <= block_error_bound(x, qtype)).all(), float(err.max())


@pytest.mark.parametrize("qtype, rel", [(Q.F32, 0.0), (Q.F16, 2.0**-11), (Q.BF16, 2.0**-8)])
def test_float_types(tmp_path, qtype, rel):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 32)).astype(np.float32)
    stored = quantize(x, qtype)
    path = write_gguf(tmp_path / "f.gguf", {"w": (stored, qtype if stored.dtype == np.uint8 else None)})
    ckpt = open_checkpoint(path)
    assert ckpt.stored_dtype("w") == qtype.name.lower()
    got = ckpt.load("w")
    assert got.dtype == np.float32 and got.shape == (5, 32)
    np.testing.assert_allclose(got, x, rtol=rel, atol=0)
    assert torch.equal(ckpt.load("w", framework="torch"), torch.from_numpy(got.copy()))


# The gguf package cannot quantize Q4_K or Q6_K. Dequantizing them is gguf's
# own code, which transformers and llama.cpp's tools share; what is ours is
# the plumbing (256-value super-blocks, byte shapes, shape order), tested here
# on random blocks with sane scales.
_K_LAYOUT = {Q.Q4_K: ((0, 2),), Q.Q6_K: ((208, 2),)}  # where each block keeps its f16 scales


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_k_quant_plumbing(tmp_path, qtype):
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, blocks = 3, 2
    rng = np.random.default_rng(int(qtype))
    raw = rng.integers(0, 256, (rows, blocks, block_bytes), dtype=np.uint8)
    for offset, _ in _K_LAYOUT[qtype]:
        raw[..., offset:offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == Q.Q4_K:
        raw[..., 2:4] = np.frombuffer(np.float16(0.005).tobytes(), np.uint8)  # dmin
    raw = raw.reshape(rows, blocks * block_bytes)
    path = write_gguf(tmp_path / "k.gguf", {"w": (raw, qtype)})
    ckpt = GGUFCheckpoint(path)
    assert ckpt.stored_dtype("w") == qtype.name.lower()
    assert ckpt.shape("w") == (rows, blocks * block_values)
    got = ckpt.load("w")
    want = dequantize(raw, qtype).reshape(rows, blocks * block_values)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN scales, in every thread
@pytest.mark.parametrize("decoder", ["c", "gguf"])
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("shape", [(3, 256), (4, 30, 512), (4099, 256)])  # fewer rows than shares; experts; odd rows
def test_dequantize_over_cores_decodes_as_gguf_does(qtype, shape, decoder, monkeypatch):
    """Rows shared out over the cores (two at least, whatever this machine has), each share decoded
    by Linnet's C decoder or, where it is not built, gguf's own routine: every value as gguf's
    whole-tensor decode gives it (random block bytes: NaN scales and all)."""
    from linnet.kernels import gguf_blocks
    from linnet.nest import checkpoint

    monkeypatch.setattr(checkpoint, "_cores", lambda: 3)
    monkeypatch.setattr(checkpoint, "SPLIT_BYTES", 1)
    calls = []
    if decoder == "c":
        if not gguf_blocks.decodes(qtype):
            pytest.skip("Linnet's C decoders are not built here")
        decode_c = gguf_blocks.decode
        monkeypatch.setattr(gguf_blocks, "decode",
                            lambda rows, q, out, **kw: calls.append(len(rows)) or decode_c(rows, q, out, **kw))
    else:
        monkeypatch.setattr(gguf_blocks, "decodes", lambda q: False)
        decode = gguf.quants.dequantize
        monkeypatch.setattr(gguf.quants, "dequantize", lambda rows, q: calls.append(len(rows)) or decode(rows, q))
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(sum(shape))
    blocks = rng.integers(0, 256, (*shape[:-1], shape[-1] // block * block_bytes), dtype=np.uint8)
    got = checkpoint.dequantize(blocks, qtype)
    want = dequantize(blocks.reshape(-1, blocks.shape[-1]), qtype)
    assert got.dtype == np.float32 and got.shape == (int(np.prod(shape[:-1])), shape[-1])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # NaNs' bits too
    assert sum(calls) == len(want) and len(calls) == min(12, len(want))  # four shares a core, each row once


def test_a_big_endian_gguf_loads_its_plain_tensors(tmp_path):
    """Written on a big-endian machine: numbers come back as numbers (in this machine's order, for
    torch too); quantized blocks, whose scales gguf's decoders read in this machine's order, are
    refused by name rather than decoded wrong."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5
    ids = np.arange(6, dtype=np.int32).reshape(2, 3) * 1000
    q = quantize(np.ones((2, 32), np.float32), Q.Q8_0)
    path = write_gguf(tmp_path / "be.gguf", {"x": (x, None), "h": (x.astype(np.float16), None), "ids": (ids, None),
                                             "q": (q, Q.Q8_0)}, big_endian=True)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.architecture == "llama"
    np.testing.assert_array_equal(ckpt.load("x"), x)
    np.testing.assert_array_equal(ckpt.load("h"), x)
    np.testing.assert_array_equal(ckpt.load("ids", "torch").numpy(), ids)
    with pytest.raises(WeightsError, match="tensor 'q' is Q8_0 in a big-endian GGUF"):
        ckpt.load("q")


def test_truncated_gguf(tmp_path):
    x = np.ones((4, 32), np.float32)
    path = write_gguf(tmp_path / "t.gguf", {"w": (x, None)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match=r"t\.gguf: cannot read GGUF file"):
        GGUFCheckpoint(path)


def test_a_type_no_decoder_here_reads_is_named(tmp_path):
    """Q8_1 (llama.cpp's type for activations, not for a file's weights): neither Linnet's C nor gguf's
    numpy decodes it (gguf raises NotImplementedError), and the checkpoint says so by tensor and type."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    path = write_gguf(tmp_path / "q81.gguf", {"w": (np.zeros((2, block_bytes), np.uint8), Q.Q8_1)})
    with pytest.raises(NotImplementedError):
        dequantize(np.zeros((2, block_bytes), np.uint8), Q.Q8_1)
    ckpt = GGUFCheckpoint(path)
    assert ckpt.shape("w") == (2, block)
    with pytest.raises(WeightsError, match=r"q81\.gguf: tensor 'w' is Q8_1, which this gguf package cannot "
                                           r"dequantize$"):
        ckpt.load("w")


def test_open_checkpoint_errors(tmp_path):
    with pytest.raises(WeightsError, match="no such file or directory"):
        open_checkpoint(tmp_path / "nope.gguf")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0")
    with pytest.raises(WeightsError, match=r"weights\.bin: not a checkpoint linnet can read"):
        open_checkpoint(other)
    shard = tmp_path / "model-00001-of-00002.safetensors"  # was "not a checkpoint linnet can read" too
    shard.write_bytes(b"\0")
    with pytest.raises(WeightsError, match=rf"^{shard}: one safetensors file; .* give {tmp_path}$"):
        open_checkpoint(shard)


@pytest.mark.parametrize("mla, kv_b", [(False, None), (True, "attn_kv_b")])
def test_a_deepseek2_gguf_in_neither_of_llama_cpps_forms_is_refused(tmp_path, mla, kv_b):
    """A deepseek2 file in neither of the forms llama.cpp's converter writes (its MLA form: attn_k_b and
    attn_v_b, `_mla` lengths; the form from before it: kv_b_proj whole as attn_kv_b, the heads' widths under
    key_length and value_length, read as the MLA form: test_gguf) is refused by name, saying how to get the
    current form, not read as a model it is not: here the old form's keys without its attn_kv_b, and the
    MLA form's keys with attn_kv_b instead of attn_k_b and attn_v_b (which llama.cpp does not load either)."""
    w = gguf.GGUFWriter(str(tmp_path / "old.gguf"), "deepseek2")
    for key, value in (("block_count", 1), ("embedding_length", 8), ("attention.head_count", 2),
                       ("attention.head_count_kv", 2), ("attention.key_length", 12), ("attention.value_length", 8),
                       ("attention.kv_lora_rank", 4), ("rope.dimension_count", 4), ("leading_dense_block_count", 1),
                       ("expert_count", 2), ("expert_used_count", 1), ("expert_feed_forward_length", 8),
                       ("expert_shared_count", 1)):
        w.add_uint32(f"deepseek2.{key}", value)
    if mla:
        w.add_uint32("deepseek2.attention.key_length_mla", 12)
        w.add_uint32("deepseek2.attention.value_length_mla", 8)
    w.add_tensor(f"blk.0.{kv_b}.weight" if kv_b else "token_embd.weight", np.zeros((2 * (8 + 8), 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match=r"old\.gguf: a deepseek2 GGUF in neither llama\.cpp's MLA form .*nor the "
                                           r"form from before it .*convert the checkpoint again with a current "
                                           r"convert_hf_to_gguf\.py"):
        GGUFCheckpoint(tmp_path / "old.gguf").config()


def test_an_architecture_or_a_key_it_lacks_is_named_as_the_gguf_names_it(tmp_path):
    """A GGUF of an architecture Nest has none for names it (not a config.json's 'unknown'); a
    file missing a key every file of its architecture holds names that key, not a config.json's."""
    embed = {"token_embd.weight": (np.zeros((4, 8), np.float32), None)}
    with pytest.raises(WeightsError, match=r"GGUF architecture 'gemma' is not supported; supported: llama, qwen2"):
        GGUFCheckpoint(write_gguf(tmp_path / "g.gguf", embed, arch="gemma")).config()
    with pytest.raises(WeightsError, match=r"the GGUF metadata has no llama\.embedding_length"):
        GGUFCheckpoint(write_gguf(tmp_path / "l.gguf", embed)).config()


@pytest.mark.parametrize("key, value, vtype, says", [
    # each was a TypeError traceback ('<=' between str and int, len() of an int), or a ValueError from
    # int() that named no file
    ("split.count", "2", gguf.GGUFValueType.STRING, "split.count is '2', where llama.cpp reads a whole number"),
    ("tokenizer.ggml.tokens", 5, gguf.GGUFValueType.UINT32, "tokenizer.ggml.tokens is 5, not an array of strings"),
    ("tokenizer.ggml.bos_token_id", "<s>", gguf.GGUFValueType.STRING, "tokenizer.ggml.bos_token_id is '<s>', where"),
    ("llama.context_length", "4k", gguf.GGUFValueType.STRING, "llama.context_length is '4k', where llama.cpp reads a number"),
    # counts: said by the GGUF's own key (they were called config.json's num_attention_heads), and heads
    # that cannot share their key/value heads (an error inside the card's attention, before)
    ("llama.attention.head_count", 0, gguf.GGUFValueType.UINT32,
     "llama.attention.head_count is 0, where llama.cpp reads a count of 1 or more"),
    ("llama.attention.head_count_kv", 3, gguf.GGUFValueType.UINT32,
     "llama.attention.head_count (2) is no multiple of llama.attention.head_count_kv (3): the query heads cannot "
     "share the key/value heads evenly"),
])
def test_metadata_of_another_kind_than_llama_cpp_reads_is_named(tmp_path, key, value, vtype, says):
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(8)
    if key != "llama.attention.head_count":
        w.add_head_count(2)
    w.add_key_value(key, value, vtype)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(WeightsError, match=f"^{re.escape(f'{path}: its GGUF metadata {says}')}"):
        GGUFCheckpoint(path).config()


@pytest.mark.parametrize("arch", ["deepseek2", "gpt-oss"])
def test_tensors_read_from_others_decode_straight_to_bf16_too(tmp_path, arch):
    """An old deepseek2 file's attn_k_b / attn_v_b (cut from a quantized attn_kv_b) and gpt-oss's joined
    experts (a quantized gate and up interleaved) come back from `load(dtype="bf16")` in bf16, bit for bit
    their float32 load rounded by torch, as a stored tensor's do: not as a float32 copy."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), arch)
    if arch == "deepseek2":  # 2 heads of nope 8 + rope 4 keys and 8 values, a kv_lora_rank of 32
        for key, value in (("attention.head_count", 2), ("attention.key_length", 12),
                           ("attention.value_length", 8), ("rope.dimension_count", 4)):
            w.add_uint32(f"deepseek2.{key}", value)
        stored = {"blk.0.attn_kv_b.weight": (2 * (8 + 8), 32)}
        names = ["blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight"]
    else:
        stored = {f"blk.0.ffn_{part}_exps.weight": (2, 6, 64) for part in ("gate", "up")}
        names = ["blk.0.ffn_gate_up_exps.weight"]
    for name, shape in stored.items():
        w.add_tensor(name, quantize(rng.standard_normal(shape).astype(np.float32), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ckpt = GGUFCheckpoint(tmp_path / "m.gguf")
    for name in names:
        got, f32 = ckpt.load(name, "torch", dtype="bf16"), ckpt.load(name, "torch")
        assert got.dtype == torch.bfloat16 and got.shape == f32.shape == ckpt.shape(name), name
        assert torch.equal(got.view(torch.int16), f32.to(torch.bfloat16).view(torch.int16)), name
        as_numpy = ckpt.load(name, dtype="bf16")
        assert as_numpy.dtype.name == "bfloat16" and np.array_equal(as_numpy.view(np.int16), got.view(torch.int16))
