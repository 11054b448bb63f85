"""Properties over random Llama cards: the checker, both code generators, and the shapes agree.

Each example is a card written as source text (random heads, kv_heads that
divide them, even head_dim, 1-2 layers, vocab, ffn, rope scaling, tying) with
random generics and the weights of a seeded transformers Llama of its config. The checker must
accept it, each prompt's logits must be transformers' for it alone, the torch
and JAX code must compute the same logits on a random pack (as it comes or
laid out in JAX's blocks) and a decode step, and every output's shape must be the one the entry's declared return
type gives under the specialized bindings.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.errors import LinnetError
from linnet.frontend import load_source
from linnet.ir.specialize import specialize
from linnet.ir.verify import verify
from linnet.kernels import xla_kernels
from linnet.nest.bind import bind_weights

FAST = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def llama_cards(draw):
    kv_heads = draw(st.integers(1, 3))
    heads = kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([2, 4, 6, 8, 10]))
    config = {"vocab": draw(st.integers(8, 64)), "layers": draw(st.integers(1, 2)), "heads": heads,
              "kv_heads": kv_heads, "ffn": draw(st.integers(4, 48)),
              "norm_eps": draw(st.sampled_from([1e-5, 1e-6])),
              "rope_theta": draw(st.sampled_from([10000.0, 500000.0]))}
    if draw(st.booleans()):  # head_dim from its default, dim / heads
        config["dim"] = heads * head_dim
    else:
        config["dim"] = draw(st.integers(4, 40))
        config["head_dim"] = head_dim
    scaling = draw(st.sampled_from(["none", "llama3", "yarn"]))
    if scaling != "none":
        config.update(rope_scaling=f'"{scaling}"', rope_factor=draw(st.sampled_from([2.0, 8.0])),
                      rope_original_max=draw(st.sampled_from([4, 16])))
    config["tie_embeddings"] = draw(st.sampled_from(["true", "false"]))
    generics = {"Batch": draw(st.integers(1, 4)), "MaxSeq": draw(st.integers(4, 16))}
    seed = draw(st.integers(0, 2**16))
    return config, generics, seed


def card_source(config: dict) -> str:
    body = "\n".join(f"  {k} = {v}" for k, v in config.items())
    return f'card "random"\nimport llama\n\nconfig {{\n{body}\n}}\n'


def declared_shape(fn, spec, per_call: dict) -> tuple:
    """The shape the checker gives an entry's result: its declared return dims, evaluated."""
    sizes = {k: v for k, v in spec.bindings.items() if isinstance(v, int) and not isinstance(v, bool)}
    return tuple(d.evaluate({**sizes, **per_call}) for d in fn.ret.shape)


# exact: plain ops on both sides; fast: the CPU kernels on both, and JAX's layer loop compiled as an
# XLA loop (rt.loop) where the kernels hold the weights
@pytest.mark.parametrize("numerics", ["exact", "fast"])
@FAST
@given(card=llama_cards(), data=st.data())
def test_random_cards_check_and_both_backends_agree(numerics, card, data, kit):
    config, generics, seed = card
    module = load_source(card_source(config), "random.linnet", near=kit.CARDS)
    verify(module)
    spec = specialize(module, generics, numerics)
    b = spec.bindings
    assert b["head_dim"] == config.get("head_dim", config["dim"] // config["heads"])

    # the weights of a seeded transformers Llama of the same config, the independent reference, where
    # transformers takes the config (it refuses a width no multiple of the heads, head_dim given or not)
    reference = kit.hf_reference(spec, seed, max_seq=generics["MaxSeq"]) if b["dim"] % b["heads"] == 0 else None
    state = kit.random_checkpoint(spec, seed) if reference is None else \
        {name: t.detach() for name, t in reference.state_dict().items()}
    weights = bind_weights(spec, state.__getitem__)
    models = {backend: kit.compiled(module, backend, generics, numerics).Model(weights) for backend in ("torch", "jax")}
    assert models["jax"].compiles_loops == (numerics == "fast" and xla_kernels.available(np.float32, "cpu"))

    # a random pack: some rows (in any order) get prompts of any length that leaves room to decode
    batch, max_seq, vocab = generics["Batch"], generics["MaxSeq"], b["vocab"]
    rows = data.draw(st.permutations(range(batch)).flatmap(lambda p: st.integers(1, batch).map(lambda k: p[:k])))
    lengths = data.draw(st.lists(st.integers(1, max_seq - 2), min_size=len(rows), max_size=len(rows)))
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab, n) for n in lengths]
    if data.draw(st.booleans()):  # as it comes, or in JAX's blocks with padding at the scratch position
        packed = kit.pack(prompts, rows)
    else:
        packed = kit.pack_in_blocks(prompts, rows, batch=batch, max_seq=max_seq)
    # every row decodes next: active rows after their prompt, the others at any position
    tokens = rng.integers(0, vocab, batch).astype(np.int32)
    positions = rng.integers(0, max_seq, batch).astype(np.int32)
    positions[list(rows)] = lengths

    out = {}
    for backend, model in models.items():
        prefill = kit.to_np(model.prefill(*kit.as_inputs(backend, *packed)))
        decode = kit.to_np(model.decode(*kit.as_inputs(backend, tokens, positions)))
        assert prefill.shape == declared_shape(module.entries["prefill"], spec,
                                               {"N": len(packed[0]), "K": len(rows)}) == (len(rows), vocab)
        assert decode.shape == declared_shape(module.entries["decode"], spec, {}) == (batch, vocab)
        assert np.isfinite(prefill).all() and np.isfinite(decode).all()
        out[backend] = prefill, decode
    with torch.no_grad():  # each prompt alone through transformers: its last position's logits
        want = None if reference is None else \
            np.stack([reference(torch.tensor([p.tolist()])).logits[0, -1].numpy() for p in prompts])
    for backend in models if want is not None else ():
        err = kit.rel_err(out[backend][0], want)
        key = f"random cards  {backend} vs transformers  {numerics}  prefill (worst)"
        kit.PARITY[key] = max(err, kit.PARITY.get(key, 0.0))
        assert err <= 1e-4, f"{backend} and transformers differ by {err:.2e}\n{card_source(config)}{generics}"
    for what, a, j in zip(("prefill", "decode"), out["torch"], out["jax"]):
        err = kit.rel_err(j, a)
        key = f"random cards  torch vs jax  {numerics}  {what} (worst)"
        kit.PARITY[key] = max(err, kit.PARITY.get(key, 0.0))
        assert err <= 1e-4, f"{what}: torch and JAX differ by {err:.2e}\n{card_source(config)}{generics}"


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(kv_heads=st.integers(2, 5), heads=st.integers(1, 12))
def test_heads_must_be_a_multiple_of_kv_heads(kv_heads, heads, kit):
    """The checker's other half: a card it must refuse is refused, with a message, not a traceback."""
    config = {"vocab": 16, "dim": 8 * heads, "layers": 1, "heads": heads, "kv_heads": kv_heads, "ffn": 8}
    module = load_source(card_source(config), "random.linnet", near=kit.CARDS)
    if heads % kv_heads == 0:
        specialize(module, {"Batch": 1, "MaxSeq": 4})
        return
    with pytest.raises(LinnetError) as err:
        specialize(module, {"Batch": 1, "MaxSeq": 4})
    assert "key/value heads" in str(err.value) and "llama.linnet" in str(err.value)
