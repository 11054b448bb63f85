"""The torch runner's choice between the runtime's kernels and Linnet's Triton ones, timed at a
CUDA decode step's capture (`serve.kernel_choice`, `TorchRunner._choose_kernels`).

No GPU here: the runner's model runs on a GPU's branches (`torch_on_gpu_branches`), its Triton
kernels in Triton's interpreter, and the two parts only CUDA has stand in for themselves: a graph's
capture and replay by the step run eagerly into one logits tensor (what a replay does to the
captured output), CUDA events by the host's clock."""

import statistics
import time

import numpy as np
import pytest
import torch

from linnet.serve import kernel_choice
from linnet.serve.kernel_choice import Trial
from tests.serve.conftest import noisy_cache, torch_on_gpu_branches

pytest.importorskip("triton")  # (in its interpreter without CUDA: tests/conftest.py)

from linnet.codegen_torch import runtime as rt  # noqa: E402
from linnet.kernels import triton_attention, triton_ops  # noqa: E402
from linnet.serve.runners import TorchRunner  # noqa: E402

K = rt.TritonKernels


def test_the_choices_are_each_auto_kernels_both_ways_the_runtimes_first():
    here = lambda module: True
    assert kernel_choice.choices(K(None, None), here) == [K(False, False), K(False, True), K(True, False),
                                                          K(True, True)]
    assert kernel_choice.choices(K(True, None), here) == [K(True, False), K(True, True)]
    assert kernel_choice.choices(K(False, False), here) == [K(False, False)]
    assert kernel_choice.choices(K(None, None), lambda module: module == "triton_ops") == [K(False, False),
                                                                                          K(False, True)]


def test_the_fastest_agreeing_choice_is_kept():
    trials = [Trial(K(False, False), 10.0, 0.0), Trial(K(True, False), 6.0, 0.5),  # fast but wrong
              Trial(K(False, True), 8.0, 0.01), Trial(K(True, True), failure="capture failed")]
    kept = kernel_choice.fastest(trials)
    assert kept is trials[2]
    line = kernel_choice.describe(trials, kept)
    assert "Triton small ops 8.00 ms (kept)" in line and "left out: logits 0.5 apart" in line
    assert "Triton attention and small ops: failed (capture failed)" in line
    assert kernel_choice.fastest([Trial(K(False, False), 10.0, 0.0), Trial(K(True, False), 6.0, float("inf"))]).ms == 10
    assert kernel_choice.relative_error(torch.tensor([1.0, float("nan")]), torch.ones(2)) == float("inf")
    assert kernel_choice.relative_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 0.0])) == pytest.approx(4 / 3)


class ReplayedEagerly:
    """A CUDA graph's stand-in: `replay` runs the step over the runner's static buffers, with the
    kernels it was captured with, into the one logits tensor the capture gave."""

    def __init__(self, runner, kernels):
        self.runner, self.kernels = runner, kernels
        self.logits = self._step().clone()

    def _step(self):
        with rt.using_triton(self.kernels):
            return self.runner.model.decode(self.runner._static_tokens, self.runner._static_positions)

    def replay(self):
        self.logits.copy_(self._step())


def host_ms(run, runs: int) -> float:
    times = []
    for _ in range(min(runs, 2)):  # (the interpreter's kernels are slow)
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@pytest.fixture
def runner_on_gpu_branches(monkeypatch):
    """tiny-llama's torch runner as on a GPU with Triton, each kernel "auto", its cache noise."""
    model = torch_on_gpu_branches(monkeypatch)
    monkeypatch.setattr(rt, "TRITON_ASKED", K(None, None))
    monkeypatch.setattr(rt, "triton_here", lambda module: True)
    monkeypatch.setattr(rt, "triton_decodes", lambda q, k_cache, v_cache: rt._TRITON[0].attention)
    monkeypatch.setattr(rt, "_triton_ops", lambda *tensors: triton_ops if rt._TRITON[0].ops else None)
    runner = TorchRunner(model)
    monkeypatch.setattr(runner, "_captured", lambda kernels: (g := ReplayedEagerly(runner, kernels), g.logits))
    monkeypatch.setattr(runner, "_median_ms", host_ms)
    noisy_cache(model)
    return runner


def test_the_capture_keeps_an_agreeing_choice_and_leaves_the_cache_and_the_step_as_they_were(
        runner_on_gpu_branches, monkeypatch):
    runner = runner_on_gpu_branches
    model = runner.model
    tokens, positions = np.array([3, 9, 0, 27], np.int32), np.array([5, 31, 32, 17], np.int32)  # row 2 idle
    start = {name: getattr(model.runner, name).clone() for name in model.runner.state}
    with rt.using_triton(K(False, False)):
        want = model.decode(tokens, positions).clone()
    want_cache = {name: getattr(model.runner, name).clone() for name in model.runner.state}
    for name, value in start.items():
        getattr(model.runner, name).copy_(value)
    attend = triton_attention.attend
    # Triton's attention computing wrongly here (its heads' outputs rolled): whatever its time, it is left out
    monkeypatch.setattr(triton_attention, "attend", lambda *a, **k: attend(*a, **k).roll(1, dims=1))
    runner.use_cuda_graph = True
    got = runner.decode(tokens, positions)  # the first step: captured, each choice timed
    lines = runner.kernels_chosen.split("; packed pass: ")
    assert len(lines) == 2 and lines[0].count(" ms") == 4 and lines[1].count(" ms") == 2  # every choice timed
    assert lines[0].count("left out") == 2 and not runner.triton.attention  # both of the attention's choices
    assert "(kept)" in lines[0] and "(kept)" in lines[1]
    assert isinstance(runner._graph, ReplayedEagerly) and runner._graph.kernels.attention is False
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-4, atol=1e-4)  # the caller's step, not the timing's
    for name, value in want_cache.items():  # this step's writes only: the timing's are undone
        torch.testing.assert_close(getattr(model.runner, name), value, rtol=1e-5, atol=1e-5)


def test_a_triton_kernel_refused_by_the_gpu_is_a_failed_choice_not_a_crash(runner_on_gpu_branches, monkeypatch):
    """Triton's own errors are no RuntimeError (TritonError: a compile that fails, a launch past the
    GPU's shared memory): such a choice is left out, and the first step runs on the others."""
    from triton.runtime.errors import OutOfResources

    runner = runner_on_gpu_branches
    tokens, positions = np.array([3, 9, 0, 27], np.int32), np.array([5, 31, 32, 17], np.int32)
    with rt.using_triton(K(False, False)):
        want = runner.model.decode(tokens, positions).clone()
    noisy_cache(runner.model)

    def refused(*args, **kwargs):
        raise OutOfResources(282688, 232448, "shared memory")
    monkeypatch.setattr(triton_attention, "attend", refused)
    runner.use_cuda_graph = True
    got = runner.decode(tokens, positions)
    step = runner.kernels_chosen.split("; packed pass: ")[0]
    assert step.count("failed (OutOfResources: out of resource: shared memory") == 2, step
    assert not runner.triton.attention and runner._graph.kernels.attention is False
    busy = [0, 1, 3]
    torch.testing.assert_close(got[busy], want[busy], rtol=1e-4, atol=1e-4)
