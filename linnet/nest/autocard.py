"""A card for a local checkpoint that is not in the registry, written from its config.

A checkpoint's `architectures` entry (config.json's, or the one a GGUF's `general.architecture`
stands for) picks the built-in architecture: Llama and Mistral checkpoints get a card over
llama, Mixtral over mixtral, Qwen2 (Qwen2.5, QwQ, DeepSeek-R1's Qwen distills) over qwen2,
Qwen3 over qwen3, Qwen3's mixtures of experts over qwen3_moe, gpt-oss over gpt_oss, Gemma 3's
text model over gemma3, OLMo 2 over olmo2, Granite over granite, Phi-3 (and Phi-4 14B) over phi3,
SmolLM3 over smollm3, Gemma 2 over gemma2, DeepSeek-V2 (without a query latent: V2-Lite) over deepseek_v2,
DeepSeek-V3 over deepseek_v3, Phi-2 (transformers' `phi`) over phi2, GPT-2 over gpt2.
Config values the architecture cannot express are refused, not dropped.
"""

from __future__ import annotations

import math
import numbers

from linnet.nest.errors import WeightsError


# What transformers' config class of each architecture gives a key config.json leaves out (a config
# written by hand, or by an older tool), where it is not what Linnet's reading falls back on
# otherwise: a Mixtral config without rope_theta is 1e6 to transformers (and vLLM), a Mistral one
# without sliding_window slides 4096 (transformers 5.x's defaults)
TRANSFORMERS_DEFAULTS = {
    "LlamaForCausalLM": {"max_position_embeddings": 2048},
    "MistralForCausalLM": {"num_key_value_heads": 8, "sliding_window": 4096, "max_position_embeddings": 131072},
    "MixtralForCausalLM": {"num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
                           "max_position_embeddings": 131072, "num_local_experts": 8, "num_experts_per_tok": 2},
    # (Qwen's window, where use_sliding_window is set and sliding_window is not, is 4096)
    "Qwen2ForCausalLM": {"num_key_value_heads": 32, "sliding_window": 4096, "max_position_embeddings": 32768},
    "Qwen3ForCausalLM": {"num_key_value_heads": 32, "head_dim": 128, "sliding_window": 4096,
                         "max_position_embeddings": 32768},
    "Qwen3MoeForCausalLM": {"num_key_value_heads": 4, "sliding_window": 4096, "max_position_embeddings": 32768,
                            "num_local_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
    "GptOssForCausalLM": {"num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
                          "num_experts_per_tok": 4, "max_position_embeddings": 131072},
    "Gemma3ForCausalLM": {"num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                          "sliding_window": 4096, "max_position_embeddings": 131072},
    "Olmo2ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "GraniteForCausalLM": {"max_position_embeddings": 2048},
    "Phi3ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096},
    "SmolLM3ForCausalLM": {"num_key_value_heads": 4, "rope_theta": 2e6, "tie_word_embeddings": True,
                           "max_position_embeddings": 32768},
    "PhiForCausalLM": {"max_position_embeddings": 2048},
    "Gemma2ForCausalLM": {"num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                          "sliding_window": 4096, "max_position_embeddings": 8192, "attn_logit_softcapping": 50.0,
                          "final_logit_softcapping": 30.0},
    "DeepseekV2ForCausalLM": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                              "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
                              "n_shared_experts": 2, "moe_intermediate_size": 1407, "first_k_dense_replace": 0,
                              "routed_scaling_factor": 1.0, "topk_method": "greedy", "max_position_embeddings": 2048},
    "DeepseekV3ForCausalLM": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                              "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
                              "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
                              "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
                              "norm_topk_prob": True, "max_position_embeddings": 4096},
}


# gpt-oss's rope where config.json has none (no rope_scaling and no rope_parameters, or either null):
# GptOssConfig's, YaRN from 4096 positions by 32 (gpt-oss-20b's and -120b's own)
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


# transformers' two names of one key (its config classes' attribute_map): the hub's Qwen3-MoE says num_experts
EXPERT_COUNTS = ("num_local_experts", "num_experts")


def _experts(config: dict) -> int:
    return int(config.get("num_local_experts") or config["num_experts"])


def architectures_of(config: dict) -> list:
    """config.json's `architectures`: a list of class names, or one name as a string (as transformers
    takes it, picking the model by model_type), which is a list of that one, not of its letters."""
    archs = config.get("architectures") or []
    return [archs] if isinstance(archs, str) else [a for a in archs if isinstance(a, str)] \
        if isinstance(archs, list) else []


class ConfigRead(dict):
    """config.json with transformers' defaults filled in; `filled`: the keys the file left out."""

    filled: frozenset = frozenset()


def with_transformers_defaults(config: dict) -> dict:
    """config.json as transformers reads it: each key it leaves out at its architecture's default
    (`TRANSFORMERS_DEFAULTS`; a key present, null included, is the file's). A rope base comes from
    `rope_theta` or transformers 5's `rope_parameters`, so the default fills neither where one is there.
    gpt-oss's rope settings, where the file has none or null ones, are GptOssConfig's (`GPT_OSS_ROPE`)."""
    arch = next((a for a in architectures_of(config) if a in TRANSFORMERS_DEFAULTS), None)
    if arch is None:
        return config
    defaults = dict(TRANSFORMERS_DEFAULTS[arch])
    if "rope_parameters" in config:
        defaults.pop("rope_theta", None)
    if any(key in config for key in EXPERT_COUNTS):  # the file's count, under either name
        defaults.pop("num_local_experts", None)
    read = ConfigRead({**defaults, **config})
    read.filled = frozenset(defaults) - set(config)
    if arch == "GptOssForCausalLM" and not config.get("rope_scaling") and config.get("rope_parameters") is None:
        read["rope_parameters"] = dict(GPT_OSS_ROPE)  # (over a null too, as GptOssConfig takes one)
    return read


def trained_context(config: dict) -> int | None:
    """The positions a config.json's model holds, as vLLM reads it (`_get_and_verify_max_len`):
    max_position_embeddings, times a linear (or dynamic) rope factor, or YaRN's factor times its
    original length; llama3's and longrope's max_position_embeddings is the scaled length already,
    and so is Gemma 3's, whose linear factor vLLM leaves out."""
    length = config.get("max_position_embeddings")
    if not length:
        return None
    scaling, kind = _rope_scaling(config)
    if kind in ("default", None, "llama3", "longrope", "su") or str(config.get("model_type", "")).startswith("gemma3"):
        return int(length)
    factor = float(scaling.get("factor", 1.0))
    base = scaling.get("original_max_position_embeddings", length) if kind == "yarn" else length
    return int(int(base) * factor)


def card_source_from_config(config: dict, name: str, rope_scaled_context: bool = True) -> str:
    """A card's text for a checkpoint's config. `rope_scaled_context`: its meta max_context is vLLM's
    length (`trained_context`); False, max_position_embeddings as it stands, as llama.cpp takes a
    GGUF's context_length (its n_ctx_train) whatever its rope scaling."""
    archs = architectures_of(config)
    arch = next((a for a in archs if a in SUPPORTED), None)
    if arch is None:
        said = (f'is {config["architectures"]!r}, an architecture' if config.get("architectures")
                else "names none, an architecture")
        raise WeightsError(f'{name}: config.json\'s "architectures" {said} not supported for checkpoints without '
                           f"a card; supported: {', '.join(SUPPORTED)}")
    linnet_arch, values_of = SUPPORTED[arch]
    check_value_types(config, name)
    check_layer_types(config, name)
    try:
        values = values_of(config, name)
    except KeyError as missing:  # a config.json without a key its family always has
        if missing.args[0] == "rope_type":  # (`_rope_scaling`: what the factor scales is not said)
            where = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
            raise WeightsError(f"{name}: config.json's {where} has a factor but no 'rope_type' (or 'type') saying "
                               f"which scaling it is (linear, dynamic, yarn, llama3, ...); the checkpoint's config "
                               f"is incomplete") from None
        raise WeightsError(f"{name}: config.json has no {missing.args[0]!r}, which a {arch} config holds; "
                           f"the checkpoint's config is incomplete") from None
    except (TypeError, ValueError) as bad:  # a null, or a word, where a number belongs (`"rms_norm_eps": null`)
        odd = [key for key, value in config.items() if value is None or isinstance(value, str)
               and key not in ("model_type", "hidden_act", "hidden_activation", "activation_function", "dtype",
                               "torch_dtype", "transformers_version", "_name_or_path")]
        raise WeightsError(f"{name}: config.json holds a value a {arch} config cannot have ({bad}); its keys "
                           f"that are null or text: {', '.join(odd) or 'none'}") from None
    lines = [f'card "{name}"', f"import {linnet_arch}", "", "config {"]
    for key, value in values.items():
        lines.append(f"  {key} = {_literal(value)}")
    lines.append("}")
    meta = []
    context = trained_context(config) if rope_scaled_context else config.get("max_position_embeddings")
    if context:  # what the model was trained to attend over
        meta.append(f"  max_context = {int(context)}")
    if arch in TOOL_CALL_PARSERS:  # the family's own way of writing tool calls, where its architecture does not say
        meta.append(f'  tool_call_parser = "{TOOL_CALL_PARSERS[arch]}"')
    if meta:
        lines += ["", "meta {", *meta, "}"]
    return "\n".join(lines) + "\n"


def config_differences(config: dict, module, name: str) -> list[str]:
    """Where a checkpoint's config says otherwise than `module` (a specialized card) on a value the
    card sets (rope, norm eps, window, ...; its shapes the tensors show), one line each; none where
    its architecture is one this module does not read configs of. A `WeightsError` where it is
    another architecture than the card's."""
    arch = next((a for a in architectures_of(config) if a in SUPPORTED), None)
    if arch is None:
        return []
    if SUPPORTED[arch][0] != module.name:  # its tensors may even fit (a Qwen3's, less its norms, a Llama's)
        raise WeightsError(f"the checkpoint is {arch} (linnet's {SUPPORTED[arch][0]}), and {name} is a "
                           f"{module.name} card")
    try:
        check_value_types(config, name)
        values = SUPPORTED[arch][1](config, name)
    except (KeyError, TypeError, ValueError, WeightsError):  # a config the card's own reading refuses: the tensors decide
        return []
    # the card written from the config: the architecture's default where the config says nothing (no rope
    # scaling, no window), which a card's own value would otherwise run over without a word
    from dataclasses import replace

    from linnet.errors import LinnetError
    from linnet.ir.specialize import config_values

    try:
        own = config_values(replace(module, config_values={k: v for k, v in values.items() if k in module.config}))
    except LinnetError:  # (a default the config's values cannot compute: the tensors decide)
        own = values
    card = module.bindings
    keys = [*values, *(k for k in module.config_values if k not in values)]  # the config's, then the card's own
    return [f"{key}: the card says {card[key]!r}, the checkpoint's config "
            + (f"{own[key]!r}" if key in values else f"sets none (the {module.name} architecture's default, {own[key]!r})")
            for key in keys if key in card and key in own and not _same(card[key], own[key])]


# The type of each config.json key a family's reading takes, as transformers' config classes annotate
# it (transformers 5 refuses a config.json whose value is of another type; 4.x crashed on most, or read
# a flag's text "false" as true, as Python's bool() does). A null is each reading's own to take.
WHOLE_NUMBERS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "max_position_embeddings", "original_max_position_embeddings", "sliding_window", "max_window_layers",
    "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
    "query_pre_attn_scalar", "sliding_window_pattern", "_sliding_window_pattern", "no_rope_layer_interval",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "moe_layer_freq",
    "n_embd", "n_layer", "n_head", "n_inner", "n_positions")
# The whole numbers of those that count something a model has at least one of (heads, layers, widths, experts,
# the steps of a layer pattern): transformers fails on a 0 in most (a ZeroDivisionError, an empty table), and
# Linnet's readings divided by one or read it as their default (0 kv heads as every head)
COUNTS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "num_local_experts", "num_experts",
    "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "query_pre_attn_scalar",
    "sliding_window_pattern", "_sliding_window_pattern", "no_rope_layer_interval", "kv_lora_rank", "v_head_dim",
    "n_routed_experts", "n_group", "topk_group", "n_embd", "n_layer", "n_head", "n_inner", "n_positions",
    # the positions a model was trained over, its context (0 was read as none said, and the default taken)
    "max_position_embeddings")
NUMBERS = (
    "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "rope_local_base_freq", "partial_rotary_factor",
    "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling", "routed_scaling_factor",
    "attn_logit_softcapping", "final_logit_softcapping", "swiglu_alpha", "swiglu_limit",
    # a rope's own (rope_scaling's, rope_parameters')
    "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
    "mscale_all_dim")
# Of those, the ones a model divides by or takes the log of (a rope's base: 0 is a division by zero in its
# frequencies) and the norms' epsilons, added under a root (a negative one is a NaN on a flat row)
ABOVE_ZERO = ("rope_theta", "rope_local_base_freq", "factor")
NOT_NEGATIVE = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
FLAGS = (
    "tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window", "norm_topk_prob", "qk_layernorm",
    "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "add_cross_attention", "use_bidirectional_attention",
    "rope_interleave", "truncate")
OBJECTS = ("rope_scaling", "rope_parameters")
LISTS = ("layer_types", "no_rope_layers", "mlp_only_layers")
TEXTS = ("hidden_act", "hidden_activation", "activation_function", "topk_method", "scoring_func", "rope_type", "type")


def _takes(key: str, value) -> str | None:
    """What `key` takes where `value` is not that (None where it is, or where the key is none of these)."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if key in WHOLE_NUMBERS and not (number and float(value).is_integer()):
        return "a whole number"
    if key in COUNTS and value < 1:
        return "a whole number of at least 1"
    if key in NUMBERS and not (number and math.isfinite(value)):  # (json reads Infinity and NaN as floats)
        return "a finite number"
    if key in ABOVE_ZERO and not value > 0:
        return "a number above 0"
    if key in NOT_NEGATIVE and not value >= 0:
        return "a number of at least 0"
    if key in FLAGS and not isinstance(value, bool):
        return "true or false"
    if key in OBJECTS and not isinstance(value, dict):
        return "an object (a rope's settings)"
    if key in LISTS and not isinstance(value, list):
        return "a list"
    if key in TEXTS and not isinstance(value, str):
        return "a string"
    return None


def check_value_types(config: dict, name: str) -> None:
    """A `WeightsError` naming the first key of config.json (or of its rope settings) whose value is not
    of the type the key takes: `"tie_word_embeddings": "false"`, `"rms_norm_eps": "1e-5"`,
    `"num_attention_heads": 4.5`, `"rope_scaling": "yarn"`, each of which transformers refuses; or is a
    count under 1 (`COUNTS`: `"num_attention_heads": 0`, which had been a bare ZeroDivisionError)."""
    ropes = [(f"{key}.", config[key]) for key in OBJECTS if isinstance(config.get(key), dict)]
    for where, rope in list(ropes):  # Gemma 3's rope_parameters: one rope a kind of layer
        ropes += [(f"{where}{kind}.", spec) for kind, spec in rope.items() if kind.endswith("_attention")
                  and isinstance(spec, dict)]
    for where, items in [("", config)] + ropes:
        for key, value in items.items():
            if where and key.endswith("_attention"):
                wrong = None if isinstance(value, dict) else "an object (the rope of that kind of layer)"
            else:
                wrong = _takes(key, value) if value is not None else None
            if wrong:
                raise WeightsError(f"{name}: config.json's {where}{key} is {value!r}, and {key} takes {wrong}; "
                                   f"the checkpoint's config is malformed")
    # query heads that cannot share their key/value heads evenly (5 and 2, or 4 and 8); where the file leaves
    # the kv heads out, transformers' default is what was read (Qwen2's 32, beside a tiny config's 4 heads)
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
        if "num_key_value_heads" in getattr(config, "filled", ()):
            arch = next(a for a in architectures_of(config) if a in TRANSFORMERS_DEFAULTS)
            raise WeightsError(f"{name}: config.json leaves out num_key_value_heads, which transformers reads as "
                               f"{arch}'s default, {kv_heads}, and its num_attention_heads ({heads}) is no multiple "
                               f"of that: set num_key_value_heads in config.json")
        raise WeightsError(f"{name}: config.json's num_attention_heads ({heads}) is no multiple of its "
                           f"num_key_value_heads ({kv_heads}): the query heads cannot share the key/value heads "
                           f"evenly; the checkpoint's config is malformed")
    # each token's experts chosen among the layer's: no more of them than there are
    chosen = config.get("num_experts_per_tok")
    experts = next(((key, config[key]) for key in (*EXPERT_COUNTS, "n_routed_experts")
                    if isinstance(config.get(key), int)), None)
    if isinstance(chosen, int) and experts and chosen > experts[1]:
        raise WeightsError(f"{name}: config.json's num_experts_per_tok ({chosen}) is more than its {experts[0]} "
                           f"({experts[1]}): each token cannot take that many experts; the checkpoint's config is "
                           f"malformed")


def layer_count_key(config: dict) -> str:
    """The config.json key of a config's layer count: GPT-2's own spelling where the config has it."""
    return "n_layer" if "n_layer" in config else "num_hidden_layers"


def check_layer_types(config: dict, name: str) -> None:
    """A `WeightsError` where `layer_types` does not name one kind for each layer, as transformers'
    config classes refuse it (`validate_layer_type`): checked by its length, before any reading lays
    out a list of the layers' own (a billion layers with a short list had hung the reading)."""
    types, key = config.get("layer_types"), layer_count_key(config)
    layers = config.get(key)
    if isinstance(types, list) and isinstance(layers, numbers.Integral) and len(types) != layers:
        raise WeightsError(f"{name}: config.json's layer_types is a list of {len(types)}, one kind a layer, and its "
                           f"{key} is {layers}; the checkpoint's config is malformed")


def check_layer_count(config: dict, tensors: int, name: str, key_said: str | None = None) -> None:
    """A `WeightsError` where config.json's layer count is more than a checkpoint of `tensors` tensors holds
    (each layer has tensors of its own): a card of a billion layers had hung laying out its layers' kinds.
    `key_said`: what names the count where it is not config.json's key (a GGUF's block_count)."""
    key = layer_count_key(config)
    layers = config.get(key)
    if isinstance(layers, numbers.Real) and not isinstance(layers, bool) and layers > tensors:
        said = key_said or f"config.json's {key}"
        raise WeightsError(f"{name}: {said} is {layers}, more layers than the checkpoint's {tensors} tensors hold "
                           f"(each layer has its own)")


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6)
    return a == b


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):  # a list config's value (SmolLM3's no_rope_layers)
        return "[" + ", ".join(map(_literal, value)) + "]"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _rope_scaling(config: dict) -> tuple[dict, str]:
    """(the rope settings, their kind). Settings with a factor that name no kind (`"rope_type": null`)
    are a KeyError (card_source_from_config names the key), not plain rope: their factor was dropped."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not scaling:
        return scaling, "default"
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind is None and "factor" in scaling:
        raise KeyError("rope_type")
    return scaling, kind or "default"


def _plain_rope(config: dict, name: str, family: str, arch: str) -> dict:
    """config.json's rope settings (rope_parameters, where transformers 5 keeps a partial rotary factor), which
    must scale nothing: `arch` computes plain rope."""
    scaling, kind = _rope_scaling(config)
    if kind not in ("default", None):
        raise WeightsError(f"{name}: rope scaling {kind!r} is not supported for {family} checkpoints; the {arch} "
                           f"architecture computes plain rope")
    return scaling


def _rope_theta(config: dict, default: float) -> float:
    """The rope base as transformers 5 reads it: the rope settings' own (rope_scaling's, or else
    rope_parameters', as `_rope_scaling` picks them) over a top-level rope_theta, where a config has both."""
    theta = _rope_scaling(config)[0].get("rope_theta")
    if theta is None:
        theta = config.get("rope_theta")
    return float(theta if theta is not None else default)


SILU = ("silu", "swish")  # transformers' names for x * sigmoid(x) (ACT2FN's "swish" is its SiLU)


def _dense_values(config: dict, name: str) -> dict:
    """What a Llama-like layer (GQA attention, SwiGLU MLP, RMSNorm) reads from any of these configs."""
    act = config.get("hidden_act", "silu")
    if act not in SILU:
        raise WeightsError(f"{name}: hidden_act {act!r}; this architecture's MLP is SwiGLU (silu)")
    heads = int(config["num_attention_heads"])
    dim = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or dim // heads)
    if head_dim % 2:  # (found only as the card is specialized, it was told at the architecture's line)
        said = f"head_dim ({head_dim})" if config.get("head_dim") else \
            f"hidden_size / num_attention_heads ({dim} / {heads} = {head_dim})"
        raise WeightsError(f"{name}: config.json's {said} is odd, and rope turns a head's dims in pairs; the "
                           f"checkpoint's config is malformed")
    return {
        "vocab": int(config["vocab_size"]),
        "dim": dim,
        "layers": int(config["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "ffn": int(config["intermediate_size"]),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "rope_theta": _rope_theta(config, 10000.0),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }


def _refuse_biases(config: dict, name: str, keys=("attention_bias", "mlp_bias")) -> None:
    """Refused: each of `keys` set, the ones the family's transformers model gives its projections
    biases by. Checkpoints with biases exist; loaded without them they would give wrong logits. A key
    the family's model does not read (Mistral's, Phi-3's: no biases whatever it says) is not refused;
    bias tensors that such a checkpoint holds anyway are (nest.load, unused biases)."""
    biased = [key for key in keys if config.get(key)]
    if biased:
        raise WeightsError(f"{name}: this checkpoint has {' and '.join(biased)} set, and its architecture "
                           f"has no such biases; write a card over an architecture that has them")


def _rope_values(config: dict, name: str, family: str, kinds: tuple) -> dict:
    """The card's rope settings for config.json's rope scaling, if it is one of `kinds` the family's
    architecture computes; another is refused."""
    scaling, kind = _rope_scaling(config)
    if kind in ("default", None):
        return {}
    if kind not in kinds:
        raise WeightsError(f"{name}: rope scaling {kind!r} is not supported for {family} checkpoints (config.json's "
                           f"rope_scaling or rope_parameters: {', '.join(kinds)} or none)")
    factor = float(scaling["factor"])
    if kind == "linear":
        return {"rope_scaling": "linear", "rope_factor": factor}
    if kind == "llama3":
        # (both said: transformers refuses a llama3 scaling without them, and a guess is another model)
        return {"rope_scaling": "llama3", "rope_factor": factor,
                "rope_low_freq_factor": float(scaling["low_freq_factor"]),
                "rope_high_freq_factor": float(scaling["high_freq_factor"]),
                "rope_original_max": _original_context(config, scaling)}
    if scaling.get("truncate") is False:  # (gpt-oss's; its architecture reads it)
        raise WeightsError(f"{name}: YaRN with truncate false is not supported for {family} checkpoints; their "
                           f"architecture rounds YaRN's ramp out to whole dims, as truncate true (the default) does")
    own, said = scaling.get("attention_factor"), "attention_factor"  # yarn
    if own is None and scaling.get("mscale") and scaling.get("mscale_all_dim"):
        mscale = lambda m: 0.1 * m * math.log(factor) + 1.0
        own = mscale(scaling["mscale"]) / mscale(scaling["mscale_all_dim"])
        said = f"mscale {scaling['mscale']} and mscale_all_dim {scaling['mscale_all_dim']}, an attention_factor of"
    if own is not None and not math.isclose(float(own), 0.1 * math.log(factor) + 1.0):  # YaRN's own
        raise WeightsError(f"{name}: YaRN with {said} {own} is not supported for {family} checkpoints; their "
                           f"architecture scales by YaRN's own 0.1 ln(factor) + 1")
    return {"rope_scaling": "yarn", "rope_factor": factor,
            "rope_original_max": _original_context(config, scaling),
            "rope_beta_fast": float(scaling.get("beta_fast") or 32.0),
            "rope_beta_slow": float(scaling.get("beta_slow") or 1.0)}


def _original_context(config: dict, scaling: dict) -> int:
    """The context a llama3 or YaRN rope scales from, as transformers 5's models read it
    (`standardize_rope_params`, run again as each model makes its rope): a top-level
    original_max_position_embeddings (where Phi-3 keeps it) over the scaling's own, and where
    neither is, max_position_embeddings (so does llama.cpp, its n_ctx_orig_yarn n_ctx_train)."""
    original = (config.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
                or config.get("max_position_embeddings"))
    if not original:  # (card_source_from_config names the key a config lacks)
        raise KeyError("original_max_position_embeddings")
    return int(original)


def _llama_values(config: dict, name: str, biases=("attention_bias", "mlp_bias")) -> dict:
    _refuse_biases(config, name, biases)
    return {**_dense_values(config, name), **_rope_values(config, name, "Llama", ("llama3", "linear", "yarn"))}


def _mistral_values(config: dict, name: str) -> dict:
    """Mistral (and Mixtral): Llama's keys and a window. transformers' Mistral and Mixtral read neither
    attention_bias nor mlp_bias (their projections have no biases), so neither is refused."""
    values = _llama_values(config, name, biases=())
    window = config.get("sliding_window")
    if window and int(window) < int(config.get("max_position_embeddings") or 1 << 62):
        values["sliding_window"] = int(window)  # Mistral 7B v0.1: every layer sees the last 4096
    return values


def _qwen_values(config: dict, name: str) -> dict:
    values = {**_dense_values(config, name), **_rope_values(config, name, "Qwen", ("yarn", "linear"))}
    window = config.get("sliding_window") if config.get("use_sliding_window") else None
    if window:
        # Qwen slides the window in layers max_window_layers on (transformers now lists each layer's
        # type): Linnet's Qwen cards have one window for every layer, or none
        layers = values["layers"]
        types = config.get("layer_types")  # (or layers max_window_layers on, counted, not listed)
        sliding = (sum(t == "sliding_attention" for t in types) if types
                   else min(max(layers - int(config.get("max_window_layers", 28)), 0), layers))
        if 0 < sliding < layers:
            raise WeightsError(f"{name}: use_sliding_window is set for {sliding} of {layers} layers (from "
                               f"max_window_layers or layer_types); Linnet's Qwen cards slide a window in every "
                               f"layer or in none")
        if sliding and int(window) < int(config.get("max_position_embeddings") or 1 << 62):
            values["sliding_window"] = int(window)
    return values


def _qwen2_values(config: dict, name: str) -> dict:
    # q, k and v have biases in every Qwen2, o and the MLP none: transformers' Qwen2 reads neither
    # attention_bias nor mlp_bias
    return _qwen_values(config, name)


def _qwen3_values(config: dict, name: str) -> dict:
    _refuse_biases(config, name, ("attention_bias",))  # (its MLP has no biases whatever mlp_bias says)
    return _qwen_values(config, name)


def _qwen3_moe_values(config: dict, name: str) -> dict:
    _refuse_biases(config, name, ("attention_bias",))
    dense = config.get("mlp_only_layers") or []
    step = int(config.get("decoder_sparse_step") or 1)
    if dense or step != 1:
        raise WeightsError(f"{name}: this checkpoint gives some layers a dense MLP (mlp_only_layers {dense}, "
                           f"decoder_sparse_step {step}); the qwen3_moe architecture routes every layer to its experts")
    # transformers' Qwen3-MoE slides use_sliding_window's window in every layer: it reads no max_window_layers
    # (which Qwen3-MoE's config.json holds, 48 in Qwen3-30B-A3B's) and no layer_types
    every_layer = {"max_window_layers": 0, "layer_types": None}
    return {**_qwen_values({**config, **every_layer, "intermediate_size": config["moe_intermediate_size"]}, name),
            # the hub's name, and transformers 5's
            "experts": _experts(config),
            "experts_per_token": int(config["num_experts_per_tok"]),
            "norm_topk_prob": bool(config.get("norm_topk_prob", False))}


def _mixtral_values(config: dict, name: str) -> dict:
    return {**_mistral_values(config, name), "experts": _experts(config),
            "experts_per_token": int(config["num_experts_per_tok"])}


def _gpt_oss_values(config: dict, name: str) -> dict:
    layers = int(config["num_hidden_layers"])
    if config.get("layer_types") not in (None, attention_layer_types(layers, 2)):
        raise WeightsError(f"{name}: gpt-oss layers must alternate sliding and full attention, sliding first "
                           f"(the architecture's pattern); this config has {config['layer_types']}")
    if config.get("tie_word_embeddings"):
        raise WeightsError(f"{name}: the gpt-oss architecture has an untied head; this config ties it")
    scaling, kind = _rope_scaling(config)
    if kind != "yarn":
        raise WeightsError(f"{name}: gpt-oss checkpoints use YaRN rope; this config has {kind!r}")
    heads = int(config["num_attention_heads"])
    return {
        "vocab": int(config["vocab_size"]),
        "dim": int(config["hidden_size"]),
        "layers": layers,
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        "experts": _experts(config),
        "experts_per_token": int(config["num_experts_per_tok"]),
        "ffn": int(config["intermediate_size"]),
        "sliding_window": _window(config, name, "gpt-oss", 128),
        "swiglu_alpha": float(config.get("swiglu_alpha", 1.702)),
        "swiglu_limit": float(config.get("swiglu_limit", 7.0)),
        "norm_eps": float(config.get("rms_norm_eps", 1e-5)),
        "rope_theta": _rope_theta(config, 150000.0),
        "rope_factor": float(scaling["factor"]),
        "rope_original_max": _original_context(config, scaling),
        "rope_beta_fast": float(scaling.get("beta_fast") or 32.0),
        "rope_beta_slow": float(scaling.get("beta_slow") or 1.0),
        "rope_truncate": bool(scaling.get("truncate", True)),
    }


def _window(config: dict, name: str, family: str, default: int) -> int:
    """The window of a family whose every config has one (Gemma 2 and 3, gpt-oss): `default` where the
    config leaves it out (a GGUF's may: Gemma 3's without a window, whose layers all attend to whole rows).
    A null is refused (it had been read as `default`): transformers' models of these families build a
    sliding-window mask and cache whatever the layers' kinds, and fail without the window's length. So is a
    window under 1, under which a sliding layer attends to nothing (transformers fails there too)."""
    window = config.get("sliding_window", default)
    if window is None or window < 1:
        raise WeightsError(f"{name}: config.json's sliding_window is {'null' if window is None else window}; a "
                           f"{family} config needs its window's length, at least 1 (transformers' {family} runs "
                           f"no model without one)")
    return int(window)


def every_nth_layer(layers: int, n: int) -> list:
    """True in every `n`-th layer, false in the others: how transformers and llama.cpp lay out a kind of
    layer from an interval (Gemma's full-attention layers, SmolLM3's NoPE ones)."""
    return [(i + 1) % n == 0 for i in range(layers)]


def attention_layer_types(layers: int, pattern: int) -> list:
    """Layer kinds as a config.json's `layer_types` lists them: full attention in every `pattern`-th layer,
    sliding in the others (Gemma 3's; at pattern 2 Gemma 2's and gpt-oss's, the first sliding)."""
    return ["full_attention" if full else "sliding_attention" for full in every_nth_layer(layers, pattern)]


GEMMA_LAYER_TYPES = ("sliding_attention", "full_attention")


def gemma_full_layers(types: list, layers: int, name: str) -> list:
    """The gemma architectures' `full_layers` (whether each layer attends to its whole row) from a
    config's `layer_types`: one of GEMMA_LAYER_TYPES for each layer."""
    unknown = sorted({t for t in types if t not in GEMMA_LAYER_TYPES}, key=str)
    if unknown or len(types) != layers:
        raise WeightsError(f"{name}: layer_types must name each of its {layers} layers' attention, "
                           f"{' or '.join(GEMMA_LAYER_TYPES)}; this config has {types}")
    return [t == "full_attention" for t in types]


def gemma_layer_values(types: list | None, layers: int, pattern: int, name: str) -> dict:
    """A Gemma card's values for its layers' kinds: the window pattern where `layer_types` follows one
    (or there is none), else the list itself as `full_layers`, any order transformers takes."""
    if types is None:
        return {"window_pattern": pattern}
    # every layer sliding says only that the pattern is past the last layer: the config's own, where it is
    follows = next((i + 1 for i, t in enumerate(types) if t == "full_attention"), max(pattern, layers + 1))
    if types == attention_layer_types(layers, follows):
        return {"window_pattern": follows}
    return {"window_pattern": pattern, "full_layers": gemma_full_layers(types, layers, name)}


def _gemma3_values(config: dict, name: str) -> dict:
    """Gemma 3's text model. Its config names each layer's kind (`layer_types`; older ones a
    `sliding_window_pattern`) and each kind's rope (`rope_parameters` by kind; older ones
    `rope_theta`, `rope_local_base_freq` and `rope_scaling` for the full-attention layers)."""
    _refuse_biases(config, name, ("attention_bias",))
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            raise WeightsError(f"{name}: {key} is set; the gemma3 architecture caps no logits (gemma2's does)")
    if config.get("use_bidirectional_attention"):  # (EmbeddingGemma's: every token sees the whole text)
        raise WeightsError(f"{name}: use_bidirectional_attention is set; the gemma3 architecture is causal")
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise WeightsError(f"{name}: hidden_activation {act!r}; the gemma3 architecture's MLP gates with GELU's "
                           f"tanh form (gelu_pytorch_tanh)")
    layers = int(config["num_hidden_layers"])
    pattern = int(config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6)
    kinds_of_layers = gemma_layer_values(config.get("layer_types"), layers, pattern, name)
    heads, dim = int(config["num_attention_heads"]), int(config["hidden_size"])
    rope = config.get("rope_parameters") or {}
    full = rope.get("full_attention") or {"rope_theta": config.get("rope_theta", 1000000.0),
                                          **(config.get("rope_scaling") or {})}
    local = rope.get("sliding_attention") or {"rope_theta": config.get("rope_local_base_freq", 10000.0)}
    kinds = {kind: spec.get("rope_type", spec.get("type", "default")) for kind, spec in
             (("full-attention", full), ("sliding-window", local))}
    if kinds["sliding-window"] != "default" or kinds["full-attention"] not in ("default", "linear"):
        raise WeightsError(f"{name}: rope scaling {kinds}; the gemma3 architecture scales the full-attention "
                           f"layers' rope linearly, or not at all, and the sliding-window layers' not at all")
    values = {
        "vocab": int(config["vocab_size"]), "dim": dim, "layers": layers, "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or dim // heads), "ffn": int(config["intermediate_size"]),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "query_pre_attn_scalar": int(config.get("query_pre_attn_scalar") or config.get("head_dim") or dim // heads),
        "rope_theta": float(full.get("rope_theta", 1000000.0)),
        "rope_local_theta": float(local.get("rope_theta", 10000.0)),
        "sliding_window": _window(config, name, "Gemma 3", 512), **kinds_of_layers,
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
    }
    if kinds["full-attention"] == "linear":
        values.update(rope_scaling="linear", rope_factor=float(full["factor"]))
    return values


def _gemma2_values(config: dict, name: str) -> dict:
    """Gemma 2: Gemma 3's keys less its second rope, its layers' kinds alternating (`layer_types`, the
    first sliding), and the two soft caps (null: none, 0 to the card)."""
    _refuse_biases(config, name, ("attention_bias",))
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise WeightsError(f"{name}: hidden_activation {act!r}; the gemma2 architecture's MLP gates with GELU's "
                           f"tanh form (gelu_pytorch_tanh)")
    if config.get("use_bidirectional_attention"):
        raise WeightsError(f"{name}: use_bidirectional_attention is set; the gemma2 architecture is causal")
    _plain_rope(config, name, "Gemma 2", "gemma2")
    layers = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    kinds_of_layers = {} if types is None or types == attention_layer_types(layers, 2) else \
        {"full_layers": gemma_full_layers(types, layers, name)}
    heads, dim = int(config["num_attention_heads"]), int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or dim // heads)
    return {
        "vocab": int(config["vocab_size"]), "dim": dim, "layers": layers, "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads), "head_dim": head_dim,
        "ffn": int(config["intermediate_size"]), "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "query_pre_attn_scalar": int(config.get("query_pre_attn_scalar") or head_dim),
        "rope_theta": _rope_theta(config, 10000.0), "sliding_window": _window(config, name, "Gemma 2", 4096),
        "window_pattern": 2, **kinds_of_layers, "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
        "attn_softcap": float(config.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(config.get("final_logit_softcapping") or 0.0),
    }


def _olmo2_values(config: dict, name: str) -> dict:
    """OLMo 2: Llama's config keys; its norms' places are the architecture's, not the config's."""
    _refuse_biases(config, name, ("attention_bias",))
    return {**_dense_values(config, name), **_rope_values(config, name, "OLMo 2", ("llama3", "linear", "yarn"))}


def _granite_values(config: dict, name: str) -> dict:
    """Granite: Llama's config keys and µP's four multipliers (each 1 where the config has none, as in
    transformers' GraniteConfig)."""
    _refuse_biases(config, name)
    return {**_dense_values(config, name), **_rope_values(config, name, "Granite", ("llama3", "linear", "yarn")),
            **{key: float(config.get(key, 1.0)) for key in ("embedding_multiplier", "residual_multiplier",
                                                            "attention_multiplier", "logits_scaling")}}


def _phi3_values(config: dict, name: str) -> dict:
    """Phi-3: Llama's config keys and Mistral's window. The longrope of the 128k models (and of
    Phi-3.5 and Phi-4-mini), and Phi-4-mini's rope over part of each head, are refused: the phi3
    architecture rotates whole heads at one frequency table. transformers' Phi-3 reads neither
    attention_bias nor mlp_bias (no projection has a bias), so neither is refused."""
    scaling, kind = _rope_scaling(config)
    if kind not in ("default", None):
        raise WeightsError(f"{name}: rope scaling {kind!r} is not supported for Phi-3 checkpoints (the 128k "
                           f"models' longrope); the phi3 architecture computes plain rope, as the 4k models use")
    partial = float(config.get("partial_rotary_factor") or (config.get("rope_parameters") or {})
                    .get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        raise WeightsError(f"{name}: partial_rotary_factor {partial}; the phi3 architecture rotates whole heads")
    values = _dense_values(config, name)
    window = config.get("sliding_window")
    if window and int(window) < int(config.get("max_position_embeddings") or 1 << 62):
        values["sliding_window"] = int(window)  # Phi-3-mini-4k: every layer sees the last 2047
    return values


def smollm3_rope_layers(layers: int, interval: int) -> list:
    """SmolLM3's `no_rope_layers` as config.json lists them: 0 (no rope) in every `interval`-th layer."""
    return [int(not nope) for nope in every_nth_layer(layers, interval)]


def _smollm3_values(config: dict, name: str) -> dict:
    """SmolLM3: Llama's config keys and its NoPE layers, read from `no_rope_layers` (1 where a layer
    rotates), or from `no_rope_layer_interval` where there is no list, as transformers' SmolLM3Config
    makes one. A list that leaves rope out of one layer in every n is that interval on the card; any
    other is the card's `no_rope_layers` itself (one item a layer: a shorter list is refused, as
    transformers would fail on it). A sliding window, which SmolLM3 slides in its NoPE layers and the
    architecture nowhere, is refused."""
    _refuse_biases(config, name)
    values = {**_dense_values(config, name), **_rope_values(config, name, "SmolLM3", ("llama3", "linear", "yarn"))}
    layers = values["layers"]
    interval = int(config.get("no_rope_layer_interval") or 4)
    flags = config.get("no_rope_layers")
    if flags is not None:
        if len(flags) < layers:
            raise WeightsError(f"{name}: no_rope_layers must say whether each of its {layers} layers rotates; "
                               f"this config has {config['no_rope_layers']}")
        flags = [int(bool(f)) for f in flags[:layers]]
        # no layer without rope says only that the interval is past the last layer
        follows = next((i + 1 for i, f in enumerate(flags) if not f), max(interval, layers + 1))
        if flags == smollm3_rope_layers(layers, follows):
            interval = follows
        else:
            values["no_rope_layers"] = [bool(f) for f in flags]
    sliding = [i for i, kind in enumerate(config.get("layer_types") or []) if kind == "sliding_attention"]
    if sliding or (config.get("use_sliding_window") and config.get("sliding_window")):
        raise WeightsError(f"{name}: this config slides a window (use_sliding_window, sliding_window, layer_types: "
                           f"layers {sliding}); the smollm3 architecture attends over whole rows in every layer")
    return {**values, "no_rope_interval": interval}


def _deepseek_v2_values(config: dict, name: str) -> dict:
    """DeepSeek-V2 without a query latent (q_lora_rank null: V2-Lite): MLA's ranks and head widths, the
    dense layers before the experts, greedy top-k of the router's softmax, YaRN with mscale. A query
    latent (DeepSeek-V2 236B, V3), group-limited routing, sigmoid scores, experts in other than every
    layer after the dense ones are refused: the deepseek_v2 architecture computes none of them."""
    _refuse_mla(config, name, "deepseek_v2", {
        "q_lora_rank": (config.get("q_lora_rank"), None),
        "topk_method": (config.get("topk_method") or "greedy", "greedy"),
        "scoring_func": (config.get("scoring_func") or "softmax", "softmax"),
        "moe_layer_freq": (int(config.get("moe_layer_freq", 1)), 1)},
        "DeepSeek-V2-Lite's: no query latent, greedy top-k of a softmax, experts in every layer after the dense ones")
    return _mla_values(config, name)


def _deepseek_v3_values(config: dict, name: str) -> dict:
    """DeepSeek-V3 (and R1): V2's MLA with a query latent, and experts chosen by sigmoid scores plus a
    correction bias among the best groups (n_group, topk_group). A config without a query latent, with
    rope not interleaved (rope_interleave false: the checkpoint's rows already in halves) or another
    scoring is refused: the deepseek_v3 architecture computes none of them."""
    _refuse_mla(config, name, "deepseek_v3", {
        "q_lora_rank is null": (config.get("q_lora_rank") is None, False),
        "rope_interleave": (bool(config.get("rope_interleave", True)), True),
        "scoring_func": (config.get("scoring_func") or "sigmoid", "sigmoid"),
        "topk_method": (config.get("topk_method") or "noaux_tc", "noaux_tc"),
        "moe_layer_freq": (int(config.get("moe_layer_freq", 1)), 1)},
        "DeepSeek-V3's: a query latent, interleaved rope, group-limited top-k of corrected sigmoid scores",
        biases=("attention_bias",))  # (transformers' DeepSeek-V3 MLPs have no biases whatever mlp_bias says)
    return {**_mla_values(config, name), "q_lora_rank": int(config["q_lora_rank"]),
            "expert_groups": int(config["n_group"]), "topk_groups": int(config["topk_group"]),
            "norm_topk_prob": bool(config.get("norm_topk_prob", True))}


def _refuse_mla(config: dict, name: str, arch: str, refused: dict, what: str,
                biases=("attention_bias", "mlp_bias")) -> None:
    """The checks both DeepSeek architectures make: none of `biases` set, SwiGLU, and each of `refused`'s
    {key: (the config's value, the one the architecture computes)}."""
    _refuse_biases(config, name, biases)
    act = config.get("hidden_act", "silu")
    if act not in SILU:
        raise WeightsError(f"{name}: hidden_act {act!r}; the {arch} architecture's MLPs are SwiGLU (silu)")
    for key, (value, want) in refused.items():
        if value != want:
            said = key if " " in key else f"{key} is {value!r}"
            raise WeightsError(f"{name}: {said}; the {arch} architecture computes {want!r} only ({what})")


def _mla_values(config: dict, name: str) -> dict:
    """What both DeepSeek architectures read: MLA's ranks and widths, the experts, YaRN with mscale."""
    scaling, kind = _rope_scaling(config)
    if kind not in ("default", None, "yarn"):
        raise WeightsError(f"{name}: rope scaling {kind!r} is not supported for DeepSeek checkpoints (YaRN or none)")
    rope = {}
    if kind == "yarn":
        factor = float(scaling["factor"])
        mscale, all_dim = float(scaling.get("mscale") or 0.0), float(scaling.get("mscale_all_dim") or 0.0)
        own = scaling.get("attention_factor")
        stretch = math.log(factor) if factor > 1 else 0.0  # transformers' get_mscale: 1 where factor <= 1
        derived = ((0.1 * mscale * stretch + 1) / (0.1 * all_dim * stretch + 1) if mscale and all_dim
                   else 0.1 * stretch + 1)
        if own is not None and not math.isclose(float(own), derived):
            raise WeightsError(f"{name}: YaRN with attention_factor {own} is not supported; the DeepSeek "
                               f"architectures derive it from mscale and mscale_all_dim ({derived})")
        rope = {"rope_scaling": "yarn", "rope_factor": factor,
                "rope_original_max": _original_context(config, scaling),
                "rope_beta_fast": float(scaling.get("beta_fast") or 32.0),
                "rope_beta_slow": float(scaling.get("beta_slow") or 1.0),
                "rope_mscale": mscale, "rope_mscale_all_dim": all_dim}
    experts_per_token = config.get("num_experts_per_tok")
    if experts_per_token is None:
        raise KeyError("num_experts_per_tok")
    return {
        "vocab": int(config["vocab_size"]), "dim": int(config["hidden_size"]),
        "layers": int(config["num_hidden_layers"]), "heads": int(config["num_attention_heads"]),
        "ffn": int(config["intermediate_size"]), "kv_lora_rank": int(config["kv_lora_rank"]),
        "qk_nope_head_dim": int(config["qk_nope_head_dim"]), "qk_rope_head_dim": int(config["qk_rope_head_dim"]),
        "v_head_dim": int(config["v_head_dim"]), "experts": int(config["n_routed_experts"]),
        "experts_per_token": int(experts_per_token), "moe_ffn": int(config["moe_intermediate_size"]),
        "shared_experts": int(config["n_shared_experts"]),
        "first_dense": int(config["first_k_dense_replace"]),
        "routed_scaling": float(config["routed_scaling_factor"]),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)), "rope_theta": _rope_theta(config, 10000.0), **rope,
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }


# transformers' two spellings of GELU's tanh form (NewGELUActivation, PytorchGELUTanh): phi2.linnet's gelu_tanh
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")


def _phi_values(config: dict, name: str) -> dict:
    """Phi-2 (and phi-1.5): PhiConfig's keys. Rotary over int(head_dim * partial_rotary_factor) of each head
    (a top-level key, or transformers 5's rope_parameters), which must be even; per-head q/k LayerNorms
    (qk_layernorm), another activation, rope scaling and a tied head are refused: phi2.linnet has none."""
    act = config.get("hidden_act", "gelu_new")
    if act not in GELU_TANH:
        raise WeightsError(f"{name}: hidden_act {act!r}; the phi2 architecture's MLP is GELU's tanh form (gelu_new)")
    if config.get("qk_layernorm"):
        raise WeightsError(f"{name}: qk_layernorm is set; the phi2 architecture norms no query or key heads")
    if config.get("tie_word_embeddings"):
        raise WeightsError(f"{name}: tie_word_embeddings is set; the phi2 architecture's head is a weight of its own")
    scaling = _plain_rope(config, name, "Phi-2", "phi2")
    heads, dim = int(config["num_attention_heads"]), int(config["hidden_size"])
    head_dim = dim // heads  # PhiAttention's: no head_dim key
    partial = config.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 0.5))
    rotary_dim = int(head_dim * float(partial))  # as transformers' PhiAttention rounds it
    if rotary_dim <= 0 or rotary_dim % 2:
        raise WeightsError(f"{name}: partial_rotary_factor {partial} rotates {rotary_dim} of each head's {head_dim} "
                           f"dims; rope rotates the halves of an even, non-zero part")
    return {
        "vocab": int(config["vocab_size"]), "dim": dim, "layers": int(config["num_hidden_layers"]), "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads), "head_dim": head_dim,
        "ffn": int(config["intermediate_size"]), "rotary_dim": rotary_dim,
        "norm_eps": float(config.get("layer_norm_eps", 1e-5)), "rope_theta": _rope_theta(config, 10000.0),
    }


def _gpt2_values(config: dict, name: str) -> dict:
    """GPT-2: GPT2Config's keys (n_embd, n_layer, n_head, n_inner, n_positions, or the names transformers maps
    them from), its defaults where one is absent. What the gpt2 architecture does not compute is refused:
    another activation, attention scaled otherwise (scale_attn_weights false, scale_attn_by_inverse_layer_idx),
    cross-attention."""
    act = config.get("activation_function", "gelu_new")
    if act not in GELU_TANH:
        raise WeightsError(f"{name}: activation_function {act!r}; the gpt2 architecture's MLP is GELU's tanh form "
                           f"(gelu_new)")
    # key -> (the value the architecture computes, what it computes)
    for key, (fine, what) in {"scale_attn_weights": (True, "scales scores by 1 / sqrt(head_dim)"),
                              "scale_attn_by_inverse_layer_idx": (False, "scales no layer's scores otherwise"),
                              "add_cross_attention": (False, "has no cross-attention")}.items():
        if bool(config.get(key, fine)) != fine:
            raise WeightsError(f"{name}: {key} is {config[key]}; the gpt2 architecture {what}")

    def get(key: str, alias: str, default):
        return config.get(key, config.get(alias, default))

    dim, heads = int(get("n_embd", "hidden_size", 768)), int(get("n_head", "num_attention_heads", 12))
    return {
        "vocab": int(config.get("vocab_size", 50257)), "dim": dim, "heads": heads,
        "layers": int(get("n_layer", "num_hidden_layers", 12)), "ffn": int(config.get("n_inner") or 4 * dim),
        "max_pos": int(get("n_positions", "max_position_embeddings", 1024)),
        "norm_eps": float(config.get("layer_norm_epsilon", 1e-5)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
    }


# Mistral's checkpoints share Llama's architecture, not its tool calls (Qwen's architectures name theirs).
TOOL_CALL_PARSERS = {"MistralForCausalLM": "mistral"}

# a checkpoint's `architectures` entry -> (Linnet architecture, its config values from config.json)
SUPPORTED = {
    "LlamaForCausalLM": ("llama", _llama_values),
    "MistralForCausalLM": ("llama", _mistral_values),
    "MixtralForCausalLM": ("mixtral", _mixtral_values),
    "Qwen2ForCausalLM": ("qwen2", _qwen2_values),
    "Qwen3ForCausalLM": ("qwen3", _qwen3_values),
    "Qwen3MoeForCausalLM": ("qwen3_moe", _qwen3_moe_values),
    "GptOssForCausalLM": ("gpt_oss", _gpt_oss_values),
    "Gemma3ForCausalLM": ("gemma3", _gemma3_values),
    "Olmo2ForCausalLM": ("olmo2", _olmo2_values),
    "GraniteForCausalLM": ("granite", _granite_values),
    "Phi3ForCausalLM": ("phi3", _phi3_values),
    "SmolLM3ForCausalLM": ("smollm3", _smollm3_values),
    "Gemma2ForCausalLM": ("gemma2", _gemma2_values),
    "DeepseekV2ForCausalLM": ("deepseek_v2", _deepseek_v2_values),
    "DeepseekV3ForCausalLM": ("deepseek_v3", _deepseek_v3_values),
    "PhiForCausalLM": ("phi2", _phi_values),
    "GPT2LMHeadModel": ("gpt2", _gpt2_values),
}
