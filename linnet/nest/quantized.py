"""A GGUF's quantized weights kept in their blocks: `nest.load(..., quantization="gguf")`.

`bind.bind_weights` gives a param whose every stored tensor is Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_NL or IQ4_XS blocks (the types `kernels.cpu_qlinear` multiplies; a Q4_K_M file's Q4_K and Q6_K, which its
attn_v and ffn_down mix from layer to layer, and Q5_0 and Q8_0 where a row is not whole super-blocks; a Q5_K_M's
Q5_1 there) as
`cpu_qlinear.QuantBlocks`, each layer in its own type, rather than decoded; a fused group runs in its blocks
only whole, joined in the layers where its members' panels agree (a Q5_1 weight's are Q5_K's). The torch model
(`codegen_torch.runtime.TorchModel`) packs those its linears read for the quantized kernel and decodes the rest
(an embedding's table, which it gathers rows from) to the param's type.
"""

from __future__ import annotations

# what the option takes, as vLLM spells it (its `quantization="gguf"` runs a GGUF's blocks as they are)
QUANTIZATIONS = ("gguf",)
SUPPORTED = "the torch backend on the CPU, with numerics='fast', reading a GGUF file"


def kept_types() -> str:
    """The block types quantization='gguf' keeps (`cpu_qlinear.READS`), as words: "Q4_0, Q4_1, ... and IQ4_XS"."""
    from linnet.kernels.cpu_qlinear import READS

    kinds = list(READS.values())
    return f"{', '.join(kinds[:-1])} and {kinds[-1]}"


def check_quantization(quantization: str | None, kind: str, device: str, numerics: str) -> None:
    """Refuses `quantization` where it does not run, saying where it does (`check_source`: the weights)."""
    if quantization is None:
        return
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}: Linnet takes {', '.join(map(repr, QUANTIZATIONS))} "
                         f"(a GGUF's {kept_types()} linears run in their blocks) or None")
    where = []
    if kind != "torch":
        where.append(f"the {kind} backend")
    if str(device).split(":")[0] != "cpu":
        where.append(f"device {device!r}")
    if numerics != "fast":
        where.append(f"numerics={numerics!r}")
    if where:
        raise ValueError(f"quantization='gguf' runs on {SUPPORTED}; not with {', '.join(where)}")


def check_source(quantization: str | None, checkpoint) -> None:
    """Refuses `quantization` for weights that are not a GGUF file's (random ones, safetensors)."""
    if quantization is not None and getattr(checkpoint, "format", None) != "gguf":
        what = "random weights" if checkpoint is None else f"{checkpoint.path} (a {checkpoint.format} checkpoint)"
        raise ValueError(f"quantization='gguf' runs on {SUPPORTED}; not with {what}")
