"""A GGUF that is not in the registry: the tiny transformers Llama converted as llama.cpp's converter
does (GGUF names, q/k rows permuted, llama.* metadata) loads through nest.load(path), with a card
written from the GGUF's metadata, and gives transformers' logits. A truncated GGUF is an error that
names the file and the tensor cut short."""

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.nest.errors import WeightsError

gguf = pytest.importorskip("gguf")

PROMPTS = [[5, 17, 200, 3, 99, 41, 7], [250, 1, 64, 128, 9]]


def logits(model):
    tokens = np.concatenate([np.array(p, np.int32) for p in PROMPTS])
    positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in PROMPTS])
    rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(PROMPTS)])
    last = np.cumsum([len(p) for p in PROMPTS]).astype(np.int32) - 1
    return np.asarray(model.prefill(tokens, positions, rows, last))


@pytest.mark.parametrize("qtype,tolerance", [(None, 1e-4), (gguf.GGMLQuantizationType.Q8_0, 2e-2)])
def test_gguf_without_a_card_matches_transformers(tiny_hf, tmp_path, qtype, tolerance, to_gguf):
    hf_model, _ = tiny_hf
    path = to_gguf(hf_model, tmp_path / "tiny.gguf", qtype)
    model = nest.load(path, backend="torch", generics={"Batch": 2, "MaxSeq": 16}, tokenizer=False)
    assert model.card == "tiny" and model.weights == str(path)
    ours = logits(model)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ref = hf_model(input_ids=torch.tensor([p])).logits[0, -1].numpy()
            assert np.abs(ours[i] - ref).max() / np.abs(ref).max() <= tolerance


def test_truncated_gguf_names_the_tensor(tiny_hf, tmp_path, to_gguf):
    hf_model, _ = tiny_hf
    path = to_gguf(hf_model, tmp_path / "tiny.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-5000])
    with pytest.raises(WeightsError) as e:
        nest.load(path, tokenizer=False)
    msg = str(e.value)
    assert msg.startswith(f"{path}: cannot read GGUF file") and "truncated or corrupt" in msg
    assert "tensor '" in msg and f"but the file has {len(data) - 5000}" in msg
