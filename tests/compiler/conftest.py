"""Shared helpers of the compiler tests, reached through the session fixture `kit`.

Everything here is a reference or plumbing: transformers' `LlamaForCausalLM`
or `GptOssForCausalLM` built from a card's specialized config, packing of prompts into the
`prefill` contract, conversion of either backend's outputs to numpy, and the
relative error every comparison uses. Measured parity errors are collected
in `kit.PARITY` (tests/conftest.py's `parity`) and printed at the end of the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import linnet
from linnet.compiler import generate, import_source
from linnet.export.hf_config import gemma_layer_types  # a card's full_layers, as transformers names them

# transformers must never reach for the network in these tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CARDS = Path(linnet.__file__).parent / "nest" / "cards"
ARCH = CARDS / "arch" / "llama.linnet"

# ------------------------------------------------------------------ numbers


def to_np(x) -> np.ndarray:
    """A torch tensor or a JAX array (any float dtype) as a float32 numpy array of its own.

    Always a copy: a torch model updates its cache in place, and a view of it
    would change under the test.
    """
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().float().numpy().copy()
    return np.array(x, dtype=np.float32)


def rel_err(a, ref) -> float:
    """max|a - ref| / max|ref|: the one metric of every numeric comparison here."""
    a, ref = to_np(a), to_np(ref)
    assert a.shape == ref.shape, f"shapes differ: {a.shape} vs {ref.shape}"
    scale = float(np.abs(ref).max())
    assert scale > 0, "the reference is all zeros; the comparison would mean nothing"
    return float(np.abs(a - ref).max()) / scale


def i32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int32)


def as_inputs(backend: str, *arrays):
    """Entry arguments: torch int32 tensors for the torch backend, numpy int32 arrays for JAX."""
    if backend == "torch":
        return tuple(torch.from_numpy(i32(a)) for a in arrays)
    return tuple(i32(a) for a in arrays)


# ------------------------------------------------------------------ packing


def pack(prompts, rows=None, starts=None):
    """The `prefill` arguments for prompts packed end to end, no padding.

    Prompt j goes to cache row rows[j] (default j) from position starts[j]
    (default 0); `last` picks each prompt's final token. Returns
    (tokens, positions, rows, last), all i32 numpy arrays.
    """
    rows = list(range(len(prompts))) if rows is None else list(rows)
    starts = [0] * len(prompts) if starts is None else list(starts)
    tokens, positions, row_ids, last = [], [], [], []
    for p, r, s in zip(prompts, rows, starts):
        tokens.extend(int(t) for t in p)
        positions.extend(range(s, s + len(p)))
        row_ids.extend([r] * len(p))
        last.append(len(tokens) - 1)
    return i32(tokens), i32(positions), i32(row_ids), i32(last)


def pack_in_blocks(prompts, rows, starts=None, *, batch: int, max_seq: int):
    """The same pack laid out as the JAX attention reads it cheaply (linnet.codegen_jax.runtime).

    One-token prompts first, padded to `head_tokens(batch)` slots; then every
    longer prompt padded to a multiple of BLOCK. Padding tokens go to position
    max_seq - 1 of their block's row (the engine's scratch position, which no
    real token may use) and get no logits. Any layout must give the same
    logits; this one takes the blocked path.
    """
    from linnet.codegen_jax.runtime import BLOCK, head_tokens

    rows = list(range(len(prompts))) if rows is None else list(rows)
    starts = [0] * len(prompts) if starts is None else list(starts)
    scratch = max_seq - 1
    singles = [j for j, p in enumerate(prompts) if len(p) == 1]
    longer = [j for j, p in enumerate(prompts) if len(p) > 1]
    head = head_tokens(batch)
    assert len(singles) <= head
    tokens, positions, row_ids, last = [], [], [], {}
    for j in singles:
        last[j] = len(tokens)
        tokens.append(int(prompts[j][0]))
        positions.append(starts[j])
        row_ids.append(rows[j])
    pad = head - len(tokens)
    tokens, positions, row_ids = tokens + [0] * pad, positions + [scratch] * pad, row_ids + [0] * pad
    for j in longer:
        n = len(prompts[j])
        assert starts[j] + n <= scratch, "a real token may not use the scratch position"
        pad = -n % BLOCK
        tokens += [int(t) for t in prompts[j]] + [0] * pad
        positions += list(range(starts[j], starts[j] + n)) + [scratch] * pad
        row_ids += [rows[j]] * (n + pad)
        last[j] = len(tokens) - pad - 1
    assert len(tokens) % BLOCK == 0
    return i32(tokens), i32(positions), i32(row_ids), i32([last[j] for j in range(len(prompts))])


def cache_of(model, name: str) -> np.ndarray:
    """A state buffer of either backend's Model, as numpy."""
    if hasattr(model, "cache"):  # the JAX model threads its state through `self.cache`
        return to_np(model.cache[name])
    return to_np(getattr(model, name))


# ------------------------------------------------------------------ building


def compiled(module, backend: str, generics: dict, numerics: str = "exact"):
    """The imported generated module (equal sources share one module, and JAX its compiled entries)."""
    return import_source(generate(module, backend, generics, numerics))


def random_checkpoint(spec, seed: int, fmt: str = "hf") -> dict:
    """{checkpoint name: tensor} for every weight the specialized module declares, seeded.

    Each is stored in the checkpoint's layout (the declared transforms undone).
    Norm weights are near 1, everything else is scaled so that activations
    stay near unit size whatever the dims.
    """
    from linnet.nest.bind import expected_shapes

    g = torch.Generator().manual_seed(seed)
    out = {}
    for ckpt, (name, shape) in expected_shapes(spec, fmt).items():
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        if len(shape) == 1:
            t = 1.0 + 0.1 * t
        elif name != "embed":
            t = t / shape[-1] ** 0.5
        out[ckpt] = t
    return out


# the transformers class for each architecture of the tiny cards (llama with a window is Mistral)
HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM",
              "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
              "olmo2": "Olmo2ForCausalLM", "granite": "GraniteForCausalLM",
              "phi3": "Phi3ForCausalLM", "smollm3": "SmolLM3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
              "deepseek_v3": "DeepseekV3ForCausalLM", "phi2": "PhiForCausalLM",
              "gpt2": "GPT2LMHeadModel", "gemma3": "Gemma3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}


def hf_family(spec) -> str:
    return "mistral" if spec.name == "llama" and spec.bindings["sliding_window"] else spec.name


def hf_config(bindings: dict, max_seq: int, family: str = "llama"):
    """The transformers config equal to a specialized Llama-like card's config: a `LlamaConfig`, or
    Mistral's (a window), Mixtral's (experts), Qwen2's (q/k/v biases), Qwen3's (q/k norms) or
    Qwen3-MoE's (and experts), OLMo 2's (norms after each half, q/k norms over whole projections), Granite's
    (µP's multipliers), Phi-3's (fused projections, a window; its architecture has no rope scaling) or SmolLM3's
    (NoPE layers)."""
    import transformers

    b = {"rope_scaling": "none", **bindings}
    if b["rope_scaling"] == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": b["rope_theta"], "factor": b["rope_factor"],
                "low_freq_factor": b["rope_low_freq_factor"], "high_freq_factor": b["rope_high_freq_factor"],
                "original_max_position_embeddings": b["rope_original_max"]}
    elif b["rope_scaling"] == "yarn":
        rope = {"rope_type": "yarn", "rope_theta": b["rope_theta"], "factor": b["rope_factor"],
                "original_max_position_embeddings": b["rope_original_max"]}
    else:
        assert b["rope_scaling"] == "none", b["rope_scaling"]
        rope = {"rope_type": "default", "rope_theta": b["rope_theta"]}
    extra = {"llama": dict(attention_bias=False, mlp_bias=False), "mistral": dict(sliding_window=b.get("sliding_window")),
             "mixtral": dict(sliding_window=b.get("sliding_window") or None, num_local_experts=b.get("experts"),
                             num_experts_per_tok=b.get("experts_per_token")),
             "qwen2": dict(use_sliding_window=False), "qwen3": dict(attention_bias=False, use_sliding_window=False),
             "qwen3_moe": dict(attention_bias=False, use_sliding_window=False, num_experts=b.get("experts"),
                               num_experts_per_tok=b.get("experts_per_token"), moe_intermediate_size=b["ffn"],
                               norm_topk_prob=b.get("norm_topk_prob"), decoder_sparse_step=1, mlp_only_layers=[]),
             "olmo2": dict(attention_bias=False),
             "granite": dict(attention_bias=False, mlp_bias=False, **{k: b.get(k) for k in (
                 "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")}),
             "phi3": dict(sliding_window=b.get("sliding_window") or None, pad_token_id=None, eos_token_id=None),
             "smollm3": dict(attention_bias=False, mlp_bias=False, use_sliding_window=False,
                             no_rope_layer_interval=b.get("no_rope_interval"),
                             no_rope_layers=[int(r) for r in b.get("no_rope_layers", [])],  # 1: the layer rotates
                             pad_token_id=None, bos_token_id=None, eos_token_id=None)}[family]
    config_class = getattr(transformers, HF_CLASSES[family].replace("ForCausalLM", "Config"))
    config = config_class(
        vocab_size=b["vocab"], hidden_size=b["dim"], num_hidden_layers=b["layers"],
        num_attention_heads=b["heads"], num_key_value_heads=b["kv_heads"], head_dim=b["head_dim"],
        intermediate_size=b["ffn"], rms_norm_eps=b["norm_eps"], rope_theta=b["rope_theta"],
        rope_scaling=rope, max_position_embeddings=max_seq, tie_word_embeddings=b["tie_embeddings"],
        hidden_act="silu", attn_implementation="eager", **extra)
    # transformers 5 folds rope_theta and rope_scaling into rope_parameters: check it kept ours
    params = getattr(config, "rope_parameters", None) or {**(config.rope_scaling or {}), "rope_theta": config.rope_theta}
    for key, value in rope.items():
        assert params.get(key) == value, f"transformers changed rope {key}: {params}"
    assert config.rms_norm_eps == b["norm_eps"] and config.head_dim == b["head_dim"]
    if family == "smollm3":
        assert config.no_rope_layers == [int(r) for r in b["no_rope_layers"]]
    return config


def hf_gemma3_config(bindings: dict, max_seq: int):
    """A `Gemma3TextConfig` equal to a specialized Gemma 3 card's config: each layer's kind from the
    card's `full_layers`, each kind's rope (the full layers' with the card's scaling)."""
    from transformers import Gemma3TextConfig

    b = bindings
    full = {"rope_type": "default", "rope_theta": b["rope_theta"]}
    if b["rope_scaling"] == "linear":
        full.update(rope_type="linear", factor=b["rope_factor"])
    config = Gemma3TextConfig(
        vocab_size=b["vocab"], hidden_size=b["dim"], num_hidden_layers=b["layers"],
        num_attention_heads=b["heads"], num_key_value_heads=b["kv_heads"], head_dim=b["head_dim"],
        intermediate_size=b["ffn"], rms_norm_eps=b["norm_eps"], query_pre_attn_scalar=b["query_pre_attn_scalar"],
        sliding_window=b["sliding_window"], layer_types=gemma_layer_types(b),
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": b["rope_local_theta"]},
                         "full_attention": full},
        max_position_embeddings=max_seq, tie_word_embeddings=b["tie_embeddings"],
        hidden_activation="gelu_pytorch_tanh", attn_implementation="eager")
    assert config.layer_types == gemma_layer_types(b)
    return config


def hf_gemma2_config(bindings: dict, max_seq: int):
    """A `Gemma2Config` equal to a specialized Gemma 2 card's config: each layer's kind from the card's
    `full_layers`, one plain rope, the two caps (0 in the card: none)."""
    from transformers import Gemma2Config

    b = bindings
    config = Gemma2Config(
        vocab_size=b["vocab"], hidden_size=b["dim"], num_hidden_layers=b["layers"],
        num_attention_heads=b["heads"], num_key_value_heads=b["kv_heads"], head_dim=b["head_dim"],
        intermediate_size=b["ffn"], rms_norm_eps=b["norm_eps"], query_pre_attn_scalar=b["query_pre_attn_scalar"],
        sliding_window=b["sliding_window"], layer_types=gemma_layer_types(b),
        rope_parameters={"rope_type": "default", "rope_theta": b["rope_theta"]},
        attn_logit_softcapping=b["attn_softcap"] or None, final_logit_softcapping=b["final_softcap"] or None,
        max_position_embeddings=max_seq, tie_word_embeddings=b["tie_embeddings"],
        hidden_activation="gelu_pytorch_tanh", attn_implementation="eager")
    assert config.layer_types == gemma_layer_types(b)
    return config


def hf_gpt_oss_config(bindings: dict, max_seq: int):
    """A `GptOssConfig` equal to a specialized gpt-oss card's config: even layers slide."""
    from transformers import GptOssConfig

    b = bindings
    rope = {"rope_type": "yarn", "rope_theta": b["rope_theta"], "factor": b["rope_factor"],
            "beta_fast": b["rope_beta_fast"], "beta_slow": b["rope_beta_slow"], "truncate": b["rope_truncate"],
            "original_max_position_embeddings": b["rope_original_max"]}
    config = GptOssConfig(
        vocab_size=b["vocab"], hidden_size=b["dim"], num_hidden_layers=b["layers"],
        num_attention_heads=b["heads"], num_key_value_heads=b["kv_heads"], head_dim=b["head_dim"],
        intermediate_size=b["ffn"], num_local_experts=b["experts"], num_experts_per_tok=b["experts_per_token"],
        sliding_window=b["sliding_window"], swiglu_limit=b["swiglu_limit"], rms_norm_eps=b["norm_eps"],
        rope_parameters=rope, max_position_embeddings=max_seq, tie_word_embeddings=False,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(b["layers"])],
        attn_implementation="eager")
    assert config.rope_parameters["truncate"] is b["rope_truncate"] and config.swiglu_alpha == b["swiglu_alpha"]
    return config


def hf_deepseek_v2_config(bindings: dict, max_seq: int, version: int = 2):
    """A `DeepseekV2Config` equal to a specialized DeepSeek-V2 card's config: no q latent, greedy
    routing; or (version 3) a `DeepseekV3Config`: a q latent, group-limited sigmoid routing."""
    import transformers

    b = bindings
    rope = {"rope_type": "default", "rope_theta": b["rope_theta"]}
    if b["rope_scaling"] == "yarn":
        rope = {"rope_type": "yarn", "rope_theta": b["rope_theta"], "factor": b["rope_factor"],
                "original_max_position_embeddings": b["rope_original_max"], "beta_fast": b["rope_beta_fast"],
                "beta_slow": b["rope_beta_slow"], "mscale": b["rope_mscale"] or None,
                "mscale_all_dim": b["rope_mscale_all_dim"] or None}
    own = dict(q_lora_rank=None, topk_method="greedy") if version == 2 else dict(
        q_lora_rank=b["q_lora_rank"], n_group=b["expert_groups"], topk_group=b["topk_groups"],
        norm_topk_prob=b["norm_topk_prob"], rope_interleave=True, num_key_value_heads=b["heads"])
    config = getattr(transformers, f"DeepseekV{version}Config")(
        vocab_size=b["vocab"], hidden_size=b["dim"], num_hidden_layers=b["layers"], num_attention_heads=b["heads"],
        intermediate_size=b["ffn"], kv_lora_rank=b["kv_lora_rank"], **own,
        qk_nope_head_dim=b["qk_nope_head_dim"], qk_rope_head_dim=b["qk_rope_head_dim"], v_head_dim=b["v_head_dim"],
        n_routed_experts=b["experts"], num_experts_per_tok=b["experts_per_token"],
        moe_intermediate_size=b["moe_ffn"], n_shared_experts=b["shared_experts"],
        first_k_dense_replace=b["first_dense"], routed_scaling_factor=b["routed_scaling"],
        rms_norm_eps=b["norm_eps"], rope_parameters=rope, max_position_embeddings=max_seq,
        tie_word_embeddings=b["tie_embeddings"], attn_implementation="eager")
    assert config.rope_parameters["rope_type"] == rope["rope_type"]
    return config


def hf_phi_config(bindings: dict, max_seq: int):
    """A `PhiConfig` equal to a specialized Phi-2 card's config: rotary over the card's `rotary_dim` of
    each head (transformers takes it as int(head_dim * partial_rotary_factor)), gelu_new."""
    from transformers import PhiConfig

    b = bindings
    config = PhiConfig(
        vocab_size=b["vocab"], hidden_size=b["dim"], num_hidden_layers=b["layers"],
        num_attention_heads=b["heads"], num_key_value_heads=b["kv_heads"], intermediate_size=b["ffn"],
        layer_norm_eps=b["norm_eps"], max_position_embeddings=max_seq, hidden_act="gelu_new",
        rope_parameters={"rope_type": "default", "rope_theta": b["rope_theta"],
                         "partial_rotary_factor": b["rotary_dim"] / b["head_dim"]},
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, qk_layernorm=False, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="eager")
    assert int(b["head_dim"] * config.rope_parameters["partial_rotary_factor"]) == b["rotary_dim"]
    assert config.hidden_size // config.num_attention_heads == b["head_dim"]
    return config


def hf_gpt2_config(bindings: dict):
    """A `GPT2Config` equal to a specialized GPT-2 card's config: its position table, gelu_new, a tied head."""
    from transformers import GPT2Config

    b = bindings
    return GPT2Config(
        vocab_size=b["vocab"], n_embd=b["dim"], n_layer=b["layers"], n_head=b["heads"], n_inner=b["ffn"],
        n_positions=b["max_pos"], layer_norm_epsilon=b["norm_eps"], activation_function="gelu_new",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=b["tie_embeddings"],
        bos_token_id=None, eos_token_id=None, attn_implementation="eager")


def hf_reference(spec, seed: int, max_seq: int):
    """A random transformers model of the card's family (f32, eager attention) with the card's
    config, every weight seeded.

    Every weight is drawn here (norms included, which transformers would set
    to ones), so a param bound to the wrong checkpoint name cannot go unseen.
    Matrices are scaled by their input width: dim -1 of a linear or of a stack
    of experts stored [experts, out, in], dim -2 of gpt-oss's [experts, in, out].
    """
    import transformers

    torch.manual_seed(seed)
    family = hf_family(spec)
    own = {"gpt_oss": hf_gpt_oss_config, "deepseek_v2": hf_deepseek_v2_config,
           "deepseek_v3": lambda b, max_seq: hf_deepseek_v2_config(b, max_seq, version=3),
           "phi2": hf_phi_config, "gpt2": lambda b, max_seq: hf_gpt2_config(b), "gemma3": hf_gemma3_config,
           "gemma2": hf_gemma2_config}
    config = own[family](spec.bindings, max_seq) if family in own else hf_config(spec.bindings, max_seq, family)
    model = getattr(transformers, HF_CLASSES[family])(config).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights are one parameter, drawn once
            t = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                t = 1.0 + 0.1 * t
            elif "embed_tokens" not in name:
                t = t / p.shape[-2 if p.dim() == 3 and family == "gpt_oss" else -1] ** 0.5
            p.copy_(t)
        for name, buffer in model.named_buffers():  # DeepSeek-V3's routing correction: a buffer, saved
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=g))

    if spec.bindings.get("tie_embeddings"):
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    return model


def saved_state(model, directory) -> dict:
    """{name: tensor} of the checkpoint `save_pretrained` writes: what users load, in the layout the
    hub holds (transformers 5 keeps Qwen3-MoE's experts fused in memory, one tensor per expert on disk)."""
    from safetensors.torch import load_file

    model.save_pretrained(directory)
    state = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        state.update(load_file(file))
    return state


def hf_greedy(model, prompts, steps: int):
    """The reference's greedy run, each step recomputed over the whole sequence so far.

    Returns (logits, tokens): logits[s] is [len(prompts), vocab] for the last
    position after s generated tokens, tokens[s] its argmax.
    """
    seqs = [list(map(int, p)) for p in prompts]
    logits, tokens = [], []
    with torch.no_grad():
        for _ in range(steps + 1):
            step = torch.stack([model(torch.tensor([s])).logits[0, -1] for s in seqs]).numpy()
            choice = step.argmax(-1).astype(np.int32)
            logits.append(step)
            tokens.append(choice)
            for s, t in zip(seqs, choice):
                s.append(int(t))
    return logits, tokens


@pytest.fixture(scope="session")
def kit(parity):
    return SimpleNamespace(
        CARDS=CARDS, ARCH=ARCH, PARITY=parity, to_np=to_np, rel_err=rel_err, i32=i32, as_inputs=as_inputs,
        pack=pack, pack_in_blocks=pack_in_blocks, cache_of=cache_of, compiled=compiled, random_checkpoint=random_checkpoint,
        hf_config=hf_config, hf_gpt_oss_config=hf_gpt_oss_config, hf_deepseek_v2_config=hf_deepseek_v2_config,
        hf_phi_config=hf_phi_config, hf_gpt2_config=hf_gpt2_config, hf_gemma3_config=hf_gemma3_config,
        hf_gemma2_config=hf_gemma2_config,
        hf_reference=hf_reference, hf_greedy=hf_greedy,
        saved_state=saved_state)

