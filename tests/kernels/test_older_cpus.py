"""The paths an older x86 CPU takes, run on this one: the kernels' tests again in a process whose
instruction sets are capped (LINNET_CPU_ISA for Linnet's kernels, `build.isa_cap`; oneDNN's,
ATen's, MKL's and XLA's own caps beside it, so that each library decides as it would there). On an
AVX-512 BF16 CPU these are the only runs of the AVX2 and plain AVX-512 kernels; a Cascade Lake's
bf16 (oneDNN's, emulated) once broke the CPU graph's capture, which no run here could see."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from linnet.kernels import build, cpu_linear

ROOT = Path(__file__).resolve().parents[2]
LEVELS = build.ISA_CAPS
# each cap as the four libraries spell it, and the CPUs that stop there
OLDER = {
    "avx2": dict(LINNET_CPU_ISA="avx2", ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2",
                 MKL_ENABLE_INSTRUCTIONS="AVX2", XLA_FLAGS="--xla_cpu_max_isa=AVX2"),  # Haswell to Zen 3
    "avx512": dict(LINNET_CPU_ISA="avx512", ONEDNN_MAX_CPU_ISA="AVX512_CORE", ATEN_CPU_CAPABILITY="avx512",
                   MKL_ENABLE_INSTRUCTIONS="AVX512", XLA_FLAGS="--xla_cpu_max_isa=AVX512"),  # Skylake-SP to Ice Lake
    "avx512_bf16": dict(LINNET_CPU_ISA="avx512_bf16", ONEDNN_MAX_CPU_ISA="AVX512_CORE_BF16",
                        ATEN_CPU_CAPABILITY="avx512", MKL_ENABLE_INSTRUCTIONS="AVX512",
                        XLA_FLAGS="--xla_cpu_max_isa=AVX512"),  # Cooper Lake, Zen 4
}
TESTS = ["tests/kernels/test_cpu_linear.py", "tests/kernels/test_cpu_qlinear.py", "tests/kernels/test_cpu_attention.py",
         "tests/kernels/test_cpu_graph.py",
         "tests/kernels/test_xla_kernels.py", "tests/kernels/test_batch_invariance.py"]
# the tests of building the library and turning it off: the same under any cap
NOT_BUILDS = "not builds and not compiler and not assembler and not cpu_kernels_0"


@pytest.mark.parametrize("cap", list(OLDER))
def test_the_kernels_tests_pass_on_an_older_cpus_instructions(cap):
    here = cpu_linear.isa()
    if here is None or LEVELS.index(here) <= LEVELS.index(cap):
        pytest.skip(f"this CPU's kernels take {here}: nothing above {cap} to leave out")
    env = dict(os.environ, **OLDER[cap])
    env.pop("PYTEST_ADDOPTS", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", NOT_BUILDS, *TESTS],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1]


def test_a_cap_the_kernels_do_not_know_is_refused(monkeypatch):
    monkeypatch.setenv("LINNET_CPU_ISA", "avx3")
    with pytest.raises(ValueError, match="LINNET_CPU_ISA='avx3': not one of avx2, avx512, avx512_bf16, amx"):
        build.isa_cap()
