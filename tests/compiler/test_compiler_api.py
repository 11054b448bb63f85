"""linnet.compiler's Python entry points take what their docstrings say: `build` a checked module,
a `.linnet` path (as a Path or a str) or source text, each the same model; `generate` a known backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linnet.compiler import build, check_file, generate

SOURCE = """\
arch bigram

config {
  vocab: int = 16
  dim: int = 4
}

params {
  embed: T[vocab, dim]
    from hf "embed.weight"
}

entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
"""


def test_build_takes_a_module_a_path_or_source_text_alike(tmp_path):
    path = tmp_path / "bigram.linnet"
    path.write_text(SOURCE)
    from_module = build(check_file(path), "torch")
    # one generated source, so one imported module (it is named after the source's hash)
    assert build(path, "torch") is from_module
    assert build(str(path), "torch") is from_module
    # source text has no path (its locations name none), so its generated source may differ: it runs alike
    embed = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    tokens = torch.tensor([3, 0, 15], dtype=torch.int32)
    for module in (build(path, "torch", {"Batch": 3}), build(SOURCE, "torch", {"Batch": 3})):
        got = module.Model({"embed": torch.from_numpy(embed)}).decode(tokens, torch.zeros(3, dtype=torch.int32))
        np.testing.assert_array_equal(got.numpy(), embed[[3, 0, 15]])


def test_generate_refuses_an_unknown_backend(tmp_path):
    path = tmp_path / "bigram.linnet"
    path.write_text(SOURCE)
    with pytest.raises(ValueError, match="unknown backend 'tensorflow'; one of torch, jax"):
        generate(check_file(path), "tensorflow")
