"""SafetensorsCheckpoint on a tiny random Llama saved by transformers, sharded."""

import json
import shutil

import numpy as np
import pytest
import torch

from linnet.nest.checkpoint import SafetensorsCheckpoint, open_checkpoint
from linnet.nest.errors import WeightsError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A bf16 tiny Llama (hidden 64, 2 layers) saved in >= 3 shards, and its state_dict."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out, max_shard_size="20KB")
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture
def tiny_copy(tiny, tmp_path):
    src, _ = tiny
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_sharded_load_equals_state_dict(tiny):
    path, state = tiny
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    ckpt = open_checkpoint(path)
    assert isinstance(ckpt, SafetensorsCheckpoint) and ckpt.format == "safetensors"
    assert sorted(ckpt.names()) == sorted(state)
    for name, want in state.items():
        assert ckpt.shape(name) == tuple(want.shape)
        assert ckpt.stored_dtype(name) == "bf16"
        got = ckpt.load(name, framework="torch")
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want), name


def test_bf16_as_numpy(tiny):
    """numpy reads bf16 itself (no torch): every tensor's bits as transformers saved them, a
    read-only view of the file."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    path, state = tiny
    ckpt = SafetensorsCheckpoint(path)
    for name, want in state.items():
        got = ckpt.load(name)
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == tuple(want.shape), name
        assert not got.flags.writeable
        np.testing.assert_array_equal(got.view(np.int16), want.view(torch.int16).numpy(), err_msg=name)


def test_config_matches(tiny):
    path, _ = tiny
    cfg = SafetensorsCheckpoint(path).config()
    assert cfg == json.loads((path / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (64, 2, 2)
    assert cfg["architectures"] == ["LlamaForCausalLM"]


def test_single_file_f32_numpy(tmp_path):
    from safetensors.numpy import save_file

    arrays = {"a.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([1, 2], np.int64)}
    save_file(arrays, str(tmp_path / "model.safetensors"))
    ckpt = open_checkpoint(tmp_path / "model.safetensors")  # a file inside the dir also works
    assert sorted(ckpt.names()) == ["a.weight", "b"]
    assert ckpt.stored_dtype("a.weight") == "f32" and ckpt.stored_dtype("b") == "i64"
    np.testing.assert_array_equal(ckpt.load("a.weight"), arrays["a.weight"])
    np.testing.assert_array_equal(ckpt.load("b", framework="torch").numpy(), arrays["b"])
    with pytest.raises(WeightsError, match="no config.json"):
        ckpt.config()


def test_missing_shard(tiny_copy):
    index = tiny_copy / "model.safetensors.index.json"
    shard = sorted(set(json.loads(index.read_text())["weight_map"].values()))[1]
    (tiny_copy / shard).unlink()
    with pytest.raises(WeightsError) as e:
        SafetensorsCheckpoint(tiny_copy)
    assert shard in str(e.value) and str(index) in str(e.value) and "missing" in str(e.value)


def test_truncated_shard(tiny_copy):
    shard = sorted(tiny_copy.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(WeightsError, match="truncated or corrupt") as e:
        SafetensorsCheckpoint(tiny_copy)
    assert str(shard) in str(e.value)


def test_truncated_header(tiny_copy):
    shard = sorted(tiny_copy.glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:5])
    with pytest.raises(WeightsError, match=shard.name):
        SafetensorsCheckpoint(tiny_copy)


def test_missing_config(tiny_copy):
    (tiny_copy / "config.json").unlink()
    ckpt = SafetensorsCheckpoint(tiny_copy)  # the weights alone still read
    with pytest.raises(WeightsError) as e:
        ckpt.config()
    assert str(tiny_copy) in str(e.value) and "no config.json" in str(e.value)


def test_a_config_that_is_not_an_object(tiny_copy):
    (tiny_copy / "config.json").write_text("[1, 2]")  # was an AttributeError from the first .get
    with pytest.raises(WeightsError, match=r"config.json: holds a JSON list, not a config object"):
        SafetensorsCheckpoint(tiny_copy).config()


def test_no_weights(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"no model\.safetensors.*pickle weights"):
        SafetensorsCheckpoint(tmp_path)
    (tmp_path / "m.Q4_0.gguf").write_bytes(b"")
    with pytest.raises(WeightsError, match=r"pass the file itself: .*m\.Q4_0\.gguf"):
        SafetensorsCheckpoint(tmp_path)


def test_index_names_tensor_its_shard_lacks(tiny_copy):
    index = tiny_copy / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.extra.weight"] = next(iter(data["weight_map"].values()))
    index.write_text(json.dumps(data))
    with pytest.raises(WeightsError, match="model.extra.weight"):
        SafetensorsCheckpoint(tiny_copy)


@pytest.mark.parametrize("elsewhere", ["../outside.safetensors", "/etc/hostname"])
def test_an_index_naming_a_shard_outside_the_folder_reads_nothing_from_there(tiny_copy, elsewhere):
    """A shard is a file of the model's folder: an index naming one elsewhere is refused, not followed."""
    index = tiny_copy / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.norm.weight"] = elsewhere
    index.write_text(json.dumps(data))
    with pytest.raises(WeightsError, match=f"names a shard outside the model's folder: {elsewhere}"):
        SafetensorsCheckpoint(tiny_copy)


def test_a_shard_that_is_a_folder_is_named_as_one(tiny_copy):
    index = tiny_copy / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.norm.weight"] = "sub"
    index.write_text(json.dumps(data))
    (tiny_copy / "sub").mkdir()
    with pytest.raises(WeightsError, match=f"^{tiny_copy / 'sub'}: is a directory, not a file; shard sub"):
        SafetensorsCheckpoint(tiny_copy)


def test_unknown_name(tiny):
    ckpt = SafetensorsCheckpoint(tiny[0])
    for read in (ckpt.load, ckpt.shape, ckpt.stored_dtype):
        with pytest.raises(WeightsError, match="did you mean 'model.norm.weight'"):
            read("model.norm.weights")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_tensor_reads_as_numpy_as_torch_reads_it(tmp_path, dtype):
    """safetensors' own numpy reader fails on float8 ("module 'numpy' has no attribute 'float8_e4m3fn'"):
    the file's bytes are viewed as ml_dtypes' float8, as bf16 is."""
    from safetensors.torch import save_file

    t = torch.linspace(-4, 4, 12).reshape(3, 4).to(dtype)
    save_file({"w": t}, str(tmp_path / "model.safetensors"))
    ours = SafetensorsCheckpoint(tmp_path).load("w")
    assert ours.dtype.name == str(dtype).removeprefix("torch.") and ours.shape == (3, 4)
    np.testing.assert_array_equal(ours.view(np.uint8), t.view(torch.uint8).numpy())
    np.testing.assert_array_equal(ours.astype(np.float32), t.float().numpy())


@pytest.mark.parametrize("file, content, says", [
    ("model.safetensors.index.json", "{", r"index\.json: not a valid safetensors index \(Expecting"),
    ("model.safetensors.index.json", '{"metadata": {}}',
     r"index\.json: not a valid safetensors index \(an object whose weight_map names each tensor's shard file; it "
     r"holds \{\"metadata\": \{\}\}\)"),
    # a list: was Python's "list indices must be integers or slices, not str"
    ("model.safetensors.index.json", '[["lm_head.weight", "model.safetensors"]]',
     r"index\.json: not a valid safetensors index \(an object whose weight_map .* it holds \[\[\"lm_head"),
    ("config.json", "{", r"config\.json: not valid JSON \(Expecting"),
    # a shard that is a number, or pairs for the map: were TypeErrors (sorting the shards' names)
    ("model.safetensors.index.json", '{"weight_map": {"lm_head.weight": 3}}',
     r"index\.json: not a valid safetensors index \(its weight_map names each tensor's shard file; it holds 3\)"),
    ("model.safetensors.index.json", '{"weight_map": [["lm_head.weight", "model.safetensors"]]}',
     r"it holds \[\[\"lm_head.weight\", \"model.safetensors\"\]\]\)"),
    # nested past Python's recursion limit: was a RecursionError
    pytest.param("config.json", "[" * 100_000 + "]" * 100_000, r"config\.json: not valid JSON \(maximum recursion depth",
                 id="config-nested-deep"),
])
def test_a_broken_json_file_is_named(tiny_copy, file, content, says):
    (tiny_copy / file).write_text(content)
    with pytest.raises(WeightsError, match=says) as e:
        SafetensorsCheckpoint(tiny_copy).config()
    assert str(e.value).startswith(f"{tiny_copy / file}: ")


def test_a_file_is_not_a_model_directory(tiny):
    shard = sorted(tiny[0].glob("*.safetensors"))[0]
    with pytest.raises(WeightsError, match=f"^{shard}: not a directory$"):
        SafetensorsCheckpoint(shard)
