"""A GGUF that is not in the registry: the tiny transformers Llama converted as llama.cpp's converter
does (GGUF names, q/k rows permuted, llama.* metadata) loads through nest.load(path), with a card
written from the GGUF's metadata, and gives transformers' logits. A truncated GGUF is an error that
names the file and the tensor cut short."""

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.nest.errors import WeightsError
from linnet.nest.transforms import permute_rope

gguf = pytest.importorskip("gguf")

PROMPTS = [[5, 17, 200, 3, 99, 41, 7], [250, 1, 64, 128, 9]]
_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}


def to_gguf(hf_model, path, qtype=None):
    cfg = hf_model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(cfg.vocab_size)
    for name, t in hf_model.state_dict().items():
        a = t.detach().float().numpy()
        if name in _TOP:
            gname = _TOP[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{_BLOCK[module]}.{suffix}"
            if module == "self_attn.q_proj":
                a = permute_rope(a, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                a = permute_rope(a, cfg.num_key_value_heads)
        a = np.ascontiguousarray(a)
        if qtype is not None and a.ndim == 2:
            a = gguf.quants.quantize(a, qtype)
            w.add_tensor(gname, a, raw_dtype=qtype)
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def logits(model):
    tokens = np.concatenate([np.array(p, np.int32) for p in PROMPTS])
    positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in PROMPTS])
    rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(PROMPTS)])
    last = np.cumsum([len(p) for p in PROMPTS]).astype(np.int32) - 1
    return np.asarray(model.prefill(tokens, positions, rows, last))


@pytest.mark.parametrize("qtype,tolerance", [(None, 1e-4), (gguf.GGMLQuantizationType.Q8_0, 2e-2)])
def test_gguf_without_a_card_matches_transformers(tiny_hf, tmp_path, qtype, tolerance):
    hf_model, _ = tiny_hf
    path = to_gguf(hf_model, tmp_path / "tiny.gguf", qtype)
    model = nest.load(path, backend="torch", generics={"Batch": 2, "MaxSeq": 16}, tokenizer=False)
    assert model.card == "tiny" and model.weights == str(path)
    ours = logits(model)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ref = hf_model(input_ids=torch.tensor([p])).logits[0, -1].numpy()
            assert np.abs(ours[i] - ref).max() / np.abs(ref).max() <= tolerance


def test_truncated_gguf_names_the_tensor(tiny_hf, tmp_path):
    hf_model, _ = tiny_hf
    path = to_gguf(hf_model, tmp_path / "tiny.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-5000])
    with pytest.raises(WeightsError) as e:
        nest.load(path, tokenizer=False)
    msg = str(e.value)
    assert msg.startswith(f"{path}: cannot read GGUF file") and "truncated or corrupt" in msg
    assert "tensor '" in msg and f"but the file has {len(data) - 5000}" in msg
