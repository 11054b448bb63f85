"""The OpenMP pool a thread leaves behind when it hands the steps to the engine's thread: freed,
and built again when that thread opens a parallel region later. Counted in a fresh process, where
no other test's threads come and go."""

import json
import os
import subprocess
import sys

import pytest

COUNT = """
import json, os, time, torch
from linnet.kernels.openmp import release_pool
threads = lambda: len(os.listdir("/proc/self/task"))
x = torch.ones(1 << 22)
torch.exp(x)  # a parallel region on this thread: its pool of workers
before = threads()
released = release_pool()
deadline = time.monotonic() + 5
while threads() >= before and time.monotonic() < deadline:
    time.sleep(0.01)
after = threads()
total = torch.exp(x).sum().item()  # a new pool
print(json.dumps([torch.get_num_threads(), before, released, after, threads(), total]))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts a Linux process's threads")
def test_the_calling_threads_workers_are_freed_and_rebuilt_on_use():
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", COUNT], capture_output=True, text=True, env=env, check=True)
    pool, before, released, after, again, total = json.loads(out.stdout.splitlines()[-1])
    assert pool == 2 and released
    assert after == before - 1  # the one worker beside this thread
    assert again == before and total == pytest.approx((1 << 22) * 2.718281828, rel=1e-5)
