"""Both backends against transformers on the tiny cards: `LlamaForCausalLM`, `MistralForCausalLM`,
`MixtralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM`, `GptOssForCausalLM`,
`Olmo2ForCausalLM`, `GraniteForCausalLM`, `Phi3ForCausalLM`, `SmolLM3ForCausalLM`, `DeepseekV2ForCausalLM`,
`DeepseekV3ForCausalLM`, `PhiForCausalLM`,
`GPT2LMHeadModel`.

The reference has the card's config (llama3 RoPE scaling and GQA in
`tiny-llama`, tied embeddings in `tiny-llama-tied`, a sliding window in `tiny-mistral`, routed experts in `tiny-mixtral`;
q/k/v biases, YaRN and a tied head in `tiny-qwen2`; per-head q/k norms and a wide head in
`tiny-qwen3`, and routed experts in `tiny-qwen3-moe`; in `tiny-gpt-oss` biases, sinks,
sliding-window layers, YaRN and routed experts; in `tiny-olmo2` norms after each half of a layer
and q/k norms over whole projections of two widths; in `tiny-granite` µP's four multipliers, a tied
head; in `tiny-phi3` fused q/k/v and gate/up projections and a sliding window; in `tiny-smollm3` a NoPE
layer, its queries and keys not rotated; in `tiny-deepseek-v2` multi-head latent attention over a cache of
latents, YaRN with mscale, a dense first layer and routed experts beside shared ones; in `tiny-deepseek-v3` a
query latent and routing among the best groups of experts by sigmoid scores plus a correction bias; in `tiny-phi2`
LayerNorms with biases feeding attention and the MLP side by side, rotary over 6 of each head's 16 dims, biases
on every linear, gelu_new; in `tiny-gpt2` learned positions, Conv1D weights stored [in, out], LayerNorms, a
tied head) and random weights. The checkpoint
`save_pretrained` writes of it is bound through the names the `.linnet` source
declares. Four prompts of different lengths are prefilled in one pack, then
16 greedy steps are decoded; each step is compared with the reference run
over the whole sequence so far. `tiny-smollm3`, `tiny-gemma3` and `tiny-gemma2` are also run with
their layers' kinds given as list configs in an order no interval gives (`LIST_CARDS`), in f32.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import torch

from linnet.compiler import BACKENDS, check_file, generate
from linnet.ir.specialize import specialize
from linnet.nest.bind import bind_weights

GENERICS = {"Batch": 4, "MaxSeq": 32}
PROMPT_LENGTHS = (7, 13, 4, 10)
STEPS = 16
# A router's choice is bf16's to break where its lead is under this many times what bf16 moved
# transformers' own scores (`_decided_by_more_than_bf16`)
BF16_MARGIN = 2.0
# mode -> (numerics, T, bound on max|a-b| / max|ref|, greedy tokens must match)
MODES = {
    "exact": ("exact", "f32", 1e-4, True),
    "fast-f32": ("fast", "f32", 1e-4, True),
    "fast-bf16": ("fast", "bf16", 2e-2, False),
}


COMPARED = ["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe",
            "tiny-gpt-oss", "tiny-olmo2", "tiny-granite", "tiny-phi3", "tiny-smollm3", "tiny-deepseek-v2",
            "tiny-deepseek-v3", "tiny-phi2", "tiny-gpt2"]


@pytest.fixture(scope="module", params=COMPARED)
def card(request, kit, tmp_path_factory):
    """The card's module, a seeded reference with its config, prompts, and the reference's greedy run."""
    name = request.param
    return _parity_case(name, check_file(kit.CARDS / f"{name}.linnet"), kit, tmp_path_factory.mktemp(name))


def _parity_case(name: str, module, kit, directory) -> dict:
    """A card's module with what the comparison needs: a seeded reference with its config (its
    checkpoint saved in `directory`), prompts, and the reference's greedy run."""
    spec = specialize(module, GENERICS, "exact")
    reference = kit.hf_reference(spec, seed=1234, max_seq=GENERICS["MaxSeq"])
    assert reference.config._attn_implementation == "eager"
    vocab = spec.bindings["vocab"]
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, vocab, n).astype(np.int32) for n in PROMPT_LENGTHS]
    assert max(PROMPT_LENGTHS) + STEPS <= GENERICS["MaxSeq"]
    logits, tokens = kit.hf_greedy(reference, prompts, STEPS)
    state = kit.saved_state(reference, directory)
    return dict(name=name, module=module, spec=spec, state=state, prompts=prompts,
                ref_logits=logits, ref_tokens=tokens, decided=_decided_by_more_than_bf16(reference, prompts, tokens))


def _decided_by_more_than_bf16(reference, prompts, tokens) -> np.ndarray:
    """[STEPS + 1, rows] bools: whether every expert choice the reference made for the row up to
    that step (each layer, each position so far: the cache carries them all) won by more than
    bf16 moves the scores. How far that is, position by position, transformers' own model says:
    the same run in bf16 moves each router score by some amount, and a lead smaller than twice
    that is bf16's to break: another bf16 computation (ours, its sums in another order) moves the
    scores by as much again, not the same way. (Once, tiny-gpt-oss broke a lead of 1.86 times
    transformers' movement, with its experts in Linnet's panels, and one of 0.55 with torch's
    grouped matmul: the logits strayed at that step by 0.05, five times rounding's 0.01.) Past
    such a choice bf16 may send a token to other experts, in any model, and the logits then
    stray by far more than rounding: those rows are left out of the bf16 comparison from that
    step on. A dense model decides everything."""
    decided = np.ones((STEPS + 1, len(prompts)), dtype=bool)
    if not _routers(reference):
        return decided
    half = copy.deepcopy(reference).to(torch.bfloat16)
    if reference.config.model_type.startswith("deepseek"):  # its router stays f32, as from_pretrained keeps it
        kept = reference._keep_in_fp32_modules_strict
        theirs = dict(reference.named_parameters()) | dict(reference.named_buffers())
        for name, ours in [*half.named_parameters(), *half.named_buffers()]:
            if any(k in name for k in kept):
                ours.data = theirs[name].detach().clone()
    k = reference.config.num_experts_per_tok
    for row, prompt in enumerate(prompts):
        run = torch.tensor([list(map(int, prompt)) + [int(t[row]) for t in tokens[:STEPS]]])
        exact, rounded = _router_scores(reference, run), _router_scores(half, run)  # [layers, positions, experts]
        if reference.config.model_type == "deepseek_v3":  # chosen by corrected sigmoid scores, in groups
            exact, rounded = _corrected(reference, exact), _corrected(reference, rounded)
        lead = _lead(reference.config, exact, k)
        moved = (rounded - exact).abs().amax(dim=-1)
        close = (lead <= BF16_MARGIN * moved).any(dim=0)  # [positions]: some layer's choice was bf16's
        for step in range(STEPS + 1):
            decided[step, row] = not close[:len(prompt) + step].any()
    return decided


def _corrected(model, logits: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's choice scores: each layer's sigmoid of the router logits plus its correction bias."""
    bias = torch.stack([m.e_score_correction_bias.float() for m in _routers(model)])
    return logits.sigmoid() + bias[:, None, :]


def _lead(config, scores: torch.Tensor, k: int) -> torch.Tensor:
    """[layers, positions]: by how much the k-th choice beat the next. DeepSeek-V3 chooses its groups
    first, by the sum of each group's best two scores (which moves by up to twice what a score moves,
    so that lead counts half), then its experts among theirs."""
    if config.model_type != "deepseek_v3":
        top = scores.sort(dim=-1, descending=True).values
        return top[..., k - 1] - top[..., k]
    grouped = scores.unflatten(-1, (config.n_group, -1))
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    ranked = group_scores.sort(dim=-1, descending=True)
    kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter(-1, ranked.indices[..., :config.topk_group], True)
    choice = grouped.masked_fill(~kept[..., None], float("-inf")).flatten(-2)
    top = choice.sort(dim=-1, descending=True).values
    group_lead = ranked.values[..., config.topk_group - 1] - ranked.values[..., config.topk_group]
    return torch.minimum(top[..., k - 1] - top[..., k], group_lead / 2)


def _routers(model) -> list:
    return [m for name, m in model.named_modules() if name.endswith(("mlp.gate", "mlp.router"))]


def _router_scores(model, run: torch.Tensor) -> torch.Tensor:
    """[layers, positions, experts]: each layer's router scores at each position of `run`, in f32."""
    scores = []
    hooks = [m.register_forward_hook(lambda _m, _in, out: scores.append(out[0].float())) for m in _routers(model)]
    with torch.no_grad():  # causal: one pass over the whole run gives every position's scores
        model(run)
    for h in hooks:
        h.remove()
    return torch.stack(scores)


def test_cards_are_what_the_tests_claim(card):
    b = card["spec"].bindings
    # near ties in routing leave rows out of the bf16 comparison (tiny random routers have many;
    # each row's every choice so far must be clear), never all but a few: at least 10 of the 68
    assert card["decided"].sum() >= 10, card["decided"]
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
    elif card["name"] == "tiny-mixtral":
        assert 1 < b["experts_per_token"] < b["experts"] and b["kv_heads"] < b["heads"]
        assert "model.layers.1.block_sparse_moe.experts.7.w2.weight" in card["state"]  # one tensor per expert
    elif card["name"] == "tiny-qwen3-moe":
        assert 1 < b["experts_per_token"] < b["experts"] and b["norm_topk_prob"] and "q_norm" in card["spec"].params
        assert "model.layers.1.mlp.experts.7.down_proj.weight" in card["state"]  # one tensor per expert
    elif card["name"] == "tiny-olmo2":  # the k norm is narrower than the q norm: GQA
        assert b["kv_heads"] < b["heads"] and "model.layers.1.post_feedforward_layernorm.weight" in card["state"]
        assert card["state"]["model.layers.0.self_attn.k_norm.weight"].shape == (b["kv_heads"] * b["head_dim"],)
    elif card["name"] == "tiny-granite":  # every multiplier away from 1, the scale not 1 / sqrt(head_dim)
        assert all(b[k] != 1.0 for k in ("embedding_multiplier", "residual_multiplier", "logits_scaling"))
        assert b["attention_multiplier"] != b["head_dim"] ** -0.5 and b["tie_embeddings"]
    elif card["name"] == "tiny-smollm3":  # the last of its layers NoPE, as transformers' config says too
        assert b["layers"] == b["no_rope_interval"] == 4 and b["kv_heads"] < b["heads"] and b["tie_embeddings"]
    elif card["name"] == "tiny-phi2":  # rotary over part of each head; a LayerNorm's bias, the head's bias
        assert 0 < b["rotary_dim"] < b["head_dim"] / 2 and b["kv_heads"] < b["heads"]
        assert {"model.layers.0.input_layernorm.bias", "lm_head.bias"} <= set(card["state"])
    elif card["name"] == "tiny-gpt2":  # Conv1D: stored [in, out]; positions of its own; the head tied
        assert card["state"]["transformer.h.0.mlp.c_fc.weight"].shape == (b["dim"], b["ffn"]) and b["tie_embeddings"]
        assert "transformer.wpe.weight" in card["state"] and GENERICS["MaxSeq"] <= b["max_pos"]
    elif card["name"] == "tiny-phi3":  # one stored tensor for q, k and v, one for gate and up
        assert 0 < b["sliding_window"] < max(PROMPT_LENGTHS) and b["kv_heads"] < b["heads"]
        assert card["state"]["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * b["ffn"], b["dim"])
    elif card["name"] == "tiny-deepseek-v2":  # a latent cache, YaRN's mscale, a dense layer before the experts
        assert b["rope_scaling"] == "yarn" and b["rope_mscale"] == b["rope_mscale_all_dim"] > 0
        assert b["rope_original_max"] < max(PROMPT_LENGTHS) + STEPS and 0 < b["first_dense"] < b["layers"]
        assert 1 < b["experts_per_token"] < b["experts"] and b["qk_nope_head_dim"] != b["v_head_dim"]
        assert "model.layers.0.mlp.gate_proj.weight" in card["state"]  # the dense layer's own MLP
        last = f"model.layers.{b['layers'] - 1}.mlp.experts.{b['experts'] - 1}.down_proj.weight"
        assert last in card["state"]  # one tensor per expert
    elif card["name"] == "tiny-deepseek-v3":  # a query latent; experts from the best groups, bias-corrected
        assert 0 < b["q_lora_rank"] and 1 < b["topk_groups"] < b["expert_groups"] and b["norm_topk_prob"]
        assert b["experts_per_token"] <= b["topk_groups"] * b["group_size"] and b["routed_scaling"] != 1.0
        bias = card["state"]["model.layers.1.mlp.gate.e_score_correction_bias"]
        assert bias.abs().min() > 0 and "model.layers.0.self_attn.q_a_layernorm.weight" in card["state"]
    else:
        assert b["tie_embeddings"] and b["rope_scaling"] == "none"


# JAX's bf16 is checked looping over stacked weights (below), as it runs on a GPU; its plain arrays' bf16 is
# the f32 code in another type (tests/compiler/test_jax_runtime.py checks its panels change no value)
@pytest.mark.parametrize("backend, mode", [(backend, mode) for backend in BACKENDS for mode in MODES
                                           if (backend, mode) != ("jax", "fast-bf16")])
def test_matches_transformers(card, backend, mode, kit):
    _compare_with_transformers(card, backend, mode, kit)


# Every card in fast bf16, as a GPU runs it (its fused groups stacked too); exact numerics' separate stacked
# weights for a card of each kind of layer: dense, experts (gpt-oss's with biases and sinks, Qwen3's), MLA,
# a stored fused projection, Conv1D's learned positions
LOOPING_EXACT = ("tiny-llama", "tiny-gpt-oss", "tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-phi3", "tiny-gpt2")


@pytest.mark.parametrize("mode", ["exact", "fast-bf16"])
def test_jax_looping_over_stacked_weights_matches_transformers(card, mode, kit, monkeypatch):
    """JAX as on one GPU (`rt.loops_over_stacks`), here on the CPU: each stacked weight one array
    (a fused group's too, joined by rows), layer loops compiled as XLA loops reading a layer at a
    traced index (or, where a card's loop stays Python's, at a static one)."""
    if mode == "exact" and card["name"] not in LOOPING_EXACT:
        pytest.skip(f"exact numerics' stacked weights are checked on {', '.join(LOOPING_EXACT)}")
    from linnet.codegen_jax import runtime as rt
    from linnet.kernels import xla_kernels

    monkeypatch.setattr(rt, "loops_over_stacks", lambda platform, mesh: mesh is None)
    monkeypatch.setattr(xla_kernels, "registered", lambda: False)  # no panels: plain arrays, as on a GPU
    model = _compare_with_transformers(card, "jax", mode, kit, label="jax-stacked")
    stacked = [name for name, is_stacked in model.linear_weights.items() if is_stacked]
    assert stacked and not any(isinstance(a, list) for a in model.weights.values())
    assert model.compiles_loops
    if mode == "fast-bf16" and model.linear_groups:
        key = "+".join(model.linear_groups[0])
        assert model.weights[key].ndim == 3 and key.split("+")[0] in stacked


def _compare_with_transformers(card, backend, mode, kit, label=None):
    """Runs the card's prompts and greedy steps through our model and checks each step's logits
    against the reference's; returns the model."""
    numerics, dtype, bound, same_tokens = MODES[mode]
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

    # under bf16, the rows whose experts were a near tie for the reference are left out (see above)
    compared = card["decided"] if dtype == "bf16" else np.ones_like(card["decided"])
    errors = [_error(kit.to_np(ours), kit.to_np(ref), rows)
              for ours, ref, rows in zip(logits, card["ref_logits"], compared)]
    ours_tokens = [kit.to_np(x).argmax(-1) for x in logits]
    agree = np.mean([np.array_equal(a, b) for a, b in zip(ours_tokens, card["ref_tokens"])])
    key = f"{card['name']:<15} {label or backend:<5} {mode:<9}"
    kit.PARITY[key + " prefill"] = errors[0]
    kit.PARITY[key + " decode (worst of 16)"] = max(errors[1:])
    if not same_tokens:
        kit.PARITY[key + " greedy steps agreeing (fraction)"] = float(agree)
    if not compared.all():
        kit.PARITY[key + " rows compared, past near-tie routing (fraction)"] = float(compared.mean())

    assert errors[0] <= bound, f"prefill logits off by {errors[0]:.2e} (bound {bound:.0e})"
    worst = int(np.argmax(errors[1:])) + 1
    assert max(errors[1:]) <= bound, f"decode step {worst} off by {errors[worst]:.2e} (bound {bound:.0e})"
    if same_tokens:
        for step, (a, b) in enumerate(zip(ours_tokens, card["ref_tokens"])):
            assert np.array_equal(a, b), f"greedy tokens differ at step {step}: {a} vs {b}"
    return model


def _error(ours: np.ndarray, ref: np.ndarray, rows: np.ndarray) -> float:
    """max|ours - ref| over the compared rows, over max|ref| of the whole step (kit.rel_err's metric)."""
    return float(np.abs(ours[rows] - ref[rows]).max() / np.abs(ref).max()) if rows.any() else 0.0


# Tiny cards whose layers' kinds follow no interval, each given as a list config: SmolLM3's first and
# last layers NoPE (`no_rope_layers`, 1 in transformers' where a layer rotates), Gemma 3's first and
# last layers attending to whole rows and Gemma 2's first only (`full_layers`, transformers'
# `layer_types`), the others sliding a window shorter than most prompts. Gemma 2's logits are capped
# at 30 here, not 3: a cap of 3 saturates random logits into near ties, where f32's rounding picks.
LIST_CARDS = {"tiny-smollm3": ("no_rope_layers", [False, True, True, False], {}),
              "tiny-gemma3": ("full_layers", [True, False, True], {}),
              "tiny-gemma2": ("full_layers", [True, False, False],
                              {"layers = 2": "layers = 3", "final_softcap = 3.0": "final_softcap = 30.0"})}


def _follows_an_interval(flags: list, hit: bool) -> bool:
    """Whether `flags` is `hit` exactly at every k-th layer, for some k: the pattern a scalar config said."""
    return any(flags == [((i + 1) % k == 0) == hit for i in range(len(flags))] for k in range(1, len(flags) + 2))


@pytest.fixture(scope="module", params=list(LIST_CARDS))
def list_card(request, kit, tmp_path_factory):
    name = request.param
    key, flags, changes = LIST_CARDS[name]
    text = (kit.CARDS / f"{name}.linnet").read_text()
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    written = "[" + ", ".join("true" if f else "false" for f in flags) + "]"
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.linnet").write_text(text.replace("\n}\n\nmeta", f"\n  {key} = {written}\n}}\n\nmeta", 1))
    return _parity_case(name, check_file(folder / f"{name}.linnet"), kit, folder / "checkpoint")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_list_config_matches_transformers(list_card, backend, kit):
    """Each layer's kind read from a list config, in f32, against transformers given the same list:
    its `no_rope_layers` or `layer_types` as the card's list says, which no interval or pattern would."""
    key, flags, _ = LIST_CARDS[list_card["name"]]
    b = list_card["spec"].bindings
    assert b[key] == flags and len(flags) == b["layers"]
    assert not _follows_an_interval(flags, key == "full_layers")
    if key == "full_layers":
        assert 0 < b["sliding_window"] < max(PROMPT_LENGTHS)
    _compare_with_transformers(list_card, backend, "exact", kit)


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_phi3s_window_is_transformers_in_eager_and_sdpa_attention(backend, kit, tmp_path):
    """Phi-3's sliding window as transformers computes it with either attention (`eager`, `sdpa`):
    token i sees positions i - window + 1 .. i. One 25-token prompt, four times tiny-phi3's window of 6,
    every position's logits; and the window is what makes the difference: transformers over whole
    rows (llama.cpp's phi3, which turns the window off) is far from them past the window."""
    module = check_file(kit.CARDS / "tiny-phi3.linnet")
    spec = specialize(module, GENERICS, "exact")
    window = spec.bindings["sliding_window"]
    reference = kit.hf_reference(spec, seed=1234, max_seq=GENERICS["MaxSeq"])
    prompt = np.random.default_rng(5).integers(0, spec.bindings["vocab"], 25).astype(np.int32)
    assert window * 4 <= len(prompt) <= GENERICS["MaxSeq"]
    model = kit.compiled(module, backend, GENERICS).Model(
        bind_weights(spec, kit.saved_state(reference, tmp_path).__getitem__))
    n = len(prompt)
    ours = kit.to_np(model.prefill(*kit.as_inputs(backend, prompt, np.arange(n), np.zeros(n), np.arange(n))))
    err = lambda a, ref: np.abs(a - ref).max(axis=1) / np.abs(ref).max(axis=1)  # per position
    ids = torch.tensor([prompt.tolist()])
    with torch.no_grad():
        for attention in ("eager", "sdpa"):
            reference.set_attn_implementation(attention)
            assert reference.config._attn_implementation == attention
            assert err(ours, reference(ids).logits[0].numpy()).max() <= 1e-4, attention
        windowed = reference(ids).logits[0].numpy()
        reference.config.sliding_window = None
        for layer in reference.model.layers:
            layer.self_attn.sliding_window = None
        whole = reference(ids).logits[0].numpy()
    assert err(whole, windowed)[:window].max() <= 1e-5 and err(whole, windowed)[window:].min() > 1e-2



LONG_PROMPT, LONG_STEPS, LONG_GENERICS = 1100, 2, {"Batch": 1, "MaxSeq": 1152, "T": "f32"}


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-gpt-oss"])
def long_run(request, kit, tmp_path_factory):
    """A card, its reference's checkpoint, a LONG_PROMPT-token prompt and the reference's greedy run."""
    module = check_file(kit.CARDS / f"{request.param}.linnet")
    spec = specialize(module, LONG_GENERICS, "fast")
    assert spec.bindings["rope_original_max"] < LONG_PROMPT
    reference = kit.hf_reference(spec, seed=1234, max_seq=LONG_GENERICS["MaxSeq"])
    prompt = np.random.default_rng(7).integers(0, spec.bindings["vocab"], LONG_PROMPT).astype(np.int32)
    logits, tokens = kit.hf_greedy(reference, [prompt], LONG_STEPS)
    state = kit.saved_state(reference, tmp_path_factory.mktemp(request.param))
    return dict(name=request.param, module=module, spec=spec, state=state, prompt=prompt, logits=logits,
                tokens=tokens)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_prompt_matches_transformers(long_run, backend, kit):
    """A 1100-token prompt and 2 greedy steps, numerics fast in f32: YaRN's frequencies far past its
    original context (tiny-qwen2's, gpt-oss's), gpt-oss's windows and sinks over a long row, and the
    CPU attention kernel's spans of 512 positions and more, computed in parts and merged. The other
    parity tests stop at 32 positions."""
    run = long_run
    model = kit.compiled(run["module"], backend, LONG_GENERICS, "fast").Model(
        bind_weights(run["spec"], run["state"].__getitem__))
    logits = [model.prefill(*kit.as_inputs(backend, *kit.pack([run["prompt"]])))]
    for step in range(1, LONG_STEPS + 1):
        position = np.array([LONG_PROMPT + step - 1])
        logits.append(model.decode(*kit.as_inputs(backend, run["tokens"][step - 1], position)))
    errors = [kit.rel_err(ours, ref) for ours, ref in zip(logits, run["logits"])]
    kit.PARITY[f"{run['name']:<15} {backend:<5} fast-f32  {LONG_PROMPT}-token prompt, worst step"] = max(errors)
    assert max(errors) <= MODES["fast-f32"][2], errors
    assert [int(kit.to_np(x).argmax(-1)[0]) for x in logits] == [int(t[0]) for t in run["tokens"]]
