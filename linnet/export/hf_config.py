"""The Hugging Face config.json of a specialized module, for each architecture Linnet writes.

The inverse of `nest.autocard`: autocard reads a config.json into a card, this writes a card's
config values back as one, under the keys transformers and vLLM read.
"""

from __future__ import annotations

from linnet.export import TRITON_INSTEAD, ExportError, not_the_builtin
from linnet.ir.nodes import Module
from linnet.nest.autocard import attention_layer_types

TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def hf_config(module: Module, tokenizer=None) -> dict:
    """config.json for `module` (specialized), with the tokenizer's BOS, EOS and pad ids; None for
    those it lacks, or without a tokenizer, where transformers would take its own defaults, another
    vocabulary's (OLMo 2's eos 50279, Gemma's pad 0, eos 1, bos 2)."""
    check_architecture(module, module.path)
    b = module.bindings
    config = _WRITERS[module.name](b)
    config["max_position_embeddings"] = context_length(module, config.get("max_position_embeddings", 8192), config=True)
    config["torch_dtype"] = TORCH_DTYPE_NAMES[b["T"]]
    config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if tokenizer is not None:
        config["bos_token_id"] = tokenizer.bos_token_id
        if tokenizer.eos_token_ids:
            eos = tokenizer.eos_token_ids
            config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        config["pad_token_id"] = tokenizer.special_token_id("pad_token")
    return config


def known(module: Module) -> bool:
    """Whether a config.json is written here for `module`'s architecture."""
    return module.name in _WRITERS


def check_architecture(module: Module, card: str) -> None:
    """Raises `ExportError` unless a config.json is written here for `module`'s architecture."""
    if not known(module):
        raise ExportError(f"the vLLM export writes the config.json of {', '.join(_WRITERS)} cards; {card!r} is "
                          f"{module.name!r}, which transformers and vLLM know no config for {TRITON_INSTEAD}")
    not_the_builtin(module, card)


def context_length(module: Module, otherwise: int = 8192, config: bool = False) -> int:
    """The context the card says it holds; where it says none, YaRN's (its factor times the
    original context, which transformers checks the config against; gpt-oss's rope is always
    YaRN), else `otherwise`. `config`: as config.json's max_position_embeddings, which a linear
    rope factor multiplies into the context (vLLM's reading, `autocard.trained_context`)."""
    b = module.bindings
    if "max_context" in module.meta:
        linear = config and b.get("rope_scaling") == "linear"
        return int(module.meta["max_context"] / b["rope_factor"]) if linear else int(module.meta["max_context"])
    if (b.get("rope_scaling") == "yarn" or module.name == "gpt_oss") and "rope_original_max" in b:
        return int(b["rope_factor"] * b["rope_original_max"])
    return int(otherwise)


def _rope(b: dict, family: str) -> dict | None:
    """config.json's rope_scaling for the card's, None for plain rope."""
    kind = b["rope_scaling"]
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": b["rope_factor"]}
    if kind == "llama3" and "rope_low_freq_factor" in b:
        return {"rope_type": "llama3", "factor": b["rope_factor"], "low_freq_factor": b["rope_low_freq_factor"],
                "high_freq_factor": b["rope_high_freq_factor"],
                "original_max_position_embeddings": b["rope_original_max"]}
    if kind == "yarn" and "rope_beta_fast" in b:
        truncate = {"truncate": b["rope_truncate"]} if "rope_truncate" in b else {}
        return {"rope_type": "yarn", "factor": b["rope_factor"], "beta_fast": b["rope_beta_fast"],
                "beta_slow": b["rope_beta_slow"], **truncate,
                "original_max_position_embeddings": b["rope_original_max"]}
    raise ExportError(f"rope scaling {kind!r} has no {family} config.json form")


def _llama(b: dict) -> dict:
    rope = _rope(b, "Llama")
    if b["sliding_window"]:  # transformers' and vLLM's Llama have no window; Mistral is Llama with one
        return {**_dense(b), "architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "rope_scaling": rope, "sliding_window": b["sliding_window"]}
    return {**_dense(b), "architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_scaling": rope,
            "attention_bias": False, "mlp_bias": False}


def _mixtral(b: dict) -> dict:
    return {**_dense(b), "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "rope_scaling": _rope(b, "Mixtral"), "sliding_window": b["sliding_window"] or None,
            "num_local_experts": b["experts"], "num_experts_per_tok": b["experts_per_token"]}


def _qwen_window(b: dict) -> dict:
    """Qwen's window keys: a card's window is every layer's, which Qwen's configs say as a window
    from layer max_window_layers = 0 on (and, for transformers since layer_types, every layer's type)."""
    if not b["sliding_window"]:
        return {"use_sliding_window": False}
    return {"use_sliding_window": True, "sliding_window": b["sliding_window"], "max_window_layers": 0,
            "layer_types": ["sliding_attention"] * b["layers"]}


def _qwen2(b: dict) -> dict:
    return {**_dense(b), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_scaling": _rope(b, "Qwen"),
            **_qwen_window(b)}


def _qwen3(b: dict) -> dict:
    return {**_dense(b), "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rope_scaling": _rope(b, "Qwen"),
            "attention_bias": False, **_qwen_window(b)}


def _qwen3_moe(b: dict) -> dict:
    # every layer routes to experts (no dense MLP layers), so intermediate_size is never read
    return {**_qwen3(b), "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "moe_intermediate_size": b["ffn"], "num_experts": b["experts"],
            "num_experts_per_tok": b["experts_per_token"],
            "norm_topk_prob": b["norm_topk_prob"], "decoder_sparse_step": 1, "mlp_only_layers": []}


def _dense(b: dict) -> dict:
    """The keys every Llama-like config shares."""
    return {
        "vocab_size": b["vocab"], "hidden_size": b["dim"], "intermediate_size": b["ffn"],
        "num_hidden_layers": b["layers"], "num_attention_heads": b["heads"], "num_key_value_heads": b["kv_heads"],
        "head_dim": b["head_dim"], "rms_norm_eps": b["norm_eps"], "rope_theta": b["rope_theta"],
        "tie_word_embeddings": b["tie_embeddings"], "hidden_act": "silu",
    }


def _gpt_oss(b: dict) -> dict:
    return {
        **_dense({**b, "tie_embeddings": False}), "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "num_local_experts": b["experts"], "num_experts_per_tok": b["experts_per_token"],
        "experts_per_token": b["experts_per_token"], "sliding_window": b["sliding_window"],
        "layer_types": attention_layer_types(b["layers"], 2),  # sliding and full alternating, the first sliding
        "swiglu_alpha": b["swiglu_alpha"], "swiglu_limit": b["swiglu_limit"],
        "rope_scaling": _rope({**b, "rope_scaling": "yarn"}, "gpt-oss"),  # gpt-oss's rope is always YaRN
        "attention_bias": True, "initial_context_length": b["rope_original_max"],
    }


def gemma_layer_types(b: dict) -> list:
    """A Gemma card's `full_layers` as transformers' `layer_types` names each layer's kind."""
    return ["full_attention" if full else "sliding_attention" for full in b["full_layers"]]


def _gemma3(b: dict) -> dict:
    """Gemma 3's text config in the form vLLM and transformers 4.5x read (transformers 5 reads it too):
    the full-attention layers' rope as rope_theta and rope_scaling, the sliding ones' as
    rope_local_base_freq; each layer's kind as layer_types, and as the pattern where it follows one."""
    pattern = b["window_pattern"]
    types = gemma_layer_types(b)
    return {
        **_dense(b), "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": b["query_pre_attn_scalar"], "rope_scaling": _rope(b, "Gemma 3"),
        "rope_local_base_freq": b["rope_local_theta"], "sliding_window": b["sliding_window"],
        **({"sliding_window_pattern": pattern} if types == attention_layer_types(b["layers"], pattern) else {}),
        "layer_types": types, "attn_logit_softcapping": None, "final_logit_softcapping": None, "attention_bias": False,
    }


def _gemma2(b: dict) -> dict:
    """Gemma 2's config: one rope, layers alternating from a sliding one, the caps (null for none)."""
    return {
        **_dense(b), "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": b["query_pre_attn_scalar"], "rope_scaling": None,
        "sliding_window": b["sliding_window"], "layer_types": gemma_layer_types(b),
        "attn_logit_softcapping": b["attn_softcap"] or None, "final_logit_softcapping": b["final_softcap"] or None,
        "attention_bias": False,
    }


def _olmo2(b: dict) -> dict:
    return {**_dense(b), "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
            "rope_scaling": _rope(b, "OLMo 2"), "attention_bias": False}


def _granite(b: dict) -> dict:
    return {**_dense(b), "architectures": ["GraniteForCausalLM"], "model_type": "granite",
            "rope_scaling": _rope(b, "Granite"), "attention_bias": False, "mlp_bias": False,
            **{key: b[key] for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                                       "logits_scaling")}}


def _phi3(b: dict) -> dict:
    # phi3.linnet's rope has no scaling
    return {**_dense(b), "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "rope_scaling": None,
            "sliding_window": b["sliding_window"] or None}


def _smollm3(b: dict) -> dict:
    # each layer's rope as the list (1: it rotates), which transformers reads before the interval, and the
    # interval, as SmolLM3-3B's config.json writes them
    return {**_dense(b), "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3",
            "rope_scaling": _rope(b, "SmolLM3"), "attention_bias": False, "mlp_bias": False,
            "no_rope_layer_interval": b["no_rope_interval"], "no_rope_layers": [int(r) for r in b["no_rope_layers"]],
            "use_sliding_window": False, "sliding_window": None}


def _deepseek_v2(b: dict) -> dict:
    """DeepSeek-V2's config (no query latent), in the keys of its hub config.json, which vLLM and
    transformers both read: MLA's ranks and widths, the routing V2-Lite's (greedy top-k of a softmax)."""
    rope = _rope(b, "DeepSeek-V2")
    if rope is not None:  # vLLM's DeepSeek YaRN reads mscale and mscale_all_dim as transformers does
        rope.update(type="yarn", mscale=b["rope_mscale"] or None, mscale_all_dim=b["rope_mscale_all_dim"] or None)
    return {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "vocab_size": b["vocab"], "hidden_size": b["dim"], "intermediate_size": b["ffn"],
        "num_hidden_layers": b["layers"], "num_attention_heads": b["heads"], "num_key_value_heads": b["heads"],
        "q_lora_rank": None, "kv_lora_rank": b["kv_lora_rank"], "qk_nope_head_dim": b["qk_nope_head_dim"],
        "qk_rope_head_dim": b["qk_rope_head_dim"], "v_head_dim": b["v_head_dim"],
        "n_routed_experts": b["experts"], "num_experts_per_tok": b["experts_per_token"],
        "moe_intermediate_size": b["moe_ffn"], "n_shared_experts": b["shared_experts"],
        "first_k_dense_replace": b["first_dense"], "moe_layer_freq": 1, "routed_scaling_factor": b["routed_scaling"],
        "topk_method": "greedy", "scoring_func": "softmax", "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
        "rms_norm_eps": b["norm_eps"], "rope_theta": b["rope_theta"], "rope_scaling": rope,
        "tie_word_embeddings": b["tie_embeddings"], "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    }


def _deepseek_v3(b: dict) -> dict:
    """DeepSeek-V3's config: V2's keys with a query latent and its group-limited sigmoid routing."""
    return {**_deepseek_v2(b), "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "q_lora_rank": b["q_lora_rank"], "n_group": b["expert_groups"], "topk_group": b["topk_groups"],
            "norm_topk_prob": b["norm_topk_prob"], "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "rope_interleave": True}


def _phi2(b: dict) -> dict:
    """PhiConfig's keys: its rotary part as the factor transformers rounds back to the card's rotary_dim."""
    factor = b["rotary_dim"] / b["head_dim"]
    if int(b["head_dim"] * factor) != b["rotary_dim"]:  # int() of a product a rounding below it
        raise ExportError(f"rotary_dim {b['rotary_dim']} of head_dim {b['head_dim']} has no partial_rotary_factor "
                          f"that transformers' int(head_dim * factor) reads back")
    return {
        "architectures": ["PhiForCausalLM"], "model_type": "phi", "vocab_size": b["vocab"], "hidden_size": b["dim"],
        "intermediate_size": b["ffn"], "num_hidden_layers": b["layers"], "num_attention_heads": b["heads"],
        "num_key_value_heads": b["kv_heads"], "hidden_act": "gelu_new", "layer_norm_eps": b["norm_eps"],
        "rope_theta": b["rope_theta"], "rope_scaling": None, "partial_rotary_factor": factor,
        "qk_layernorm": False, "tie_word_embeddings": False, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attention_dropout": 0.0, "max_position_embeddings": 2048,
    }


def _gpt2(b: dict) -> dict:
    """GPT2Config's keys (its own spellings, as GPT-2's config.json writes them)."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": b["vocab"], "n_embd": b["dim"],
        "n_layer": b["layers"], "n_head": b["heads"], "n_inner": b["ffn"], "n_positions": b["max_pos"],
        "n_ctx": b["max_pos"], "layer_norm_epsilon": b["norm_eps"], "activation_function": "gelu_new",
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True,
        "tie_word_embeddings": b["tie_embeddings"],
        "max_position_embeddings": b["max_pos"],  # GPT2Config's name for n_positions: the table's rows
    }


_WRITERS = {"llama": _llama, "mixtral": _mixtral, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe,
            "gpt_oss": _gpt_oss, "gemma3": _gemma3, "olmo2": _olmo2,
            "granite": _granite, "phi3": _phi3, "smollm3": _smollm3,
            "gemma2": _gemma2, "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3,
            "phi2": _phi2, "gpt2": _gpt2}
