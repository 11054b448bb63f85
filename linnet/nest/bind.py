"""Weights for a module's params, by the checkpoint names its `.linnet` source declares.

`bind_weights` reads one tensor at a time through a getter, applies the
declared transforms, and copies it straight into a target allocated once per
param in the module's dtype on the target device; params declared inside
`for l in layers` are one stacked tensor, filled layer by layer (or expert by
expert, where the checkpoint stores one tensor per expert). So loading
never holds more than the model plus the one tensor in flight (which, for a
memory-mapped safetensors file, is the file's own pages, not process memory).

`check_checkpoint` validates a checkpoint against a module from its headers
alone (names, shapes, stored dtypes) before a byte of tensor data is read.
`unbind_weights` goes the other way, for `linnet export`.

Binding works in torch (the torch backend, export) or in numpy (the JAX backend, which moves host
arrays to its device): a JAX process need not import torch to load a checkpoint.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Callable

import numpy as np

from linnet.kernels.pages import aligned_empty
from linnet.ir.nodes import Module
from linnet.ir.specialize import concrete_dtype, evaluate, param_shape
from linnet.ir.types import FLOAT_DTYPES, GENERIC_DTYPE
from linnet.nest.errors import WeightsError
from linnet.nest.transforms import permute_rope, split_heads, unpermute_rope

READS_AS = {"mxfp4": "bf16"}  # a safetensors checkpoint's quantized pairs, as its reader gives them
# bf16 values held as their bits in numpy, which has no bf16 type of its own (ml_dtypes' is JAX's, and
# not installed with torch alone): what the torch backend's CPU binding reads a bf16 tensor as
BF16_BITS = np.dtype([("bf16", "<u2")])


def checkpoint_pieces(module: Module, fmt: str) -> dict:
    """{param: [(index, checkpoint name)]} for a specialized module; tied params are left out.

    Each stored tensor fills `target[index]`: () for an unstacked param, (l,) for one layer of a
    param declared in `for l in layers`, (l, e) for one expert where the pattern names `{e}` too.
    """
    out = {}
    for p in module.params.values():
        if p.tie and evaluate(p.tie[1], module.bindings):
            continue
        src = _source(module, p, fmt)
        counts = param_shape(module, p.name)[:src.stacked]
        pieces = []
        for index in itertools.product(*(range(n) for n in counts)):
            name = src.pattern
            for var, i in zip(p.loops, index):
                start = evaluate_dim(p.starts[var], module) if var in p.starts else 0  # `for l in a:b`
                name = name.replace("{" + var + "}", str(start + i))
            pieces.append((index, name))
        out[p.name] = pieces
    return out


def past_f16(bound) -> str | None:
    """Where a param of `bound` (`load.BoundWeights`) holds inf in f16, the
    checkpoint tensor it came from, else None. f16 holds nothing past +-65504: a wider stored value
    past it was cast to inf, which turns every logit it reaches to NaN. Tensors stored in f16 were
    not cast and are not looked at. Params: torch tensors or numpy arrays."""
    ckpt = bound.checkpoint  # (None: random weights, named as a Hugging Face checkpoint would name them)
    for name, pieces in checkpoint_pieces(bound.module, "hf" if ckpt is None else ckpt.source_format).items():
        p = bound.params.get(name)
        if isinstance(p, np.ndarray) and p.dtype == np.float16:
            bits = np.int16
        elif type(p).__module__.startswith("torch") and str(p.dtype) == "torch.float16":
            import torch

            bits = torch.int16
        else:  # another type, or quantized blocks
            continue
        for index, tensor in pieces:
            if ckpt is not None and ckpt.stored_dtype(tensor) == "f16":
                continue
            count = _infinities(p[index], bits)
            if count:
                return (f"{name}{list(index) if index else ''} ({tensor} in {bound.source}): {count} "
                        f"value{'s' if count > 1 else ''} past f16's range (+-65504), which f16 holds as inf")
    return None


def _infinities(values, bits, block: int = 1 << 22) -> int:
    """How many of f16 `values` (a numpy array or torch tensor, viewed as the int16 type `bits`) are
    +-inf: 0x7C00 past the sign bit. Read a block of rows at a time, so that the scan's temporaries
    stay small beside a large param (an 8B model's embedding: 1 GB in f16)."""
    values = values.reshape(1, -1) if values.ndim < 2 else values
    rows = max(1, block // math.prod(values.shape[1:]))
    return sum(int(((values[start:start + rows].view(bits) & 0x7FFF) == 0x7C00).sum())
               for start in range(0, values.shape[0], rows))


def checkpoint_names(module: Module, fmt: str) -> dict:
    """{param: [checkpoint name of each stored tensor]}, in the order `checkpoint_pieces` gives."""
    return {name: [ckpt for _, ckpt in pieces] for name, pieces in checkpoint_pieces(module, fmt).items()}


def _source(module: Module, p, fmt: str):
    src = next((s for s in p.sources if s.format == fmt), None)
    if src is None:
        raise WeightsError(f"param `{p.name}` declares no `{fmt}` source in {module.path}")
    return src


def expected_shapes(module: Module, fmt: str) -> dict:
    """{checkpoint name: (param, shape the checkpoint must store it in)}: the declared
    shape with the declared transforms undone (a `.transpose(a, b)` swaps two dims back)."""
    out = {}
    for name, pieces in checkpoint_pieces(module, fmt).items():
        src = _source(module, module.params[name], fmt)
        stored = list(param_shape(module, name)[src.stacked:])
        for tname, args in reversed(src.transforms):
            if tname == "transpose":
                a, b = transpose_axes(args, module)
                stored[a], stored[b] = stored[b], stored[a]
            if tname == "split_heads":  # [heads, rows taken, ...] of [heads * head_rows, ...]
                heads, head_rows = (evaluate_dim(a, module) for a in args[:2])
                stored = [heads * head_rows, *stored[2:]]
        for _, ckpt in pieces:
            out[ckpt] = (name, tuple(stored))
    return out


def layers_held(module: Module, ckpt, fmt: str) -> int | None:
    """How many layers `ckpt` holds tensors of: one past the highest index under the names the card's
    per-layer params read (`model.layers.{l}.`, `blk.{l}.`); None where the card has no such params."""
    layers, prefixes = module.bindings.get("layers"), set()
    for p in module.params.values():
        src = next((s for s in p.sources if s.format == fmt), None)
        mark = "{" + p.loop_var + "}" if p.loop_var else None
        if src is None or mark is None or mark not in src.pattern:
            continue
        start = evaluate_dim(p.starts[p.loop_var], module) if p.loop_var in p.starts else 0
        if start + param_shape(module, p.name)[0] == layers:  # a loop over the layers (to their last)
            prefixes.add(src.pattern[:src.pattern.index(mark)])
    if not prefixes:
        return None
    index = re.compile("(?:" + "|".join(map(re.escape, sorted(prefixes))) + r")(\d+)(?:\.|$)")
    return max((int(m[1]) + 1 for n in ckpt.names() if (m := index.match(n))), default=0)


def check_layers_held(module: Module, ckpt, fmt: str, said: str | None = None, missing: str | None = None) -> None:
    """A `WeightsError` naming both counts and the file where the checkpoint holds the tensors of fewer
    layers than the card has (not only its first missing tensor), or, where `said` names the layer count as
    the checkpoint's own config gives it (config.json's num_hidden_layers, a GGUF's block_count), of more:
    vLLM and llama.cpp refuse both ("wrong number of tensors"); a card of the user's runs what it says,
    with the tensors past its layers reported unused, as transformers warns of them. `missing`: the first
    tensor the card needs that the checkpoint lacks, named as llama.cpp names it ("missing tensor ...")."""
    held, layers = layers_held(module, ckpt, fmt), module.bindings.get("layers")
    if not held or held == layers or (held > layers and said is None):  # none held: another model's names
        return
    if held > layers and fmt == "hf":  # DeepSeek-V3's multi-token prediction layer, stored past the last
        spare = ckpt.config().get("num_nextn_predict_layers")  # (transformers and vLLM skip it, as the card)
        if isinstance(spare, int) and held <= layers + spare:
            return
    count = f"{said} is {layers}" if said else f"the card {module.card or module.name} has {layers} layers"
    lacks = f" (it has no tensor {missing!r})" if missing and held < layers else ""
    raise WeightsError(f"{ckpt.path}: {count}, but the checkpoint holds the tensors of {held} layer"
                       f"{'' if held == 1 else 's'}{lacks}{_looked_in(ckpt)}")


def check_checkpoint(module: Module, ckpt, fmt: str, cast_dtype: bool, layers_said: str | None = None) -> list:
    """Raises `WeightsError` for a tensor the card needs that `ckpt` lacks, one stored in
    another shape, or (without `cast_dtype`) one stored in another float type than T; first, for a
    layer count the tensors do not hold (`check_layers_held`, `layers_said` its).
    Returns the checkpoint's tensors the card does not use, sorted."""
    expected = expected_shapes(module, fmt)
    where = f" ({module.path})"
    missing = [n for n in expected if n not in ckpt]
    if missing or layers_said is not None:
        check_layers_held(module, ckpt, fmt, layers_said, missing[0] if missing else None)
    if missing:
        more = f", and {len(missing) - 1} more" if len(missing) > 1 else ""
        quantized = _quantization(ckpt) if fmt != "gguf" else ""  # GPTQ and AWQ store qweight, not weight
        raise WeightsError(f"{ckpt.path}: the checkpoint has no tensor {missing[0]!r}, which param "
                           f"`{expected[missing[0]][0]}` needs{more}{where}{_looked_in(ckpt)}"
                           + (f"; it is quantized{quantized}. {_READABLE}" if quantized else ""))
    bad = [(n, p, shape, tuple(ckpt.shape(n))) for n, (p, shape) in expected.items() if tuple(ckpt.shape(n)) != shape]
    if bad:
        lines = [f"{_file_of(ckpt, n)}: tensor {n!r} is {list(got)}, but param `{p}` declares {list(want)}"
                 for n, p, want, got in bad[:5]]
        more = f"\n  ... and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise WeightsError("shapes differ between the checkpoint and the card" + where + ":\n  "
                           + "\n  ".join(lines) + more + _packed(ckpt, fmt, [n for n, *_ in bad]))
    if fmt != "gguf":
        _check_stored_types(module, ckpt, expected, cast_dtype)
    return sorted(set(ckpt.names()) - set(expected) - set(getattr(ckpt, "config_tensors", ())))


def _check_stored_types(module: Module, ckpt, expected: dict, cast_dtype: bool) -> None:
    """Each float param's tensor is stored in a float type: another (FP8 with scales beside it,
    int8, ...) is a quantized checkpoint's, whose numbers are not the weights, so it is refused,
    never cast; and without `cast_dtype`, in the param's own type."""
    types = {n: (p, _read_as(ckpt, n), concrete_dtype(module.params[p].type.dtype, module))
             for n, (p, _) in expected.items()}
    for n, (p, stored, want) in types.items():
        if want in FLOAT_DTYPES and stored not in (*FLOAT_DTYPES, "f64"):
            raise WeightsError(f"{_file_of(ckpt, n)}: tensor {n!r} is stored as {stored}, but param `{p}` is a "
                               f"float weight: the checkpoint is quantized{_quantization(ckpt)}. {_READABLE}")
    if cast_dtype:
        return
    target = module.bindings.get("T")
    for n, (p, stored, want) in types.items():
        if stored in FLOAT_DTYPES and stored != want and not _widens(stored, want):
            others = sum(1 for _, have, own in types.values() if have != own)
            more = f" (and {others - 1} more tensors)" if others > 1 else ""
            # (a param of T's own type could take the stored one instead; exact numerics hold f32 whatever T,
            # so there only a widening, which is taken above, would reach this)
            generic = module.params[p].type.dtype == GENERIC_DTYPE
            instead = f", or load with generics T={stored!r}" if generic else ""
            raise WeightsError(f"{_file_of(ckpt, n)}: tensor {n!r} is stored as {stored}, but param `{p}` is "
                               f"{want}{' (T = ' + target + ')' if target and generic else ''}{more}; "
                               f"pass cast_dtype=True to convert it{instead}")


_READABLE = ("Linnet reads unquantized safetensors (f32, bf16, f16), gpt-oss's MXFP4 experts and GGUF files; "
             "load the unquantized checkpoint or a GGUF")


def _quantization(ckpt) -> str:
    """" (config.json's quantization_config: ...)" where a checkpoint's config names a quantization
    (transformers' quantization_config, MLX's quantization), else ""."""
    try:
        config = ckpt.config()
    except WeightsError:  # no config.json: the tensors alone tell
        return ""
    method = (config.get("quantization_config") or {}).get("quant_method")
    mlx = config.get("quantization")  # MLX's: {"group_size": 64, "bits": 4}
    if isinstance(mlx, dict) and "bits" in mlx:
        return f" (config.json's quantization: MLX's {mlx['bits']}-bit groups of {mlx.get('group_size')})"
    return f" (config.json's quantization_config: {method!r})" if method and method != "mxfp4" else ""


def _read_as(ckpt, name: str) -> str:
    """The type a tensor is read in: as stored, but a safetensors checkpoint's MXFP4 pairs read as bf16."""
    stored = ckpt.stored_dtype(name)
    return READS_AS.get(stored, stored)


def _packed(ckpt, fmt: str, names: list) -> str:
    """"\nthe checkpoint is quantized (...)" where tensors of another shape than the card's are weights
    packed into integers (MLX's and bitsandbytes' are narrower than the card's) or the config names a
    quantization; else ""."""
    if fmt == "gguf":
        return ""
    packed = [n for n in names if _read_as(ckpt, n) not in (*FLOAT_DTYPES, "f64")]
    quantized = _quantization(ckpt)
    if not (packed or quantized):
        return ""
    example = f" ({packed[0]!r} is {_read_as(ckpt, packed[0])})" if packed else ""
    return f"\nthe checkpoint is quantized{quantized}{example}. {_READABLE}"


def _looked_in(ckpt) -> str:
    """"; looked in its 3 files: a, b, c" for a checkpoint of several files (shards, a GGUF's splits)."""
    files = ckpt.files() if hasattr(ckpt, "files") else []
    if len(files) < 2:
        return ""
    names = [Path(f).name for f in files]
    shown = ", ".join(names if len(names) <= 6 else names[:3] + ["..."] + names[-2:])
    return f"; looked in its {len(files)} files: {shown}"


def _file_of(ckpt, name: str) -> str:
    return ckpt.file_of(name) if hasattr(ckpt, "file_of") else str(getattr(ckpt, "path", "the checkpoint"))


def bind_weights(module: Module, get: Callable[[str], object], fmt: str = "hf", cast_dtype: bool = True,
                 device: str = "cpu", where: str | Callable[[str], str] = "the checkpoint",
                 progress: Callable[[str], None] | None = None, framework: str = "torch",
                 get_in_type: bool = False, get_blocks: Callable[[str], tuple | None] | None = None) -> dict:
    """{param name: array} in the module's dtype, read through `get(checkpoint_name)`.

    framework="torch": torch tensors on `device`, from the torch tensors `get` returns; "numpy":
    host arrays (bf16 as ml_dtypes' bfloat16), from the numpy arrays `get` returns. `where` names
    the file a tensor comes from in messages (a string, or a function of the tensor's name, for
    sharded checkpoints); `progress(name)` is called after each tensor. `get_in_type`: `get` is
    called as get(checkpoint_name, param's type), for a reader that can give a tensor in that type
    as the conversion would (a GGUF's blocks decoded straight to bf16). `get_blocks(checkpoint_name)`:
    (type, [rows, row bytes] blocks) of a tensor kept quantized, or None; a param [*layers, N, K] whose
    every tensor it gives (a layer's type its own) is bound as `cpu_qlinear.QuantBlocks` (`nest.quantized`),
    not decoded.
    """
    arrays = _ARRAYS[framework](device)
    file_of = where if callable(where) else (lambda _name: where)
    out = {}
    for name, pieces in checkpoint_pieces(module, fmt).items():
        p = module.params[name]
        shape = param_shape(module, name)
        dtype = concrete_dtype(p.type.dtype, module)
        src = _source(module, p, fmt)
        stored = tuple(shape[src.stacked:])
        if get_blocks is not None:
            blocks = _quantized(module, src, pieces, shape, get_blocks)
            if blocks is not None:
                out[name] = blocks
                for _, ckpt in pieces if progress is not None else ():
                    progress(ckpt)
                continue
        target = arrays.empty(shape, dtype, device)
        for index, ckpt in pieces:
            t = arrays.take(get(ckpt, dtype) if get_in_type else get(ckpt))
            for tname, args in src.transforms:
                t = apply_transform(tname, t, [evaluate_dim(a, module) for a in args])
            if tuple(t.shape) != stored:
                after = f" after {', '.join(n for n, _ in src.transforms)}" if src.transforms else ""
                raise WeightsError(f"{file_of(ckpt)}: tensor {ckpt!r} is {list(t.shape)}{after}, but param `{name}` "
                                   f"declares {list(stored)} ({module.path})")
            have = arrays.type_name(t)
            if have != dtype and not cast_dtype and arrays.is_float(t) and not _widens(have, dtype):
                raise WeightsError(f"{file_of(ckpt)}: tensor {ckpt!r} is {have}, but param `{name}` is "
                                   f"{dtype}; pass cast_dtype=True to convert it")
            arrays.put(target, index, t)
            del t  # the next tensor replaces this one: one in flight at a time
            if progress is not None:
                progress(ckpt)
        out[name] = target
    return out


def _widens(stored: str, want: str) -> bool:
    """A 16-bit float read into an f32 param (`want`: its type with T bound): exact, so no cast_dtype is
    asked for it. A bf16 checkpoint loads in f32 as transformers' default loads it (and DeepSeek's router,
    declared f32 whatever T, reads a bf16 one); only a cast that rounds (f32 to bf16, bf16 to f16) asks."""
    return want == "f32" and stored in ("bf16", "f16")


def _quantized(module: Module, src, pieces: list, shape: tuple, get_blocks: Callable[[str], tuple | None]):
    """A param's stored tensors as one `QuantBlocks`, where each is blocks `get_blocks` keeps (each layer
    in its own type: a Q4_K_M file mixes Q4_K and Q6_K in one param), of the declared [N, K] each, rewritten
    by row permutations alone (`unpermute_rope`); else None, and the param is decoded as any other (a shape
    that does not fit then fails there, as ever)."""
    from gguf import GGML_QUANT_SIZES

    from linnet.kernels.cpu_qlinear import QuantBlocks

    if len(shape) - src.stacked != 2 or src.stacked > 1 or any(t != "unpermute_rope" for t, _ in src.transforms):
        return None
    stored = [get_blocks(ckpt) for _, ckpt in pieces]
    if any(s is None for s in stored):
        return None
    layers = []
    for qtype, rows in stored:
        values, block_bytes = GGML_QUANT_SIZES[qtype]
        if rows.shape != (shape[-2], shape[-1] // values * block_bytes) or shape[-1] % values:
            return None
        for tname, args in src.transforms:
            rows = apply_transform(tname, rows, [evaluate_dim(a, module) for a in args])
        layers.append(rows)
    return QuantBlocks(tuple(qtype for qtype, _ in stored), tuple(shape), layers)


class _TorchArrays:
    """bind_weights' array operations in torch.

    On the CPU a tensor is transformed and copied into its place through numpy views of the same
    memory, on this thread: torch splits each copy over its threads, and where another process
    kept a core busy every tensor waited for it (a bf16 SmolLM2's 272 copies took 1.3 s, one 3.5 MB
    tensor 8 ms against 0.2 on one thread). f32 is rounded to bf16 by `gguf_blocks.round_to_bf16`
    and to f16 by numpy, to nearest even as torch rounds; a type numpy has not, or a library not
    built, goes through torch's copy."""

    def __init__(self, device=None):
        import torch

        from linnet.codegen_torch.runtime import DTYPES

        self.torch = torch
        self.types = DTYPES
        self.on_host = torch.device(device or "cpu").type == "cpu"
        self.numpy_types = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
                            torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64)}
        self.names = {v: k for k, v in DTYPES.items()}

    def empty(self, shape, dtype: str, device):
        return self.torch.empty(shape, dtype=self.types[dtype], device=device)

    def take(self, t):
        torch = self.torch
        if not (self.on_host and isinstance(t, torch.Tensor) and t.device.type == "cpu") or t.requires_grad:
            return t
        if t.dtype == torch.bfloat16:  # numpy has no bf16 (without ml_dtypes): its bits, marked so
            return t.view(torch.int16).numpy().view(BF16_BITS)
        # the same memory: transforms and the copy run in numpy (see the class)
        return t.numpy() if t.dtype in self.numpy_types else t

    def type_name(self, t) -> str:
        if isinstance(t, np.ndarray):
            if t.dtype == BF16_BITS:
                return "bf16"
            return next((k for k, v in self.types.items() if self.numpy_types.get(v) == t.dtype), str(t.dtype))
        return self.names.get(t.dtype, str(t.dtype).replace("torch.", ""))

    def is_float(self, t) -> bool:
        return t.dtype.kind == "f" or t.dtype == BF16_BITS if isinstance(t, np.ndarray) else t.is_floating_point()

    def put(self, target, index, t) -> None:
        dst = target[index]
        if dst.device.type == "cpu" and self._host_copy(dst, t):
            return
        if isinstance(t, np.ndarray):
            bits = t.dtype == BF16_BITS
            t = np.ascontiguousarray(t.view(np.int16) if bits else t)
            t = self.torch.from_numpy(t if t.flags.writeable else t.copy())
            t = t.view(self.torch.bfloat16) if bits else t
        dst.copy_(t)

    def _host_copy(self, dst, t) -> bool:
        """t copied into dst (a CPU tensor) through numpy, as torch's copy would, a share of a large
        tensor's rows on each core (`checkpoint.over_rows`); False where left to torch."""
        from linnet.nest.checkpoint import over_rows

        torch = self.torch
        if not isinstance(t, np.ndarray) or not dst.is_contiguous() or dst.dim() == 0:
            return False
        round_rows = None  # a converter of rows of src into out, where numpy's assignment is not the copy
        if t.dtype == BF16_BITS:  # bf16 into bf16: copied as it is, bits for bits (else: torch's)
            if dst.dtype != torch.bfloat16:
                return False
            src, out = t.view(np.int16), dst.view(torch.int16).numpy()
        elif dst.dtype == torch.bfloat16 and t.dtype == np.float32:
            from linnet.kernels.gguf_blocks import round_to_bf16 as round_rows

            src, out = np.ascontiguousarray(t), dst.view(torch.int16).numpy()
            if not round_rows(src[:1], out[:1]):  # (the library is not built here)
                return False
        elif dst.dtype in (torch.float32, torch.float16) and t.dtype in (np.float32, np.float16) or \
                self.numpy_types.get(dst.dtype) == t.dtype:
            src, out = t, dst.numpy()  # numpy rounds f32 to f16 to nearest even, as torch does
        else:
            return False

        def copy(lo, hi):
            if round_rows is None:
                with np.errstate(over="ignore"):  # (past f16's range is inf, as torch casts it: `past_f16` says so)
                    out[lo:hi] = src[lo:hi]
            else:
                round_rows(src[lo:hi], out[lo:hi])

        over_rows(len(out), out.nbytes, copy)
        return True


class _NumpyArrays:
    """bind_weights' array operations in numpy; bf16 is ml_dtypes' bfloat16 (the type JAX uses)."""

    def __init__(self, device=None):
        import ml_dtypes

        self.types = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16)}

    def empty(self, shape, dtype: str, device):
        if device not in (None, "cpu"):
            raise ValueError(f"numpy arrays are host arrays; device={device!r}")
        return aligned_empty(shape, self.types[dtype])  # JAX's CPU device array is then this memory, not a copy

    def take(self, t):
        return np.asarray(t)

    def type_name(self, t) -> str:
        return next((k for k, v in self.types.items() if v == t.dtype), str(t.dtype))

    def is_float(self, t) -> bool:
        return t.dtype.kind == "f" or t.dtype in self.types.values()

    def put(self, target, index, t) -> None:
        with np.errstate(over="ignore"):  # (past f16's range is inf, as torch casts it: `past_f16` says so)
            target[index] = t  # numpy casts to the target's type, rounding to nearest even as torch does


_ARRAYS = {"torch": _TorchArrays, "numpy": _NumpyArrays}


def unbind_weights(module: Module, params: dict, fmt: str = "hf"):
    """The inverse of `bind_weights`: (checkpoint name, tensor as the checkpoint stores it) for every
    tensor of `params` under `fmt`'s names, each layer (or expert) of a stacked param apart as the
    pattern names them, the declared transforms undone (`.transpose` is its own inverse,
    `.unpermute_rope` undoes `permute_rope`). A param tied to another under this config is skipped:
    the checkpoint holds it once. Params that each `.split_heads` rows of one stored tensor are put
    back together into it, yielded once all of them are in; rows none of them takes are an error."""
    split: dict = {}  # checkpoint name -> ([heads, head_rows, ...] being filled, rows filled)
    for name, pieces in checkpoint_pieces(module, fmt).items():
        src = _source(module, module.params[name], fmt)
        for index, ckpt in pieces:
            t = params[name][index]
            rows = None
            for tname, args in reversed(src.transforms):
                values = [evaluate_dim(a, module) for a in args]
                if tname == "split_heads":
                    rows = values
                    break  # (the first transform: `split_heads` reads the stored tensor itself)
                t = permute_rope(t, *values) if tname == "unpermute_rope" else apply_transform(tname, t, values)
            if rows is None:
                yield ckpt, t
                continue
            heads, head_rows, start, stop = rows
            whole, filled = split.setdefault(ckpt, (_zeros_like(t, (heads, head_rows, *t.shape[2:])), set()))
            whole[:, start:stop] = t
            filled.update(range(start, stop))
    for ckpt, (whole, filled) in split.items():
        if len(filled) != whole.shape[1]:
            missing = sorted(set(range(whole.shape[1])) - filled)
            raise WeightsError(f"tensor {ckpt!r}: no param takes rows {missing} of its heads' {whole.shape[1]} "
                               f"(`.split_heads`), so it cannot be written back whole ({module.path})")
        yield ckpt, whole.reshape(whole.shape[0] * whole.shape[1], *whole.shape[2:])


def _zeros_like(t, shape: tuple):
    return t.new_zeros(shape) if hasattr(t, "new_zeros") else np.zeros(shape, t.dtype)


def evaluate_dim(d, module: Module) -> int:
    sizes = {k: v for k, v in module.bindings.items() if isinstance(v, int) and not isinstance(v, bool)}
    return d.evaluate(sizes)


def transpose_axes(args: list, module: Module) -> tuple:
    """The two dims a `.transpose(...)` swaps: its arguments, or the first two."""
    return tuple(evaluate_dim(a, module) for a in args) if args else (0, 1)


def apply_transform(name: str, t, args: list):
    """A weight transform declared in `.linnet` (`.unpermute_rope(heads)`, `.transpose()`), on a
    torch tensor or a numpy array."""
    if name == "unpermute_rope":
        return unpermute_rope(t, *args)
    if name == "transpose":
        return t.swapaxes(*(args or (0, 1)))  # torch's transpose(a, b); numpy's transpose permutes
    if name == "split_heads":
        return split_heads(t, *args)
    raise WeightsError(f"unknown weight transform `{name}`")
