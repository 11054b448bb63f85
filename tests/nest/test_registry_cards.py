"""The registry's cards for published models hold those models' shapes: each card's parameter
count is the total the Hugging Face hub gives for the checkpoint's safetensors (tied heads counted
once), so a wrong width, depth, head count or vocabulary shows."""

import pytest

from linnet import nest

# hf_repo -> its parameters, as the hub's safetensors metadata counts them
PUBLISHED = {
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
    "mistralai/Mistral-7B-Instruct-v0.3": 7_248_023_552,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46_702_792_704,
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen3-0.6B": 596_049_920,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008,
    "openai/gpt-oss-20b": 20_914_757_184,
    "google/gemma-3-1b-it": 999_885_952,
    # these three summed from each config.json's shapes (the hub rounds them to 1.48B, 2.53B and 3.82B)
    "allenai/OLMo-2-0425-1B-Instruct": 1_484_916_736,
    "ibm-granite/granite-3.1-2b-instruct": 2_533_531_648,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    # summed from transformers' SmolLM3Config shapes, which are SmolLM3-3B's (the hub rounds it to 3.08B)
    "HuggingFaceTB/SmolLM3-3B": 3_075_098_624,
    # summed from Gemma2Config's defaults, which are gemma-2-2b's shapes (the hub rounds it to 2.61B)
    "google/gemma-2-2b-it": 2_614_341_888,
    # summed from DeepseekV2ForCausalLM's shapes under the hub's config.json (the hub rounds it to 15.7B)
    "deepseek-ai/DeepSeek-V2-Lite-Chat": 15_706_484_224,
    # summed from microsoft/phi-2's config.json shapes (the hub rounds it to 2.78B)
    "microsoft/phi-2": 2_779_683_840,
    "openai-community/gpt2": 124_439_808,
}
CARDS = [info for info in nest.cards() if info.hf_repo]


def test_every_published_card_is_counted_here():
    assert sorted(info.hf_repo for info in CARDS) == sorted(PUBLISHED)


@pytest.mark.parametrize("info", CARDS, ids=lambda info: info.name)
def test_a_card_has_its_checkpoints_parameters(info):
    assert info.parameters() == PUBLISHED[info.hf_repo]


def test_deepseek_v2_caches_its_latent_not_keys_and_values():
    """DeepSeek-V2-Lite-Chat's cache holds, a token a layer, the kv_lora_rank latent and the
    qk_rope_head_dim rotated key (512 + 64 values), as vLLM and SGLang cache MLA: not each head's
    key and value (16 * (192 + 128) values, 8.9 times as many)."""
    from linnet.compiler import check_file
    from linnet.ir.specialize import specialize
    from linnet.nest.memory import footprint

    info = next(i for i in nest.cards() if i.name == "deepseek-v2-lite-chat")
    spec = specialize(check_file(info.path), {"Batch": 2, "MaxSeq": 8, "T": "bf16"}, "fast")
    b = spec.bindings
    per_token_layer = footprint(spec).state / (2 * 8 * b["layers"] * 2)  # bf16 values
    assert per_token_layer == b["kv_lora_rank"] + b["qk_rope_head_dim"] == 576
    assert b["heads"] * (b["qk_nope_head_dim"] + b["qk_rope_head_dim"] + b["v_head_dim"]) == 5120
