"""Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Gemma 3, OLMo 2, Granite, Phi-3, SmolLM3, Gemma 2, DeepSeek-V2,
Phi-2 and GPT-2 checkpoints without a card: a random tiny model saved
by transformers loads through nest.load with a card written from its config.json (Mistral over the
llama architecture, its sliding window kept; Mixtral over mixtral; Qwen2 with its q/k/v biases; Qwen3 with its per-head
q/k norms; Qwen3-MoE with one tensor per expert; Gemma 3 with its two kinds of layer; OLMo 2 with its norms after
each half of a layer; Granite with its µP multipliers;
Phi-3 with its fused projections; SmolLM3 with its NoPE layers; Gemma 2 with its soft caps; DeepSeek-V2 with its latent
attention and experts after a dense layer; Phi-2 with its LayerNorms and rotary over part of each
head; GPT-2 with its learned positions and Conv1D weights) and gives transformers' logits on both backends.
Qwen and Gemma 3 GGUFs, laid out as llama.cpp's converter writes them (q and k in checkpoint order, a
layer's experts in one tensor, Gemma's norm weights with 1 added), load the same."""

import itertools
import json
import warnings

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.nest.autocard import card_source_from_config

PROMPTS = [[5, 17, 200, 3, 99, 41, 7], [250, 1, 64, 128, 9], [33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43]]
GENERICS = {"Batch": 4, "MaxSeq": 32}
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, max_position_embeddings=128, rope_theta=10000.0, attn_implementation="eager")
# family -> (transformers class, its config's own keys)
FAMILIES = {
    "mistral": ("Mistral", dict(sliding_window=4, tie_word_embeddings=False)),  # shorter than two of the prompts
    "mixtral": ("Mixtral", dict(num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)),
    "qwen2": ("Qwen2", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3", dict(head_dim=32, tie_word_embeddings=False)),  # heads * head_dim != hidden_size
    "qwen3_moe": ("Qwen3Moe", dict(head_dim=32, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                                   moe_intermediate_size=32, norm_topk_prob=True)),
    # sliding-window layers (a window shorter than two prompts) with a full-attention one in every two, each
    # kind with its own rope (the full ones' scaled), q/k norms, norms after each half, a query scale of its own
    "gemma3": ("Gemma3", dict(head_dim=32, sliding_window=4, query_pre_attn_scalar=24,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "linear", "rope_theta": 1e6,
                                                                  "factor": 8.0}})),
    # norms after each half of a layer, q/k norms over whole projections (GQA: two widths)
    "olmo2": ("Olmo2", dict(tie_word_embeddings=False)),
    # every µP multiplier away from 1, the attention scale not 1 / sqrt(head_dim)
    "granite": ("Granite", dict(tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22,
                                attention_multiplier=0.03125, logits_scaling=8.0)),
    # fused q/k/v (GQA: parts of two widths) and gate/up, a window shorter than two of the prompts
    # (Phi3Config's default pad id is the real vocabulary's 32000)
    "phi3": ("Phi3", dict(tie_word_embeddings=False, sliding_window=4, pad_token_id=None, eos_token_id=None)),
    # the second of two layers NoPE (no rotation of its queries and keys); SmolLM3Config's default token ids
    # are the real vocabulary's (pad 128004)
    "smollm3": ("SmolLM3", dict(no_rope_layer_interval=2, tie_word_embeddings=True, pad_token_id=None,
                                bos_token_id=None, eos_token_id=None)),
    # sliding and full layers alternating (a window shorter than two prompts), a query scale of its own, and caps
    # that random scores and logits reach (a cap of 2 on the scores, 3 on the logits)
    "gemma2": ("Gemma2", dict(head_dim=32, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                              final_logit_softcapping=3.0)),
    # multi-head latent attention (no query latent), a dense first layer then four experts (two a token) beside
    # one shared, routed weights scaled, and YaRN whose mscale and mscale_all_dim differ (cos and sin scaled by
    # their ratio, the scores by the second's square) over a context shorter than the prompts
    "deepseek_v2": ("DeepseekV2", dict(num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
                                       qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=4,
                                       num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=1,
                                       first_k_dense_replace=1, routed_scaling_factor=2.5, tie_word_embeddings=False,
                                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                        "original_max_position_embeddings": 4, "mscale": 1.0,
                                                        "mscale_all_dim": 0.5})),
    # DeepSeek-V3: V2's latent attention with a query latent, 8 experts in 4 groups (2 groups, then 2 experts a
    # token), renormalized and scaled, beside one shared; its correction bias, a buffer, drawn in random_model
    "deepseek_v3": ("DeepseekV3", dict(num_hidden_layers=2, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32,
                                       qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
                                       num_experts_per_tok=2, n_group=4, topk_group=2, moe_intermediate_size=24,
                                       n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
                                       norm_topk_prob=True, tie_word_embeddings=False,
                                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                        "original_max_position_embeddings": 4, "mscale": 1.0,
                                                        "mscale_all_dim": 1.0})),
    # LayerNorms (weights and biases) feeding attention and the MLP side by side, rotary over 6 of each head's
    # 16 dims, biases on every linear and the head, gelu_new
    "phi2": ("Phi", dict(partial_rotary_factor=0.375, tie_word_embeddings=False, pad_token_id=None,
                         bos_token_id=None, eos_token_id=None)),
    # learned positions (128: COMMON's max_position_embeddings, GPT2Config's n_positions), Conv1D weights
    # stored [in, out], LayerNorms, gelu_new, the head tied (COMMON's intermediate_size and kv heads mean
    # nothing to GPT-2: its MLP is n_inner = 4 * 64 wide, its heads all key/value heads)
    "gpt2": ("GPT2", dict(activation_function="gelu_new", bos_token_id=None, eos_token_id=None)),
}
# transformers' model class where it is not the prefix's ForCausalLM
MODELS = {"gpt2": "GPT2LMHeadModel"}
# transformers' config class where it is not the prefix's (Gemma3Config is the multimodal model's)
CONFIGS = {"gemma3": "Gemma3TextConfig"}
pytestmark = pytest.mark.filterwarnings("ignore:no tokenizer loaded")


def random_model(family: str, **overrides):
    import transformers

    prefix, own = FAMILIES[family]
    config = getattr(transformers, CONFIGS.get(family, prefix + "Config"))(**{**COMMON, **own, **overrides})
    torch.manual_seed(3)
    model = getattr(transformers, MODELS.get(family, prefix + "ForCausalLM"))(config).float().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # every weight drawn: norms away from 1, biases away from 0
        for _, p in model.named_parameters():
            t = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * t if p.dim() == 1 else t / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():  # DeepSeek-V3's routing correction (saved with the weights)
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory):
    """(family, directory, reference): the tiny model as save_pretrained writes it."""
    model = random_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path, model


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_saved_checkpoint_loads_with_a_card_from_its_config(saved, backend, prefill_error):
    family, path, reference = saved
    model = nest.load(str(path), backend=backend, generics=GENERICS, tokenizer=False)
    assert model.info["unused_tensors"] == []
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_fast_bf16_is_as_close_to_f32_as_transformers_own_bf16(saved, backend):
    # each card computes in f32 where the family's transformers code does (Gemma 3's norms scaled by
    # 1 + w in f32, its GELU in f32), so its bf16 drifts from f32 no more than transformers' bf16 does;
    # Gemma's rounded at each step drifted 2-4x as far on torch
    import copy

    family, path, reference = saved
    half = copy.deepcopy(reference).to(torch.bfloat16)
    model = nest.load(str(path), backend=backend, generics={**GENERICS, "T": "bf16"}, numerics="fast",
                      tokenizer=False, cast_dtype=True)
    worst_theirs, worst_ours = 0.0, 0.0
    for prompt in PROMPTS:
        with torch.no_grad():
            want = reference(input_ids=torch.tensor([prompt])).logits[0, -1].numpy()
            theirs = half(input_ids=torch.tensor([prompt])).logits[0, -1].float().numpy()
        model.reset()
        n = len(prompt)
        ours = np.asarray(model.prefill(np.array(prompt, np.int32), np.arange(n, dtype=np.int32),
                                        np.zeros(n, np.int32), np.array([n - 1], np.int32)), np.float32)[0]
        scale = np.abs(want).max()
        worst_theirs = max(worst_theirs, float(np.abs(theirs - want).max() / scale))
        worst_ours = max(worst_ours, float(np.abs(ours - want).max() / scale))
    assert worst_ours <= 2 * worst_theirs, (worst_ours, worst_theirs)


# the families added after the engine's own tests were written, each checked through it against transformers
THROUGH_THE_ENGINE = ["olmo2", "granite", "phi3", "smollm3", "gemma2", "deepseek_v2", "deepseek_v3", "phi2", "gpt2"]


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("family", THROUGH_THE_ENGINE)
def test_the_engine_generates_transformers_greedy_tokens(family, backend, tmp_path):
    """The checkpoint directory served: the engine packs the prompts into one prefill pass, then
    decodes them together, and each request's tokens are transformers' greedy ones for its prompt
    alone (each step recomputed over the whole sequence)."""
    from linnet.serve import Engine, Request

    reference = random_model(family)
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), backend=backend, generics=GENERICS, tokenizer=False)
    steps = 8
    done, stats = Engine(model, token_budget=64).run([Request(prompt=p, max_new_tokens=steps) for p in PROMPTS])
    assert stats.passes["decode"] > 0
    for prompt, completion in zip(PROMPTS, done):
        run = list(prompt)
        with torch.no_grad():
            for _ in range(steps):
                run.append(int(reference(input_ids=torch.tensor([run])).logits[0, -1].argmax()))
        assert completion.tokens == run[len(prompt):], (prompt, completion.tokens, run[len(prompt):])


def test_the_cards_say_what_the_configs_do(saved):
    family, path, _ = saved
    config = json.loads((path / "config.json").read_text())
    source = card_source_from_config(config, "tiny")
    arch = {"mistral": "llama", "mixtral": "mixtral"}.get(family, family)
    assert f"import {arch}\n" in source
    if family == "mistral":
        assert "sliding_window = 4" in source and 'tool_call_parser = "mistral"' in source
        # a window as long as the context never binds: no window in the card
        assert "sliding_window" not in card_source_from_config({**config, "sliding_window": 128}, "tiny")
    if family == "qwen3":
        assert "head_dim = 32" in source
    if family == "mixtral":
        assert "experts = 8" in source and "experts_per_token = 2" in source and "sliding_window" not in source
    if family == "qwen3_moe":
        assert "experts = 8" in source and "experts_per_token = 2" in source and "ffn = 32" in source
        assert "norm_topk_prob = true" in source
    if family == "granite":
        for line in ("embedding_multiplier = 12.0", "residual_multiplier = 0.22", "attention_multiplier = 0.03125",
                     "logits_scaling = 8.0", "tie_embeddings = true"):
            assert line in source
    if family == "phi3":
        assert "sliding_window = 4" in source and "head_dim = 16" in source
    if family == "gemma2":
        for line in ("window_pattern = 2", "sliding_window = 4", "query_pre_attn_scalar = 24", "attn_softcap = 2.0",
                     "final_softcap = 3.0", "head_dim = 32"):
            assert line in source
    if family == "gpt2":  # its own spellings: n_positions, n_inner (none: 4 * n_embd)
        for line in ("max_pos = 128", "ffn = 256", "dim = 64", "heads = 4", "tie_embeddings = true"):
            assert line in source
    if family == "phi2":  # int(16 * 0.375) of each head rotated
        assert config["rope_parameters"]["partial_rotary_factor"] == 0.375 and "rotary_dim = 6" in source
        assert "head_dim = 16" in source and "norm_eps = 1e-05" in source
    if family == "smollm3":  # transformers' config lists each layer's rope: [1, 0]
        assert config["no_rope_layers"] == [1, 0] and "no_rope_interval = 2" in source
    if family == "deepseek_v2":
        for line in ("kv_lora_rank = 32", "qk_nope_head_dim = 16", "qk_rope_head_dim = 8", "v_head_dim = 12",
                     "experts = 4", "experts_per_token = 2", "moe_ffn = 24", "shared_experts = 1", "first_dense = 1",
                     "routed_scaling = 2.5", 'rope_scaling = "yarn"', "rope_mscale = 1.0", "rope_mscale_all_dim = 0.5"):
            assert line in source
    if family == "deepseek_v3":
        for line in ("q_lora_rank = 24", "expert_groups = 4", "topk_groups = 2", "norm_topk_prob = true",
                     "routed_scaling = 2.5", "experts = 8", "first_dense = 1"):
            assert line in source
    if family == "gemma3":
        for line in ("window_pattern = 2", "sliding_window = 4", 'rope_scaling = "linear"', "rope_factor = 8.0",
                     "rope_theta = 1000000.0", "rope_local_theta = 10000.0", "query_pre_attn_scalar = 24"):
            assert line in source


def test_gemma_3_1b_its_config_as_the_hub_ships_it_is_its_registry_card(tmp_path):
    """The older form of Gemma 3's config (sliding_window_pattern, rope_local_base_freq) gives the
    values of the registry's card, written from the model card."""
    config = {"architectures": ["Gemma3ForCausalLM"], "attn_logit_softcapping": None, "final_logit_softcapping": None,
              "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
              "intermediate_size": 6912, "max_position_embeddings": 32768, "num_attention_heads": 4,
              "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
              "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
              "sliding_window_pattern": 6, "vocab_size": 262144}
    from linnet.frontend.load import load_file
    from linnet.ir.specialize import specialize

    written = tmp_path / "gemma-3-1b-it.linnet"
    written.write_text(card_source_from_config(config, "gemma-3-1b-it"))
    values = lambda module: {k: v for k, v in specialize(module).bindings.items() if k in module.config}
    assert values(load_file(written)) == values(nest.registry.card("gemma-3-1b-it").module())


# config.json of each checkpoint a registry card of a newer family is written for, as the hub's model
# pages give it (written out here without a network: the values, not the file's every key)
HUB_CONFIGS = {
    "olmo-2-0425-1b-instruct": {
        "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 100257, "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 16,
        "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False, "vocab_size": 100352},
    "granite-3.1-2b-instruct": {
        "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
        "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192, "logits_scaling": 8.0,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "granite", "num_attention_heads": 32,
        "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0, "residual_multiplier": 0.22,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 5000000.0, "tie_word_embeddings": True,
        "vocab_size": 49155},
    "phi-3-mini-4k-instruct": {
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
        "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
        "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064},
    # (as code that reads SmolLM3-3B's config.json quotes it: this was written without the hub to look at)
    "smollm3-3b": {
        "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 11008, "layer_types": ["full_attention"] * 36, "max_position_embeddings": 65536,
        "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3", "no_rope_layer_interval": 4,
        "no_rope_layers": [1, 1, 1, 0] * 9, "num_attention_heads": 16, "num_hidden_layers": 36,
        "num_key_value_heads": 4, "pad_token_id": 128004, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False,
        "vocab_size": 128256},
    # (written without the hub to look at, as DeepSeek-V2-Lite-Chat's config.json for its remote code gives it;
    # its 15,706,484,224 parameters, the hub's 15.7B, are test_registry_cards')
    "deepseek-v2-lite-chat": {
        "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
        "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
        "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
        "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
        "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
        "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
        "vocab_size": 102400},
}


@pytest.mark.parametrize("card", list(HUB_CONFIGS))
def test_a_hub_config_gives_its_registry_card(card, tmp_path):
    """The card written from the checkpoint's config.json holds the registry card's values (Phi-3
    mini's window of 2047 in its 4096 kept; Granite's multipliers; OLMo's untied head), so the
    checkpoint loads the same under either, and the registry card finds nothing it says otherwise."""
    from linnet.frontend.load import load_file
    from linnet.ir.specialize import specialize
    from linnet.nest.autocard import config_differences

    written = tmp_path / f"{card}.linnet"
    written.write_text(card_source_from_config(HUB_CONFIGS[card], card))
    values = lambda module: {k: v for k, v in specialize(module).bindings.items() if k in module.config}
    registry = nest.registry.card(card).module()
    assert values(load_file(written)) == values(registry)
    assert load_file(written).meta["max_context"] == registry.meta["max_context"]
    assert config_differences(HUB_CONFIGS[card], specialize(registry), card) == []


@pytest.mark.parametrize("family, change, message", [
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
     "use_sliding_window is set for 1 of 2 layers"),
    ("qwen3", {"attention_bias": True}, "has attention_bias set"),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 2.0}}, "attention_factor 2.0"),
    ("qwen3", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope scaling 'dynamic'"),
    ("mistral", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, r"some layers a dense MLP \(mlp_only_layers \[1\]"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step 2"),
    ("gemma3", {"layer_types": ["full_attention", "chunked_attention"]},
     r"layer_types must name each of its 2 layers' attention, sliding_attention or full_attention"),
    ("gemma3", {"layer_types": ["full_attention"]}, r"layer_types is a list of 1, one kind a layer, and its "
                                                     r"num_hidden_layers is 2"),
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping is set"),
    ("gemma3", {"hidden_activation": "silu"}, "hidden_activation 'silu'"),
    ("olmo2", {"attention_bias": True}, "has attention_bias set"),
    ("granite", {"mlp_bias": True}, "has mlp_bias set"),
    ("granite", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope scaling 'dynamic' is not supported "
                                                                            "for Granite checkpoints"),
    ("phi3", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
                               "original_max_position_embeddings": 64}}, "rope scaling 'longrope' is not supported"),
    ("phi3", {"partial_rotary_factor": 0.75}, "partial_rotary_factor 0.75"),
    ("smollm3", {"no_rope_layers": [1]}, r"whether each of its 2 layers rotates; this config has \[1\]"),
    ("smollm3", {"use_sliding_window": True, "sliding_window": 4}, "the smollm3 architecture attends over whole rows"),
    ("smollm3", {"layer_types": ["full_attention", "sliding_attention"]}, r"layers \[1\]"),
    ("smollm3", {"mlp_bias": True}, "has mlp_bias set"),
    ("gemma2", {"layer_types": ["full_attention", "sliding_window"]}, r"this config has \['full_attention', "
                                                                       r"'sliding_window'\]"),
    ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation 'gelu'"),
    ("gemma2", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope scaling 'linear' is not supported"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1], "q_lora_rank": 1536}, "q_lora_rank is 1536"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1], "topk_method": "group_limited_greedy"},
     "topk_method is 'group_limited_greedy'"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1], "scoring_func": "sigmoid"}, "scoring_func is 'sigmoid'"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1], "moe_layer_freq": 2}, "moe_layer_freq is 2"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1],
                     "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 2.0}},
     "attention_factor 2.0"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1], "attention_bias": True}, "has attention_bias set"),
    ("deepseek_v3", {**FAMILIES["deepseek_v3"][1], "q_lora_rank": None}, "q_lora_rank is null"),
    ("deepseek_v3", {**FAMILIES["deepseek_v3"][1], "rope_interleave": False}, "rope_interleave is False"),
    ("deepseek_v3", {**FAMILIES["deepseek_v3"][1], "scoring_func": "softmax"}, "scoring_func is 'softmax'"),
    ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor 0.5"),
    ("olmo2", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope scaling 'dynamic'"),
    ("phi2", {"qk_layernorm": True}, "qk_layernorm is set"),
    ("gpt2", {"activation_function": "relu"}, "activation_function 'relu'"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx is True"),
    ("gpt2", {"add_cross_attention": True}, "has no cross-attention"),
    ("phi2", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("phi2", {"tie_word_embeddings": True}, "tie_word_embeddings is set"),
    ("phi2", {"partial_rotary_factor": 0.2}, "rotates 3 of each head's 16 dims"),
    ("phi2", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope scaling 'dynamic' is not supported "
                                                                         "for Phi-2"),
    ("gemma3", {"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0},
                                    "full_attention": {"rope_type": "default"}}}, "rope scaling"),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention is set; the gemma2 architecture "
                                                      "is causal"),
    ("deepseek_v2", {**FAMILIES["deepseek_v2"][1], "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     r"rope scaling 'linear' is not supported for DeepSeek checkpoints \(YaRN or none\)"),
    ("deepseek_v2", {k: v for k, v in FAMILIES["deepseek_v2"][1].items() if k != "num_experts_per_tok"},
     "config.json has no 'num_experts_per_tok', which a DeepseekV2ForCausalLM config holds"),
    ("deepseek_v3", {**FAMILIES["deepseek_v3"][1], "hidden_act": "relu"},
     r"hidden_act 'relu'; the deepseek_v3 architecture's MLPs are SwiGLU \(silu\)"),
    # YaRN's ramp not rounded out (gpt-oss's truncate false), and an attention factor from mscale over mscale_all_dim,
    # which transformers' Qwen2 and Llama compute: the qwen2 and llama architectures compute neither
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": False}},
     "YaRN with truncate false is not supported for Qwen checkpoints"),
    ("mistral", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0}},
     "YaRN with mscale 1.0 and mscale_all_dim 1.0, an attention_factor of 1.0 is not supported"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention is set; the gemma3 architecture "
                                                      "is causal"),
    # a YaRN rope with no context to scale from: neither original_max_position_embeddings nor max_position_embeddings
    ("qwen2", {"max_position_embeddings": None, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "config.json has no 'original_max_position_embeddings', which a Qwen2ForCausalLM config holds"),
    # a null where a number belongs: named, not a TypeError
    # a rope scaled by a factor, of no kind (rope_type null): named, not read as plain rope
    ("mistral", {"rope_scaling": {"rope_type": None, "factor": 2.0}},
     r"config.json's rope_scaling has a factor but no 'rope_type' \(or 'type'\) saying which scaling it is"),
    ("mistral", {"rope_scaling": {"factor": 2.0}}, r"rope_scaling has a factor but no 'rope_type' \(or 'type'\)"),
    ("mistral", {"rms_norm_eps": None}, r"config.json holds a value a MistralForCausalLM config cannot have \(float\(\) "
                                        r".*; its keys that are null or text: .*rms_norm_eps$"),
])
def test_what_the_architectures_cannot_express_is_refused(family, change, message):
    prefix, _ = FAMILIES[family]
    config = {"architectures": [MODELS.get(family, prefix + "ForCausalLM")], **COMMON, **change}
    with pytest.raises(nest.WeightsError, match=message):
        card_source_from_config(config, "tiny")


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_yarn_as_qwen_long_context_configs_set_it(family, tmp_path, prefill_error):
    reference = random_model(family, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                      "original_max_position_embeddings": 8})
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["rope_scaling"] == "yarn"
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize("family, rope, top_level", [
    ("mistral", LLAMA3_ROPE, None), ("qwen2", YARN_ROPE, None), ("deepseek_v2", None, None),
    ("qwen2", {**YARN_ROPE, "original_max_position_embeddings": 32}, 8)])
def test_the_context_a_rope_scales_from_is_the_one_transformers_reads(family, rope, top_level, tmp_path,
                                                                      prefill_error):
    """A llama3 or YaRN rope whose config.json leaves out original_max_position_embeddings (a hand-written
    config, an older tool's) scales from max_position_embeddings, as transformers' models read it (Linnet
    took 8192, 32768 or 4096: other frequencies); a top-level original_max_position_embeddings (Phi-3's
    place) is transformers' over the scaling's own."""
    import transformers

    saved = random_model(family, **({"rope_parameters": rope} if rope else {}))
    saved.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if top_level is None:
        del config["rope_parameters"]["original_max_position_embeddings"]
    else:
        config["original_max_position_embeddings"] = top_level
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["rope_original_max"] == (top_level or COMMON["max_position_embeddings"])
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


def test_a_swish_activation_is_silu_as_transformers_computes_it(tmp_path, prefill_error):
    """hidden_act "swish" is transformers' other name for SiLU: such a config loads, and computes as
    transformers does (it was refused as no SwiGLU)."""
    import transformers

    random_model("mistral").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "swish"}))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_qwen_window_in_every_layer_is_the_cards(family, tmp_path, prefill_error):
    """use_sliding_window from layer max_window_layers = 0 on: every layer sees the last 4 positions,
    as a card's sliding_window says (two of the prompts are longer). From layer 28 on (Qwen's
    default), no layer of two slides: no window."""
    reference = random_model(family, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["sliding_window"] == 4
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4
    config = {"architectures": [FAMILIES[family][0] + "ForCausalLM"], **COMMON, **FAMILIES[family][1],
              "use_sliding_window": True, "sliding_window": 4}
    assert "sliding_window" not in card_source_from_config(config, "tiny")


def test_unnormalized_expert_weights(tmp_path, prefill_error):
    """norm_topk_prob false (the chosen experts weighed by their softmax over all experts, as
    Qwen2-MoE does): a case the renormalized default would get wrong."""
    reference = random_model("qwen3_moe", norm_topk_prob=False)
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["norm_topk_prob"] is False
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_a_gguf_loads_as_its_checkpoint_does(family, tmp_path, prefill_error, to_gguf):
    """Qwen's GGUFs (q and k in checkpoint order), and Mixtral's, which llama.cpp writes as its llama
    architecture with experts (q and k in its rope order)."""
    reference = random_model(family)
    arch = "llama" if family == "mixtral" else family.replace("_", "")
    path = to_gguf(reference, tmp_path / f"tiny-{family}.gguf", arch=arch)
    model = nest.load(str(path), generics=GENERICS, tokenizer=False)
    assert model.module.name == family and model.info["unused_tensors"] == []
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


def test_a_gemma3_gguf_loads_as_llama_cpp_reads_it(tmp_path, prefill_error, to_gguf):
    """Gemma 3 as llama.cpp's converter writes it (norm weights with 1 added, q and k in checkpoint
    order, the window and the full-attention layers' rope as keys): its card has llama.cpp's fixed
    settings, a window in five layers of every six and the sliding layers' rope at base 10000, and
    its logits are transformers'. Six layers, so that the last attends to its whole row; a query
    scale of head_dim (llama.cpp's), which is not dim / heads."""
    from linnet.nest.autocard import attention_layer_types

    reference = random_model("gemma3", num_hidden_layers=6, layer_types=attention_layer_types(6, 6),
                             query_pre_attn_scalar=32)
    path = to_gguf(reference, tmp_path / "tiny-gemma3.gguf", arch="gemma3")
    model = nest.load(str(path), generics=GENERICS, tokenizer=False)
    b = model.module.bindings
    assert model.module.name == "gemma3" and model.info["unused_tensors"] == []
    assert (b["window_pattern"], b["sliding_window"], b["rope_local_theta"], b["rope_theta"]) == (6, 4, 1e4, 1e6)
    assert (b["rope_scaling"], b["rope_factor"], b["query_pre_attn_scalar"]) == ("linear", 8.0, 32)
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


def test_a_phi3_gguf_loads_as_llama_cpp_runs_it(tmp_path, prefill_error, to_gguf):
    """Phi-3 as llama.cpp's converter writes it (the fused q/k/v and gate/up tensors as they are, q
    and k in checkpoint order) gives llama.cpp's own logits and transformers'. llama.cpp's phi3
    attends over whole rows, whatever window the file holds: the card written from it has none, and
    llama.cpp's logits are those of transformers' model without one (with one they differ past it)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    windowed = random_model("phi3")  # sliding_window 4: shorter than two of the prompts
    whole = random_model("phi3", sliding_window=None)  # the same weights
    path = to_gguf(windowed, tmp_path / "tiny-phi3.gguf", arch="phi3", tokens=True)
    model = nest.load(str(path), generics=GENERICS, tokenizer=False)
    assert model.module.name == "phi3" and model.info["unused_tensors"] == []
    assert model.module.bindings["sliding_window"] == 0
    assert max(prefill_error(model, whole, PROMPTS)) <= 1e-4
    assert max(prefill_error(model, windowed, PROMPTS)) > 1e-2
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=GENERICS["MaxSeq"], logits_all=True, verbose=False,
                          n_threads=1, type_k=0, type_v=0)  # (GGML_TYPE_F32 caches)
    for prompt in PROMPTS:
        llm.reset()
        llm.eval(prompt)
        theirs = np.array(llm.scores[len(prompt) - 1])
        with torch.no_grad():
            want = whole(input_ids=torch.tensor([prompt])).logits[0, -1].numpy()
        assert np.abs(theirs - want).max() / np.abs(want).max() <= 1e-4


# SmolLM3 in four layers, the last NoPE: llama.cpp's smollm3 reads no NoPE layers from the file and fixes one in every
# four, and so does the card Nest writes from it
GGUF_FAMILIES = {"olmo2": {}, "granite": {}, "smollm3": dict(num_hidden_layers=4, no_rope_layer_interval=4), "phi2": {},
                 "gpt2": {}}


@pytest.mark.parametrize("family", list(GGUF_FAMILIES))
def test_olmo2_granite_smollm3_phi2_and_gpt2_ggufs_give_llama_cpps_logits(family, tmp_path, prefill_error, to_gguf):
    """OLMo 2 as llama.cpp's converter writes it (q and k in checkpoint order, its four norms a layer
    under llama.cpp's names), Granite (q and k in llama.cpp's rope order, µP's multipliers as
    `granite.*` keys), SmolLM3 (q and k in llama.cpp's rope order, no key for its NoPE layers), Phi-2
    (LayerNorms with biases, its rotary part as `rope.dimension_count`, q and k in checkpoint order) and GPT-2
    (Conv1D weights transposed, learned positions): the card from the file's metadata gives transformers'
    logits, and so does llama.cpp reading the same file, which holds the file to llama.cpp's own reading of it
    (Phi-2's and GPT-2's to 2e-4: llama.cpp's GELU reads an f16 table)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    reference = random_model(family, **GGUF_FAMILIES[family])
    path = to_gguf(reference, tmp_path / f"tiny-{family}.gguf", arch=family, tokens=True)
    model = nest.load(str(path), generics=GENERICS, tokenizer=False)
    assert model.module.name == family and model.info["unused_tensors"] == []
    if family == "granite":
        b = model.module.bindings
        assert (b["embedding_multiplier"], b["residual_multiplier"], b["attention_multiplier"],
                b["logits_scaling"]) == pytest.approx((12.0, 0.22, 0.03125, 8.0), rel=1e-7)  # (f32 keys)
    if family == "smollm3":
        assert reference.config.no_rope_layers == [1, 1, 1, 0] and model.module.bindings["no_rope_interval"] == 4
    if family == "phi2":
        assert model.module.bindings["rotary_dim"] == 6 and model.module.bindings["norm_eps"] == pytest.approx(1e-5)
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=GENERICS["MaxSeq"], logits_all=True, verbose=False,
                          n_threads=1, type_k=0, type_v=0)
    for prompt in PROMPTS:
        llm.reset()
        llm.eval(prompt)
        with torch.no_grad():
            want = reference(input_ids=torch.tensor([prompt])).logits[0, -1].numpy()
        bound = 2e-4 if family in ("phi2", "gpt2") else 1e-4
        assert np.abs(np.array(llm.scores[len(prompt) - 1]) - want).max() / np.abs(want).max() <= bound


def test_smollm3s_nope_layers_are_read_from_its_list(tmp_path, prefill_error):
    """A SmolLM3 config listing each layer's rope (no_rope_layers: the third of three layers NoPE, against
    the interval of 4 it also says) gives transformers' logits; the same checkpoint read as rotating in
    every layer does not: the NoPE layer is what the card leaves out of the rotation."""
    reference = random_model("smollm3", num_hidden_layers=3, no_rope_layers=[1, 1, 0], no_rope_layer_interval=4)
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["no_rope_interval"] == 3
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "no_rope_layers": [1, 1, 1]}))
    rotating = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert rotating.module.bindings["no_rope_interval"] == 4  # past the last layer: none NoPE
    assert min(prefill_error(rotating, reference, PROMPTS)) > 1e-2


@pytest.mark.parametrize("family, key, types", [
    ("smollm3", "no_rope_layers", [0, 1, 1, 0]),  # the first and last layers NoPE: no interval's
    ("gemma3", "layer_types", ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]),
    ("gemma2", "layer_types", ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]),
])
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_config_listing_layers_in_no_pattern_loads_as_its_list(family, key, types, backend, tmp_path, prefill_error):
    """Each layer's kind as transformers' config lists it, in an order no interval or pattern gives: the
    card written from the config sets the list itself (`no_rope_layers`, `full_layers`), and the logits
    are transformers'; read as the architecture's own pattern, the same checkpoint's are not."""
    reference = random_model(family, num_hidden_layers=4, **{key: types})
    assert getattr(reference.config, key) == types
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), backend=backend, generics=GENERICS, tokenizer=False)
    listed = "no_rope_layers" if family == "smollm3" else "full_layers"
    want = [bool(t) for t in types] if family == "smollm3" else [t == "full_attention" for t in types]
    assert model.module.bindings[listed] == want
    assert f"  {listed} = [" in model.module.sources[model.module.card_path]  # the card sets the list
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != key}))
    patterned = nest.load(str(tmp_path), backend=backend, generics=GENERICS, tokenizer=False)
    assert patterned.module.bindings[listed] != want
    assert min(prefill_error(patterned, reference, PROMPTS)) > 1e-3


@pytest.mark.parametrize("factor, rotary_dim", [(0.25, 4), (1.0, 16)])
def test_phi2s_rotary_part_is_what_the_card_rotates(factor, rotary_dim, tmp_path, prefill_error):
    """The same Phi-2 checkpoint (rotary over 6 of 16 dims: the saved test above) read as rotating another
    part of each head is far from transformers' logits: the part is what the card computes."""
    reference = random_model("phi2")
    reference.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"]["partial_rotary_factor"] = factor
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["rotary_dim"] == rotary_dim
    assert min(prefill_error(model, reference, PROMPTS)) > 1e-2


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_gpt2_as_the_hub_stores_it_loads_under_its_models_names(backend, tmp_path, prefill_error):
    """openai-community/gpt2's model.safetensors holds the base model's names (`wte.weight`, `h.0.attn.c_attn.weight`:
    GPT2Model's), which transformers reads under GPT2LMHeadModel's `transformer.` prefix: so does Nest."""
    from safetensors.torch import load_file, save_file

    reference = random_model("gpt2")
    reference.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert all(name.startswith("transformer.") for name in state)  # (the head is tied: not saved)
    # older transformers saved each layer's causal mask and masked_bias buffers too, as the hub's file holds them
    n = reference.config.n_positions
    buffers = {f"h.{l}.attn.{b}": t for l in range(reference.config.n_layer)
               for b, t in (("bias", torch.ones(n, n).tril().view(1, 1, n, n)), ("masked_bias", torch.tensor(-1e4)))}
    save_file({**{name.removeprefix("transformer."): t for name, t in state.items()}, **buffers},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the buffers are neither refused as biases nor warned of
        model = nest.load(str(tmp_path), backend=backend, generics=GENERICS, tokenizer=False)
    assert sorted(model.info["unused_tensors"]) == sorted("transformer." + name for name in buffers)  # (read under it)
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


@pytest.mark.parametrize("cap", ["attn_logit_softcapping", "final_logit_softcapping"])
def test_each_of_gemma2s_caps_is_what_the_card_computes(cap, tmp_path, prefill_error):
    """The same Gemma 2 checkpoint read without one of its caps (null in config.json, 0 in the card) is
    far from transformers' logits, which the card with both gives (test above): each cap is computed."""
    reference = random_model("gemma2")
    reference.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, cap: None}))
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings[{"attn_logit_softcapping": "attn_softcap"}.get(cap, "final_softcap")] == 0.0
    assert min(prefill_error(model, reference, PROMPTS)) > 1e-2


def test_a_phi3_gguf_with_longrope_is_refused(tmp_path, to_gguf, write_gguf):
    """The 128k models' GGUFs carry longrope as llama.cpp's rope_factors tables: refused, named."""
    from linnet.nest.checkpoint import GGUFCheckpoint

    def keys(w):
        w.add_embedding_length(64)
        w.add_block_count(2)
        w.add_head_count(4)
        w.add_feed_forward_length(96)

    path = write_gguf(tmp_path / "long.gguf", "phi3", keys, [("token_embd.weight", np.zeros((8, 64), np.float32), None),
                                                             ("rope_factors_long.weight", np.ones(8, np.float32), None)])
    with pytest.raises(nest.WeightsError, match="rope scaling 'longrope' is not supported for Phi-3"):
        card_source_from_config(GGUFCheckpoint(path).config(), "long")


def write_gemma3_keys(write_gguf, path, layers=8, window=4, cap=None, dims=(64, 4, 16), ffn=True):
    """A gemma3 GGUF of keys alone (and an embedding): `dims` is dim, heads and head_dim."""
    dim, heads, head_dim = dims

    def keys(w):
        w.add_embedding_length(dim)
        w.add_block_count(layers)
        w.add_head_count(heads)
        w.add_key_length(head_dim)
        if ffn:
            w.add_feed_forward_length(4 * dim)
        if window:
            w.add_sliding_window(window)
        if cap:
            w.add_final_logit_softcapping(cap)

    return write_gguf(path, "gemma3", keys, [("token_embd.weight", np.zeros((8, dim), np.float32), None)])


def test_a_gemma3_gguf_card_takes_what_llama_cpp_fixes(tmp_path, write_gguf):
    """llama.cpp's gemma3 fixes what the file does not say: a window in five layers of every six, the
    sliding layers' rope at base 10000, queries scaled by head_dim, or by dim / heads at 62 layers
    (Gemma 3 27B). Without a window every layer attends to its whole row, and a logit cap, which
    llama.cpp applies only then, is refused; with one, llama.cpp caps nothing. A file without a key
    every gemma3 file holds names it."""
    from linnet.nest.checkpoint import GGUFCheckpoint

    files = (tmp_path / f"g{i}.gguf" for i in itertools.count())  # each its own: a checkpoint maps its file

    def card(**kw):
        path = write_gemma3_keys(write_gguf, next(files), **kw)
        return card_source_from_config(GGUFCheckpoint(path).config(), "g")

    source = card(cap=30.0)
    for line in ("window_pattern = 6", "sliding_window = 4", "rope_local_theta = 10000.0", "query_pre_attn_scalar = 16"):
        assert line in source
    assert "query_pre_attn_scalar = 168" in card(layers=62, dims=(5376, 32, 128))
    assert "window_pattern = 1\n" in card(window=0)
    with pytest.raises(nest.WeightsError, match="final_logit_softcapping is set"):
        card(window=0, cap=30.0)
    path = write_gemma3_keys(write_gguf, tmp_path / "g.gguf", ffn=False)
    with pytest.raises(nest.WeightsError, match=r"g\.gguf: the GGUF metadata has no gemma3\.feed_forward_length, "
                                                r"which every gemma3 file holds"):
        nest.load(str(path), tokenizer=False)


def test_a_gguf_of_more_blocks_than_tensors_is_refused(tmp_path, write_gguf):
    """A GGUF whose block_count its tensors cannot hold (each layer has its own): refused naming the key. A
    billion blocks had hung reading a gemma3 or gemma2 file's config, which listed each layer's kind."""
    path = write_gemma3_keys(write_gguf, tmp_path / "g.gguf", layers=10 ** 9)
    with pytest.raises(nest.WeightsError, match=r"g\.gguf: its GGUF metadata gemma3\.block_count is 1000000000, more "
                                                r"layers than the checkpoint's 1 tensors hold"):
        nest.load(str(path), tokenizer=False)


# what transformers' config class gives each key a hand-written config.json leaves out (the keys every
# config has, and Mixtral's expert counts, are given)
REQUIRED = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
ARCHITECTURES = {"LlamaForCausalLM": "LlamaConfig", "MistralForCausalLM": "MistralConfig",
                 "MixtralForCausalLM": "MixtralConfig", "Qwen2ForCausalLM": "Qwen2Config",
                 "Qwen3ForCausalLM": "Qwen3Config", "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
                 "Gemma3ForCausalLM": "Gemma3TextConfig", "Olmo2ForCausalLM": "Olmo2Config",
                 "GraniteForCausalLM": "GraniteConfig", "Phi3ForCausalLM": "Phi3Config",
                 "SmolLM3ForCausalLM": "SmolLM3Config", "Gemma2ForCausalLM": "Gemma2Config",
                 "PhiForCausalLM": "PhiConfig"}
OWN_REQUIRED = {"MixtralForCausalLM": dict(num_local_experts=4, num_experts_per_tok=2),
                "Qwen3MoeForCausalLM": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)}


def heads_sharing_the_default_kv_heads(config_class: str, own: dict) -> dict:
    """`own` with as many query heads as the config class's default key/value heads where 4 cannot share
    them (Qwen2's 32, Mistral's 8): a config the card is written for, not one refused for its heads."""
    import transformers

    kv_heads = getattr(transformers, config_class)(**own).num_key_value_heads
    return own if own["num_attention_heads"] % kv_heads == 0 else {**own, "num_attention_heads": kv_heads}


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_keys_a_config_leaves_out_are_transformers_defaults(arch, tmp_path):
    """A config.json of the keys every config has: the card's values are those transformers' config
    class reads from it (a Mixtral without rope_theta is 1e6, an OLMo 2 or Phi-3 without rms_norm_eps
    1e-5, a Mistral without sliding_window slides 4096); each was Linnet's own fallback."""
    import transformers
    from safetensors.numpy import save_file

    from linnet.nest.checkpoint import SafetensorsCheckpoint

    own = heads_sharing_the_default_kv_heads(ARCHITECTURES[arch], {**REQUIRED, **OWN_REQUIRED.get(arch, {})})
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], **own}))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    config = SafetensorsCheckpoint(tmp_path).config()
    reference = getattr(transformers, ARCHITECTURES[arch])(**own)
    source = card_source_from_config(config, "tiny")
    rope = reference.rope_parameters
    rope = rope.get("full_attention", rope)
    head_dim = getattr(reference, "head_dim", None) or reference.hidden_size // reference.num_attention_heads
    want = {"kv_heads": reference.num_key_value_heads, "rope_theta": rope["rope_theta"], "head_dim": head_dim,
            "max_context": reference.max_position_embeddings}
    if arch == "PhiForCausalLM":  # LayerNorms, rotary over part of each head, a head of its own
        assert not reference.tie_word_embeddings
        want.update(norm_eps=reference.layer_norm_eps, rotary_dim=int(head_dim * rope["partial_rotary_factor"]))
    else:
        want.update(norm_eps=reference.rms_norm_eps, tie_embeddings=reference.tie_word_embeddings)
    if arch in ("MistralForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM"):
        want["sliding_window"] = reference.sliding_window
    if arch in ("Gemma3ForCausalLM", "Gemma2ForCausalLM"):
        want["query_pre_attn_scalar"] = reference.query_pre_attn_scalar
    if arch == "Gemma2ForCausalLM":
        want.update(attn_softcap=reference.attn_logit_softcapping, final_softcap=reference.final_logit_softcapping)
    if arch == "SmolLM3ForCausalLM":  # its NoPE layers: every fourth, as transformers lists them
        assert reference.no_rope_layers == [1, 1] and "no_rope_interval = 4" in source
    for key, value in want.items():
        line = f"  {key} = {str(value).lower() if isinstance(value, bool) else value}\n"
        assert line in source, (key, value, source)


def test_keys_a_gpt2_config_leaves_out_are_gpt2configs_defaults(tmp_path):
    """GPT-2's config.json in its own spellings, the keys left out GPT2Config's (n_inner none: 4 * n_embd;
    1024 positions; a tied head), as transformers reads them, through the checkpoint's reader."""
    import transformers
    from safetensors.numpy import save_file

    from linnet.nest.checkpoint import SafetensorsCheckpoint

    own = dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], **own}))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    source = card_source_from_config(SafetensorsCheckpoint(tmp_path).config(), "tiny")
    reference = transformers.GPT2Config(**own)
    want = {"dim": reference.n_embd, "layers": reference.n_layer, "heads": reference.n_head,
            "ffn": reference.n_inner or 4 * reference.n_embd, "max_pos": reference.n_positions,
            "norm_eps": reference.layer_norm_epsilon, "tie_embeddings": str(reference.tie_word_embeddings).lower()}
    for key, value in want.items():
        assert f"  {key} = {value}\n" in source, (key, value, source)


def test_a_mixtral_config_without_its_rope_base_runs_as_transformers_reads_it(tmp_path, prefill_error):
    """transformers 5 writes the rope base in rope_parameters; a config.json without one (an older
    tool's, a hand-written one) is Mixtral's 1e6 to transformers, where Linnet's card had 1e4."""
    import transformers

    saved = random_model("mixtral", rope_theta=1e6)
    saved.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = transformers.MixtralForCausalLM.from_pretrained(tmp_path).float().eval()
    assert reference.config.rope_parameters["rope_theta"] == 1e6
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


def test_keys_a_deepseek_v3_config_leaves_out_are_transformers_defaults(tmp_path):
    """DeepseekV3Config's defaults: V3-671B's query latent, experts, groups, dense layers and context."""
    import transformers
    from safetensors.numpy import save_file

    from linnet.nest.checkpoint import SafetensorsCheckpoint

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], **REQUIRED}))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    source = card_source_from_config(SafetensorsCheckpoint(tmp_path).config(), "tiny")
    r = transformers.DeepseekV3Config(**REQUIRED)
    want = {"q_lora_rank": r.q_lora_rank, "kv_lora_rank": r.kv_lora_rank, "experts": r.n_routed_experts,
            "experts_per_token": r.num_experts_per_tok, "moe_ffn": r.moe_intermediate_size,
            "shared_experts": r.n_shared_experts, "first_dense": r.first_k_dense_replace,
            "routed_scaling": r.routed_scaling_factor, "expert_groups": r.n_group, "topk_groups": r.topk_group,
            "norm_topk_prob": str(r.norm_topk_prob).lower(), "max_context": r.max_position_embeddings}
    for key, value in want.items():
        assert f"  {key} = {value}\n" in source, (key, value, source)


def test_keys_a_deepseek_v2_config_leaves_out_are_transformers_defaults(tmp_path):
    """DeepseekV2Config's defaults for the keys a config.json leaves out: MLA's ranks and widths, the
    experts, no dense layer, the context; a query latent of 1536 (its default) is refused by name."""
    import transformers
    from safetensors.numpy import save_file

    from linnet.nest.checkpoint import SafetensorsCheckpoint

    own = {**REQUIRED, "num_experts_per_tok": 2}
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    for extra in ({"q_lora_rank": None}, {}):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV2ForCausalLM"], **own, **extra}))
        config = SafetensorsCheckpoint(tmp_path).config()
        reference = transformers.DeepseekV2Config(**own, **extra)
        if reference.q_lora_rank is not None:
            with pytest.raises(nest.WeightsError, match=f"q_lora_rank is {reference.q_lora_rank}"):
                card_source_from_config(config, "tiny")
            continue
        source = card_source_from_config(config, "tiny")
        want = {"kv_lora_rank": reference.kv_lora_rank, "qk_nope_head_dim": reference.qk_nope_head_dim,
                "qk_rope_head_dim": reference.qk_rope_head_dim, "v_head_dim": reference.v_head_dim,
                "experts": reference.n_routed_experts, "moe_ffn": reference.moe_intermediate_size,
                "shared_experts": reference.n_shared_experts, "first_dense": reference.first_k_dense_replace,
                "routed_scaling": reference.routed_scaling_factor, "norm_eps": reference.rms_norm_eps,
                "max_context": reference.max_position_embeddings}
        for key, value in want.items():
            assert f"  {key} = {value}\n" in source, (key, value, source)


@pytest.mark.parametrize("family, key, value", [
    ("mistral", "tie_word_embeddings", "false"), ("qwen3", "attention_bias", "false"), ("gemma3", "rms_norm_eps", "1e-6"),
    ("mistral", "num_attention_heads", "4"), ("qwen2", "num_attention_heads", 4.5), ("qwen3", "rope_theta", "1e6"),
    ("granite", "embedding_multiplier", "12"), ("mistral", "rope_parameters", "yarn"), ("smollm3", "layer_types", "full"),
    ("deepseek_v3", "norm_topk_prob", "true"), ("phi2", "partial_rotary_factor", "0.5"), ("gpt2", "n_embd", "64"),
])
def test_a_value_of_another_type_than_its_key_takes_is_refused_by_name(family, key, value):
    """A value of a type its key does not take, which transformers' config class refuses too (a flag's
    text "false" was read as true, a number as text read, 4.5 heads read as 4, a rope's name in place of
    its settings an AttributeError): a WeightsError naming the key."""
    prefix, own = FAMILIES[family]
    config = {**COMMON, **own, key: value}
    with pytest.raises(Exception):  # the reference: transformers makes no model of such a config
        random_model(family, **{key: value})
    with pytest.raises(nest.WeightsError, match=f"config.json's {key} is {value!r}, and {key} takes"):
        card_source_from_config({"architectures": [MODELS.get(family, prefix + "ForCausalLM")], **config}, "tiny")


def test_a_rope_of_one_kind_of_layer_given_as_a_name_is_refused_by_name():
    config = {"architectures": ["Gemma3ForCausalLM"], **COMMON, **FAMILIES["gemma3"][1]}
    config["rope_parameters"] = {**config["rope_parameters"], "full_attention": "linear"}
    with pytest.raises(nest.WeightsError, match="config.json's rope_parameters.full_attention is 'linear'"):
        card_source_from_config(config, "tiny")


def test_architectures_as_one_name_is_that_architecture(tmp_path):
    """`"architectures": "MistralForCausalLM"` (a string, which transformers takes, picking the model by
    model_type) is that architecture, its defaults transformers'; it was read letter by letter, and refused
    as an unsupported architecture. One not supported is named as config.json's "architectures"."""
    import transformers
    from safetensors.numpy import save_file

    from linnet.nest.checkpoint import SafetensorsCheckpoint

    required = heads_sharing_the_default_kv_heads("MistralConfig", REQUIRED)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": "MistralForCausalLM", **required}))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    source = card_source_from_config(SafetensorsCheckpoint(tmp_path).config(), "tiny")
    reference = transformers.MistralConfig(**required)
    assert "import llama\n" in source and f"  sliding_window = {reference.sliding_window}\n" in source
    with pytest.raises(nest.WeightsError, match=r"""config.json's "architectures" is 'FalconForCausalLM', an """
                                                r"architecture not supported"):
        card_source_from_config({"architectures": "FalconForCausalLM", **REQUIRED}, "tiny")
    with pytest.raises(nest.WeightsError, match=r"""config.json's "architectures" names none"""):
        card_source_from_config(REQUIRED, "tiny")
    with pytest.raises(nest.WeightsError, match=r"""config.json's "architectures" is \{'LlamaForCausalLM': 1\}"""):
        card_source_from_config({"architectures": {"LlamaForCausalLM": 1}, **REQUIRED}, "tiny")


@pytest.mark.parametrize("family, key", [("mistral", "attention_bias"), ("qwen2", "mlp_bias"),
                                         ("phi3", "attention_bias")])
def test_a_bias_key_the_familys_model_does_not_read_is_not_refused(family, key, tmp_path, prefill_error):
    """Mistral's and Phi-3's projections have no biases, Qwen2's q/k/v always and the rest never, whatever
    attention_bias or mlp_bias says: transformers' models read neither, and such a config loads as
    transformers runs it (it was refused). Where the checkpoint holds bias tensors anyway, which
    transformers drops, it is refused: the biases would change every logit."""
    import transformers
    from safetensors.torch import load_file, save_file

    random_model(family).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: True}))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file({**state, "model.layers.0.self_attn.o_proj.bias": torch.ones(64)}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(nest.WeightsError, match=r"1 bias tensor\(s\) the card \w+ does not compute: "
                                                r"model.layers.0.self_attn.o_proj.bias"):
        nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)


def test_a_qwen3_moe_window_slides_in_every_layer_as_transformers_slides_it(tmp_path, prefill_error):
    """transformers' Qwen3-MoE slides use_sliding_window's window in every layer, whatever max_window_layers
    says (it reads none; Qwen3-30B-A3B's config.json holds 48): the card's window is in every layer. It had
    none, from Qwen2's max_window_layers of 28, up to 1.4 off transformers' logits."""
    reference = random_model("qwen3_moe", use_sliding_window=True, sliding_window=4, max_window_layers=2)
    reference.save_pretrained(tmp_path)
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["sliding_window"] == 4
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"])
def test_a_qwen_window_a_config_sets_without_its_length_is_transformers_default(arch, tmp_path):
    """use_sliding_window with no sliding_window: transformers' Qwen configs slide 4096 (Linnet had no window)."""
    import transformers
    from safetensors.numpy import save_file

    from linnet.nest.checkpoint import SafetensorsCheckpoint

    own = heads_sharing_the_default_kv_heads(ARCHITECTURES[arch], {**REQUIRED, **OWN_REQUIRED.get(arch, {}),
                                                                    "use_sliding_window": True, "max_window_layers": 0})
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], **own}))
    save_file({"x": np.zeros(1, np.float32)}, str(tmp_path / "model.safetensors"))
    reference = getattr(transformers, ARCHITECTURES[arch])(**own)
    source = card_source_from_config(SafetensorsCheckpoint(tmp_path).config(), "tiny")
    assert f"  sliding_window = {reference.sliding_window}\n" in source


@pytest.mark.parametrize("where", ["rope_parameters", "rope_scaling"])
def test_a_rope_base_in_the_ropes_settings_is_read_over_a_top_level_one(where, tmp_path, prefill_error):
    """A config.json with a rope_theta both at the top and in its rope settings (transformers 5's
    rope_parameters, or rope_scaling, their older name), the two apart: transformers reads the settings'
    own, and so does the card (it read the top-level one)."""
    import transformers

    random_model("mistral").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    rope = config.pop("rope_parameters")
    assert rope["rope_theta"] == COMMON["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps({**config, where: rope, "rope_theta": 500000.0}))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).float().eval()
    model = nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
    assert model.module.bindings["rope_theta"] == reference.config.rope_parameters["rope_theta"]
    assert max(prefill_error(model, reference, PROMPTS)) <= 1e-4


@pytest.mark.parametrize("arch", ["MixtralForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM"])
def test_expert_counts_a_config_leaves_out_are_transformers_defaults(arch):
    """A mixture of experts' config.json without its expert counts (or gpt-oss's without its kv heads and
    head width): transformers' config class's defaults, where the card had none (refused) or heads and
    dim / heads."""
    import transformers

    from linnet.nest.autocard import EXPERT_COUNTS, with_transformers_defaults

    rope = {"rope_scaling": {"rope_type": "yarn", "factor": 32.0}} if arch == "GptOssForCausalLM" else {}
    required = heads_sharing_the_default_kv_heads(arch.replace("ForCausalLM", "Config"), REQUIRED)
    reference = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**required)
    source = card_source_from_config(with_transformers_defaults({"architectures": [arch], **required, **rope}), "t")
    want = {"experts": getattr(reference, "num_experts", None) or reference.num_local_experts,
            "experts_per_token": reference.num_experts_per_tok, "kv_heads": reference.num_key_value_heads}
    if arch == "Qwen3MoeForCausalLM":
        want["ffn"] = reference.moe_intermediate_size
    if arch == "GptOssForCausalLM":
        want["head_dim"] = reference.head_dim
    for key, value in want.items():
        assert f"  {key} = {value}\n" in source, (key, value, source)
    # either of transformers' names of the count (its attribute_map), not the default, where the file has one
    # (16: no fewer than the experts a token takes by default, Qwen3-MoE's 8)
    for count in EXPERT_COUNTS:
        config = with_transformers_defaults({"architectures": [arch], **required, **rope, count: 16})
        assert getattr(transformers, arch.replace("ForCausalLM", "Config"))(**required, **{count: 16}).num_experts == 16
        assert "  experts = 16\n" in card_source_from_config(config, "t")


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
@pytest.mark.parametrize("window", [None, 0])
def test_a_gemma_window_null_or_under_1_is_refused_as_transformers_runs_none(family, window):
    """`"sliding_window": null` in a Gemma config: transformers' Gemma builds a sliding-window mask and cache
    whatever the layers' kinds, and fails without the window's length, even where every layer attends to whole
    rows; a window of 0, where layers slide, fails too. Linnet had read either as its default window (512 for
    Gemma 3, 4096 for Gemma 2), and ran: both are refused, naming the key."""
    prefix, own = FAMILIES[family]
    for types in (None, ["full_attention"] * 2) if window is None else (None,):
        kinds = {} if types is None else {"layer_types": types}
        reference = random_model(family, sliding_window=window, **kinds)
        with pytest.raises((TypeError, ValueError, RuntimeError)), torch.no_grad():
            reference(input_ids=torch.tensor([PROMPTS[0]]))
        config = {"architectures": [prefix + "ForCausalLM"], **COMMON, **own, **kinds, "sliding_window": window}
        said = "null" if window is None else window
        with pytest.raises(nest.WeightsError, match=f"config.json's sliding_window is {said}; a Gemma [23] config "
                                                    f"needs its window's length"):
            card_source_from_config(config, "tiny")


def test_a_context_of_0_is_refused_naming_its_key():
    """max_position_embeddings 0: no context a model attends over (vLLM's max_model_len would be 0); it had been
    read as none given, and the card's default context taken silently."""
    prefix, own = FAMILIES["qwen3"]
    config = {"architectures": [prefix + "ForCausalLM"], **COMMON, **own, "max_position_embeddings": 0}
    with pytest.raises(nest.WeightsError, match="config.json's max_position_embeddings is 0, and "
                                                "max_position_embeddings takes a whole number of at least 1"):
        card_source_from_config(config, "tiny")


@pytest.mark.parametrize("family, key", [
    ("mistral", "num_attention_heads"), ("mistral", "num_key_value_heads"), ("qwen2", "vocab_size"),
    ("gemma2", "query_pre_attn_scalar"), ("qwen3_moe", "decoder_sparse_step"), ("smollm3", "no_rope_layer_interval"),
    ("deepseek_v3", "n_group"), ("phi2", "num_attention_heads"),
])
def test_a_count_of_0_is_refused_naming_its_key(family, key):
    """A count a model has at least one of, 0 in config.json: transformers makes no model that runs of it (a
    ZeroDivisionError, an empty table); Linnet's reading had divided by it (a bare ZeroDivisionError) or read it
    as its default (0 kv heads as every head, a query scale of 0 as head_dim, a step or interval of 0 as 1 or 4)."""
    prefix, own = FAMILIES[family]
    with pytest.raises((ZeroDivisionError, RuntimeError, ValueError)), torch.no_grad():
        random_model(family, **{key: 0})(input_ids=torch.tensor([PROMPTS[0]]))
    config = {"architectures": [MODELS.get(family, prefix + "ForCausalLM")], **COMMON, **own, key: 0}
    with pytest.raises(nest.WeightsError, match=f"config.json's {key} is 0, and {key} takes a whole number of at "
                                                f"least 1"):
        card_source_from_config(config, "tiny")


@pytest.mark.parametrize("family, key, value, takes", [
    ("qwen3", "rope_theta", 0, "a number above 0"), ("qwen2", "rope_theta", -5.0, "a number above 0"),
    ("mistral", "rms_norm_eps", -1e-5, "a number of at least 0"),
    # json's Infinity and NaN, which Python's json reads as floats (the card's own check named its line)
    ("qwen3", "rope_theta", float("inf"), "a finite number"), ("mistral", "rms_norm_eps", float("inf"), "a finite number"),
    ("qwen2", "rms_norm_eps", float("nan"), "a finite number"),
])
def test_a_rope_base_or_norm_epsilon_out_of_its_range_is_refused_naming_its_key(family, key, value, takes):
    """A rope base of 0 or under (transformers' frequencies divide by its powers: NaN logits) or a negative
    norm epsilon (added under a root): config.json's key named, where the card's own check had named a line
    of Linnet's architecture file, or (a base of 0) the model had loaded and answered NaN."""
    prefix, own = FAMILIES[family]
    if key == "rope_theta" and value == 0:
        with torch.no_grad():
            logits = random_model(family, rope_theta=value)(input_ids=torch.tensor([PROMPTS[0]])).logits
        assert not torch.isfinite(logits).all()
    config = {"architectures": [MODELS.get(family, prefix + "ForCausalLM")], **COMMON, **own, key: value}
    with pytest.raises(nest.WeightsError, match=f"config.json's {key} is {value}, and {key} takes {takes}; the "
                                                f"checkpoint's config is malformed"):
        card_source_from_config(config, "tiny")


def test_more_kv_heads_than_heads_is_the_configs_fault_and_a_default_is_said_to_be_one():
    """4 query heads beside 8 key/value heads cannot share them (transformers' model fails on it): named as
    config.json's; where the file leaves the kv heads out, the number is transformers' default (Qwen2's
    32), which the message says, rather than a line of the card's attention."""
    import transformers

    from linnet.nest.autocard import with_transformers_defaults

    with pytest.raises(Exception), torch.no_grad():
        random_model("mistral", num_key_value_heads=8)(input_ids=torch.tensor([PROMPTS[0]]))
    config = {"architectures": ["MistralForCausalLM"], **COMMON, **FAMILIES["mistral"][1], "num_key_value_heads": 8}
    with pytest.raises(nest.WeightsError, match=r"tiny: config.json's num_attention_heads \(4\) is no multiple of "
                                                r"its num_key_value_heads \(8\)"):
        card_source_from_config(with_transformers_defaults(config), "tiny")
    left_out = {k: v for k, v in COMMON.items() if k != "num_key_value_heads"}
    assert transformers.Qwen2Config(**left_out).num_key_value_heads == 32
    with pytest.raises(nest.WeightsError, match=r"tiny: config.json leaves out num_key_value_heads, which transformers "
                                                r"reads as Qwen2ForCausalLM's default, 32, and its num_attention_heads "
                                                r"\(4\) is no multiple of that: set num_key_value_heads in config.json"):
        card_source_from_config(with_transformers_defaults({"architectures": ["Qwen2ForCausalLM"], **left_out}), "tiny")


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "qwen2", "smollm3"])
def test_layer_types_of_another_length_than_the_layers_is_refused_as_transformers_refuses_it(family):
    """`layer_types` names one kind a layer: a list of another length transformers' config classes refuse
    (validate_layer_type), and so does the card, by its length. Under a billion layers a short list had hung
    the reading (Gemma's, gpt-oss's), which laid out a list of as many layers to compare it with."""
    import transformers

    prefix, own = FAMILIES[family]
    types = ["full_attention", "full_attention"]
    with pytest.raises(Exception, match="must be equal to the number of `layer_types`"):
        getattr(transformers, CONFIGS.get(family, prefix + "Config"))(**{**COMMON, **own, "num_hidden_layers": 3,
                                                                         "layer_types": types})
    for layers in (3, 10 ** 9):
        config = {"architectures": [prefix + "ForCausalLM"], **COMMON, **own, "num_hidden_layers": layers,
                  "layer_types": types}
        with pytest.raises(nest.WeightsError, match=f"layer_types is a list of 2, one kind a layer, and its "
                                                    f"num_hidden_layers is {layers}"):
            card_source_from_config(config, "tiny")


def test_a_qwen_window_over_a_billion_layers_is_counted_not_listed():
    """Qwen's window from max_window_layers on: the layers it slides in are counted (they were listed, one a
    layer, and a billion layers hung the reading); some of them only is refused, as under two layers."""
    config = {"architectures": ["Qwen2ForCausalLM"], **COMMON, "num_hidden_layers": 10 ** 9,
              "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 28}
    with pytest.raises(nest.WeightsError, match=f"use_sliding_window is set for {10 ** 9 - 28} of {10 ** 9} layers"):
        card_source_from_config(config, "tiny")
    assert "  sliding_window = 4\n" in card_source_from_config({**config, "max_window_layers": 0}, "tiny")


def test_more_layers_than_the_checkpoint_has_tensors_is_refused(tmp_path):
    """A config.json whose layer count the checkpoint's tensors cannot hold (each layer has several of its own):
    refused before the card lays out its layers (a billion of them had hung the load, building Gemma 3's list
    of each layer's kind), naming the key."""
    from safetensors.torch import load_file

    random_model("gemma3").save_pretrained(tmp_path)
    tensors = len(load_file(str(tmp_path / "model.safetensors")))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10 ** 9}))
    with pytest.raises(nest.WeightsError, match=f"config.json's num_hidden_layers is {10 ** 9}, more layers than "
                                                f"the checkpoint's {tensors} tensors hold"):
        nest.load(str(tmp_path), generics=GENERICS, tokenizer=False)
