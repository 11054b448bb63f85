"""pool.c, the threads torch's path's kernels share out their work on: any number of callers at
once, any thread count, and a forked child, each get the whole product (float64 reference)."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from linnet.kernels import cpu_linear, cpu_ops

pytestmark = pytest.mark.skipif(not cpu_linear.available(torch.float32), reason="Linnet's CPU kernels do not run here")


def reference(x: torch.Tensor, w: torch.Tensor) -> np.ndarray:
    return x.double().numpy() @ w.double().numpy().T


def test_callers_on_many_threads_at_once_each_get_their_product():
    # each call posts its job to the same helpers, taking back one a helper had not begun
    w = torch.randn(200, 64)
    packed = cpu_linear.pack(w)
    inputs = [torch.randn(1 + i % 5, 64) for i in range(8)]
    wrong = []

    def caller(x):
        for _ in range(40):
            got = cpu_linear.matmul(x, packed)
            if not np.allclose(got.double().numpy(), reference(x, w), rtol=1e-5, atol=1e-4):
                wrong.append(x.shape)
    threads = [threading.Thread(target=caller, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@pytest.mark.parametrize("threads", [1, 2, 5, 16])  # more threads than cores: helpers that start late find it done
def test_any_thread_count_gives_the_product_and_the_small_ops(threads):
    x, w = torch.randn(300, 96), torch.randn(40, 96)
    weight = torch.randn(96)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = cpu_linear.matmul(x, cpu_linear.pack(w))
        normed = cpu_ops.rmsnorm(x, weight, 1e-6)  # 300 x 96 elements: over the pool's threshold
    finally:
        torch.set_num_threads(before)
    np.testing.assert_allclose(got.double().numpy(), reference(x, w), rtol=1e-5, atol=1e-4)
    xd = x.double()
    want = weight.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    np.testing.assert_allclose(normed.double().numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


FORKED = """
import os, sys, torch
from linnet.kernels import cpu_linear
torch.set_num_threads(2)
x, w = torch.randn(7, 64), torch.randn(300, 64)
packed = cpu_linear.pack(w)
want = cpu_linear.matmul(x, packed)  # the parent's helpers started
pid = os.fork()
if pid == 0:  # none of them in the child: it starts its own
    os._exit(0 if torch.equal(cpu_linear.matmul(x, packed), want) else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_runs_the_kernels():
    out = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "child 0", out.stderr


def test_while_the_kernels_take_the_cores_torch_keeps_one_thread():
    from linnet.kernels import pool

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert pool.threads() == 2
        with pool.kernels_take_the_cores():
            assert torch.get_num_threads() == 1 and pool.threads() == 2
            with pool.kernels_take_the_cores():  # nested: the count stays the first one's
                assert torch.get_num_threads() == 1 and pool.threads() == 2
            assert torch.get_num_threads() == 1 and pool.threads() == 2
        assert torch.get_num_threads() == 2 and pool.threads() == 2
    finally:
        torch.set_num_threads(before)


HELPERS = """
import json, os, signal, torch
from linnet.kernels import cpu_linear
torch.set_num_threads(3)
cpu_linear.matmul(torch.randn(4, 64), cpu_linear.pack(torch.randn(300, 64)))  # its helpers started
found = {}
for task in os.listdir("/proc/self/task"):
    status = dict(line.split(":", 1) for line in open(f"/proc/self/task/{task}/status"))
    name = "main" if int(task) == os.getpid() else status["Name"].strip()
    found.setdefault(name, []).append(int(status["SigBlk"], 16) >> (signal.SIGINT - 1) & 1)
print(json.dumps(found))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads a Linux process's threads")
def test_the_helpers_are_named_and_take_no_signals():
    # a Ctrl-C goes to the process's own threads, where Python's handler runs
    import json

    out = subprocess.run([sys.executable, "-c", HELPERS], capture_output=True, text=True, timeout=120, check=True)
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["linnet-pool"] == [1, 1]  # two helpers beside the caller, SIGINT blocked in each
    assert found["main"] == [0]  # (the mask they were made under is the caller's again)
