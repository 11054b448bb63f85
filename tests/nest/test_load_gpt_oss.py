"""gpt-oss checkpoints: a random tiny `GptOssForCausalLM` saved by transformers loads through
nest.load with a card written from its config.json, with its experts stored as they are in
memory or, as on the Hugging Face hub, in MXFP4; both give transformers' logits."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from linnet import nest
from linnet.nest.checkpoint import open_checkpoint
from linnet.nest.mxfp4 import dequantize

PROMPTS = [[5, 17, 100, 3, 99, 41, 7, 8, 9, 10], [120, 1, 64, 127, 9], [33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44]]
GENERICS = {"Batch": 4, "MaxSeq": 32}
EXPERTS = ("gate_up_proj", "down_proj")
pytestmark = pytest.mark.filterwarnings("ignore:no tokenizer loaded")  # the saved models have none


def tiny_config():
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                         "original_max_position_embeddings": 16},
                        attn_implementation="eager")


def random_model(seed: int):
    from transformers import GptOssForCausalLM

    torch.manual_seed(seed)
    model = GptOssForCausalLM(tiny_config()).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            t = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * t if p.dim() == 1 else t / p.shape[-1 if p.dim() == 2 else -2] ** 0.5)
    return model


def random_mxfp4(shape_in_memory, g):
    """Random MXFP4 blocks and scales of an [experts, in, out] matrix: ([E, out, in/32, 16], [E, out, in/32])."""
    e, n_in, n_out = shape_in_memory
    blocks = torch.randint(0, 256, (e, n_out, n_in // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 126, (e, n_out, n_in // 32), generator=g, dtype=torch.uint8)
    return blocks, scales


@pytest.fixture
def assert_matches(prefill_error):
    def check(model, hf_model):
        assert max(prefill_error(model, hf_model, PROMPTS)) <= 1e-4
    return check


def test_mxfp4_dequantizes_as_transformers_does():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(100, 150, (3, 10, 4), generator=g, dtype=torch.uint8)
    ours = dequantize(blocks, scales)
    assert ours.shape == (3, 128, 10) and ours.dtype == torch.bfloat16
    assert torch.equal(ours, convert_moe_packed_tensors(blocks, scales))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(directory, reference): the tiny model as save_pretrained writes it."""
    model = random_model(seed=21)
    path = tmp_path_factory.mktemp("tiny-gpt-oss")
    model.save_pretrained(path)
    return path, model


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_saved_gpt_oss_loads_with_a_card_from_its_config(saved, backend, assert_matches):
    path, reference = saved
    model = nest.load(str(path), backend=backend, weights=str(path), generics=GENERICS)
    assert_matches(model, reference)


def test_mxfp4_experts_load_as_transformers_dequantizes_them(saved, tmp_path, assert_matches):
    """The hub's layout: experts as `_blocks` and `_scales`. The reference takes the same
    experts, dequantized by transformers."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    path, _ = saved
    reference = random_model(seed=21)
    tensors = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(4)
    for name in list(tensors):
        if name.split(".")[-1] in EXPERTS:
            blocks, scales = random_mxfp4(tensors.pop(name).shape, g)
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            layer, part = int(name.split(".")[2]), name.split(".")[-1]
            with torch.no_grad():
                getattr(reference.model.layers[layer].mlp.experts, part).copy_(
                    convert_moe_packed_tensors(blocks, scales).float())
    out = tmp_path / "mxfp4"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text((path / "config.json").read_text())

    ckpt = open_checkpoint(out)
    assert "model.layers.0.mlp.experts.gate_up_proj" in ckpt
    assert not any(n.endswith("_blocks") or n.endswith("_scales") for n in ckpt.names())
    model = nest.load(str(out), backend="torch", weights=str(out), generics=GENERICS, cast_dtype=True)
    assert_matches(model, reference)

    # `linnet export --to llama.cpp` writes these experts back as MXFP4, which loses nothing: gguf's
    # quantizer gives each block of the dequantized values the shared exponent it came with
    gguf = pytest.importorskip("gguf")
    from linnet.export.gguf import _experts_stored_mxfp4
    from linnet.nest.load import read_weights

    bound = read_weights(str(out), weights=str(out), tokenizer=False, cast_dtype=True)
    assert ckpt.stored_dtype("model.layers.0.mlp.experts.gate_up_proj") == "mxfp4" and _experts_stored_mxfp4(bound)
    mx = gguf.GGMLQuantizationType.MXFP4
    for param in ("w_gate_up", "w_down"):
        w = bound.params[param].numpy()
        assert np.array_equal(gguf.quants.dequantize(gguf.quants.quantize(w, mx), mx).reshape(w.shape), w)


def test_the_card_config_follows_config_json(saved):
    from linnet.nest.autocard import card_source_from_config

    path, _ = saved
    config = json.loads((path / "config.json").read_text())
    source = card_source_from_config(config, "tiny")
    assert "import gpt_oss" in source and "sliding_window = 4" in source and "rope_truncate = false" in source
    config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
    with pytest.raises(nest.WeightsError, match="alternate sliding and full"):
        card_source_from_config(config, "tiny")


def test_a_null_window_is_refused_as_transformers_runs_no_model_of_it():
    """`"sliding_window": null`: transformers' gpt-oss builds its sliding layers' mask and cache without a
    length, and fails; Linnet had read it as 128 and run."""
    from transformers import GptOssForCausalLM

    from linnet.nest.autocard import card_source_from_config

    config = tiny_config()
    config.sliding_window = None
    with pytest.raises((TypeError, ValueError)), torch.no_grad():
        GptOssForCausalLM(config).eval()(input_ids=torch.tensor([PROMPTS[0]]))
    with pytest.raises(nest.WeightsError, match="config.json's sliding_window is null; a gpt-oss config needs"):
        card_source_from_config({**config.to_dict(), "architectures": ["GptOssForCausalLM"]}, "tiny")


@pytest.mark.parametrize("rope", [{}, {"rope_scaling": None}, {"rope_parameters": None, "rope_theta": 50000.0}])
def test_a_config_without_rope_settings_has_gpt_oss_configs_yarn(rope, tmp_path):
    """A gpt-oss config.json without rope settings (or with null ones): GptOssConfig's YaRN (factor 32 from
    4096 positions, betas 32 and 1, not truncated), over a top-level rope_theta where there is one. Linnet
    refused it as plain rope."""
    from transformers import AutoConfig

    from linnet.nest.autocard import card_source_from_config

    config = {key: value for key, value in tiny_config().to_dict().items() if key not in ("rope_parameters", "rope_scaling")}
    (tmp_path / "config.json").write_text(json.dumps({**config, **rope, "architectures": ["GptOssForCausalLM"]}))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    reference = AutoConfig.from_pretrained(tmp_path).rope_parameters
    source = card_source_from_config(open_checkpoint(tmp_path).config(), "tiny")
    want = {"rope_theta": reference["rope_theta"], "rope_factor": reference["factor"],
            "rope_original_max": reference["original_max_position_embeddings"],
            "rope_beta_fast": reference["beta_fast"], "rope_beta_slow": reference["beta_slow"],
            "rope_truncate": str(reference["truncate"]).lower(),
            "max_context": int(reference["factor"] * reference["original_max_position_embeddings"])}
    assert reference["rope_type"] == "yarn"
    for key, value in want.items():
        assert f"  {key} = {value}\n" in source, (key, value, source)
