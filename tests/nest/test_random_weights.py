"""Seeded random weights: one model per seed, whichever backend it is made for."""

import numpy as np
import torch

from linnet.nest.load import read_weights


def test_a_seed_gives_each_backend_the_same_weights():
    """JAX's are made on the host for a model that runs elsewhere (`runs_on`): on a GPU machine both
    backends' noise comes from torch's CUDA generator, here (no CUDA) both from the CPU's."""
    mine = read_weights("tiny-llama", {"T": "bf16"}, "fast", weights="random", seed=3).params
    jax_host = read_weights("tiny-llama", {"T": "bf16"}, "fast", weights="random", seed=3, framework="numpy",
                            runs_on="cuda" if torch.cuda.is_available() else "cpu").params
    assert mine.keys() == jax_host.keys()
    for name, t in mine.items():
        assert torch.equal(t.cpu(), jax_host[name].cpu()), name
    other = read_weights("tiny-llama", {"T": "bf16"}, "fast", weights="random", seed=4).params
    assert not torch.equal(other["embed"], mine["embed"])


def test_matrices_are_small_noise_and_vectors_near_one():
    bound = read_weights("tiny-llama", {"T": "f32"}, "fast", weights="random", seed=0)
    vectors = 0
    for name, t in bound.params.items():
        values = t.float().numpy()
        vector = values.ndim - len(bound.module.params[name].loops) == 1  # a layer's norm weight
        vectors += vector
        centre = 1.0 if vector else 0.0
        assert abs(float(np.mean(values)) - centre) < 0.01, name
        assert 0.015 < float(np.std(values)) < 0.025, name
    assert 0 < vectors < len(bound.params)
