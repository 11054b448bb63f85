"""Names a model can use, and suggestions for names that are not there.

Generated code names config values, params, state, entries, arguments and locals as the source
does, so a name the generated code itself uses is reserved: the names below were read off both
code generators (`pyemit`, `codegen_torch.emit`, `codegen_jax.emit`) and their runtimes' model
classes. Names the code generators make up themselves (a JAX loop's body function, rope tables,
locals of an inlined `fn`) are chosen to avoid the model's names, so they reserve nothing.
"""

from __future__ import annotations

import difflib
import keyword

# Why each name is reserved, wherever it is declared.
_GENERATED = {
    **{name: "a module the generated code imports" for name in ("rt", "torch", "jax", "jnp", "np", "lax", "F", "math")},
    **{name: "a constant of the generated module" for name in ("Model", "PARAMS", "STATE", "TIED", "CONFIG",
                                                                "GENERICS", "FAST")},
    **{name: "a Python built-in the generated code calls" for name in ("range", "slice", "max", "min", "abs")},
    "self": "the torch model's `self`",
    "params": "an argument of every JAX entry, and a table of the generated model",
    "state": "an argument of every JAX entry, and a table of the generated model",
}
RESERVED = set(keyword.kwlist) | set(_GENERATED)

# Attributes of the generated model classes (`rt.TorchModel`, `rt.JaxModel` and what the generated
# class adds). A torch model holds its params, state and entries as attributes, so none of those
# can take one of TORCH_ATTRIBUTES; a JAX model holds its params and state in dicts, its entries as
# attributes, so an entry cannot take one of JAX_ATTRIBUTES either. tests/frontend/test_names.py
# holds these lists against the classes.
TORCH_ATTRIBUTES = frozenset({
    "params", "tied", "state", "linear_weights", "linear_groups", "fast", "pack_rows", "device", "init_tables",
    "reset_state", "pack_linear_weights", "fuse_linear_groups", "weight_bytes",
    "join_linear_groups", "_joined_groups", "_hand_out_parts", "expert_weights", "pack_expert_weights",
    "quant_blocks", "_kept_in_blocks", "_join_quant_group", "gathered_tables", "_gathered_from_head",
})
JAX_ATTRIBUTES = frozenset({
    "params", "tied", "state", "entries", "stacked", "linear_groups", "linear_weights", "shard_params",
    "shard_state", "fast", "mesh", "device", "whole", "weights", "compiles_loops", "traced", "compiled",
    "compiled_then", "state_bits", "cache", "reset_state", "fuse_linear_groups", "pack_linear_weights", "call",
    "call_then", "_placement", "_placements", "_jit", "_run", "_arguments", "ahead", "compile_ahead",
    "fused_parts", "device_major", "_splits_by_part", "_zero_state",
})


def reserved_reason(name: str) -> str | None:
    """Why `name` cannot name anything in a model (None when it can)."""
    if keyword.iskeyword(name):
        return "a Python keyword"
    if name in _GENERATED:
        return _GENERATED[name]
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        return "one of Python's special names"
    return None


def reserved(name: str) -> bool:
    return reserved_reason(name) is not None


def suggest(name: str, candidates) -> list[str]:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return [f"did you mean {' or '.join(repr(c) for c in close)}?"] if close else []
