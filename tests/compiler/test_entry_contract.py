"""The entries keep the engine contract (DESIGN.md), on both backends.

Each entry is checked against another way of computing the same thing with
the same model: a packed prefill against each prompt prefilled alone, decode
against recomputing the whole sequence by prefill, copy_rows against
prefilling the copied prompt where it was copied to, and decode with idle
rows against decode with those rows active. Packs come as they are, in the
blocks JAX's attention reads cheaply, and padded without being in blocks
(JAX's on-device fallback); torch reads prompts and one-token segments
apart. Numbers are exact-mode f32, so the bound is tight.
"""

from __future__ import annotations

import numpy as np
import pytest

from linnet.compiler import BACKENDS, check_file

GENERICS = {"Batch": 4, "MaxSeq": 32}
PROMPT_LENGTHS = (6, 3, 9, 4)
PROMPT_ROWS = (2, 0, 3, 1)  # not in order: the pack names rows, it does not imply them
BOUND = 1e-5


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    return [rng.integers(0, 128, n).astype(np.int32) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=[(b, c) for c in ("tiny-llama", "tiny-gpt-oss") for b in BACKENDS],
                ids=lambda p: f"{p[1]}-{p[0]}")
def model(request, kit):
    """One model per backend and architecture (a dense Llama; gpt-oss, whose sliding window is
    shorter than the longest prompt and whose tokens each take their own experts); tests call
    reset_state() for fresh state (JAX keeps its compiled entries)."""
    from linnet.ir.specialize import specialize
    from linnet.nest.bind import bind_weights

    backend, card = request.param
    module = check_file(kit.CARDS / f"{card}.linnet")
    spec = specialize(module, GENERICS, "exact")
    weights = bind_weights(spec, kit.random_checkpoint(spec, seed=5).__getitem__)
    m = kit.compiled(module, backend, GENERICS).Model(weights)
    m.backend = backend
    return m


@pytest.fixture
def fresh(kit):
    """fresh(model): the model with its state reset, checked to be all zeros."""
    def reset(model):
        model.reset_state()
        for name in ("k_cache", "v_cache"):
            assert not np.any(kit.cache_of(model, name)), "reset_state() left the cache dirty"
        return model
    return reset


def close(kit, a, b, what):
    err = kit.rel_err(a, b)
    assert err <= BOUND, f"{what}: off by {err:.2e}"


def scratch_padded(packed, to: int):
    """A pack with padding tokens appended (row 0, the scratch position) up to `to` tokens."""
    tokens, positions, rows, last = packed
    pad = to - len(tokens)
    scratch = GENERICS["MaxSeq"] - 1
    return (np.r_[tokens, np.zeros(pad, np.int32)].astype(np.int32),
            np.r_[positions, np.full(pad, scratch, np.int32)].astype(np.int32),
            np.r_[rows, np.zeros(pad, np.int32)].astype(np.int32), last)


def layout(kit, name, prompts, rows, starts=None):
    """One pack, three ways: as it comes; in JAX's blocks (the engine's layout); padded to a
    multiple of the block size without being in blocks (JAX checks on the device and falls back)."""
    from linnet.codegen_jax.runtime import BLOCK

    if name == "plain":
        return kit.pack(prompts, rows, starts)
    if name == "blocks":
        return kit.pack_in_blocks(prompts, rows, starts, batch=GENERICS["Batch"], max_seq=GENERICS["MaxSeq"])
    packed = kit.pack(prompts, rows, starts)
    padded = scratch_padded(packed, -(-len(packed[0]) // BLOCK) * BLOCK + BLOCK)
    assert len(set(padded[2][BLOCK:BLOCK * 2])) > 1, "this layout must not be in blocks"
    return padded


@pytest.fixture(scope="module")
def alone(model, prompts, kit):
    """Each prompt prefilled alone into its row of a fresh cache: (logits [vocab], keys of its row)."""
    out = []
    for p, row in zip(prompts, PROMPT_ROWS):
        model.reset_state()
        logits = kit.to_np(model.prefill(*kit.pack([p], [row])))
        out.append((logits[0], kit.cache_of(model, "k_cache")[:, row, :len(p)]))
    return out


@pytest.mark.parametrize("how", ["plain", "blocks", "unaligned"])
def test_packed_prefill_equals_each_prompt_alone(how, model, prompts, alone, kit, fresh):
    packed = kit.to_np(fresh(model).prefill(*layout(kit, how, prompts, PROMPT_ROWS)))
    assert packed.shape == (len(prompts), 128)
    keys = kit.cache_of(model, "k_cache")
    for j, (p, row) in enumerate(zip(prompts, PROMPT_ROWS)):
        close(kit, packed[j], alone[j][0], f"prompt {j} (row {row})")
        # and the cache row it wrote holds the same keys
        close(kit, keys[:, row, :len(p)], alone[j][1], f"keys of row {row}")


def test_decode_after_prefill_equals_prefill_of_the_whole_sequence(model, prompts, kit, fresh):
    steps = 3
    rng = np.random.default_rng(3)
    new = rng.integers(0, 128, (steps, len(prompts))).astype(np.int32)
    lengths = np.array(PROMPT_LENGTHS)
    order = np.argsort(PROMPT_ROWS)  # decode runs row by row: token i is row i's

    fresh(model)
    incremental = [kit.to_np(model.prefill(*kit.pack(prompts, PROMPT_ROWS)))]
    for s in range(steps):
        out = kit.to_np(model.decode(new[s][order], (lengths + s)[order]))
        incremental.append(out[PROMPT_ROWS, :])  # back to prompt order
    incremental = np.stack(incremental, axis=1)  # [prompt, step, vocab]

    # one prefill of every full sequence, `last` picking each step's position
    full = [np.concatenate([p, new[:, j]]) for j, p in enumerate(prompts)]
    tokens, positions, rows, _ = kit.pack(full, PROMPT_ROWS)
    ends = np.cumsum([len(f) for f in full])
    last = np.concatenate([np.arange(e - steps - 1, e) for e in ends]).astype(np.int32)
    recomputed = kit.to_np(fresh(model).prefill(tokens, positions, rows, last))
    recomputed = recomputed.reshape(len(prompts), steps + 1, -1)
    for j in range(len(prompts)):
        for s in range(steps + 1):
            close(kit, incremental[j, s], recomputed[j, s], f"prompt {j}, step {s}")


def test_copy_rows_then_decode_equals_prefill_into_the_copy(model, prompts, kit, fresh):
    a, b = prompts[0], prompts[2]
    token = np.int32(17)
    # a into row 0, b into row 1; copy them whole to rows 2 and 3
    fresh(model).prefill(*kit.pack([a, b], [0, 1]))
    assert model.copy_rows(*kit.i32([[0, 1], [2, 3], [len(a), len(b)]])) is None
    positions = kit.i32([len(a), len(b), len(a), len(b)])
    copied = kit.to_np(model.decode(kit.i32([token] * 4), positions))
    close(kit, copied[2], copied[0], "copy of a decodes like a")
    close(kit, copied[3], copied[1], "copy of b decodes like b")
    # against the prompts prefilled straight into rows 2 and 3
    fresh(model).prefill(*kit.pack([a, b], [2, 3]))
    direct = kit.to_np(model.decode(kit.i32([token] * 4), positions))
    close(kit, copied[2:], direct[2:], "copied rows against rows prefilled directly")


def test_copy_rows_shares_a_prefix(model, prompts, kit, fresh):
    """Row 3 takes the first 3 positions of row 0, then prefills only the rest of its own prompt."""
    base, garbage = prompts[0], prompts[2]
    shared = 3
    own = np.concatenate([base[:shared], (base[shared:] + 5) % 128]).astype(np.int32)  # same prefix, own suffix
    fresh(model).prefill(*kit.pack([garbage], [3]))  # row 3 holds another prompt first
    model.prefill(*kit.pack([base], [0]))
    before = kit.cache_of(model, "k_cache")
    model.copy_rows(*kit.i32([[0, 0], [3, 1], [shared, 0]]))  # upto 0: row 1 keeps what it has
    after = kit.cache_of(model, "k_cache")
    np.testing.assert_array_equal(after[:, 3, :shared], before[:, 0, :shared])
    np.testing.assert_array_equal(after[:, 3, shared:], before[:, 3, shared:])  # beyond upto: untouched
    np.testing.assert_array_equal(np.delete(after, 3, axis=1), np.delete(before, 3, axis=1))
    suffix = kit.to_np(model.prefill(*kit.pack([own[shared:]], [3], [shared])))
    whole = kit.to_np(fresh(model).prefill(*kit.pack([own], [3])))
    close(kit, suffix, whole, "prefix copied, suffix prefilled")


def test_idle_rows_do_not_disturb_active_rows(model, prompts, kit, fresh):
    """Rows 0 and 2 decode; rows 1 and 3 are idle, fed garbage tokens at garbage positions."""
    lengths = np.array(PROMPT_LENGTHS)[np.argsort(PROMPT_ROWS)].astype(np.int32)  # by row
    active = np.array([True, False, True, False])
    rng = np.random.default_rng(5)
    results = []
    for trial in range(3):
        fresh(model).prefill(*kit.pack(prompts, PROMPT_ROWS))
        if trial == 0:  # the reference run: every row decodes its own next token
            tokens, positions = kit.i32([40, 60, 41, 61]), lengths.copy()
        else:
            tokens = rng.integers(0, 128, 4).astype(np.int32)
            positions = rng.integers(0, GENERICS["MaxSeq"], 4).astype(np.int32)
            tokens[active], positions[active] = [40, 41], lengths[active]
        first = kit.to_np(model.decode(tokens, positions))
        positions[active] += 1  # a second step: the idle rows' garbage went into their own rows only
        second = kit.to_np(model.decode(tokens, positions))
        results.append((first[active], second[active], kit.cache_of(model, "v_cache")[:, active]))
    for trial in (1, 2):
        for got, want, what in zip(results[trial], results[0], ("first step", "second step", "active rows' cache")):
            close(kit, got, want, f"trial {trial}: {what}")


@pytest.mark.parametrize("how", ["plain", "blocks"])
def test_prompt_joins_while_rows_decode(how, model, prompts, kit, fresh):
    """A prefill whose pack holds one token for each decoding row plus a new prompt (DESIGN.md)."""
    lengths = np.array(PROMPT_LENGTHS)
    rng = np.random.default_rng(9)
    newcomer = rng.integers(0, 128, 19).astype(np.int32)
    step = kit.i32([50, 51, 52])  # next tokens of prompts 0..2

    fresh(model).prefill(*kit.pack(prompts, PROMPT_ROWS))
    rows = list(PROMPT_ROWS)
    mixed = kit.to_np(model.prefill(*layout(kit, how, [[t] for t in step] + [newcomer], rows, list(lengths[:3]) + [0])))

    fresh(model).prefill(*kit.pack(prompts, PROMPT_ROWS))
    tokens, positions = np.zeros(4, np.int32), np.zeros(4, np.int32)
    for j in range(3):
        tokens[rows[j]], positions[rows[j]] = step[j], lengths[j]
    decoded = kit.to_np(model.decode(tokens, positions))
    alone = kit.to_np(fresh(model).prefill(*kit.pack([newcomer], [rows[3]])))
    for j in range(3):
        close(kit, mixed[j], decoded[rows[j]], f"decoding row {rows[j]} inside the pack")
    close(kit, mixed[3], alone[0], "the prompt that joined")


def test_packed_attention_in_chunks(model, prompts, alone, kit, fresh, monkeypatch):
    """Long caches make JAX's packed attention gather keys a few tokens at a time; the result must not change.

    The bound on gathered elements is lowered so that the tiny model takes that
    path too (3 tokens a chunk). JAX reads it when tracing, so the pack has a
    shape no other test compiles.
    """
    if model.backend != "jax":
        pytest.skip("torch reads each prompt's own row: it gathers no chunks")
    from linnet.codegen_jax import runtime

    per_token = GENERICS["MaxSeq"] * 2 * 16  # MaxSeq * kv_heads * head_dim of tiny-llama
    monkeypatch.setattr(runtime, "_GATHER_ELEMENTS", 3 * per_token)
    pick = [1, 3]  # 3 + 4 tokens: chunks of 3, 3 and 1
    chunked = kit.to_np(fresh(model).prefill(*kit.pack([prompts[j] for j in pick], [PROMPT_ROWS[j] for j in pick])))
    for i, j in enumerate(pick):
        close(kit, chunked[i], alone[j][0], f"prompt {j} with attention in chunks of 3 tokens")
