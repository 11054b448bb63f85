"""Both backends against transformers on the tiny cards: `LlamaForCausalLM`, `MistralForCausalLM`,
`Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `GptOssForCausalLM`.

The reference has the card's config (llama3 RoPE scaling and GQA in
`tiny-llama`, tied embeddings in `tiny-llama-tied`, a sliding window in `tiny-mistral`;
q/k/v biases, YaRN and a tied head in `tiny-qwen2`; per-head q/k norms and a wide head in
`tiny-qwen3`; in `tiny-gpt-oss` biases, sinks, sliding-window layers, YaRN and routed
experts) and random weights; its
state dict is bound through the checkpoint names the `.linnet` source
declares. Four prompts of different lengths are prefilled in one pack, then
16 greedy steps are decoded; each step is compared with the reference run
over the whole sequence so far.
"""

from __future__ import annotations

import numpy as np
import pytest

import torch

from linnet.compiler import BACKENDS, check_file, generate
from linnet.ir.specialize import specialize
from linnet.nest.bind import bind_weights

GENERICS = {"Batch": 4, "MaxSeq": 32}
PROMPT_LENGTHS = (7, 13, 4, 10)
STEPS = 16
# mode -> (numerics, T, bound on max|a-b| / max|ref|, greedy tokens must match)
MODES = {
    "exact": ("exact", "f32", 1e-4, True),
    "fast-f32": ("fast", "f32", 1e-4, True),
    "fast-bf16": ("fast", "bf16", 2e-2, False),
}


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-qwen2", "tiny-qwen3",
                                        "tiny-gpt-oss"])
def card(request, kit):
    """The card's module, a seeded reference with its config, prompts, and the reference's greedy run."""
    name = request.param
    module = check_file(kit.CARDS / f"{name}.linnet")
    spec = specialize(module, GENERICS, "exact")
    reference = kit.hf_reference(spec, seed=1234, max_seq=GENERICS["MaxSeq"])
    assert reference.config._attn_implementation == "eager"
    vocab = spec.bindings["vocab"]
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, vocab, n).astype(np.int32) for n in PROMPT_LENGTHS]
    assert max(PROMPT_LENGTHS) + STEPS <= GENERICS["MaxSeq"]
    logits, tokens = kit.hf_greedy(reference, prompts, STEPS)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    return dict(name=name, module=module, spec=spec, state=state, prompts=prompts,
                ref_logits=logits, ref_tokens=tokens, bf16_yardstick=_bf16_yardstick(reference, prompts, tokens, logits, kit))


def _bf16_yardstick(reference, prompts, tokens, logits, kit) -> float:
    """The bound on bf16 logits for a model that routes tokens to experts: the worst error of the
    reference's own bf16 run against its f32 run, with a margin. A rounding that moves a router
    score past another expert's changes that token's experts, in either model, so bf16 MoE logits
    stray further than a dense model's; Linnet's must stray no further than transformers' own.
    For a dense model, the plain bound."""
    bound = MODES["fast-bf16"][2]
    if not any("experts" in n for n, _ in reference.named_parameters()):
        return bound
    half = reference.to(torch.bfloat16)
    seqs = [list(map(int, p)) for p in prompts]
    worst = 0.0
    with torch.no_grad():
        for step in range(STEPS + 1):
            out = torch.stack([half(torch.tensor([s])).logits[0, -1].float() for s in seqs])
            worst = max(worst, kit.rel_err(out, logits[step]))
            for s, t in zip(seqs, tokens[step]):
                s.append(int(t))
    kit.PARITY[f"{'transformers':<21} bf16 decode (worst, the yardstick)"] = worst
    return max(bound, 1.25 * worst)


def test_cards_are_what_the_tests_claim(card):
    b = card["spec"].bindings
    if card["name"] == "tiny-llama":
        assert b["rope_scaling"] == "llama3" and b["kv_heads"] < b["heads"] and not b["tie_embeddings"]
    elif card["name"] == "tiny-gpt-oss":
        # the sliding window is shorter than the prompts, and the router chooses among several experts
        assert b["sliding_window"] < max(PROMPT_LENGTHS) and 1 < b["experts_per_token"] < b["experts"]
        assert b["kv_heads"] < b["heads"] and b["layers"] >= 2
    elif card["name"] == "tiny-mistral":
        assert 0 < b["sliding_window"] < max(PROMPT_LENGTHS)
    elif card["name"] == "tiny-qwen2":
        assert b["rope_scaling"] == "yarn" and b["rope_original_max"] < max(PROMPT_LENGTHS) + STEPS
        assert b["tie_embeddings"] and "bq" in card["spec"].params
    elif card["name"] == "tiny-qwen3":
        assert b["head_dim"] * b["heads"] != b["dim"] and "q_norm" in card["spec"].params
    else:
        assert b["tie_embeddings"] and b["rope_scaling"] == "none"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(MODES))
def test_matches_transformers(card, backend, mode, kit):
    numerics, dtype, bound, same_tokens = MODES[mode]
    if mode == "fast-bf16":
        bound = card["bf16_yardstick"]
    generics = {**GENERICS, "T": dtype}
    spec = specialize(card["module"], generics, numerics)
    assert spec.bindings["T"] == dtype
    weights = bind_weights(spec, card["state"].__getitem__)
    model = kit.compiled(card["module"], backend, generics, numerics).Model(weights)

    lengths = np.array(PROMPT_LENGTHS)
    logits = [model.prefill(*kit.as_inputs(backend, *kit.pack(card["prompts"])))]
    for step in range(1, STEPS + 1):
        # the reference's greedy tokens; ours are checked to be the same below
        tokens, positions = card["ref_tokens"][step - 1], lengths + step - 1
        logits.append(model.decode(*kit.as_inputs(backend, tokens, positions)))

    errors = [kit.rel_err(ours, ref) for ours, ref in zip(logits, card["ref_logits"])]
    ours_tokens = [kit.to_np(x).argmax(-1) for x in logits]
    agree = np.mean([np.array_equal(a, b) for a, b in zip(ours_tokens, card["ref_tokens"])])
    key = f"{card['name']:<15} {backend:<5} {mode:<9}"
    kit.PARITY[key + " prefill"] = errors[0]
    kit.PARITY[key + " decode (worst of 16)"] = max(errors[1:])
    if not same_tokens:
        kit.PARITY[key + " greedy steps agreeing (fraction)"] = float(agree)

    assert errors[0] <= bound, f"prefill logits off by {errors[0]:.2e} (bound {bound:.0e})"
    worst = int(np.argmax(errors[1:])) + 1
    assert max(errors[1:]) <= bound, f"decode step {worst} off by {errors[worst]:.2e} (bound {bound:.0e})"
    if same_tokens:
        for step, (a, b) in enumerate(zip(ours_tokens, card["ref_tokens"])):
            assert np.array_equal(a, b), f"greedy tokens differ at step {step}: {a} vs {b}"


def test_exact_computes_in_f32_whatever_t(card):
    """numerics="exact" forces T to f32: in the bindings, in the weights bound, and in the code."""
    spec = specialize(card["module"], {**GENERICS, "T": "bf16"}, "exact")
    assert spec.bindings["T"] == "f32"
    weights = bind_weights(spec, card["state"].__getitem__)
    assert {str(t.dtype) for t in weights.values()} == {"torch.float32"}
    for backend in BACKENDS:
        source = generate(card["module"], backend, {**GENERICS, "T": "bf16"}, "exact")
        assert "T=f32; numerics: exact" in source
        assert "'bf16'" not in source and "bfloat16" not in source
