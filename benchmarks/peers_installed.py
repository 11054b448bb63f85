"""Whether a peer's package (transformers, llama-cpp-python) imports here: a benchmark says so in one line
and skips that peer, or refuses where the peer is its reference, instead of a traceback."""

from __future__ import annotations

import importlib

PACKAGES = {"transformers": "transformers", "llama_cpp": "llama-cpp-python"}  # module: what pip installs


def installed(module: str) -> bool:
    """Whether `module` ("llama_cpp", "transformers") imports here."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def not_installed(module: str) -> str:
    """The words for a missing peer: "not installed (pip install llama-cpp-python)"."""
    return f"not installed (pip install {PACKAGES[module]})"
