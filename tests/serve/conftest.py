import pytest

from linnet import nest


def make_model(backend: str, rows: int = 16, max_seq: int = 96, numerics: str = "exact", compile: bool = False):
    return nest.load("tiny-llama", backend=backend, weights="random", seed=1, numerics=numerics, compile=compile,
                     generics={"Batch": rows, "MaxSeq": max_seq})


@pytest.fixture(scope="module", params=["torch", "torch-replayed", "jax"])
def model(request):
    """Each backend; and torch with its decode step captured and replayed (a CPU graph of Linnet's
    kernels here, a CUDA graph on a GPU), checked against the same model's eager entries."""
    if request.param == "torch-replayed":
        return make_model("torch", numerics="fast", compile=True)
    return make_model(request.param)
