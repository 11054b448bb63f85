"""kernels.h's type codes for torch's types: apart from `build`, which the JAX kernels share
without importing torch."""

import torch

from linnet.kernels.build import TYPE_CODES

TYPES = {torch.float32: TYPE_CODES["f32"], torch.bfloat16: TYPE_CODES["bf16"], torch.float16: TYPE_CODES["f16"]}
