"""Names a model can use, and suggestions for names that are not there."""

from __future__ import annotations

import difflib
import keyword

RESERVED = set(keyword.kwlist) | {"self", "params", "state", "rt", "torch", "jax", "jnp", "np", "lax", "F", "Model",
                                    "PARAMS", "STATE", "CONFIG", "GENERICS", "FAST", "range"}


def suggest(name: str, candidates) -> list[str]:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.6)
    return [f"did you mean {' or '.join(repr(c) for c in close)}?"] if close else []
