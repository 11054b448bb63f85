import pytest

from linnet import nest


def make_model(backend: str, rows: int = 16, max_seq: int = 96, numerics: str = "exact"):
    return nest.load("tiny-llama", backend=backend, weights="random", seed=1, numerics=numerics,
                     generics={"Batch": rows, "MaxSeq": max_seq})


@pytest.fixture(scope="module", params=["torch", "jax"])
def model(request):
    return make_model(request.param)
