"""Weights for a module's params, by the checkpoint names its `.linnet` source declares.

`bind_weights` reads one tensor at a time through a getter, applies the
declared transforms, casts, and stacks the tensors of params declared inside
`for l in layers` into one tensor per param.
"""

from __future__ import annotations

from typing import Callable

import torch

from linnet.ir.nodes import Module
from linnet.ir.specialize import concrete_dtype, evaluate, param_shape
from linnet.nest.errors import WeightsError
from linnet.nest.transforms import unpermute_rope

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def checkpoint_names(module: Module, fmt: str) -> dict:
    """{param: [checkpoint name per layer]} for a specialized module; tied params are left out."""
    out = {}
    for p in module.params.values():
        if p.tie and evaluate(p.tie[1], module.bindings):
            continue
        src = next((s for s in p.sources if s.format == fmt), None)
        if src is None:
            raise WeightsError(f"param `{p.name}` declares no `{fmt}` source in {module.path}")
        if p.loop_var:
            count = param_shape(module, p.name)[0]
            out[p.name] = [src.pattern.replace("{" + p.loop_var + "}", str(i)) for i in range(count)]
        else:
            out[p.name] = [src.pattern]
    return out


def bind_weights(module: Module, get: Callable[[str], torch.Tensor], fmt: str = "hf", cast_dtype: bool = True,
                 device: str | torch.device = "cpu", where: str = "the checkpoint") -> dict:
    """{param name: tensor} in the module's dtype, read through `get(checkpoint_name)`."""
    out = {}
    for name, ckpt_names in checkpoint_names(module, fmt).items():
        p = module.params[name]
        shape = param_shape(module, name)
        dtype = TORCH_DTYPES[concrete_dtype(p.type.dtype, module)]
        src = next(s for s in p.sources if s.format == fmt)
        per_layer = shape[1:] if p.loop_var else shape
        target = torch.empty(shape, dtype=dtype, device=device) if p.loop_var else None
        for i, ckpt in enumerate(ckpt_names):
            t = get(ckpt)
            for tname, args in src.transforms:
                t = apply_transform(tname, t, [evaluate_dim(a, module) for a in args])
            if tuple(t.shape) != tuple(per_layer):
                raise WeightsError(f"{where}: tensor {ckpt!r} is {list(t.shape)}, but `{name}` declares "
                                   f"{list(per_layer)} ({module.path})")
            if t.dtype != dtype and not cast_dtype and t.is_floating_point():
                raise WeightsError(f"{where}: tensor {ckpt!r} is {t.dtype}, but the model runs in {dtype}; "
                                   "pass cast_dtype=True to convert it")
            if p.loop_var:
                target[i].copy_(t)
            else:
                target = t.to(device=device, dtype=dtype)
        out[name] = target
    return out


def evaluate_dim(d, module: Module) -> int:
    sizes = {k: v for k, v in module.bindings.items() if isinstance(v, int) and not isinstance(v, bool)}
    return d.evaluate(sizes)


def apply_transform(name: str, t: torch.Tensor, args: list) -> torch.Tensor:
    """A weight transform declared in `.linnet` (`.unpermute_rope(heads)`, `.transpose()`)."""
    if name == "unpermute_rope":
        return unpermute_rope(t, args[0])
    if name == "transpose":
        return t.transpose(0, 1)
    raise WeightsError(f"unknown weight transform `{name}`")
