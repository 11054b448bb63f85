"""One GGUF file for llama.cpp (`llama-server -m FILE`): Llama, Mixtral, Qwen2, Qwen3, Qwen3-MoE, gpt-oss,
Gemma 3 (text), OLMo 2, Granite, Phi-3, SmolLM3, Gemma 2, Phi-2, GPT-2, DeepSeek-V2 and DeepSeek-V3.

Metadata is written from the card's config under llama.cpp's keys for the architecture (`llama.*`,
Mixtral's too, with its experts; `qwen2.*`, `qwen3.*`, `qwen3moe.*`, `gpt-oss.*`, `gemma3.*`, `olmo2.*`,
`granite.*` with µP's multipliers, `phi3.*` with the card's window as `phi3.attention.sliding_window`, as
llama.cpp's converter writes it; llama.cpp's phi3 reads it and turns the window off (`phi3_window_warning`);
`smollm3.*`, with no key for its NoPE layers: llama.cpp's smollm3 fixes one in every four; `gemma2.*` with its
window and both caps; `phi2.*` with its LayerNorm eps and its rotary part as `rope.dimension_count`,
q and k in checkpoint order, which llama.cpp's phi2 rotates NeoX-wise; `gpt2.*` with its LayerNorm eps and its
position table's rows as the context; `deepseek2.*` for both DeepSeeks, as llama.cpp's converter writes them
(`_deepseek2_keys`)). Llama's, Mixtral's, Qwen's, Gemma's, OLMo's, Granite's, Phi-3's, SmolLM3's and DeepSeek's
tensors go under the names of the card's `from gguf` lines (a layer's experts as one tensor each for gate, up
and down; DeepSeek's kv_b_proj as `attn_k_b` and `attn_v_b`, as that converter splits it), with the declared
transforms undone (Llama's q and k rows back in llama.cpp's rope order) and Gemma's norm weights stored as
1 + w, as llama.cpp's converter stores them; llama3 rope scaling goes in as llama.cpp's
`rope_freqs.weight`, one divisor per frequency, YaRN and linear scaling as keys. gpt-oss's go as
llama.cpp's own converter writes a Hugging Face checkpoint: its names through gguf's table of
them, the experts' interleaved gate and up columns split into two tensors, the expert matrices in
MXFP4 where the checkpoint stored them so (the same blocks), else unquantized. Matrices are
written in the model's type; 1-D tensors, biases, routers and learned positions in f32, as that converter does. The
tokenizer's keys are copied from the source when it was a GGUF; otherwise they are written from
the tokenizer.json Nest loaded (byte-level BPE as llama.cpp's `gpt2` tokenizer, SentencePiece's
BPE as its `llama` one, scored by merge rank). Either way the token list is padded to the model's
vocabulary, as llama.cpp sizes the embedding by it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

import linnet
from linnet.export import TRITON_INSTEAD, ExportError, check_folder, hf_config, not_the_builtin, sizes
from linnet.export.hf_config import context_length
from linnet.ir.specialize import specialize
from linnet.nest.autocard import every_nth_layer
from linnet.nest.bind import checkpoint_names, unbind_weights
from linnet.nest.checkpoint import (LLAMA_CPP_GEMMA2_PATTERN, LLAMA_CPP_GEMMA3_LOCAL_THETA, LLAMA_CPP_GEMMA3_PATTERN,
                                    LLAMA_CPP_SMOLLM3_NO_ROPE_INTERVAL, NORMS_PLUS_ONE, GGUFCheckpoint,
                                    llama_cpp_gemma2_query_scalar, llama_cpp_gemma3_query_scalar)
from linnet.nest.gguf_tokenizer import (BYTE, BYTE_TOKEN, CONTROL, END_OF_GENERATION, END_OF_TURN, NORMAL,
                                       PRE_TOKENIZERS, RSTRIP_LOOKED_UP, UNKNOWN, UNUSED, USER_DEFINED, llama_cpp_types,
                                       named_phi3, rstripped)
from linnet.rope_tables import llama3_divisors

# llama.cpp's canonical tokenizer.ggml.pre name for each pre-tokenizer Nest reads
PRE_NAMES = ("gpt-2", "smollm", "llama-bpe", "qwen2", "gpt-4o")  # spelled as llama.cpp reads them


# Linnet's -> llama.cpp's
ARCHITECTURES = {"llama": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
                 "gpt_oss": "gpt-oss", "gemma3": "gemma3", "olmo2": "olmo2", "granite": "granite", "phi3": "phi3",
                 "smollm3": "smollm3", "gemma2": "gemma2", "phi2": "phi2", "gpt2": "gpt2",
                 "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2"}


def check_architecture(module, card: str) -> None:
    """Raises `ExportError` unless `module`'s architecture is one written here and llama.cpp can
    run it as configured."""
    if module.name not in ARCHITECTURES:
        instead = "(export it with --to vllm instead)" if hf_config.known(module) else TRITON_INSTEAD
        raise ExportError(f"the llama.cpp export covers {', '.join(ARCHITECTURES)} cards; {card!r} is "
                          f"{module.name!r} {instead}")
    not_the_builtin(module, card)
    b = module.bindings or specialize(module, sizes(module), "fast").bindings  # the card's values, defaults included
    if module.name == "qwen3_moe" and not b["norm_topk_prob"]:
        raise ExportError(f"{card!r} weighs its experts by their router probabilities unnormalized, and "
                          f"llama.cpp's qwen3moe always renormalizes them (export it with --to vllm instead)")
    if ARCHITECTURES[module.name] == "deepseek2":
        _check_deepseek2(b, card)
    if module.name == "gemma3":
        _check_gemma3(b, card)
    elif module.name == "gemma2":
        _check_gemma2(b, card)
    elif module.name not in ("gpt_oss", "phi3") and b.get("sliding_window"):
        raise ExportError(f"{card!r} attends over a sliding window of {b['sliding_window']}, which llama.cpp's "
                          f"{ARCHITECTURES[module.name]} architecture does not (export it with --to vllm instead)")
    if module.name == "smollm3":
        _check_smollm3(b, card)
    if ARCHITECTURES[module.name] != "llama" and b.get("rope_scaling") == "llama3":
        raise ExportError(f"{card!r} scales its rope as llama3 does, which llama.cpp reads only for its llama "
                          f"architecture, not {ARCHITECTURES[module.name]} (export it with --to vllm instead)")


def phi3_window_warning(b: dict, card: str) -> str | None:
    """What a Phi-3 card's window costs on llama.cpp, or None where it has none. llama.cpp's phi3 reads
    `phi3.attention.sliding_window` and then turns the window off ("Phi SWA is currently disabled",
    llama.cpp PR 13676): every token attends to its whole row, so past `window` tokens of context its
    logits are not the model's (transformers', vLLM's, Linnet's). The export still writes the key, as
    llama.cpp's converter does, so that a llama.cpp that slides the window reads it."""
    window = b.get("sliding_window") or 0
    if window <= 0:
        return None
    return (f"{card!r} attends over a sliding window of {window}; the GGUF says so "
            f"(phi3.attention.sliding_window), but llama.cpp's phi3 turns the window off and attends to every "
            f"position, so past {window} tokens of context llama.cpp's logits are not the model's (export it with "
            f"--to vllm to keep the window)")


def check_phi3_name(tok, name: str) -> None:
    """Raises `ExportError` where llama.cpp could not load the GGUF: named as a Phi-3 (`named_phi3`), it
    sets the whitespace rules of </s>, <unk>, <s> and <|endoftext|> looking each up by its text, and fails
    on one the vocabulary lacks (a Phi-3 card given another model's tokenizer)."""
    missing = [t for t in RSTRIP_LOOKED_UP if tok.backend.token_to_id(t) is None]
    if named_phi3(name) and missing:
        raise ExportError(f"{name!r}: llama.cpp would not load this GGUF: it takes a model named so for a Phi-3 "
                          f"and looks up {', '.join(RSTRIP_LOOKED_UP)} by their text, and this tokenizer has no "
                          f"{', '.join(missing)}; export it under a card name without 'phi3' or 'phi-3' (a card "
                          f"file's `card` line, a checkpoint folder's name)")


def strip_warning(tok, name: str) -> str | None:
    """Where llama.cpp takes the whitespace beside the added tokens of a GGUF named `name` otherwise than
    `tok` takes it, what it does, or None: llama.cpp strips it after them by the model's name alone
    (`gguf_tokenizer.rstripped`: a name holding "phi-3" or "phi3"), which no key of the file can say."""
    added = list(tok.backend.get_added_tokens_decoder().values())
    texts = [t.content for t in added]
    types = llama_cpp_types(texts, [CONTROL if t.special else USER_DEFINED for t in added])
    llama_cpp = rstripped(lambda key, default=None: name if key == "general.name" else default, texts, types)
    ours, left = {t.content for t in added if t.rstrip}, {t.content for t in added if t.lstrip}
    strips, keeps = sorted(llama_cpp - ours), sorted((ours - llama_cpp) | left)
    if not strips and not keeps:
        return None
    listed = lambda texts: ", ".join(texts[:3]) + (" ..." if len(texts) > 3 else "")  # noqa: E731
    said = [f"llama.cpp strips the whitespace after {listed(strips)} (it takes a model named {name!r} for a "
            f"Phi-3), which this tokenizer keeps"] if strips else []
    said += [f"this tokenizer strips the whitespace beside {listed(keeps)}, which llama.cpp keeps (it strips only "
             f"after the added tokens of a model named Phi-3)"] if keeps else []
    return f"{name!r}: the GGUF's prompts tokenize otherwise on llama.cpp than on Linnet: {'; '.join(said)}"


def _check_deepseek2(b: dict, card: str) -> None:
    """llama.cpp's deepseek2 reads one YaRN multiplier (`yarn_log_multiplier`, 0.1 * mscale_all_dim) for the
    attention's scale and rotates by unscaled cos and sin: a card whose rope is scaled by mscale over
    mscale_all_dim (they differ) or by YaRN's default (neither given) is refused."""
    if b["rope_scaling"] == "yarn" and b["rope_factor"] > 1 and \
            (b["rope_mscale"] != b["rope_mscale_all_dim"] or b["rope_mscale_all_dim"] == 0):
        raise ExportError(f"{card!r} has YaRN with rope_mscale {b['rope_mscale']} and rope_mscale_all_dim "
                          f"{b['rope_mscale_all_dim']}; llama.cpp's deepseek2 takes them equal and given (its rope "
                          f"unscaled, its attention scaled by mscale_all_dim's) (export it with --to vllm instead)")


def _check_gemma3(b: dict, card: str) -> None:
    """llama.cpp's gemma3 reads no window pattern, local rope or query scale from the file: it fixes
    them (`LLAMA_CPP_GEMMA3_*`, `llama_cpp_gemma3_query_scalar`), so a card set otherwise is refused."""
    instead = "(export it with --to vllm instead)"
    _check_gemma_fixed(b, card, "gemma3", LLAMA_CPP_GEMMA3_PATTERN,
                       f"five layers of every {LLAMA_CPP_GEMMA3_PATTERN}",
                       llama_cpp_gemma3_query_scalar(b["dim"], b["heads"], b["head_dim"], b["layers"]))
    if b["rope_local_theta"] != LLAMA_CPP_GEMMA3_LOCAL_THETA:
        raise ExportError(f"{card!r} has rope_local_theta {b['rope_local_theta']}; llama.cpp's gemma3 rotates its "
                          f"sliding-window layers at base {LLAMA_CPP_GEMMA3_LOCAL_THETA:g} {instead}")
    if b["rope_scaling"] not in ("none", "linear"):
        raise ExportError(f"{card!r} scales its rope as {b['rope_scaling']!r}; llama.cpp's gemma3 takes linear "
                          f"scaling of the full-attention layers' rope, or none {instead}")


def _check_gemma2(b: dict, card: str) -> None:
    """llama.cpp's gemma2 reads its window and caps from the file but fixes the rest: layers alternating
    from a sliding one, both caps applied (none is not a value it takes), queries scaled by
    `llama_cpp_gemma2_query_scalar`; a card set otherwise is refused."""
    _check_gemma_fixed(b, card, "gemma2", LLAMA_CPP_GEMMA2_PATTERN, "every other layer, the first",
                       llama_cpp_gemma2_query_scalar(b["dim"], b["heads"], b["head_dim"], b["layers"]))
    if not (b["attn_softcap"] > 0 and b["final_softcap"] > 0):
        raise ExportError(f"{card!r} has attn_softcap {b['attn_softcap']} and final_softcap {b['final_softcap']}; "
                          f"llama.cpp's gemma2 caps both, 0 is no cap to it (export it with --to vllm instead)")


def _check_gemma_fixed(b: dict, card: str, arch: str, pattern: int, sliding: str, scalar: int) -> None:
    """What llama.cpp's Gemmas fix rather than read from the file: which layers slide (`pattern`, said in
    words as `sliding`) and the query scale (`scalar`)."""
    instead = "(export it with --to vllm instead)"
    if b["full_layers"] != every_nth_layer(b["layers"], pattern) or b["sliding_window"] <= 0:
        kinds = (f"window_pattern {b['window_pattern']}"
                 if b["full_layers"] == every_nth_layer(b["layers"], b["window_pattern"])
                 else f"full_layers {_flags(b['full_layers'])}")
        raise ExportError(f"{card!r} has {kinds} and sliding_window {b['sliding_window']}; "
                          f"llama.cpp's {arch} slides a window in {sliding} {instead}")
    if b["query_pre_attn_scalar"] != scalar:
        raise ExportError(f"{card!r} has query_pre_attn_scalar {b['query_pre_attn_scalar']}; llama.cpp's {arch} "
                          f"scales queries by {scalar} ** -0.5 for {b['layers']} layers {instead}")


def _check_smollm3(b: dict, card: str) -> None:
    """llama.cpp's smollm3 reads no NoPE layers from the file: it leaves rope out of every
    `LLAMA_CPP_SMOLLM3_NO_ROPE_INTERVAL`-th layer, so a card whose NoPE layers lie otherwise is refused."""
    nope = [not rotates for rotates in b["no_rope_layers"]]
    if nope == every_nth_layer(b["layers"], LLAMA_CPP_SMOLLM3_NO_ROPE_INTERVAL):
        return
    said = (f"leaves rope out of one layer in every {b['no_rope_interval']}"
            if nope == every_nth_layer(b["layers"], b["no_rope_interval"])
            else f"rotates its layers as no_rope_layers {_flags(b['no_rope_layers'])} says")
    raise ExportError(f"{card!r} {said}; llama.cpp's smollm3 reads no such interval from the file and leaves "
                      f"rope out of every {LLAMA_CPP_SMOLLM3_NO_ROPE_INTERVAL}th layer (export it with --to vllm "
                      f"instead)")


def _flags(flags: list) -> str:
    """A list config's bools as a card writes them."""
    return "[" + ", ".join("true" if f else "false" for f in flags) + "]"


# a GGUF file's type as its name ends in llama.cpp's convention (`.F16`, `.BF16`, `.Q8_0`, `.Q4_K_M`, `.IQ2_XS`)
FILE_TYPE_SUFFIX = re.compile(r"\.(?:B?F(?:16|32)|I?Q\d\w*)$", re.IGNORECASE)


def gguf_path(out, card: str, dtype: str) -> Path:
    """The file `write_gguf` writes for `out`: `out` itself where it names a .gguf file or an
    existing file (not an existing folder, whatever its name, nor a name ending in a slash), else
    `<card>.<DTYPE>.gguf` inside the folder `out` (a GGUF source's card is its file's stem, whose own
    type is left out: `X.Q4_1` exported as Q8_0 is `X.Q8_0.gguf`, not `X.Q4_1.Q8_0.gguf`). A folder
    that could not be made, or an existing file that is not a GGUF (which would be lost), is said here,
    before the weights are read; nothing is made until they are."""
    path = Path(out).expanduser()
    folder = os.fspath(out).endswith(("/", os.sep))  # `-o new.gguf/`: a folder, as the shell's `mkdir` reads it
    is_file = not folder and not path.is_dir() and (path.suffix.lower() == ".gguf" or path.is_file())
    file = path if is_file else path / f"{FILE_TYPE_SUFFIX.sub('', card)}.{dtype.upper()}.gguf"
    if file.is_file() and file.stat().st_size > 0:  # an earlier export there is replaced; anything else is kept
        with open(file, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ExportError(f"{file}: is a file that is not a GGUF ({file.stat().st_size} bytes), which the "
                                  f"export would replace; name a new file or a folder")
        _refuse_another_gguf(file)
    check_folder(out, file.parent, "the GGUF", file.name + ".partial")  # (written under that name first)
    return file


# the key that says Linnet wrote a GGUF: an export replaces a file holding it, never another (a download)
MARK = "linnet.exported_by"


def _refuse_another_gguf(file: Path) -> None:
    """A GGUF Linnet did not write (a model downloaded, llama.cpp's own conversion) is not replaced:
    it would be lost without a word, as a folder's model would (`hf_dir._refuse_another_model`)."""
    from linnet.nest.gguf_file import GGUFFile, GGUFFormatError

    try:
        found = GGUFFile(str(file))
    except (GGUFFormatError, OSError):
        found = None
    if found is not None and MARK in found.fields:
        return
    what = "a damaged GGUF" if found is None else \
        f"a GGUF Linnet did not write ({found.value('general.name') or found.value('general.architecture')})"
    raise ExportError(f"{file}: holds {what}, which the export would replace; name a new file, or remove this one "
                      f"first (an export by a Linnet from before exports were marked is refused too)")


def write_gguf(bound, out, dtype: str | None = None) -> str:
    """Writes `bound` (`nest.load.read_weights`) as a GGUF at `out` (a directory gets
    `<card>.<DTYPE>.gguf`), its matrices in `dtype` (default: the type they are bound in; "q8_0"
    quantizes f32 ones); returns the file's path."""
    import gguf

    spec = bound.module
    check_architecture(spec, bound.card)
    if bound.tokenizer is None:
        raise ExportError(f"{bound.card}: llama.cpp needs a tokenizer in the GGUF, and these weights "
                          f"({bound.source}) came without one")
    name = model_name(bound)
    check_phi3_name(bound.tokenizer, name)
    b = spec.bindings
    dtype = dtype or b["T"]
    path = gguf_path(out, bound.card, dtype)
    sources = [Path(p) for p in (bound.source, bound.tokenizer_from) if p not in (None, "random")]
    if path.is_file() and any(path.samefile(s) for s in sources if s.is_file()):  # (as the vLLM export's folder)
        raise ExportError(f"{path}: that is the file the weights or the tokenizer are read from, which the export "
                          f"would replace; write elsewhere")
    partial = path.with_name(path.name + ".partial")  # renamed when whole: an earlier file there stays till then
    writer = gguf.GGUFWriter(str(partial), ARCHITECTURES[spec.name])
    writer.add_type(gguf.GGUFType.MODEL)  # (with the quantization version: in every file llama.cpp's converter writes)
    writer.add_name(name)
    writer.add_string(MARK, f"linnet {linnet.__version__}")  # (llama.cpp reads past keys it does not know)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(int({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                              "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype]))
    # GPT-2's: its position table's rows, which llama.cpp reads as the context it was trained for
    writer.add_context_length(b["max_pos"] if spec.name == "gpt2" else context_length(spec))
    writer.add_vocab_size(b["vocab"])
    writer.add_embedding_length(b["dim"])
    writer.add_block_count(b["layers"])
    writer.add_feed_forward_length(b["ffn"])
    writer.add_head_count(b["heads"])
    if ARCHITECTURES[spec.name] == "deepseek2":
        _deepseek2_keys(b, writer)
    else:
        writer.add_head_count_kv(b.get("kv_heads", b["heads"]))  # (GPT-2's heads are all key/value heads)
        writer.add_key_length(b["head_dim"])
        writer.add_value_length(b["head_dim"])
    # llama.cpp's phi2 rotates the first rope.dimension_count of each head, NeoX-wise, and norms by LayerNorm;
    # GPT-2 rotates nothing; DeepSeek the last qk_rope_head_dim of each query head and its one shared key
    if "rope_theta" in b:
        rotated = {"phi2": "rotary_dim", "deepseek_v2": "qk_rope_head_dim", "deepseek_v3": "qk_rope_head_dim"}
        writer.add_rope_dimension_count(b[rotated.get(spec.name, "head_dim")])
        writer.add_rope_freq_base(b["rope_theta"])
    if spec.name in ("phi2", "gpt2"):
        writer.add_layer_norm_eps(b["norm_eps"])
    else:
        writer.add_layer_norm_rms_eps(b["norm_eps"])
    quantized = set()  # names written as MXFP4
    if spec.name == "gpt_oss":
        tensors = _gpt_oss(spec, bound.params, writer)
        if _experts_stored_mxfp4(bound):  # as llama.cpp's converter keeps them: the same blocks, requantized
            quantized = {name for name, t in tensors if name.endswith("_exps.weight")}
    else:
        if "experts" in b and "moe_ffn" not in b:  # Mixtral's as wide as llama's `feed_forward_length` says
            _expert_keys(b, writer, width=spec.name != "mixtral")
        tensors = _norms_plus_one(unbind_weights(spec, bound.params, "gguf"), ARCHITECTURES[spec.name])
        _rope_keys(b, writer)
        if spec.name in ("gemma3", "gemma2"):
            writer.add_sliding_window(b["sliding_window"])
        if spec.name == "gemma2":  # the caps, as llama.cpp's converter writes them
            writer.add_attn_logit_softcapping(b["attn_softcap"])
            writer.add_final_logit_softcapping(b["final_softcap"])
        if spec.name == "phi3":  # 0 for none, as llama.cpp's converter writes a Phi-4's
            # a Phi-3 GGUF is read as llama.cpp runs it, its window off: its file's window is written back as it was
            source = bound.checkpoint if isinstance(bound.checkpoint, GGUFCheckpoint) else None
            writer.add_sliding_window(b["sliding_window"] or (source and source.metadata(PHI3_WINDOW)) or 0)
            said = phi3_window_warning(b, bound.card)
            if said:
                warnings.warn(said)
        if spec.name == "granite":  # µP's multipliers, under llama.cpp's names
            writer.add_embedding_scale(b["embedding_multiplier"])
            writer.add_residual_scale(b["residual_multiplier"])
            writer.add_attention_scale(b["attention_multiplier"])
            writer.add_logit_scale(b["logits_scaling"])
    if bound.tokenizer_from is not None and bound.tokenizer_from.is_file():  # a GGUF's keys, as they are
        _copy_tokenizer_keys(GGUFCheckpoint(bound.tokenizer_from), writer, b["vocab"])
    else:
        _write_tokenizer_keys(bound.tokenizer, writer, b["vocab"])
    if isinstance(bound.checkpoint, GGUFCheckpoint):
        _copy_provenance_keys(bound.checkpoint, writer)
    said = strip_warning(bound.tokenizer, name)
    if said:
        warnings.warn(said)

    for name, t in tensors:
        t = t.contiguous()
        if name in quantized:
            mx = gguf.GGMLQuantizationType.MXFP4
            writer.add_tensor(name, gguf.quants.quantize(t.float().numpy(), mx), raw_dtype=mx)
        elif t.dim() == 1 or dtype == "f32" or name.endswith(".bias") or ".ffn_gate_inp." in name or \
                name == "position_embd.weight":  # (the converter keeps GPT-2's learned positions in f32 too)
            writer.add_tensor(name, t.float().numpy())
        elif dtype == "q8_0" and t.shape[-1] % 32 == 0:  # blocks of 32 along each row, each scale an f16
            _check_f16_range(bound.card, name, t, 127, "Q8_0's scale (its block's largest value / 127)")
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(t.float().numpy(), q8), raw_dtype=q8)
        elif dtype in ("f16", "q8_0"):  # (q8_0: a row of no whole blocks in f16, as llama.cpp's converter has it)
            if dtype == "q8_0":  # (f16's own export checked its range on reading)
                _check_f16_range(bound.card, name, t, 1, "f16, which a row of no whole Q8_0 blocks is written in")
            writer.add_tensor(name, t.to(torch.float16).numpy())
        else:  # bf16: numpy has no such type; its bytes, which the writer measures in bf16 elements
            writer.add_tensor(name, t.view(torch.uint8).numpy(), raw_dtype=gguf.GGMLQuantizationType.BF16)
    made = next((p for p in (*reversed(path.parent.parents), path.parent) if not p.exists()), None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        # (a rename that fails, the earlier file kept where its folder's rules let none replace it,
        # left the whole new one beside it as .partial, and an error naming that)
        partial.replace(path)
    except BaseException as err:  # a full disk, an interrupt: no part of a file of gigabytes is left behind
        partial.unlink(missing_ok=True)
        if made is not None:  # nor the folders made for it
            shutil.rmtree(made, ignore_errors=True)
        if isinstance(err, OSError):  # (numpy's short write names no file, and has no strerror)
            why = err.strerror or f"{err}: a short write, as on a full disk"
            raise ExportError(f"{path}: cannot write the GGUF ({why})") from None
        raise
    return str(path)


def _check_f16_range(card: str, name: str, t, over: int, what: str) -> None:
    """Raises `ExportError` where a value of `t` over `over` is past f16's range: `what` would hold it as inf."""
    largest = float(t.abs().max()) / over
    if not largest <= 65504:  # (NaN too)
        raise ExportError(f"{card}: {name}: {largest * over:g} is past what {what} holds (+-65504); export "
                          f"--dtype bf16 or f32")


def _norms_plus_one(tensors, arch: str):
    """The norm weights of an architecture whose norms multiply by 1 + w (Gemma's) as llama.cpp's
    converter stores them, 1 added (Nest's GGUF reader takes it off again); other tensors as they are."""
    suffix = NORMS_PLUS_ONE.get(arch)
    for name, t in tensors:
        yield name, (t.float() + 1.0 if suffix and name.endswith(suffix) else t)


def _rope_keys(b: dict, writer) -> None:
    """Llama's, Qwen's and Gemma's rope scaling as llama.cpp reads it (Gemma's: the full-attention layers')."""
    import gguf

    if b.get("rope_scaling", "none") == "none":  # (phi3.linnet has no rope scaling to set)
        return
    if b["rope_scaling"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(b["rope_factor"])
    elif b["rope_scaling"] == "llama3":
        divisors = llama3_divisors(b["head_dim"], b["rope_theta"], b["rope_factor"], b["rope_low_freq_factor"],
                                   b["rope_high_freq_factor"], b["rope_original_max"])
        writer.add_tensor("rope_freqs.weight", divisors.astype(np.float32))
    elif b["rope_scaling"] == "yarn":
        _yarn_keys(b, writer)
    else:
        raise ExportError(f"rope scaling {b['rope_scaling']!r} has no llama.cpp form")


def _yarn_keys(b: dict, writer) -> None:
    import gguf

    if (b["rope_beta_fast"], b["rope_beta_slow"]) != (32.0, 1.0):
        raise ExportError("llama.cpp's YaRN keys have no betas and it takes 32 and 1; this card changes them")
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(b["rope_factor"])
    writer.add_rope_scaling_orig_ctx_len(b["rope_original_max"])


def _deepseek2_keys(b: dict, writer) -> None:
    """DeepSeek's latent attention and experts as llama.cpp's converter writes them (DeepseekV2Model): MLA as
    multi-query attention over the cached latent and rotated key (one key/value head, keys kv_lora_rank +
    qk_rope_head_dim wide, values kv_lora_rank), the heads' own widths as the `_mla` lengths; the
    dense layers before the experts; V2's softmax over the experts unnormalized, V3's sigmoid scores
    chosen among the best groups, renormalized where the card says so; YaRN's mscale_all_dim as 0.1 times it."""
    import gguf

    writer.add_head_count_kv(1)
    writer.add_key_length(b["kv_lora_rank"] + b["qk_rope_head_dim"])
    writer.add_value_length(b["kv_lora_rank"])
    writer.add_key_length_mla(b["qk_nope_head_dim"] + b["qk_rope_head_dim"])
    writer.add_value_length_mla(b["v_head_dim"])
    # 0: no query latent (llama-cpp-python 0.3.36 requires the key unless the model has V2-Lite's 27 layers)
    writer.add_q_lora_rank(b.get("q_lora_rank", 0))
    writer.add_kv_lora_rank(b["kv_lora_rank"])
    writer.add_leading_dense_block_count(b["first_dense"])
    writer.add_expert_feed_forward_length(b["moe_ffn"])
    writer.add_expert_count(b["experts"])
    writer.add_expert_used_count(b["experts_per_token"])
    writer.add_expert_shared_count(b["shared_experts"])
    writer.add_expert_weights_scale(b["routed_scaling"])
    v3 = "expert_groups" in b
    writer.add_expert_weights_norm(bool(b["norm_topk_prob"]) if v3 else False)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_expert_group_count(b["expert_groups"] if v3 else 1)  # (V2's greedy choice: all in one group)
    writer.add_expert_group_used_count(b["topk_groups"] if v3 else 1)
    if b["rope_scaling"] == "yarn":
        writer.add_rope_scaling_yarn_log_mul(0.1 * b["rope_mscale_all_dim"])


def _expert_keys(b: dict, writer, width: bool = True) -> None:
    """A mixture of experts' counts (and, with `width`, each expert's hidden width) as llama.cpp reads them."""
    if width:
        writer.add_expert_feed_forward_length(b["ffn"])
    writer.add_expert_count(b["experts"])
    writer.add_expert_used_count(b["experts_per_token"])


def _gpt_oss(spec, params: dict, writer) -> list:
    """gpt-oss's keys, and its tensors as (GGUF name, tensor): what llama.cpp's converter makes of
    the Hugging Face checkpoint these params bind to."""
    import gguf

    b = spec.bindings
    if (b["swiglu_alpha"], b["swiglu_limit"]) != (1.702, 7.0):
        raise ExportError("llama.cpp's gpt-oss fixes swiglu alpha 1.702 and limit 7.0; this card changes them")
    _expert_keys(b, writer)
    writer.add_sliding_window(b["sliding_window"])
    _yarn_keys(b, writer)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, b["layers"])

    def gguf_name(hf_name: str) -> str:
        found = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise ExportError(f"gguf names no gpt-oss tensor for {hf_name!r}")
        return found

    out = []
    for hf_name, t in unbind_weights(spec, params, "hf"):
        if ".experts." not in hf_name:
            out.append((gguf_name(hf_name + ".weight" if hf_name.endswith(".sinks") else hf_name), t))
            continue
        bias = hf_name.endswith("_bias")
        stem, suffix = hf_name.removesuffix("_bias"), ".bias" if bias else ".weight"
        if not bias:  # checkpoints store expert matrices [experts, in, out]; llama.cpp [experts, out, in]
            t = t.transpose(-1, -2)
        if stem.endswith("gate_up_proj"):  # gate and up rows interleave: gate, up, gate, up, ...
            base = stem.removesuffix("gate_up_proj")
            out += [(gguf_name(base + "gate_proj" + suffix), t[:, 0::2]), (gguf_name(base + "up_proj" + suffix), t[:, 1::2])]
        else:
            out.append((gguf_name(stem + suffix), t))
    return out


def _experts_stored_mxfp4(bound) -> bool:
    """Whether the checkpoint the weights came from stores gpt-oss's expert matrices in MXFP4 (the
    hub's checkpoints, llama.cpp's files). Written back so they lose nothing: dequantized values
    requantize to the very blocks, each block's shared exponent being the one its largest value
    needs. Other weights (a bf16 fine-tune, random ones) keep the model's type."""
    ckpt = bound.checkpoint
    if ckpt is None:
        return False
    name = checkpoint_names(bound.module, ckpt.source_format)["w_gate_up"][0]
    return ckpt.stored_dtype(name) == "mxfp4"


PHI3_WINDOW = "phi3.attention.sliding_window"


def model_name(bound) -> str:
    """The GGUF's `general.name` (which llama.cpp reads a Phi-3's whitespace rules from): a GGUF
    source's own, as llama-quantize keeps it, else the card's."""
    if isinstance(bound.checkpoint, GGUFCheckpoint):
        name = bound.checkpoint.metadata("general.name")
        if isinstance(name, str) and name:
            return name
    return bound.card


# general.* keys each export writes for itself: what the file is, not where the model came from
OWN_GENERAL_KEYS = ("general.architecture", "general.type", "general.name", "general.file_type",
                    "general.quantization_version", "general.alignment")


def _copy_provenance_keys(src: GGUFCheckpoint, writer) -> None:
    """The source GGUF's other `general.*` keys (license, organization, basename, finetune, size_label,
    languages, base models, ...), with their value types: the same model in another type, as
    llama-quantize keeps every key of the file it requantizes."""
    for key, field in src.fields().items():
        if key.startswith("general.") and key not in OWN_GENERAL_KEYS:
            writer.add_key_value(key, field.value, field.type, field.element_type)


def _copy_tokenizer_keys(src: GGUFCheckpoint, writer, vocab_size: int) -> None:
    """Every `tokenizer.*` key of the source GGUF, with its value type (arrays keep their element
    type); a token list shorter than the model's vocabulary padded to it, as llama.cpp sizes the
    embedding by the list (unused pieces, as `_write_tokenizer_keys` pads)."""
    per_token = {"tokenizer.ggml.tokens": lambda i: f"[PAD{i}]", "tokenizer.ggml.token_type": lambda i: UNUSED,
                 "tokenizer.ggml.scores": lambda i: -1000.0}
    for key, field in src.fields().items():
        if key.startswith("tokenizer."):
            value = field.value
            if key in per_token and len(value) < vocab_size:
                value = list(value) + [per_token[key](i) for i in range(len(value), vocab_size)]
            writer.add_key_value(key, value, field.type, field.element_type)


def _write_tokenizer_keys(tok, writer, vocab_size: int) -> None:
    """A tokenizer.json as llama.cpp's tokenizer keys: byte-level BPE as its `gpt2` tokenizer,
    SentencePiece's BPE (byte fallback) as its `llama` one; the token list padded to the model's
    `vocab_size`, as llama.cpp sizes the embedding by it."""
    data = json.loads(tok.backend.to_str())
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise ExportError(f"{tok.source}: only BPE tokenizers (byte-level, or SentencePiece's with byte fallback) "
                          f"can be written to a GGUF, not {model.get('type')!r}; pass --tokenizer a GGUF holding "
                          f"this model's vocabulary to copy its keys")
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    size = max(max(vocab.values()) + 1, vocab_size)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for added in data.get("added_tokens") or []:
        types[added["id"]] = CONTROL if added.get("special") else USER_DEFINED
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges") or []]
    if model.get("byte_fallback"):
        _sentencepiece_keys(tok, data, writer, tokens, types, pairs)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_pre_name(data.get("pre_tokenizer"), tok.source))
        writer.add_token_merges([" ".join(p) for p in pairs])
        if (unk := tok.special_token_id("unk_token")) is not None:  # as llama.cpp's converter reads it
            writer.add_unk_token_id(unk)  # (from tokenizer_config.json)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if tok.bos_token_id is not None:
        writer.add_bos_token_id(tok.bos_token_id)
        probe = tok.backend.encode("a", add_special_tokens=True).ids
        writer.add_add_bos_token(bool(probe) and probe[0] == tok.bos_token_id)
    _write_stops(tok, writer)
    if (pad := tok.special_token_id("pad_token")) is not None:  # (llama.cpp's converter writes it too)
        writer.add_pad_token_id(pad)
    if tok.chat_template:  # with its named ones (tool_use, ...), which the writer keys by name
        writer.add_chat_template(tok.saved_chat_template())


def _write_stops(tok, writer) -> None:
    """The ids generation ends on, in GGUF's three keys: EOS the tokenizer's own end token (the chat's
    end: Llama 3.1's <|eot_id|>, where generation_config lists <|end_of_text|> first), EOM llama's
    <|eom_id|>, EOT an end of turn (llama.cpp's `token_eot()`). Readers add the stops llama.cpp knows
    by their text (`gguf_tokenizer.END_OF_GENERATION`); EOT takes a stop they would not know only
    where no end of turn is left, so that it is not lost."""
    stops = list(tok.eos_token_ids)
    if not stops:
        return
    own = tok.backend.token_to_id(tok.eos_token) if tok.eos_token is not None else None
    eos = own if own in stops else stops[0]
    writer.add_eos_token_id(eos)
    rest = [i for i in stops if i != eos]
    eom = next((i for i in rest if tok.backend.id_to_token(i) == "<|eom_id|>"), None)
    if eom is not None:
        writer.add_eom_token_id(eom)
    rest = [i for i in rest if i != eom]
    turn = [i for i in rest if tok.backend.id_to_token(i) in END_OF_TURN]
    unknown = [i for i in rest if tok.backend.id_to_token(i) not in END_OF_GENERATION]
    if turn or unknown:
        writer.add_eot_token_id((turn or unknown)[0])


def _sentencepiece_keys(tok, data: dict, writer, tokens: list, types: list, pairs: list) -> None:
    """llama.cpp's `llama` tokenizer for SentencePiece's BPE (Mistral's, Llama 2's tokenizer.json).
    llama.cpp merges the adjacent pair whose join scores highest; tokenizer.json ranks its merges,
    so a piece scores minus the rank of the first merge that makes it (llama.cpp's own converter
    gives every piece -1000 when there is no tokenizer.model, losing the order). Bytes are <0xNN>
    tokens; the dummy "▁" before the text is the add_space_prefix key."""
    made: dict[str, int] = {}
    for rank, (left, right) in enumerate(pairs):
        made.setdefault(left + right, rank)
    last = -float(len(pairs) + 1)  # a piece no merge makes: after all that merges make
    scores = [0.0] * len(tokens)
    for i, text in enumerate(tokens):
        if types[i] != NORMAL:
            continue
        if BYTE_TOKEN.fullmatch(text):
            types[i] = BYTE
        elif text in made:
            scores[i] = -float(made[text])
        elif len(text) > 1:
            scores[i] = last
    unknown = data["model"].get("unk_token")
    if unknown is not None and tok.backend.token_to_id(unknown) is not None:
        types[tok.backend.token_to_id(unknown)] = UNKNOWN
        writer.add_unk_token_id(tok.backend.token_to_id(unknown))
    writer.add_tokenizer_model("llama")
    writer.add_token_scores(scores)
    writer.add_add_space_prefix(_space_prefix(data, tok.source))


def _space_prefix(data: dict, source: str) -> bool:
    """Whether the tokenizer puts SentencePiece's "▁" before the text: a Prepend normalizer (Mistral's
    tokenizer.json), or a Metaspace pre-tokenizer that prepends (transformers' conversions)."""
    norm, pre = data.get("normalizer") or {}, data.get("pre_tokenizer") or {}
    steps = norm.get("normalizers") if norm.get("type") == "Sequence" else [norm]
    replaced = any(n.get("type") == "Replace" and n.get("content") == "▁" for n in steps)
    prepended = any(n.get("type") == "Prepend" and n.get("prepend") == "▁" for n in steps)
    # transformers' Gemma form splits on spaces after the normalizer has replaced them all: a no-op
    no_op_split = pre.get("type") == "Split" and pre.get("pattern") == {"String": " "}
    if replaced and (not pre or no_op_split):
        return prepended
    if pre.get("type") == "Metaspace" and not norm and not pre.get("split", True):
        return pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never") != "never"
    raise ExportError(f"{source}: this SentencePiece tokenizer spells spaces in a way llama.cpp is not known "
                      f"to (normalizer {norm.get('type')!r}, pre-tokenizer {pre.get('type')!r})")


def _pre_name(pre: dict | None, source: str) -> str:
    """The llama.cpp pre-tokenizer whose splitting regexes are this tokenizer.json's, step by step: a
    Split's own regex, Digits' (one digit, or a run of them), and ByteLevel's, which is GPT-2's
    (SmolLM2's tokenizer.json, Digits then ByteLevel, is llama.cpp's "smollm")."""
    steps = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else [pre or {}]
    regexes = []
    for step in steps:
        kind = step.get("type")
        if kind == "Split" and "Regex" in step.get("pattern", {}):
            regexes.append(step["pattern"]["Regex"])
        elif kind == "Digits":
            regexes.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        elif kind == "ByteLevel" and step.get("use_regex", True):
            regexes.append(PRE_TOKENIZERS["gpt-2"][0][0])
    for name in PRE_NAMES:
        if PRE_TOKENIZERS[name][0] == tuple(regexes):
            return name
    raise ExportError(f"{source}: this tokenizer splits text in a way llama.cpp is not known to "
                      f"(pre-tokenizer regexes {regexes}); known: {', '.join(PRE_NAMES)}")
