import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers must never reach for the network here
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture
def file_size_limit():
    """file_size_limit(n): a context in which this process cannot write a file past n bytes (RLIMIT_FSIZE,
    as a full disk fails a write: OSError EFBIG; Python ignores the SIGXFSZ that comes with it)."""
    import contextlib
    import resource

    @contextlib.contextmanager
    def limit(n: int):
        before = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, before[1]))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, before)
    return limit
