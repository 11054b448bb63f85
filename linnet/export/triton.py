"""A Triton Inference Server model repository that serves a card on Linnet's own engine.

    <out>/<name>/config.pbtxt   Python backend, decoupled (streams), one instance
    <out>/<name>/1/model.py     Triton's entry point: `linnet.export.triton_model.TritonPythonModel`

The model's inputs and outputs are those of Triton's vLLM backend, read as it reads them, so its
clients work unchanged: `text_input` (the prompt), optional `stream`, `sampling_parameters` (a JSON
object of OpenAI / vLLM sampling fields: max_tokens, temperature, top_p, top_k, stop, seed, ...; else
the request's own parameters), `exclude_input_in_output` and `return_finish_reason`,
`return_cumulative_logprob`, `return_logprobs`, `return_num_input_tokens`, `return_num_output_tokens`;
`text_output` (and what was asked for) comes back, once or as it is generated. The card, its
weights and the engine's sizes are the config's parameters, read when Triton loads the model.
Serve with `tritonserver --model-repository <out>`; the server's Python needs linnet installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path

MODEL_PY = '''\
"""Triton's Python-backend entry point for a Linnet card: see linnet/export/triton_model.py.

Written by `linnet export --to triton`; the card and its sizes are in ../config.pbtxt.
"""
from linnet.export.triton_model import TritonPythonModel  # noqa: F401
'''
# what marks a model folder as an export's, which a later export may replace: its model.py's import
MARK = "from linnet.export.triton_model import"

INPUTS = (("text_input", "TYPE_STRING", False), ("stream", "TYPE_BOOL", True),
          ("sampling_parameters", "TYPE_STRING", True), ("exclude_input_in_output", "TYPE_BOOL", True),
          ("return_finish_reason", "TYPE_BOOL", True), ("return_cumulative_logprob", "TYPE_BOOL", True),
          ("return_logprobs", "TYPE_BOOL", True), ("return_num_input_tokens", "TYPE_BOOL", True),
          ("return_num_output_tokens", "TYPE_BOOL", True))
OUTPUTS = (("text_output", "TYPE_STRING", "-1"), ("finish_reason", "TYPE_STRING", "-1"),
           ("cumulative_logprob", "TYPE_FP32", "-1"), ("logprobs", "TYPE_STRING", "-1"),
           ("num_input_tokens", "TYPE_UINT32", "1"), ("num_output_tokens", "TYPE_UINT32", "-1"))


def config_pbtxt(name: str, parameters: dict) -> str:
    """The model's config.pbtxt (protobuf text format)."""
    lines = [f'name: "{name}"', 'backend: "python"', "max_batch_size: 0",
             "model_transaction_policy { decoupled: true }", "", "input ["]
    for i, (input_name, dtype, optional) in enumerate(INPUTS):
        comma = "," if i < len(INPUTS) - 1 else ""
        lines.append(f'  {{ name: "{input_name}" data_type: {dtype} dims: [ 1 ]'
                     f'{" optional: true" if optional else ""} }}{comma}')
    lines += ["]", "output ["]
    for i, (output_name, dtype, dims) in enumerate(OUTPUTS):
        comma = "," if i < len(OUTPUTS) - 1 else ""
        lines.append(f'  {{ name: "{output_name}" data_type: {dtype} dims: [ {dims} ] }}{comma}')
    lines += ["]", "",
              "# Requests are batched by Linnet's engine (continuous batching over `batch` cache rows), not by Triton.",
              "instance_group [ { count: 1 kind: KIND_MODEL } ]", ""]
    for key, value in parameters.items():
        lines.append(f'parameters: {{ key: "{key}" value: {{ string_value: {json.dumps(str(value))} }} }}')
    return "\n".join(lines) + "\n"


TRITON_MAX_SEQ = 4096  # positions per row, where the card learns no fewer


def write_repository(card, out, *, weights=None, dtype: str = "bf16", name: str | None = None, batch: int = 32,
                     max_seq: int | None = None, backend: str = "torch", tokenizer=None, seed: int | None = None) -> str:
    """Writes the repository at `out`, holding one model (`name`, default the card's name) serving `batch`
    rows of `max_seq` positions (default 4096, or the positions a learned table holds where fewer: GPT-2's
    1024); returns the model's directory. Nothing is loaded now: the card is checked, and the paths given as
    `weights` and `tokenizer` (a model directory or GGUF whose tokenizer to serve with) are checked
    and made absolute, since Triton loads the model from its own working directory."""
    from linnet.export import ExportError, check_folder, check_own_tokenizer, check_seed
    from linnet.ir.specialize import learned_positions, specialize
    from linnet.nest.checkpoint import open_checkpoint
    from linnet.nest.load import check_headers, find_card_weights, past_context, resolve_card, tokenizer_of
    from linnet.nest.locate import shown_places

    check_seed(seed, weights)
    module, card_name, ckpt = resolve_card(card, weights)  # an unknown card, a bad .linnet file or checkpoint fails here
    table = learned_positions(module)
    if max_seq is None:
        max_seq = TRITON_MAX_SEQ if table is None else min(TRITON_MAX_SEQ, table)
    for flag, value, least in (("batch", batch, 1), ("max_seq", max_seq, 2)):  # only the one out of range named
        if value < least:
            raise ExportError(f"{flag} must be at least {least}, not {value}")
    if table is not None and max_seq > table:  # (said here in one line: specialize's error names other commands)
        raise ExportError(f"max_seq {max_seq} is past the {table} positions {card_name} learns (its position "
                          f"table): at most {table}")
    # as the model will be loaded: a row longer than the card holds (learned positions) is said now, not in Triton
    spec = specialize(module, {"Batch": batch, "MaxSeq": max_seq, "T": dtype}, "fast")
    past = past_context(module, card_name, max_seq, flag="max_seq")
    if past:  # said now, as the model's load will say it in the server's log
        warnings.warn(f"{past}; --max-seq {module.meta['max_context']} keeps to it", stacklevel=2)
    name = card_name if name is None else name  # a registry card's whole name: llama-3.1-8b-instruct, not llama-3
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
        raise ExportError(f"{name!r} cannot name a Triton model: it is a folder of the repository "
                          f"(letters, digits, '_', '-' and '.')")
    check_folder(out, Path(out) / name, "the model")
    check_model_folder(Path(out) / name)
    if weights is None and ckpt is None:
        found, looked = find_card_weights(card_name, module)
        if found is None and not module.meta.get("hf_repo"):  # nowhere the server could find them either
            raise ExportError(f"{card_name} has no weights to serve: pass weights (a model directory or GGUF, "
                              f"or 'random' with a seed)")
        if found is None:  # the server may have them in its own Hugging Face cache: said, not refused
            warnings.warn(f"{card_name}'s weights are not on this machine (looked in {', '.join(shown_places(looked))}): "
                          f"the Triton server must find them in its own cache, or pass weights", stacklevel=2)
    if weights == "random" and tokenizer is None and find_card_weights(card_name, module)[0] is None:
        # the model reads text_input; random weights take the tokenizer of the card's own, not here
        warnings.warn(f"random weights take the tokenizer of {card_name}'s own weights, which are not on this "
                      f"machine, and the Triton model takes text: unless the server finds them, every request "
                      f"will be refused; pass a tokenizer (a model directory or GGUF) to serve with", stacklevel=2)
    card = os.path.abspath(card) if os.path.exists(str(card)) else str(card)
    if weights is not None and weights != "random":
        if not os.path.exists(str(weights)):
            raise ExportError(f"{weights}: no such checkpoint")
        # read as Triton's load will read it, headers only: not a checkpoint, cut short, another model's
        check_headers(spec, open_checkpoint(weights), cast_dtype=True)
        weights = os.path.abspath(weights)
    if tokenizer is None:  # the weights' own, served with them: one there that cannot be read fails here
        check_own_tokenizer((module, card_name, ckpt), weights)
    if tokenizer is not None:  # one that cannot be read fails here; a directory needs only the tokenizer's files
        tokenizer_of(Path(tokenizer) if os.path.isdir(tokenizer) else open_checkpoint(tokenizer))
        tokenizer = os.path.abspath(tokenizer)
    model_dir = Path(out) / name
    parameters = {"card": card, "dtype": dtype, "batch": batch, "max_seq": max_seq, "backend": backend}
    if weights is not None:
        parameters["weights"] = weights
    if weights == "random":
        parameters["seed"] = 0 if seed is None else seed
    if tokenizer is not None:
        parameters["tokenizer"] = tokenizer
    _write_model(model_dir, {model_dir / "1" / "model.py": MODEL_PY,
                             model_dir / "config.pbtxt": config_pbtxt(name, parameters)})
    return str(model_dir)


def check_model_folder(model_dir: Path) -> None:
    """Raises `ExportError` where `model_dir` holds a Triton model an export did not write (a vLLM
    backend's config.pbtxt, a Python model of the user's): its config.pbtxt and model.py would be
    replaced, as the vLLM export refuses a directory holding another model's config.json."""
    from linnet.export import ExportError

    config, model_py = model_dir / "config.pbtxt", model_dir / "1" / "model.py"
    theirs = [p for p in (config, model_py) if p.is_file()]
    if not theirs:
        return
    try:
        ours = MARK in model_py.read_text()
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise ExportError(f"{model_dir}: holds a Triton model that Linnet did not write "
                          f"({', '.join(str(p.relative_to(model_dir)) for p in theirs)}), which the export would "
                          f"replace; name another model (--name) or repository, or remove that one first")


def _write_model(model_dir: Path, files: dict) -> None:
    """Writes `files` ({path: text}) each as `<path>.partial` beside an earlier export's, then renames
    them over it: a write that fails (a full disk, an interrupt) leaves the earlier model as it was,
    and takes its own partial files and any folder it made with it."""
    from linnet.export import ExportError

    made = next((p for p in (*reversed(model_dir.parents), model_dir, model_dir / "1") if not p.exists()), None)
    partial = {path: path.with_name(path.name + ".partial") for path in files}
    where = model_dir  # what is being written, for an error (a full disk's names no file)
    try:
        try:
            (model_dir / "1").mkdir(parents=True, exist_ok=True)
            for where, text in files.items():
                partial[where].write_text(text)
            for where in files:  # model.py first: it is the same for every export, config.pbtxt says which
                partial[where].replace(where)
        except OSError as err:
            raise ExportError(f"{where}: cannot write the model ({err.strerror or err})") from None
    except BaseException:
        for path in partial.values():
            path.unlink(missing_ok=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
