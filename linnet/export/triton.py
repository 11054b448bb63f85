"""A Triton Inference Server model repository that serves a card on Linnet's own engine.

    <out>/<name>/config.pbtxt   Python backend, decoupled (streams), one instance
    <out>/<name>/1/model.py     Triton's entry point: `linnet.export.triton_model.TritonPythonModel`

The model's inputs and outputs are those of Triton's vLLM backend, so its clients work unchanged:
`text_input` (the prompt), optional `stream`, `sampling_parameters` (a JSON object of OpenAI /
vLLM sampling fields: max_tokens, temperature, top_p, top_k, stop, seed, ...) and
`exclude_input_in_output`; `text_output` comes back, once or as it is generated. The card, its
weights and the engine's sizes are the config's parameters, read when Triton loads the model.
Serve with `tritonserver --model-repository <out>`; the server's Python needs linnet installed.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

MODEL_PY = '''\
"""Triton's Python-backend entry point for a Linnet card: see linnet/export/triton_model.py.

Written by `linnet export --to triton`; the card and its sizes are in ../config.pbtxt.
"""
from linnet.export.triton_model import TritonPythonModel  # noqa: F401
'''

INPUTS = (("text_input", "TYPE_STRING", False), ("stream", "TYPE_BOOL", True),
          ("sampling_parameters", "TYPE_STRING", True), ("exclude_input_in_output", "TYPE_BOOL", True))


def config_pbtxt(name: str, parameters: dict) -> str:
    """The model's config.pbtxt (protobuf text format)."""
    lines = [f'name: "{name}"', 'backend: "python"', "max_batch_size: 0",
             "model_transaction_policy { decoupled: true }", "", "input ["]
    for i, (input_name, dtype, optional) in enumerate(INPUTS):
        comma = "," if i < len(INPUTS) - 1 else ""
        lines.append(f'  {{ name: "{input_name}" data_type: {dtype} dims: [ 1 ]'
                     f'{" optional: true" if optional else ""} }}{comma}')
    lines += ["]", "output [", '  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }', "]", "",
              "# Requests are batched by Linnet's engine (continuous batching over `batch` cache rows), not by Triton.",
              "instance_group [ { count: 1 kind: KIND_MODEL } ]", ""]
    for key, value in parameters.items():
        lines.append(f'parameters: {{ key: "{key}" value: {{ string_value: {json.dumps(str(value))} }} }}')
    return "\n".join(lines) + "\n"


def write_repository(card, out, *, weights=None, dtype: str = "bf16", name: str | None = None, batch: int = 32,
                     max_seq: int = 4096, backend: str = "torch", tokenizer=None) -> str:
    """Writes the repository at `out`, holding one model (`name`, default the card's name); returns
    the model's directory. Nothing is loaded now: the card is checked, and the paths given as
    `weights` and `tokenizer` (a model directory or GGUF whose tokenizer to serve with) are checked
    and made absolute, since Triton loads the model from its own working directory."""
    from linnet.export import ExportError
    from linnet.nest.checkpoint import open_checkpoint
    from linnet.nest.load import resolve_card, tokenizer_of

    _, card_name, _ = resolve_card(card, weights)  # an unknown card, a bad .linnet file or checkpoint fails here
    if batch < 1 or max_seq < 2:
        raise ExportError(f"batch must be at least 1 and max_seq at least 2, not {batch} and {max_seq}")
    if weights == "random" and tokenizer is None:  # the model reads text_input: without a tokenizer, none
        warnings.warn("random weights have no tokenizer, and the Triton model takes text: every request will "
                      "be refused; pass a tokenizer (a model directory or GGUF) to serve with", stacklevel=2)
    card = os.path.abspath(card) if os.path.exists(str(card)) else str(card)
    if weights is not None and weights != "random":
        if not os.path.exists(str(weights)):
            raise ExportError(f"{weights}: no such checkpoint")
        weights = os.path.abspath(weights)
    if tokenizer is not None:
        tokenizer_of(open_checkpoint(tokenizer))  # one that cannot be read fails here too
        tokenizer = os.path.abspath(tokenizer)
    name = name or card_name  # a registry card's whole name: llama-3.1-8b-instruct, not llama-3
    model_dir = Path(out) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    parameters = {"card": card, "dtype": dtype, "batch": batch, "max_seq": max_seq, "backend": backend}
    if weights is not None:
        parameters["weights"] = weights
    if tokenizer is not None:
        parameters["tokenizer"] = tokenizer
    (model_dir / "config.pbtxt").write_text(config_pbtxt(name, parameters))
    (model_dir / "1" / "model.py").write_text(MODEL_PY)
    return str(model_dir)
