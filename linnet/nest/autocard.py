"""A card for a local checkpoint that is not in the registry, written from its config.

Llama-family checkpoints (`architectures: LlamaForCausalLM`, or a GGUF whose
architecture is llama) get a card over the built-in Llama architecture.
"""

from __future__ import annotations

from linnet.nest.errors import WeightsError

SUPPORTED = ("LlamaForCausalLM",)


def card_source_from_config(config: dict, name: str) -> str:
    archs = config.get("architectures") or []
    if not any(a in SUPPORTED for a in archs):
        raise WeightsError(f"{name}: architecture {archs or 'unknown'} is not supported for checkpoints "
                           f"without a card; supported: {', '.join(SUPPORTED)}")
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
        "rope_theta": float(config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "llama3":
        values.update(rope_scaling="llama3", rope_factor=float(scaling["factor"]),
                      rope_low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
                      rope_high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
                      rope_original_max=int(scaling.get("original_max_position_embeddings", 8192)))
    elif kind == "linear":
        values.update(rope_scaling="linear", rope_factor=float(scaling["factor"]))
    elif kind not in ("default", None):
        raise WeightsError(f"{name}: rope scaling {kind!r} is not supported for Llama checkpoints")
    lines = [f'card "{name}"', "import llama", "", "config {"]
    for key, value in values.items():
        text = ("true" if value else "false") if isinstance(value, bool) else (f'"{value}"' if isinstance(value, str) else repr(value))
        lines.append(f"  {key} = {text}")
    lines.append("}")
    return "\n".join(lines) + "\n"
