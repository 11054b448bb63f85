"""Architectures a newcomer wrote from docs/language.md alone (tests/compiler/from_the_doc), on
both backends: GPT-2 (LayerNorm through `layer_norm`, GELU-tanh written from ops, learned positions, Conv1D weights
read with `.transpose()`, a tied head) and GPT-NeoX (parallel residual, q/k/v fused per head,
rotary over part of each head) held to transformers' own models; ALiBi attention, written from
ops since `attention` takes no position bias, held to plain numpy."""

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


def _alibi_reference(weights: dict, tokens: np.ndarray) -> list:
    """Plain numpy: each step's attention output for 2 rows decoding tokens[t] at position t."""
    heads, head_dim = 4, 8
    slopes = 2.0 ** (-8.0 * (np.arange(heads) + 1) / heads)
    keys, values, out = [], [], []
    for t, step in enumerate(tokens):
        qkv = weights["embed"][step] @ weights["wqkv"].T
        q, k, v = (qkv[:, i * 32:(i + 1) * 32].reshape(2, heads, head_dim) for i in range(3))
        keys.append(k)
        values.append(v)
        scores = np.einsum("nhd,nshd->nhs", q, np.stack(keys, 1)) / np.sqrt(head_dim)
        scores = scores + slopes[None, :, None] * (np.arange(t + 1) - t)[None, None, :]
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out.append(np.einsum("nhs,nshd->nhd", p, np.stack(values, 1)).reshape(2, 32))
    return out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_alibi_written_from_ops_is_numpys(backend):
    from linnet.compiler import build, check_file

    rng = np.random.default_rng(0)
    weights = {"embed": rng.standard_normal((64, 32)).astype(np.float32),
               "wqkv": (rng.standard_normal((96, 32)) * 0.3).astype(np.float32)}
    tokens = np.array([[3, 9], [5, 7], [11, 2]], np.int32)
    held = {k: torch.from_numpy(v) for k, v in weights.items()} if backend == "torch" else weights
    model = build(check_file(HERE / "alibi.linnet"), backend, {"Batch": 2, "MaxSeq": 8}).Model(held)
    for t, want in enumerate(_alibi_reference(weights, tokens)):
        out = model.decode(tokens[t], np.full(2, t, np.int32))
        np.testing.assert_allclose(np.asarray(out[0] if isinstance(out, tuple) else out), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("spelling", ["wpe[positions]", "take(wpe, positions)"])
@pytest.mark.parametrize("backend, options", [("torch", {}), ("torch", {"numerics": "fast", "compile": True}),
                                              ("jax", {})])
def test_learned_positions_serve_up_to_the_tables_size(checkpoints, backend, options, spelling, tmp_path):
    """GPT-2 through the engine with MaxSeq the size of its position table (64), as vLLM's
    max_model_len defaults to n_positions: a row that idles, or a pack's padding, sits at position
    MaxSeq, one past the table, whose row the runtime must read without raising (it had been an
    IndexError in torch); each request's greedy tokens, up to the last position, are
    transformers' own."""
    from transformers import GPT2LMHeadModel

    from linnet.serve import Engine, Request

    card, ckpt, _ = checkpoints["gpt2"]
    (tmp_path / "gpt2.linnet").write_text(card.with_name("gpt2.linnet").read_text().replace("wpe[positions]", spelling))
    card = tmp_path / "card.linnet"
    card.write_text('card "tiny-gpt2"\nimport gpt2\n')
    reference = GPT2LMHeadModel.from_pretrained(ckpt).eval()
    model = load(card, backend=backend, weights=ckpt, tokenizer=False, progress=False,
                 generics={"Batch": 2, "MaxSeq": 64, "T": "f32"}, **options)
    prompts = [TOKENS[:5].tolist(), TOKENS.tolist(), TOKENS[2:].tolist()]
    news = [64 - len(prompts[0]), 12, 64 - len(prompts[2])]  # two run to the table's last position
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=n, ignore_eos=True) for p, n in zip(prompts, news)])
    got_by_prompt = {tuple(c.request.prompt): c for c in done}
    for prompt, new in zip(prompts, news):
        got = got_by_prompt[tuple(prompt)]
        with torch.no_grad():
            want = reference.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                      pad_token_id=0)[0, len(prompt):].tolist()
        assert got.tokens == want
