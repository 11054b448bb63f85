"""The engine against transformers on tiny cards with a transformers twin (built as
tests/compiler/test_parity_hf.py builds them: the card's config, seeded random weights, the
checkpoint save_pretrained writes, loaded through nest.load): prompts past the sliding window,
chunked by a small token budget, equal and sharing prefixes (copied between rows, reused in
place), packed with decoding rows; each request's greedy tokens as transformers gives them for
its prompt alone, recomputed over the whole sequence at each step."""

import random

import pytest

from linnet import nest
from linnet.serve import Engine, Request

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from tests.compiler.conftest import CARDS, hf_reference, saved_state  # noqa: E402

GENERICS = {"Batch": 4, "MaxSeq": 64}
NEW = 6


@pytest.fixture(scope="module", params=["tiny-gpt-oss", "tiny-mixtral"])
def twin(request, tmp_path_factory):
    """(card, checkpoint directory, prompts, transformers' greedy tokens for each alone)."""
    from linnet.compiler import check_file
    from linnet.ir.specialize import specialize

    card = request.param
    spec = specialize(check_file(CARDS / f"{card}.linnet"), GENERICS, "exact")
    reference = hf_reference(spec, seed=1234, max_seq=GENERICS["MaxSeq"])
    directory = tmp_path_factory.mktemp(card)
    saved_state(reference, directory)
    vocab, rng = spec.bindings["vocab"], random.Random(3)
    base = [rng.randrange(vocab) for _ in range(40)]
    # equal prompts, a prefix and longer ones past it, one token, and one well past gpt-oss's
    # window of 6 and the budget's chunk
    prompts = [base[:n] + [rng.randrange(vocab) for _ in range(k)]
               for n, k in [(40, 0), (40, 0), (30, 5), (12, 9), (1, 0), (20, 20)]]
    return card, directory, prompts, [hf_greedy(reference, p, NEW) for p in prompts]


def hf_greedy(reference, prompt: list, steps: int) -> list:
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(reference(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_chunked_shared_and_windowed_prompts_equal_transformers(twin, backend):
    card, directory, prompts, expected = twin
    model = nest.load(card, backend=backend, weights=directory, tokenizer=False, generics={**GENERICS, "T": "f32"})
    engine = Engine(model, token_budget=24, prefix_min=8)
    done, stats = engine.run([Request(prompt=p, max_new_tokens=NEW) for p in prompts])
    assert [c.tokens for c in done] == expected
    assert stats.copied_tokens > 0 and stats.passes["mixed"] > 0  # prefixes shared; prompts beside decoding rows


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_model_loaded_without_its_tokenizer_stops_at_its_checkpoints_end_tokens(twin, backend, tmp_path):
    """tokenizer=False: the engine still ends a request at the end tokens generation_config.json names
    (as vLLM's skip_tokenizer_init and transformers' generate do), here two tokens transformers' greedy
    reply reaches; before, it had none and ran on to max_new_tokens."""
    import json
    import shutil

    card, directory, prompts, expected = twin
    ends = [expected[3][2], expected[5][4]]
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(directory, checkpoint)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    model = nest.load(card, backend=backend, weights=checkpoint, tokenizer=False, generics={**GENERICS, "T": "f32"})
    assert model.tokenizer is None and list(model.end_tokens) == ends
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=NEW) for p in prompts])
    for comp, want in zip(done, expected):
        cut = next((i + 1 for i, t in enumerate(want) if t in ends), len(want))
        assert comp.tokens == want[:cut]
        assert comp.finish_reason == ("stop" if cut < len(want) or want[-1] in ends else "length")
