"""A Hugging Face model directory: what vLLM serves (`vllm serve DIR`) and transformers loads.

config.json from the card's config (`hf_config`), the weights as safetensors under the names the
card's `from hf` lines declare (in shards of at most SHARD_BYTES, with an index), and the
tokenizer: copied as it was when the weights came from a model directory, else written from the
tokenizer Nest built (a GGUF's), with its chat template.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import linnet
from linnet.export.hf_config import hf_config
from linnet.nest.bind import unbind_weights

SHARD_BYTES = 4 << 30
MARK = "exported_by"  # config.json's key that says Linnet wrote the folder (transformers keeps it as an attribute)
# (tokenizer.model and tekken.json: Mistral's own, which vLLM's --tokenizer-mode mistral reads)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "tokenizer.model", "tekken.json")
TEMPLATES_DIR = "additional_chat_templates"
STAGING = ".linnet-export-"  # the hidden folders inside the model directory an export is written in first


def write_hf_dir(bound, out) -> str:
    """Writes `bound` (`nest.load.read_weights`) as a model directory at `out`; returns its path.

    The files are written in a hidden folder inside `out` (STAGING, same file system) and swapped in
    only when all are whole: until then an earlier export there stays as it was, and a write that
    fails (a full disk, an interrupt, a weight that cannot be unbound) takes only its own files with it."""
    from linnet.export import ExportError

    out = Path(out)
    sources = [Path(p) for p in (bound.source, bound.tokenizer_from) if p not in (None, "random") and Path(p).is_dir()]
    if out.is_dir() and any(out.resolve() == s.resolve() for s in sources):
        raise ExportError(f"{out}: that is where the weights or the tokenizer are read from; write elsewhere")
    check_destination(out)
    made = next((p for p in (*reversed(out.parents), out) if not p.exists()), None)  # the first folder made
    stage = None
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
            for stale in out.glob(f"{STAGING}*"):  # what an export killed outright (SIGKILL, power) left
                shutil.rmtree(stale, ignore_errors=True)
            stage = Path(tempfile.mkdtemp(prefix=STAGING, suffix=".partial", dir=out))
            _write_files(bound, stage, out)
            _swap_in(stage, out)
        except OSError as err:  # named where it would have gone (safetensors' own errors are said in _save)
            where = Path(err.filename) if err.filename else out  # (a folder made for the export: as it is)
            if stage is not None and stage in where.parents:  # a file of the export, by its place in `out`
                where = out / where.relative_to(stage)
            raise ExportError(f"{where}: cannot write the model ({err.strerror or err})") from None
    except BaseException:  # a full disk, an interrupt: the earlier export stays whole, this one goes
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if made is not None and not (out.is_dir() and any(out.iterdir())):  # (only the folders made for it)
            shutil.rmtree(made, ignore_errors=True)
        raise
    return str(out)


def _swap_in(stage: Path, out: Path) -> None:
    """Moves the whole new export from `stage` into `out` in place of what an earlier one wrote there
    (`_owned`: vLLM reads the shards an old index names, and a tokenizer left from another model
    would be served with this one); other files are the user's, and stay. Renames only, so the
    folder is between two exports for moments, not for the length of a write; a rename that fails
    puts the earlier export back."""
    old = Path(tempfile.mkdtemp(prefix=STAGING, suffix=".old", dir=out))
    retired, placed = [], []
    try:
        for path in _owned(out):
            if path.exists():
                path.rename(old / path.name)
                retired.append(path.name)
        for path in sorted(stage.iterdir()):
            path.rename(out / path.name)
            placed.append(path.name)
    except BaseException:
        for name in placed:
            (out / name).rename(stage / name)
        for name in retired:
            (old / name).rename(out / name)
        shutil.rmtree(old, ignore_errors=True)
        raise
    try:
        shutil.rmtree(old, ignore_errors=True)
    except KeyboardInterrupt:  # the new export is in place: the earlier one's files go all the same
        shutil.rmtree(old, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _write_files(bound, out: Path, final: Path) -> None:
    """The export's files, written in `out`; `final`, the folder they go to, names them in errors."""
    config = {**hf_config(bound.module, bound.tokenizer), MARK: f"linnet {linnet.__version__}"}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    shards, current, size, total = [], {}, 0, 0
    for name, t in unbind_weights(bound.module, bound.params, "hf"):
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = t.contiguous()
        size += nbytes
        total += nbytes
    shards.append(current)
    if len(shards) == 1:
        _save(shards[0], out / "model.safetensors", final)
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _save(shard, out / file, final)
            weight_map.update({name: file for name in shard})
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    _write_tokenizer(bound, out, final, config)
    _readable(out.glob("model*.safetensors"))


def check_destination(out: Path) -> None:
    """Raises `ExportError` where the export could not be written at `out`: a folder that cannot be
    made there, or one holding another model (`_refuse_another_model`). `export` asks before the
    weights are read (an 8B model's take minutes), `write_hf_dir` again."""
    from linnet.export import check_folder

    check_folder(out, out, "the model")
    _refuse_another_model(out)


def _save(tensors: dict, path: Path, final: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from linnet.export import ExportError

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as err:  # a full disk is one of these, not an OSError
        raise ExportError(f"{final / path.name}: cannot write the weights ({err})") from None


def _refuse_another_model(out: Path) -> None:
    """A folder holding a model Linnet did not write is not cleared: its weights and tokenizer would
    go without a word. Linnet's exports say so in config.json (MARK), written before anything else;
    a folder without one (Mistral's own layout: params.json, consolidated.safetensors,
    tokenizer.model) is refused where it holds a file the export would replace or that names a
    model."""
    from linnet.export import ExportError

    config = out / "config.json"
    advice = "write to a new folder, or empty this one first"
    if config.is_file():
        try:
            found = json.loads(config.read_text())
        except (ValueError, UnicodeDecodeError):
            found = None
        ours = isinstance(found, dict) and MARK in found  # (a JSON string holding the mark's text is not)
        if not ours:
            raise ExportError(f"{out}: its config.json has no {MARK!r} key: another model's (or an export by a Linnet "
                              f"from before exports were marked), whose files the export would replace; {advice}")
        return
    model_files = sorted(p.name for p in _owned(out) if p.is_file())
    model_files += sorted(p.name for p in (*out.glob("consolidated*.safetensors"), out / "params.json") if p.is_file())
    if model_files:
        raise ExportError(f"{out}: holds another model's files ({', '.join(model_files)}) and no config.json "
                          f"written by Linnet; the export would replace them; {advice}")


def _owned(out: Path) -> list[Path]:
    """The files an export writes in `out`, whatever an earlier one left there."""
    return [*out.glob("model*.safetensors"), out / "model.safetensors.index.json", out / "config.json",
            *(out / f for f in TOKENIZER_FILES), out / TEMPLATES_DIR]


def _readable(paths) -> None:
    """safetensors writes its files 0600 whatever the umask; a server running as another user (a
    container's, say) must read them: the mode any other new file would have."""
    umask = os.umask(0)
    os.umask(umask)
    for path in paths:
        path.chmod(0o666 & ~umask)


# what a GGUF's tokenizer does that a tokenizer.json cannot say (`Tokenizer.merger`, `Tokenizer.splitter`)
TIED_PIECES = ("SentencePiece pieces tie on score, or hold a character that is no token: of tied pairs llama.cpp "
               "merges the leftmost first, which no ranking of merges holds")
OVERLAPPING_TOKENS = ("two added tokens can overlap in a text: llama.cpp takes the longer, tokenizers the leftmost")


def _write_tokenizer(bound, out: Path, final: Path, config: dict) -> None:
    if bound.tokenizer_from is not None and bound.tokenizer_from.is_dir():  # a model directory's files, as they are
        for file in TOKENIZER_FILES:
            if (bound.tokenizer_from / file).is_file():
                shutil.copyfile(bound.tokenizer_from / file, out / file)
        named = bound.tokenizer_from / TEMPLATES_DIR  # transformers 5's named templates, a file each
        if named.is_dir():
            shutil.copytree(named, out / TEMPLATES_DIR, dirs_exist_ok=True)
        return
    tok = bound.tokenizer
    if tok is None:  # random weights, or a checkpoint without one
        warnings.warn(f"{final}: no tokenizer written ({bound.source} came without one): vLLM needs "
                      f"--tokenizer to serve it", stacklevel=3)
        return
    tok.backend.save(str(out / "tokenizer.json"))
    unheld = [why for why, kept in ((TIED_PIECES, tok.merger), (OVERLAPPING_TOKENS, tok.splitter)) if kept is not None]
    if unheld:
        warnings.warn(f"{final}: its tokenizer.json encodes some texts otherwise than Linnet and llama.cpp encode them "
                      f"({'; '.join(unheld)}): vLLM serving it sees other prompt tokens there", stacklevel=3)
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                "model_max_length": config["max_position_embeddings"]}
    for key, value in tok.special_tokens.items():
        if value is not None:
            settings[key] = value
    if tok.chat_template:  # with its named ones (tool_use, ...), a list transformers reads by name
        settings["chat_template"] = tok.saved_chat_template()
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    # (the pad id too, as Hugging Face's own generation_config.json for SmolLM2 has it: generate's padding)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
