"""The decode step as a CUDA graph holds it: no value read back to the host inside it (an `.item()`,
a `.tolist()`, a mask's `nonzero`), which a capture refuses and no test here could otherwise see
without a GPU. Run on the meta device, whose tensors have shapes and no data, any such read raises;
and the runtime's device checks (`device.type == "cpu"`) take the branches an accelerator takes:
every key position attended (no span read on the host), cache writes clamped rather than filtered.
"""

from pathlib import Path

import pytest
import torch

from linnet.codegen_torch import runtime as rt
from linnet.codegen_torch.emit import generate
from linnet.compiler import import_source
from linnet.nest.load import read_weights

CARDS = sorted(p.stem for p in (Path(rt.__file__).parents[1] / "nest" / "cards").glob("tiny-*.linnet"))


def test_a_host_read_of_a_meta_tensor_raises():
    """The premise: what the decode step must not do fails on the meta device."""
    t = torch.arange(4, device="meta")
    for read in (lambda: t.tolist(), lambda: int(t[0]), lambda: t[t > 1], lambda: torch.nonzero(t)):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("card", CARDS)
def test_the_decode_step_reads_nothing_back(monkeypatch, card, dtype):
    # Mixtures of experts multiply through torch's grouped GEMM where CUDA has it (bf16, on Hopper);
    # the per-expert loop it falls back to elsewhere reads each expert's row count on the host.
    monkeypatch.setattr(rt, "_grouped_mm_serves", lambda x, w: x.dtype == w.dtype == torch.bfloat16)
    rows, max_seq = 4, 48
    bound = read_weights(card, {"Batch": rows, "MaxSeq": max_seq, "T": dtype}, "fast", cast_dtype=True,
                         weights="random", tokenizer=False)
    source = generate(bound.module)
    model = import_source(source).Model({n: t.to("meta") for n, t in bound.params.items()}, device="meta",
                                        consume=True)
    tokens = torch.zeros(rows, dtype=torch.int32, device="meta")
    positions = torch.zeros(rows, dtype=torch.int32, device="meta")
    if "expert_linear" in source and dtype != "bf16":
        # CUDA's grouped GEMM is bf16 only: other mixtures read each expert's row count, and the
        # runner runs their decode eagerly (`TorchRunner._capture_cuda`)
        with pytest.raises(NotImplementedError):
            model.decode(tokens, positions)
        return
    logits = model.decode(tokens, positions)
    assert logits.device.type == "meta" and logits.shape == (rows, bound.module.bindings["vocab"])
