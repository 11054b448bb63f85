"""MXFP4, the 4-bit format of gpt-oss's expert weights on the Hugging Face hub.

A checkpoint stores an expert matrix `X` as two uint8 tensors:

- `X_blocks` [experts, out, groups, 16]: two 4-bit codes per byte, low nibble first, each
  an e2m1 float (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6);
- `X_scales` [experts, out, groups]: one power of two per group of 32 values, stored as
  its exponent plus 127 (e8m0).

`dequantize` returns the matrix in the layout the model's unquantized checkpoints use:
[experts, in, out].
"""

from __future__ import annotations

BLOCKS, SCALES = "_blocks", "_scales"
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
CODES = _E2M1 + tuple(-v for v in _E2M1)  # 4-bit code -> value; bit 3 is the sign


def quantized_names(names) -> dict:
    """{X: (X_blocks, X_scales)} for every matrix stored in MXFP4 among `names`."""
    present = set(names)
    out = {}
    for name in present:
        if name.endswith(BLOCKS):
            base = name[: -len(BLOCKS)]
            if base + SCALES in present and base not in present:
                out[base] = (name, base + SCALES)
    return out


def dequantized_shape(blocks_shape: tuple) -> tuple:
    *lead, groups, width = blocks_shape
    return (*lead[:-1], groups * width * 2, lead[-1])


def dequantize(blocks, scales, dtype=None):
    """[experts, out, groups, 16] codes and [experts, out, groups] exponents (torch uint8) ->
    [experts, in, out], bf16 unless `dtype` says otherwise.

    One expert at a time, so that the f32 working copy is one expert's matrix, not the layer's."""
    import torch

    dtype = dtype or torch.bfloat16
    codes_table = torch.tensor(CODES, dtype=torch.float32)
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 needs uint8 blocks [..., groups, 16] and uint8 scales [..., groups]; "
                         f"got {blocks.dtype} {list(blocks.shape)} and {scales.dtype} {list(scales.shape)}")
    experts, out_dim, groups, width = blocks.shape
    result = torch.empty(experts, out_dim, groups * width * 2, dtype=dtype)
    for e in range(experts):
        codes = blocks[e].to(torch.int64)
        values = torch.stack([codes_table[codes & 0x0F], codes_table[codes >> 4]], dim=-1)  # low nibble first
        exponents = scales[e].to(torch.int32) - 127
        values = torch.ldexp(values.reshape(out_dim, groups, width * 2), exponents.unsqueeze(-1).float())
        result[e] = values.reshape(out_dim, -1).to(dtype)
    return result.transpose(1, 2)
