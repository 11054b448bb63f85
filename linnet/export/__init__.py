"""linnet.export: a card with its weights, written out for another server to run.

  hf_dir    a Hugging Face model directory (config.json, safetensors, tokenizer):
            what vLLM serves (`vllm serve DIR`), and transformers loads
  gguf      one GGUF file for llama.cpp (`llama-server -m FILE`): Llama, Mixtral, Qwen2, Qwen3,
            Qwen3-MoE, gpt-oss, Gemma 3
  triton    a Triton Inference Server model repository whose Python backend runs
            the card on Linnet's own engine
  hf_config the config.json of each architecture Linnet writes in `.linnet`

    from linnet.export import export
    export("smollm2-135m-instruct", "vllm", "out/smollm2")
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


class ExportError(Exception):
    """A card cannot be written for the target asked for; the message says why and what would do."""


TARGETS = ("vllm", "llama.cpp", "triton")
DTYPES = ("bf16", "f16", "f32")
# llama.cpp's block types a GGUF export writes itself, as its converter does (`--outtype q8_0`);
# the others, which llama.cpp makes with llama-quantize (mixing types by tensor), are refused
GGUF_TYPES = ("q8_0",)
TRITON_INSTEAD = "(export it with --to triton, which runs any card on Linnet's own engine)"


def export(card: str | os.PathLike, to: str, out: str | os.PathLike, *, weights=None, dtype: str = "bf16",
           seed: int | None = None, tokenizer: str | os.PathLike | None = None, name: str | None = None,
           progress: bool | None = None, batch: int = 32, max_seq: int | None = None, backend: str = "torch") -> str:
    """Writes `card` (a registered card, a `.linnet` file or a checkpoint path) with its weights
    (found as `nest.load` finds them, or `weights=`; "random" for random ones, drawn from `seed`,
    default 0) for `to`:

    - "vllm": a Hugging Face model directory at `out`;
    - "llama.cpp": a GGUF file at `out` (a directory gets `<card>.<DTYPE>.gguf` inside);
    - "triton": a model repository at `out` holding the model `name` (default: the card's name),
      which serves `batch` rows of `max_seq` positions on `backend` (default 4096, or as many as a
      learned position table holds where fewer: GPT-2's 1024).

    `dtype` is the element type the weights are written in (for llama.cpp also "q8_0": its matrices in
    Q8_0 blocks, quantized from f32 as llama.cpp's converter does); `tokenizer`, a model directory or GGUF
    whose tokenizer to write instead of the weights' own (random weights take that of the card's own
    weights, where Nest finds them). Returns the path written."""
    if to not in TARGETS:
        raise ExportError(f"unknown export target {to!r}; one of {', '.join(TARGETS)}")
    dtype = dtype.lower() if dtype.lower() in GGUF_TYPES else dtype
    if dtype not in DTYPES + GGUF_TYPES:
        raise ExportError(dtype_refusal(dtype))
    if dtype in GGUF_TYPES and to != "llama.cpp":
        raise ExportError(f"dtype {dtype!r}: llama.cpp's block type, written to a GGUF only (--to llama.cpp); "
                          f"a {to} export holds weights in {', '.join(DTYPES)}")
    check_seed(seed, weights)
    if not isinstance(out, (str, os.PathLike)) or not str(out):  # ("" would be the current folder)
        raise ExportError(f"out must be the path to write to, not {out!r}")
    given = os.fspath(out)  # (its trailing slash says a folder, which a Path drops)
    out = Path(out).expanduser()  # (a shell expands ~ on the command line; a caller's string is taken as it)
    try:
        is_file = out.exists() and not out.is_dir()
    except OSError as err:  # a name longer than the file system takes, a loop of links
        raise ExportError(f"{out}: cannot write there ({err.strerror or err})") from None
    if to in ("vllm", "triton") and is_file:
        raise ExportError(f"{out}: is a file; a {to} export is a folder: name a new or an existing one")
    if to == "triton":
        from linnet.export.triton import write_repository

        return write_repository(card, out, weights=weights, dtype=dtype, name=name, batch=batch, max_seq=max_seq,
                                backend=backend, tokenizer=tokenizer, seed=seed)
    from linnet.nest.load import read_weights, resolve_card

    resolved = resolve_card(card, weights)
    own = check_own_tokenizer(resolved, weights) if tokenizer is None else None
    if to == "llama.cpp":  # before a byte of the weights is read
        from linnet.export.gguf import check_architecture, gguf_path

        check_architecture(resolved[0], str(card))
        gguf_path(given, resolved[1], dtype)
    else:
        from linnet.export.hf_config import check_architecture
        from linnet.export.hf_dir import check_destination

        check_architecture(resolved[0], str(card))
        check_destination(out)
    # (Q8_0's blocks are quantized from f32, as llama.cpp's converter does, not from a 16-bit rounding)
    # (the weights' own tokenizer, read by check_own_tokenizer, is not read again: 0.3-0.5 s a large one)
    bound = read_weights(card, generics={**sizes(resolved[0]), "T": "f32" if dtype in GGUF_TYPES else dtype},
                         numerics="fast", cast_dtype=True, weights=weights, seed=0 if seed is None else seed,
                         tokenizer=False if own else True if tokenizer is None else tokenizer,
                         progress=progress, resolved=resolved)
    if own:
        bound.tokenizer, bound.tokenizer_from = own, Path(bound.checkpoint.path)
    if dtype == "f16":
        check_f16_range(bound)
    if to == "vllm":
        from linnet.export.hf_dir import write_hf_dir

        return write_hf_dir(bound, out)
    from linnet.export.gguf import write_gguf

    return write_gguf(bound, given, dtype)


def not_the_builtin(module, card: str) -> None:
    """Raises `ExportError` where `module` is an architecture of the user's that shares a built-in one's
    name (`arch gpt2` written from the docs) without its config values: the exporters write the built-in's
    keys and tensor layout, which such a module need not have."""
    missing = [name for name in _builtin_config(module.name) if name not in module.config]
    if missing:
        raise ExportError(f"{card!r} is an architecture of its own named {module.name!r}, not Linnet's built-in "
                          f"{module.name} (it declares no {missing[0]!r}) {TRITON_INSTEAD}")


@functools.lru_cache(maxsize=None)
def _builtin_config(name: str) -> tuple:
    """The config values Linnet's built-in architecture `name` declares (none where there is no such one)."""
    from linnet.compiler import check_file

    path = Path(__file__).parents[1] / "nest" / "cards" / "arch" / f"{name}.linnet"
    return tuple(check_file(path).config) if path.is_file() else ()


def sizes(module) -> dict:
    """The generics an export specializes `module` at: the defaults, MaxSeq cut to a learned position
    table's rows (GPT-2's), which bound it though the export never runs the cache."""
    from linnet.ir.specialize import DEFAULT_GENERICS, learned_positions

    table = learned_positions(module)
    return {} if table is None else {"MaxSeq": min(table, DEFAULT_GENERICS["MaxSeq"])}


def quantized_type(dtype: str) -> str | None:
    """The llama.cpp quantized type `dtype` names (llama-quantize's names, any case: q8_0, Q4_K_M), or None."""
    import gguf

    name = dtype.upper()
    if name in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"):
        return None
    known = name in gguf.GGMLQuantizationType.__members__ or f"MOSTLY_{name}" in gguf.LlamaFileType.__members__
    return name if known else None


def dtype_refusal(dtype: str) -> str:
    """Why `dtype` cannot be written; for a llama.cpp quantized type, how to make that file from one
    the export writes."""
    name = quantized_type(dtype)
    if name is None:
        return f"unknown dtype {dtype!r}; one of {', '.join(DTYPES + GGUF_TYPES)}"
    return (f"{dtype!r} is a llama.cpp quantized type that the export does not write (it writes "
            f"{', '.join(DTYPES + GGUF_TYPES)}; q8_0 to llama.cpp only); export --dtype f16 to llama.cpp, then "
            f"quantize that file with llama.cpp's llama-quantize: llama-quantize OUT.F16.gguf OUT.{name}.gguf {name}")


def check_f16_range(bound) -> None:
    """Raises `ExportError` where a weight bound in f16 is infinite (`bind.past_f16`): the server's
    logits it reaches would be NaN. Said before a file is written."""
    from linnet.nest.bind import past_f16

    past = past_f16(bound)
    if past:
        raise ExportError(f"{past}; export --dtype bf16 or f32")


def check_seed(seed, weights) -> None:
    """A seed draws random weights and nothing else: given with weights that are read (the card's
    own, a checkpoint), it would be dropped without a word, so it is refused."""
    if seed is not None and weights != "random":
        source = "the card's own weights" if weights is None else f"the weights {weights}"
        raise ExportError(f"seed {seed}: a seed draws random weights (weights 'random'); {source} are read as "
                          f"they are, and nothing else in an export is random")


def check_own_tokenizer(resolved: tuple, weights):
    """The weights' own tokenizer, read (None where they hold none, or are random or not found: left to
    the reading of the weights). Raises `ExportError` where it is there but cannot be read (a
    tokenizer.json cut short by a download, a config.json it takes its ids from that is no JSON):
    a load warns of it and goes on without one, and the export then wrote a model folder or a
    Triton model with no tokenizer (vLLM could not serve it, Triton refused every text) or refused a
    GGUF as "coming without one". `resolved`: `resolve_card`'s answer for the card and `weights`."""
    from linnet.nest.checkpoint import GGUFCheckpoint, open_checkpoint
    from linnet.nest.errors import TokenizerError
    from linnet.nest.load import find_card_weights, tokenizer_of
    from linnet.nest.tokenizer import SENTENCEPIECE_FILE

    module, card_name, ckpt = resolved
    if weights == "random":
        return None
    source = ckpt.path if ckpt is not None else weights if weights is not None else \
        find_card_weights(card_name, module)[0]
    if source is None or not os.path.exists(source):  # (reading the weights says they are missing)
        return None
    source = Path(source)
    if source.is_dir():
        if not ((source / "tokenizer.json").is_file() or (source / SENTENCEPIECE_FILE).is_file()):
            return None
        held = source
    else:
        held = ckpt if isinstance(ckpt, GGUFCheckpoint) else open_checkpoint(source)
        if not isinstance(held, GGUFCheckpoint) or held.metadata("tokenizer.ggml.model") is None:
            return None
    try:
        return tokenizer_of(held)
    except TokenizerError as err:
        raise ExportError(f"{err} (the weights' own tokenizer, which the export writes with them: mend its files, "
                          f"or give --tokenizer a model directory or GGUF holding a sound one)") from None


def check_folder(out, folder: Path, what: str, file: str | None = None) -> None:
    """Raises `ExportError` where `folder` cannot be made or written in (a file in its way, a link to
    a folder that is not there, a name the file system cannot hold, a folder that is not writable),
    or where the name `file` could not be written in it: said before the weights are read, not after."""
    try:
        there = next(p for p in (folder, *folder.parents) if p.exists() or p == p.parent)
    except OSError as err:  # a name longer than the file system takes, a loop of links
        raise ExportError(f"{out}: cannot write {what} there ({err.strerror or err})") from None
    chain = (folder, *folder.parents)
    to_make = chain[:chain.index(there)]
    for p in to_make:
        if p.is_symlink():  # a link to nowhere (a drive not mounted): mkdir would say "File exists"
            raise ExportError(f"{out}: cannot make the folder {folder} to write {what} in ({p} is a link to "
                              f"{os.readlink(p)}, which is not there: make that folder, or name another)")
    if not there.is_dir():
        raise ExportError(f"{out}: cannot make the folder {folder} to write {what} in ({there} is not a folder)")
    longest, limit = max(len(os.fsencode(name)) for name in [p.name for p in to_make] + [file or ""]), _name_max(there)
    if longest > limit:
        raise ExportError(f"{out}: cannot write {what} there (a name of {longest} bytes, longer than the {limit} "
                          f"its file system takes)")
    if not os.access(there, os.W_OK):
        raise ExportError(f"{out}: cannot write {what} there ({there} is not writable)")


def _name_max(folder: Path) -> int:
    """The longest name, in bytes, a file or folder in `folder` can have (255 on Linux's file systems)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


__all__ = ["DTYPES", "ExportError", "GGUF_TYPES", "TARGETS", "TRITON_INSTEAD", "check_f16_range", "check_folder",
           "check_own_tokenizer", "check_seed", "dtype_refusal", "export", "quantized_type"]
