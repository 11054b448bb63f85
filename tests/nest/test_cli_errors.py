"""The command line's answers to what cannot be done: one line that names the thing at fault, exit
status 1, or for a flag's value or flags that do not go together the command's usage and exit status 2
(as argparse answers for the flags it refuses itself); never a traceback."""

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from linnet.cli import main

TINY = "linnet/nest/cards/tiny-llama.linnet"


def error_of(capsys, argv) -> str:
    assert main(argv) == 1, argv
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(("linnet: error: ", argv[1])), err
    return err


def usage_error_of(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"usage: linnet {argv[0]} ") and "Traceback" not in err, err
    assert f"\nlinnet {argv[0]}: error: " in err, err
    return err[err.index(f"\nlinnet {argv[0]}: error: ") + 1:]  # the error, after the usage


def test_files_that_cannot_be_read_or_written(capsys, tmp_path):
    assert "/nowhere/dir/out.py: No such file or directory" in error_of(
        capsys, ["compile", TINY, "-o", "/nowhere/dir/out.py"])
    assert f"{tmp_path}: Is a directory" in error_of(capsys, ["compile", TINY, "-o", str(tmp_path)])
    missing = str(tmp_path / "nothere.linnet")
    assert error_of(capsys, ["compile", missing]).startswith(f"{missing}: error: cannot read")
    bad = tmp_path / "latin1.linnet"
    bad.write_bytes(b"arch x\n\n  caf\xe9\n")
    assert error_of(capsys, ["check", str(bad)]).startswith(f"{bad}:3:6: error: ")


def test_compile_output_dash_is_standard_output_and_an_empty_name_is_refused(capsys):
    # argparse's own reading of an output file name: `-` is standard output, `` no file at all
    assert argparse.FileType("w")("-") is sys.stdout
    with pytest.raises(argparse.ArgumentTypeError):
        argparse.FileType("w")("")
    assert main(["compile", TINY]) == 0
    plain = capsys.readouterr().out
    assert main(["compile", TINY, "-o", "-"]) == 0
    assert capsys.readouterr().out == plain and plain.startswith('"""PyTorch module')
    assert not Path("-").exists()  # (no file of that name in the working folder)
    assert "-o/--output needs a file name" in usage_error_of(capsys, ["compile", TINY, "-o", ""])


@pytest.mark.parametrize("argv", [["compile", ""], ["check", ""], ["ir", ""], ["export", "", "--to", "vllm", "-o", "x"]])
def test_an_empty_card_name_is_refused_not_read_as_the_current_folder(capsys, argv):
    assert main(argv) == 1
    assert capsys.readouterr().err == "linnet: error: a card's name or a path is needed, not ''\n"


def test_compile_does_not_write_over_the_models_own_source(capsys, tmp_path):
    # as gcc refuses `gcc a.c -o a.c`: the card, and the architecture it imports, are left as they were
    (tmp_path / "arch").mkdir()
    arch = tmp_path / "arch" / "llama.linnet"
    arch.write_text(Path("linnet/nest/cards/arch/llama.linnet").read_text())
    card = tmp_path / "mine.linnet"
    card.write_text(Path(TINY).read_text())
    before = {p: p.read_bytes() for p in (card, arch)}
    for output in (card, arch, tmp_path / "arch" / ".." / "mine.linnet"):
        err = usage_error_of(capsys, ["compile", str(card), "-o", str(output)])
        assert "a source of this model" in err, err
    assert {p: p.read_bytes() for p in (card, arch)} == before
    assert main(["compile", str(card), "-o", str(tmp_path / "mine.py")]) == 0  # any other file is written
    assert (tmp_path / "mine.py").read_text().startswith('"""PyTorch module')


def test_request_values_are_checked_before_the_model_loads(capsys):
    """Wrong numbers answer at once (the model's load takes seconds to minutes), as flag errors: the
    ranges are Request.validate's (temperature past 1e30 is NaN in the step's f32)."""
    base = ["generate", "smollm2-135m-instruct", "hi"]
    for flag, value, says in (("--top-p", "2", "must be from 0 to 1, not 2.0"),
                              ("--top-p", "nan", "must be from 0 to 1, not nan"),
                              ("--temperature", "-1", "must be from 0 to 1e+30, not -1.0"),
                              ("--temperature", "inf", "must be from 0 to 1e+30, not inf"),
                              ("--temperature", "hot", "not a number: 'hot'"),
                              ("--max-new-tokens", "0", "must be 1 or more, not 0"),
                              ("--stop", "", "an empty stop string")):
        assert f"argument {flag}: {says}" in usage_error_of(capsys, base + [flag, value])
    # and what argparse cannot see alone: flags that do not go together
    assert "linnet generate: error: --system needs --chat" in usage_error_of(capsys, base + ["--system", "be brief"])
    assert "linnet generate: error: --chat-template needs --chat" in usage_error_of(
        capsys, base + ["--chat-template", "{{ messages[0]['content'] }}"])
    assert "argument -c: must be 1 or more (auto or 0: the model's own context), not -5" in usage_error_of(
        capsys, base + ["-c", "-5"])
    assert "give one of --json-schema, --regex, --grammar" in usage_error_of(
        capsys, base + ["--regex", "a", "--grammar", 'root ::= "a"'])
    assert "--shards 2 spreads a JAX model over devices" in usage_error_of(capsys, ["serve", "tiny-llama", "--shards", "2"])
    assert "argument --stored-responses: must be 0 or more, not -1" in usage_error_of(
        capsys, ["serve", "tiny-llama", "--stored-responses", "-1"])


def test_an_empty_prompt_is_refused(capsys, gguf_path):
    for backend in ("torch", "jax"):
        err = error_of(capsys, ["generate", "smollm2-135m-instruct", "", "--backend", backend, "--max-seq", "64"])
        assert "the prompt is empty" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs it")
@pytest.mark.parametrize("argv", [["generate", "tiny-llama", "hi", "--weights", ""],
                                  ["generate", "tiny-llama", "hi", "--weights", "random", "--device", ""],
                                  ["serve", "tiny-llama", "--tokenizer", ""],
                                  ["export", "tiny-llama", "--to", "vllm", "--weights", "random", "-o", ""],
                                  ["export", "tiny-llama", "--to", "triton", "--weights", "random", "-o", "r",
                                   "--name", ""]])
def test_an_empty_path_or_device_is_its_flags_error(capsys, argv):
    # "" named the current folder (an export written into it, a checkpoint looked for there) or the default device
    assert "needs a path or a name, not an empty string" in usage_error_of(capsys, argv)


def test_chat_without_a_chat_template_says_what_to_do(capsys, tmp_path, gguf_path):
    from linnet.export import export

    folder = export(gguf_path, "vllm", tmp_path / "base", dtype="f32")
    Path(folder, "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    err = error_of(capsys, ["generate", folder, "hi", "--chat", "-n", "1", "--max-seq", "64"])
    assert "no chat template, which --chat needs (a base model): give one with --chat-template FILE, or leave " \
           "out --chat" in err


def test_a_device_this_process_lacks(capsys):
    err = error_of(capsys, ["generate", "tiny-llama", "hi", "--weights", "random", "--device", "cuda"])
    assert "--device cuda, but" in err and "use --device cpu" in err  # the flags, on the command line
    from linnet import nest
    from linnet.nest.errors import DeviceError

    with pytest.raises(DeviceError, match="JAX has no gpu devices here"):
        nest.load("tiny-llama", backend="jax", device="gpu", weights="random")
    with pytest.raises(DeviceError, match="JAX has 1 cpu device$"):
        nest.load("tiny-llama", backend="jax", device="cpu:3", weights="random")
    with pytest.raises(DeviceError, match="the CPU is one device"):  # torch would take it and ignore the 3
        nest.load("tiny-llama", backend="torch", device="cpu:3", weights="random")
    for other in ("mps", "xpu", "meta"):  # torch devices the runtime is not written for
        with pytest.raises(DeviceError, match="runs on 'cpu' and 'cuda'"):
            nest.load("tiny-llama", backend="torch", device=other, weights="random")


def test_a_seed_that_is_not_an_integer():
    from linnet import nest

    for seed in ("x", 1.5, None, True):
        with pytest.raises(TypeError, match="seed must be an integer, not"):
            nest.load("tiny-llama", weights="random", seed=seed)
    with pytest.raises(ValueError, match=r"seed must be 0 to 2\*\*63 - 1, not"):
        nest.load("tiny-llama", weights="random", seed=2 ** 70)


def test_arguments_of_the_wrong_kind_are_named_before_anything_is_read():
    from linnet import nest

    for kwargs, error, says in (
            (dict(cast_dtype="no"), TypeError, "cast_dtype must be True or False, not 'no'"),
            (dict(compile=1), TypeError, "compile must be True or False, not 1"),
            (dict(weights=123), TypeError, "weights must be a path"),
            (dict(tokenizer=3), TypeError, "tokenizer must be True, False or a path"),
            (dict(progress="no"), TypeError, "progress must be True, False or None .*, not 'no'"),
            (dict(backend="jax", shards="2"), TypeError, "shards must be an integer, not '2'"),
            (dict(generics=[("Batch", 1)]), TypeError, "generics must be a dict such as"),
            (dict(generics="Batch=8"), TypeError, "generics must be a dict such as"),
            (dict(device=0), TypeError, "device must be a device's name such as 'cpu'"),  # (torch's 0: cuda:0)
            (dict(device=""), TypeError, "device must be a device's name"),
            (dict(weights=""), ValueError, "weights must be a path, \"random\" or None, not ''")):
        with pytest.raises(error, match=says):
            nest.load("tiny-llama", **{"weights": "random", **kwargs})
    with pytest.raises(ValueError, match="name must be a card's name or a path, not ''"):
        nest.load("", weights="random")  # (the current directory, as a path)
    model = nest.load("tiny-llama", weights="random", tokenizer=None)  # None: the default, as transformers has it
    assert model.tokenizer is None
    with pytest.warns(UserWarning, match="numerics='exact' computes and stores in f32, whatever T; T='bf16'"):
        model = nest.load("tiny-llama", weights="random", generics={"T": "bf16"})
    assert model.dtype == "f32"


def test_a_port_out_of_range(capsys):
    assert "a port is 0 to 65535, not 99999" in usage_error_of(
        capsys, ["serve", "tiny-llama", "--weights", "random", "--port", "99999"])
    # vLLM's -tp 1 (one device) is taken with torch, so the next check, the port's, is what answers
    for one in (["-tp", "1"], ["--tensor-parallel-size", "1"]):
        assert "a port is 0 to 65535, not 99999" in usage_error_of(
            capsys, ["serve", "tiny-llama", "--weights", "random", *one, "--port", "99999"])


def test_a_parser_a_card_names_that_linnet_lacks(capsys, tmp_path):
    card = tmp_path / "odd.linnet"
    card.write_text(open(TINY).read() + '\nmeta {\n  tool_call_parser = "nonexistent"\n}\n')
    err = error_of(capsys, ["serve", str(card), "--weights", "random", "--batch", "1", "--max-seq", "32"])
    assert "its meta names the tool-call parser 'nonexistent'" in err and "hermes" in err


def test_a_path_that_is_not_there_is_not_called_an_unknown_card(capsys, tmp_path):
    err = error_of(capsys, ["generate", str(tmp_path / "no-such-model"), "hi"])
    assert f"{tmp_path / 'no-such-model'}: no such file or directory" in err and "unknown card" not in err


@pytest.mark.parametrize("argv", [["generate", "tiny-llama", "hi", "--max-seq", "0"],
                                  ["serve", "tiny-llama", "--batch", "0"],
                                  ["serve", "tiny-llama", "--max-model-len", "-5"],
                                  ["export", "tiny-llama", "--to", "triton", "--batch", "0"]])
def test_counts_below_one_are_flag_errors(capsys, argv):
    """A size the user typed is named by its flag, not as a generic at the card's first line."""
    err = usage_error_of(capsys, argv)
    assert "must be 1 or more" in err and argv[-2] in err


@pytest.mark.parametrize("argv", [["export", "tiny-llama", "--to", "vllm", "-o", "out", "--weights", "random",
                                   "--seed", "99999999999999999999"],
                                  ["generate", "tiny-llama", "hi", "--seed", "-2"],  # (-1: llama-cli's random one)
                                  ["serve", "tiny-llama", "--seed", "1.5"]])
def test_a_seed_the_generators_cannot_take_is_a_flag_error(capsys, argv):
    """torch's generator takes a signed 64-bit seed: past it, a flag error, not an overflow traceback."""
    assert "argument --seed" in usage_error_of(capsys, argv)


def test_a_token_budget_too_small_for_the_rows_is_one_line(capsys):
    assert main(["serve", "tiny-llama", "--weights", "random", "--backend", "jax", "--batch", "1",
                 "--token-budget", "12"]) == 1
    err = capsys.readouterr().err
    # (after the note of the MaxSeq chosen, as vLLM logs its max_model_len first)
    assert err.splitlines()[-1].startswith("linnet: error: token_budget (12) is too small for 1 rows: at least")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["check", "compile"])
@pytest.mark.parametrize("generic, needle", [("Batch=0", "generic `Batch` must be a positive integer, not '0'"),
                                             ("MaxSeq=abc", "generic `MaxSeq` must be a positive integer, not 'abc'"),
                                             ("T=f64", "generic `T` must be a float type (f32, bf16, f16; or as torch names them: "
                                                       "bfloat16, float16, half, float32, float), not 'f64'"),
                                             ("Seq=4", "unknown generic `Seq`"), ("T", "takes NAME=VALUE"),
                                             # a digit outside ASCII, which str.isdigit takes and int() may not
                                             ("Batch=\u00b3", "generic `Batch` must be a positive integer"),
                                             # rows and positions are i32: numpy's bound of the type
                                             (f"MaxSeq={np.iinfo(np.int32).max + 1}", "must be at most 2 ** 31 - 1"),
                                             (f"Batch={10 ** 20}", "must be at most 2 ** 31 - 1")])
def test_a_bad_generic_is_its_flags_error(capsys, command, generic, needle):
    """What the user typed is named by its flag, not reported as an error in the card's source."""
    err = usage_error_of(capsys, [command, TINY, "--generic", generic])
    assert "argument --generic" in err and needle in err and "tiny-llama.linnet:" not in err


def test_the_largest_size_an_i32_holds_is_taken(capsys):
    assert main(["compile", TINY, "--generic", f"MaxSeq={np.iinfo(np.int32).max}"]) == 0
    assert f"MaxSeq={np.iinfo(np.int32).max}" in capsys.readouterr().out


def test_ir_takes_no_generics(capsys):
    """It prints the checked IR, which no number is bound in: --generic and --numerics were taken and
    changed nothing."""
    for flag in (["--generic", "Batch=8"], ["--numerics", "fast"]):
        with pytest.raises(SystemExit, match="2"):  # (named by the command they were given to)
            main(["ir", TINY, *flag])
        assert f"linnet ir: error: unrecognized arguments: {' '.join(flag)}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_generic_given_twice_is_refused(capsys, command):
    """Which of two values was meant the command cannot know (it kept the last); the same one twice is
    no question."""
    err = usage_error_of(capsys, [command, TINY, "--generic", "Batch=2", "--generic", "Batch=3"])
    assert f"linnet {command}: error: --generic Batch is given twice: Batch=2 and Batch=3" in err
    assert main(["check", TINY, "--generic", "T=f32", "--generic", "T=f32"]) == 0


def test_generics_for_an_architecture_without_its_config_values_name_what_lacks(capsys):
    # an architecture alone is checked (ok); its numbers, with --generic, only through a card
    arch = str(TINY).replace("tiny-llama.linnet", "arch/llama.linnet")
    assert main(["check", arch]) == 0
    capsys.readouterr()
    err = usage_error_of(capsys, ["check", arch, "--generic", "Batch=8"])
    assert "config value `vocab` has no default" in err and "through a card that imports it" in err


def test_a_structure_file_that_is_not_there_or_not_json(capsys, tmp_path):
    pytest.importorskip("llguidance")
    args = ["generate", "smollm2-135m-instruct", "x", "--max-seq", "64", "--json-schema"]
    assert "--json-schema nope.json: no such file, nor a JSON schema" in usage_error_of(capsys, [*args, "nope.json"])
    broken = tmp_path / "broken.json"
    broken.write_text('{"type": "object",')
    assert f"--json-schema {broken}: not JSON (Expecting property name" in usage_error_of(capsys, [*args, str(broken)])


@pytest.mark.parametrize("flag, what", [("--json-schema", "a JSON schema"), ("--grammar", "a grammar")])
def test_a_structure_file_missing_a_folder_or_not_text(capsys, tmp_path, flag, what):
    """A grammar file's name mistyped was parsed as GBNF ("Expected ::= at line 1"), and a file that is
    not UTF-8 was a UnicodeDecodeError's traceback."""
    pytest.importorskip("llguidance")
    args = ["generate", "tiny-llama", "x", flag]
    missing = str(tmp_path / "yes-no.gbnf")
    assert f"{flag} {missing}: no such file, nor {what}" in usage_error_of(capsys, [*args, missing])
    assert f"{flag} {tmp_path}: a directory, not a file, nor {what}" in usage_error_of(capsys, [*args, str(tmp_path)])
    latin1 = tmp_path / "schema.txt"
    latin1.write_bytes('{"enum": ["café"]}'.encode("latin-1"))
    assert (f"{flag} {latin1}: not UTF-8 text (invalid continuation byte: byte 0xe9 at offset 14)"
            in usage_error_of(capsys, [*args, str(latin1)]))


@pytest.mark.parametrize("flag, value, needle", [
    ("--regex", "(", "--regex (: cannot hold an output to it: invalid regex \"(\""),
    ("--json-schema", '{"type": "nonsense"}', "cannot hold an output to it: Invalid type: nonsense"),
    ("--grammar", "start: foo", "cannot hold an output to it: at 1(8): unknown name: \"foo\""),
])
def test_a_structure_that_cannot_be_held_is_said_before_the_model_loads(capsys, flag, value, needle):
    """tiny-llama has no weights here: the structure's error comes first, with no grammar the user
    did not write (llguidance wraps a regex in one)."""
    pytest.importorskip("llguidance")
    err = usage_error_of(capsys, ["generate", "tiny-llama", "x", flag, value])
    assert needle in err and "weights" not in err
    assert flag == "--grammar" or "start:" not in err


def test_a_cpu_cap_the_kernels_do_not_know_is_one_line():
    # (in a process of its own: the kernels read the variable once)
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "linnet.cli", "generate", "smollm2-135m-instruct", "Hi",
                          "--max-new-tokens", "1", "--max-seq", "64"], capture_output=True, text=True,
                         env=dict(os.environ, LINNET_CPU_ISA="AVX3"))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "linnet: error: LINNET_CPU_ISA='AVX3': not one of avx2, avx512, avx512_bf16, amx" in run.stderr


def test_a_compile_cache_that_cannot_be_made_is_one_warning_and_the_run_goes_on(tmp_path):
    # JAX's own warning came at each executable, said "reading", and named an internal op
    import argparse
    import warnings

    import jax

    from linnet.cli import _use_compile_cache

    (tmp_path / "a_file").write_text("")
    before = jax.config.jax_compilation_cache_dir
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _use_compile_cache(argparse.Namespace(backend="jax", compile_cache=str(tmp_path / "a_file" / "xla")))
    assert len(seen) == 1 and "compiled executables are not kept this run" in str(seen[0].message)
    assert jax.config.jax_compilation_cache_dir == before  # left as it was: nothing set


@pytest.mark.parametrize("command", ["compile", "check", "ir", "cards", "generate", "serve", "export"])
def test_each_flag_says_what_it_is(capsys, command):
    """In `linnet COMMAND --help`, every flag and argument has its line of help (serve's
    --uvicorn-log-level and export's --to had none)."""
    import re

    with pytest.raises(SystemExit, match="0"):
        main([command, "--help"])
    # past the usage, up to the examples
    lines = capsys.readouterr().out.split("\n\n", 1)[-1].split("\nexamples:\n")[0].splitlines()
    for i, line in enumerate(lines):
        if re.fullmatch(r"  \S.*", line) and not re.search(r"\S  +\S", line.strip()):
            assert i + 1 < len(lines) and lines[i + 1].startswith(" " * 8), f"{line.strip()!r} has no help"


def test_the_examples_in_the_help_parse_and_every_other_spelling_is_named(capsys):
    """Each `linnet` line under a command's examples parses with that command's flags (they were
    run by hand: README's own), and each spelling that has no help line of its own (llama-cli's -n,
    --ctx-size, ...) is named in `--help`, where --system-prompt, --n-predict, --max-tokens and
    --ctx-size were not."""
    import argparse
    import shlex

    from linnet.cli import GENERATE_EXAMPLES, SERVE_EXAMPLES, build_parser

    parser = build_parser()
    text = (GENERATE_EXAMPLES + SERVE_EXAMPLES).replace("\\\n", " ")  # (a command continued on the next line)
    lines = [line.strip().split("| ", 1)[-1].split("  #")[0] for line in text.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("linnet ")]
    assert {argv[0] for argv in commands} == {"generate", "serve"} and len(commands) == 6
    for argv in commands:
        assert parser.parse_args(argv).command == argv[0]
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, command in subcommands.items():
        with pytest.raises(SystemExit, match="0"):
            main([name, "--help"])
        shown = " ".join(capsys.readouterr().out.split())
        for action in command._actions:
            if action.help == argparse.SUPPRESS and action.dest != argparse.SUPPRESS:  # (not a refusal)
                for flag in action.option_strings:
                    assert flag + "," in shown or flag + ")" in shown or flag + ";" in shown, (name, flag)


@pytest.mark.parametrize("argv, says", [
    (["generate", "tiny-llama", "hi", "--device", "tpu"], "linnet: error: --device tpu: not a torch device"),
    (["generate", "tiny-llama", "hi", "--device", "cpu:1"], "linnet: error: --device cpu:1, but the CPU is one device"),
    (["serve", "tiny-llama", "--weights", "random", "--device", "mps"], "linnet: error: --device mps: Linnet's torch "
                                                                        "backend runs on 'cpu' and 'cuda'"),
    (["serve", "tiny-llama", "--weights", "random", "--backend", "jax", "--shards", "64"],
     "linnet: error: --shards 64, but there "),
])
def test_a_device_that_cannot_be_had_is_named_by_its_flag(capsys, monkeypatch, argv, says):
    """As the user typed it (--device tpu), not as nest.load's argument (device='tpu')."""
    import linnet.cli as cli

    monkeypatch.setattr(cli, "_check_address", lambda host, port: None)
    assert says in error_of(capsys, argv)


def test_a_write_that_fails_once_the_file_is_open_names_the_file(capsys, tmp_path, monkeypatch):
    """`linnet compile -o FILE` where the write itself fails (/proc/version's EIO: the open succeeds):
    the error names the file, as it does where the open fails."""
    from pathlib import Path

    def failing(self, text, *args, **kwargs):
        raise OSError(5, "Input/output error")  # (what Python raises there: no filename)

    monkeypatch.setattr(Path, "write_text", failing)
    target = tmp_path / "out.py"
    assert main(["compile", "tiny-llama", "-o", str(target)]) == 1
    assert f"linnet: error: {target}: Input/output error" in capsys.readouterr().err
