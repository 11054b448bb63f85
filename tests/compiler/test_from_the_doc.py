"""Two architectures a newcomer wrote from docs/language.md alone (tests/compiler/from_the_doc),
each held to transformers' own model on both backends: GPT-2 (LayerNorm and GELU-tanh written
from ops, learned positions, Conv1D weights read with `.transpose()`, a tied head) and GPT-NeoX
(parallel residual, q/k/v fused per head, rotary over part of each head)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from linnet.nest import load

HERE = Path(__file__).parent / "from_the_doc"


def _gpt2(transformers):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
        eos_token_id=0))


def _pythia(transformers):
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        rotary_pct=0.25, max_position_embeddings=64, use_parallel_residual=True, hidden_act="gelu",
        tie_word_embeddings=False, layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=0))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{arch: (card path, checkpoint dir, the reference's logits for TOKENS)}."""
    transformers = pytest.importorskip("transformers")
    out = {}
    for arch, make in (("gpt2", _gpt2), ("pythia", _pythia)):
        d = tmp_path_factory.mktemp(arch)
        (d / f"{arch}.linnet").write_text((HERE / f"{arch}.linnet").read_text())
        (d / "card.linnet").write_text(f'card "tiny-{arch}"\nimport {arch}\n')
        torch.manual_seed(0)
        model = make(transformers).eval()
        with torch.no_grad():
            for p in model.parameters():  # (biases and norms start at 0 and 1: make them count)
                p.add_(torch.randn_like(p) * 0.05)
            want = model(torch.tensor(TOKENS[None].astype(np.int64))).logits[0].numpy()
        model.save_pretrained(d / "ckpt")
        out[arch] = (d / "card.linnet", d / "ckpt", want)
    return out


TOKENS = np.array([5, 17, 3, 88, 40, 2, 9, 11], np.int32)


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("arch", ["gpt2", "pythia"])
def test_a_newcomers_architecture_computes_as_transformers(checkpoints, arch, backend):
    card, ckpt, want = checkpoints[arch]
    model = load(card, backend=backend, weights=ckpt, tokenizer=False, generics={"Batch": 2, "MaxSeq": 16},
                 progress=False)
    n = len(TOKENS) - 1
    got = np.asarray(model.prefill(TOKENS[:n], np.arange(n, dtype=np.int32), np.zeros(n, np.int32),
                                   np.arange(n, dtype=np.int32)))
    np.testing.assert_allclose(got, want[:n], rtol=0, atol=2e-5)
    # the last token decodes in row 0 over the prompt's cache, beside an empty row 1
    step = np.asarray(model.decode(np.array([TOKENS[n], 1], np.int32), np.array([n, 0], np.int32)))
    np.testing.assert_allclose(step[0], want[n], rtol=0, atol=2e-5)
