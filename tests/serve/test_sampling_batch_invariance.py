"""A request's draw, logprobs and top alternatives are bitwise the same whatever other requests
share its sampling batch, on both backends: a probe row's settings (greedy, or seeded with
top-k / top-p / min-p) alone, then at the first and the last of M rows beside others of random
settings. Prompt scores (`score`) likewise. JAX's reductions went to YNNPACK from about 4096
elements (vocab 128 at 32 rows, 3000 at 2), whose sums and exp differ from XLA's own
(`codegen_jax.fixed_order`)."""

import numpy as np
import pytest
import torch

from linnet.serve import sampling_jax, sampling_torch
from linnet.serve.request import Request
from tests.serve.test_sampling import run

ROW_COUNTS = [1, 2, 17, 32, 64]  # below and past YNNPACK's 4096 elements at both vocabularies

PROBES = {
    "greedy": dict(),
    "top_p": dict(temperature=0.8, top_p=0.7),
    "top_k": dict(temperature=1.2, top_k=7),
    "min_p+top_p": dict(temperature=1.0, min_p=0.02, top_p=0.95),
}


def others(rng, m: int, vocab: int) -> list:
    kinds = list(PROBES.values())
    return [Request(prompt=[1], logprobs=int(rng.integers(0, 6)), **kinds[int(rng.integers(len(kinds)))])
            for _ in range(m)]


@pytest.mark.parametrize("vocab", [128, 3000])
@pytest.mark.parametrize("probe", list(PROBES))
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_rows_draw_is_the_same_beside_any_rows(backend, probe, vocab):
    """The draw, its logprob and rank, and the top alternatives."""
    rng = np.random.default_rng(vocab)
    req = Request(prompt=[1], logprobs=5, **PROBES[probe])
    logits = (rng.standard_normal((1, vocab)) * 3).astype(np.float32)
    tokens, chosen, (values, ids), ranks = run(backend, logits, [req], [11], [4])
    alone = (tokens[0], chosen[0], values[0, :5], ids[0, :5], ranks[0])
    differ = []
    for m in ROW_COUNTS:
        rest = others(rng, m - 1, vocab)
        rest_logits = (rng.standard_normal((m - 1, vocab)) * 3).astype(np.float32)
        for at in sorted({0, m - 1}):
            reqs = rest[:at] + [req] + rest[at:]
            seeds = [int(s) for s in rng.integers(0, 1000, m)]
            seeds[at] = 11
            steps = [int(s) for s in rng.integers(0, 50, m)]
            steps[at] = 4
            t, c, (v, i), r = run(backend, np.concatenate([rest_logits[:at], logits, rest_logits[at:]]), reqs, seeds,
                                  steps)
            got = (t[at], c[at], v[at, :5], i[at, :5], r[at])
            if not all(np.array_equal(a, b) for a, b in zip(got, alone)):
                differ.append((m, at))
    assert not differ, f"(rows, position) where the probe's draw or logprobs differ from its own alone: {differ}"


@pytest.mark.parametrize("vocab", [128, 3000])
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_prompt_tokens_score_is_the_same_beside_any_rows(backend, vocab):
    rng = np.random.default_rng(vocab + 1)

    def score(logits, targets):
        if backend == "torch":
            c, r, (v, i) = sampling_torch.score(torch.from_numpy(logits), torch.from_numpy(targets), 5)
        else:
            import jax.numpy as jnp

            c, r, (v, i) = sampling_jax.score(jnp.asarray(logits), jnp.asarray(targets), 5)
        return [np.asarray(a) for a in (c, r, v, i)]

    probe = (rng.standard_normal((1, vocab)) * 3).astype(np.float32)
    target = np.array([3], np.int32)
    alone = [a[0] for a in score(probe, target)]
    differ = []
    for m in ROW_COUNTS:
        rows = (rng.standard_normal((m, vocab)) * 3).astype(np.float32)
        rows[m - 1] = probe[0]
        targets = rng.integers(0, vocab, m).astype(np.int32)
        targets[m - 1] = 3
        got = [a[m - 1] for a in score(rows, targets)]
        if not all(np.array_equal(a, b) for a, b in zip(got, alone)):
            differ.append(m)
    assert not differ, f"row counts where the probe's score differs from its own alone: {differ}"
