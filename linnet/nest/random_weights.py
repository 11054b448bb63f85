"""Seeded random weights for any card at any size: benchmarks and tests without files."""

from __future__ import annotations

import torch

from linnet.codegen_torch.runtime import DTYPES
from linnet.ir.nodes import Module
from linnet.ir.specialize import concrete_dtype, evaluate, param_shape


def random_weights(module: Module, seed: int = 0, device: str | torch.device = "cpu",
                   runs_on: str | torch.device | None = None) -> dict:
    """Normal(0, 0.02) matrices, norm-like vectors near 1; made one param at a time on `device`.

    `runs_on`: the device the model will run on, where it is not `device` (JAX's weights are
    made on the host and moved by its runtime)."""
    # For a model that runs on a GPU the noise is made there by torch's CUDA generator, for either
    # backend (a big model's worth of CPU random numbers takes minutes: 8B values, about a minute
    # and a half on one core), a layer at a time; elsewhere on the CPU, so that a seed gives the
    # same weights on every machine.
    maker = torch.device(runs_on or device)
    if maker.type != "cuda" or not torch.cuda.is_available():
        maker = torch.device("cpu")
    gen = torch.Generator(device=maker).manual_seed(seed)
    out = {}
    for p in module.params.values():
        if p.tie and evaluate(p.tie[1], module.bindings):
            continue
        shape = param_shape(module, p.name)
        dtype = DTYPES[concrete_dtype(p.type.dtype, module)]
        vector = len(shape) - len(p.loops) == 1
        t = torch.empty(shape, dtype=dtype, device=device)
        # Made in f32 one layer at a time: peak memory stays one layer above the model.
        for i, part in enumerate(t if p.loop_var else [t]):
            values = torch.randn(part.shape, generator=gen, device=maker) * 0.02
            if vector:
                values = values + 1.0
            # rounded to the param's type where the noise was made: a GPU's noise for JAX's host
            # weights then crosses to the host in 16 bits, not as f32 for one CPU core to round
            part.copy_(values.to(part.dtype))
        out[p.name] = t
    return out
