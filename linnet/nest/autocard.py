"""A card for a local checkpoint that is not in the registry, written from its config.

Llama-family checkpoints (`architectures: LlamaForCausalLM`, or a GGUF whose
architecture is llama) get a card over the built-in Llama architecture;
`GptOssForCausalLM` checkpoints one over the gpt-oss architecture.
"""

from __future__ import annotations

from linnet.nest.errors import WeightsError


def card_source_from_config(config: dict, name: str) -> str:
    archs = config.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED), None)
    if arch is None:
        raise WeightsError(f"{name}: architecture {archs or 'unknown'} is not supported for checkpoints "
                           f"without a card; supported: {', '.join(SUPPORTED)}")
    linnet_arch, values_of = SUPPORTED[arch]
    lines = [f'card "{name}"', f"import {linnet_arch}", "", "config {"]
    for key, value in values_of(config, name).items():
        lines.append(f"  {key} = {_literal(value)}")
    lines.append("}")
    if config.get("max_position_embeddings"):  # what the model was trained to attend over
        lines += ["", "meta {", f"  max_context = {int(config['max_position_embeddings'])}", "}"]
    return "\n".join(lines) + "\n"


def _literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _rope_scaling(config: dict) -> tuple[dict, str]:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return scaling, (scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default")


def _rope_theta(config: dict, default: float) -> float:
    return float(config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", default))


def _llama_values(config: dict, name: str) -> dict:
    # Llama checkpoints with biases (attention_bias, mlp_bias) exist; loaded without them they would
    # give wrong logits with nothing but an unused-tensor warning, so they are refused here.
    biased = [key for key in ("attention_bias", "mlp_bias") if config.get(key)]
    if biased:
        raise WeightsError(f"{name}: this Llama checkpoint has {' and '.join(biased)} set, and the llama "
                           f"architecture has no biases; write a card over an architecture that has them")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise WeightsError(f"{name}: hidden_act {act!r}; the llama architecture's MLP is SwiGLU (silu)")
    heads = int(config["num_attention_heads"])
    dim = int(config["hidden_size"])
    values = {
        "vocab": int(config["vocab_size"]),
        "dim": dim,
        "layers": int(config["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or dim // heads),
        "ffn": int(config["intermediate_size"]),
        "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "rope_theta": _rope_theta(config, 10000.0),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    scaling, kind = _rope_scaling(config)
    if kind == "llama3":
        values.update(rope_scaling="llama3", rope_factor=float(scaling["factor"]),
                      rope_low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
                      rope_high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
                      rope_original_max=int(scaling.get("original_max_position_embeddings", 8192)))
    elif kind == "linear":
        values.update(rope_scaling="linear", rope_factor=float(scaling["factor"]))
    elif kind not in ("default", None):
        raise WeightsError(f"{name}: rope scaling {kind!r} is not supported for Llama checkpoints")
    return values


def _gpt_oss_values(config: dict, name: str) -> dict:
    layers = int(config["num_hidden_layers"])
    sliding = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if config.get("layer_types") not in (None, sliding):
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
        "experts": int(config["num_local_experts"]),
        "experts_per_token": int(config["num_experts_per_tok"]),
        "ffn": int(config["intermediate_size"]),
        "sliding_window": int(config.get("sliding_window") or 128),
        "swiglu_alpha": float(config.get("swiglu_alpha", 1.702)),
        "swiglu_limit": float(config.get("swiglu_limit", 7.0)),
        "norm_eps": float(config.get("rms_norm_eps", 1e-5)),
        "rope_theta": _rope_theta(config, 150000.0),
        "rope_factor": float(scaling["factor"]),
        "rope_original_max": int(scaling.get("original_max_position_embeddings", 4096)),
        "rope_beta_fast": float(scaling.get("beta_fast") or 32.0),
        "rope_beta_slow": float(scaling.get("beta_slow") or 1.0),
        "rope_truncate": bool(scaling.get("truncate", True)),
    }


# a checkpoint's `architectures` entry -> (Linnet architecture, its config values from config.json)
SUPPORTED = {"LlamaForCausalLM": ("llama", _llama_values), "GptOssForCausalLM": ("gpt_oss", _gpt_oss_values)}
