"""Each CPU benchmark in benchmarks/ once, in its smallest form, in this process (`main(argv)`): what it
prints has the shape its --help promises (each system's line, the ratio lines), every figure is positive
and finite, and each printed ratio is the printed rates divided (the arithmetic, checked apart).

throughput_vs_peers.py's transformers peer raised TypeError on every run for a while and nothing here
noticed. load_memory.py is tests/nest/test_load_memory.py's, gpu_check.sh tests/test_examples.py's."""

from __future__ import annotations

import importlib
import math
import re
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


@pytest.fixture(scope="module", autouse=True)
def benchmarks_importable():
    """The scripts import their neighbours (llamacpp_peer, decode_step, ...) as a run from benchmarks/ does."""
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """`--threads` sets torch's threads for the process: put them back for the tests after."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def bench(name: str):
    return importlib.import_module(name)


def positive(text: str) -> float:
    value = float(text)
    assert math.isfinite(value) and value > 0, text
    return value


def assert_ratio(printed: float, top: float, bottom: float, decimals: int = 2, rate_decimals: int = 1) -> None:
    """`printed` (rounded to `decimals`) is top / bottom, both rounded to `rate_decimals` as printed."""
    slack = 0.5 * 10 ** -decimals + (top / bottom) * 0.5 * 10 ** -rate_decimals * (1 / top + 1 / bottom) + 1e-9
    assert abs(printed - top / bottom) <= slack, (printed, top, bottom)


def throughput_lines(out: str) -> tuple[dict, dict, dict]:
    """(load tokens/s by system, ratio against transformers by system, one request's tokens/s by system)."""
    load, ratios, single, section = {}, {}, {}, None
    for line in out.splitlines():
        if line.startswith("load:"):
            section = load
        elif line.startswith("ratios against transformers f32:"):
            section = ratios
        elif line.startswith("one request,"):
            section = single
        elif m := re.fullmatch(rf"  (\S+(?: \S+)*?)\s+{NUMBER} tokens/s(?:   \(.*\))?", line):
            section[m[1]] = positive(m[2])
        elif m := re.fullmatch(rf"  (\S+(?: \S+)*?)\s+{NUMBER}x", line):
            assert section is ratios, line
            ratios[m[1]] = positive(m[2])
    return load, ratios, single


# one thread: on this loaded 2-core host two threads' barriers wait on each other (llama.cpp's f16 one request
# ran 7.6 tokens/s on 2 threads, 60.4 on 1)
SMALL = ["--repeats", "1", "--in-process", "--threads", "1"]


def test_throughput_vs_peers_against_transformers(capsys):
    """A tiny card's load and one request on Linnet torch (f32, bf16) and transformers, in one process."""
    bench("throughput_vs_peers").main(["--card", "tiny-llama", "--requests", "3", "--rows", "2", "--new", "4", *SMALL,
                                       "--only", "transformers", "torch-f32", "torch-bf16"])
    out = capsys.readouterr().out
    load, ratios, single = throughput_lines(out)
    systems = {"transformers f32", "linnet torch f32", "linnet torch bf16"}
    assert set(load) == set(ratios) == set(single) == systems, out
    for system in systems:
        assert_ratio(ratios[system], load[system], load["transformers f32"])
    assert "jax / torch" not in out  # only where both backends ran


@pytest.mark.parametrize("transformers", [None, 50.0])
def test_throughput_vs_peers_jax_over_torch(capsys, transformers):
    """JAX over torch per type (JAX's compile would take this file's time: the printing alone), under a heading
    with or without transformers' ratios."""
    rates = {"linnet torch f32": 100.0, "linnet jax f32": 150.0, "linnet torch bf16": 80.0, "linnet jax bf16": 60.0}
    if transformers:
        rates = {"transformers f32": transformers, **rates}
    bench("throughput_vs_peers").print_ratios(rates)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("ratios against transformers f32:" if transformers else "ratios:")
    assert lines[-2:] == ["  jax / torch (f32): 1.50x", "  jax / torch (bf16): 0.75x"]
    assert len(lines) == 3 + (len(rates) if transformers else 0)


def test_throughput_vs_peers_transformers_of_another_layout(capsys):
    """tiny-mixtral: transformers 5 fuses Mixtral's experts (mlp.experts.gate_up_proj), so the peer is read
    by transformers' own loader from the card's export (load_state_dict of Linnet's names raised), holding
    Linnet's weights: its logits are Linnet's."""
    import numpy as np
    import torch

    peers = bench("throughput_vs_peers")
    peers.main(["--card", "tiny-mixtral", "--requests", "2", "--rows", "2", "--new", "2", "--no-single", *SMALL,
                "--only", "transformers"])
    load, ratios, _ = throughput_lines(capsys.readouterr().out)
    assert set(load) == set(ratios) == {"transformers f32"}
    # the peer holds the very weights Linnet loads: its logits are Linnet's
    reference = peers.transformers_model(peers.Chosen.card, peers.Chosen.weights)
    ours = peers.Chosen.load("f32", {"Batch": 1, "MaxSeq": 16}, backend="torch", cast_dtype=True)
    prompt = np.array([1, 5, 9, 2, 7], np.int32)
    n = len(prompt)
    got = np.asarray(ours.prefill(prompt, np.arange(n, dtype=np.int32), np.zeros(n, np.int32),
                                  np.array([n - 1], np.int32)))[0]
    with torch.no_grad():
        want = reference(torch.tensor([prompt.tolist()])).logits[0, -1].numpy()
    assert float(np.abs(got - want).max() / np.abs(want).max()) <= 1e-4


def test_throughput_vs_peers_against_llamacpp(capsys):
    """SmolLM2's load on llama.cpp (the F16 GGUF written from the embedded file, and that file as it is)
    beside transformers holding the same weights."""
    pytest.importorskip("llama_cpp")
    pytest.importorskip("transformers")
    bench("throughput_vs_peers").main(["--requests", "2", "--rows", "2", "--new", "2", "--no-single", *SMALL,
                                       "--only", "transformers", "llamacpp-f16", "llamacpp-q4_1"])
    out = capsys.readouterr().out
    load, ratios, single = throughput_lines(out)
    systems = {"transformers f32", "llama.cpp f16", "llama.cpp q4_1"}
    assert set(load) == set(ratios) == systems and not single, out
    for system in systems:
        assert_ratio(ratios[system], load[system], load["transformers f32"])


def test_throughput_vs_peers_says_a_missing_peer_and_goes_on(capsys, monkeypatch):
    """Without transformers and llama-cpp-python (None in sys.modules: their import fails), each is said,
    once, and Linnet's system still runs; without transformers no ratio against it is printed."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    bench("throughput_vs_peers").main(["--requests", "2", "--rows", "2", "--new", "2", "--no-single", *SMALL,
                                       "--only", "transformers", "llamacpp-f16", "torch-bf16"])
    out = capsys.readouterr().out
    assert "transformers: not installed (pip install transformers), skipped\n" in out
    assert "llama.cpp: not installed (pip install llama-cpp-python), skipped\n" in out
    load, ratios, single = throughput_lines(out)
    assert list(load) == ["linnet torch bf16"] and not ratios and not single, out


@pytest.mark.parametrize("argv, error", [
    (["--rows", "0"], "argument --rows: must be at least 1, not 0"),
    (["--no-load", "--no-single"], "--no-load and --no-single leave nothing to measure"),
])
def test_throughput_vs_peers_bad_arguments_are_one_line(capsys, argv, error):
    with pytest.raises(SystemExit) as exit_:
        bench("throughput_vs_peers").main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"throughput_vs_peers.py: error: {error}"


def test_throughput_vs_peers_unknown_card_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench("throughput_vs_peers").main(["--card", "nope"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.startswith("throughput_vs_peers.py: error: unknown card 'nope'")
    assert err.count("\n") == 1


def test_decode_step(capsys):
    """A tiny Llama's decode step on Linnet torch and JAX beside transformers' LlamaForCausalLM."""
    pytest.importorskip("transformers")
    bench("decode_step").main(["--card", "tiny-llama", "--batch", "2", "--prompt", "4", "--steps", "2",
                               "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "decode step, batch 2, 4-token prompts, tiny-llama's shapes, f32, 1 threads (median of 2)"
    ms, ratios = {}, {}
    for line in lines[1:]:
        m = re.fullmatch(rf"  (linnet torch|linnet jax|transformers) +{NUMBER} ms/step +{NUMBER}x transformers", line)
        assert m, line
        ms[m[1]], ratios[m[1]] = positive(m[2]), positive(m[3])
    assert list(ms) == ["linnet torch", "linnet jax", "transformers"]
    for system in ms:  # how many times faster than transformers: its milliseconds over the system's
        assert_ratio(ratios[system], ms["transformers"], ms[system], rate_decimals=2)


def test_decode_step_refuses_without_transformers(capsys, monkeypatch):
    """transformers is decode_step's reference (its model draws the weights both run): refused in one line."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(SystemExit) as exit_:
        bench("decode_step").main(["--card", "tiny-llama"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert err == "decode_step.py: error: transformers not installed (pip install transformers)\n"


def test_capped_attention(capsys):
    cpu_attention = pytest.importorskip("linnet.kernels.cpu_attention")
    if cpu_attention.library() is None:
        pytest.skip("Linnet's CPU kernels do not build here")
    bench("capped_attention").main(["--positions", "8", "20", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    for line, pos in zip(lines, (8, 20)):
        m = re.fullmatch(rf"position {pos}: uncapped {NUMBER} us, capped at 50 {NUMBER} us, {NUMBER}x", line)
        assert m, line
        # the microseconds are printed whole: a ratio of tens of us is checked to that rounding
        plain, capped, ratio = (positive(g) for g in m.groups())
        assert_ratio(ratio, capped, plain, rate_decimals=0)


def test_qlinear_rows(capsys):
    from linnet.kernels import cpu_linear

    if cpu_linear.isa() is None:
        pytest.skip("Linnet's CPU kernels do not build here")
    bench("qlinear_rows").main(["--rows", "1", "--types", "Q8_0", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"[0-9]+ threads, ISA \S+, median of 1", lines[0]), lines[0]
    matmuls = [line for line in lines[1:] if line.startswith("[")]
    gathers = [line for line in lines[1:] if line.startswith("gather")]
    assert len(matmuls) >= 4 and len(gathers) == 1 and len(lines) == 1 + len(matmuls) + len(gathers), lines
    for line in matmuls:
        m = re.fullmatch(rf"\[ +1, [0-9]+\] x \[[0-9]+, [0-9]+\] Q8_0 +{NUMBER} ms   bf16 +{NUMBER} ms +{NUMBER}x   "
                         rf"\(least {NUMBER} and {NUMBER} ms: {NUMBER}x\)", line)
        assert m, line
        quant, bf16, ratio, quant_least, bf16_least, least_ratio = (positive(g) for g in m.groups())
        assert_ratio(ratio, quant, bf16, rate_decimals=3)
        assert_ratio(least_ratio, quant_least, bf16_least, rate_decimals=3)


@pytest.mark.parametrize("script", ["gpu_parity.py", "gpu_profile.py", "transformers_peer.py"])
def test_a_gpu_script_stops_at_once_without_a_gpu(capsys, monkeypatch, script):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run")
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(BENCH / script), run_name="__main__")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"{script}: no CUDA GPU here (torch ") and err.count("\n") == 1


@pytest.mark.parametrize("script, argv, error", [
    # (gpu_parity's load asks prompt 1 again as prompt 3, and a prefix of it as prompt 5: an IndexError below 6)
    ("gpu_parity.py", ["--requests", "4"], "argument --requests: must be at least 6, not 4"),
    ("gpu_parity.py", ["--rows", "0"], "argument --rows: must be at least 1, not 0"),
    ("gpu_profile.py", ["--rows", "0"], "argument --rows: must be at least 1, not 0"),
    ("transformers_peer.py", ["--new", "0"], "argument --new: must be at least 1, not 0"),
])
def test_a_gpu_scripts_bad_count_is_its_flags_error(capsys, monkeypatch, script, argv, error):
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(BENCH / script), run_name="__main__")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"{script}: error: {error}"


def test_gpu_profile_on_jax_stops_at_once_without_a_jax_gpu(capsys, monkeypatch):
    """With --backend jax the GPU the script needs is JAX's, not torch's: where JAX has none, one line and
    exit 2 before any model is built (whether torch has CUDA or not)."""
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
        pytest.skip("JAX has a GPU here: the script would run")
    except RuntimeError:
        pass
    monkeypatch.setattr(sys, "argv", ["gpu_profile.py", "--backend", "jax"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(BENCH / "gpu_profile.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"gpu_profile.py: no JAX GPU here (jax {jax.__version__}: its backend is cpu); --device "
                          "cpu runs the script itself on the CPU")
