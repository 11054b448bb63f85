"""`linnet export` on the command line: what it prints, and one line of error for what cannot be done."""

import json
import re
from pathlib import Path

import pytest

from linnet.cli import main


def test_writes_and_says_how_to_serve(tmp_path, capsys):
    assert main(["export", "tiny-llama", "--to", "vllm", "-o", str(tmp_path / "m"), "--weights", "random"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'm'}" in out and f"vllm serve {tmp_path / 'm'}" in out
    assert json.loads((tmp_path / "m" / "config.json").read_text())["torch_dtype"] == "bfloat16"



@pytest.mark.parametrize("given, stored", [("float16", "F16"), ("half", "F16"), ("float32", "F32"), ("bfloat16", "BF16")])
def test_export_takes_vllms_dtype_names(tmp_path, given, stored):
    """As `serve --dtype` does: the safetensors file's own header says what was written."""
    import struct

    assert main(["export", "tiny-llama", "--to", "vllm", "-o", str(tmp_path / "m"), "--weights", "random",
                 "--dtype", given]) == 0
    raw = (tmp_path / "m" / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    assert {entry["dtype"] for name, entry in header.items() if name != "__metadata__"} == {stored}

def test_triton_repository(tmp_path, capsys):
    assert main(["export", "tiny-llama", "--to", "triton", "-o", str(tmp_path), "--weights", "random",
                 "--batch", "8", "--max-seq", "256", "--name", "tiny"]) == 0
    assert f"tritonserver --model-repository {tmp_path}" in capsys.readouterr().out
    config = (tmp_path / "tiny" / "config.pbtxt").read_text()
    assert 'name: "tiny"' in config and 'key: "batch" value: { string_value: "8" }' in config
    assert (tmp_path / "tiny" / "1" / "model.py").read_text().count("TritonPythonModel") == 1


def test_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    cases = [
        (["no-such-card", "--to", "vllm"], "unknown card 'no-such-card'"),
        (["tiny-gpt-oss", "--to", "llama.cpp", "--weights", "random"], "llama.cpp needs a tokenizer"),
        (["llama-3.1-8b-instruct", "--to", "vllm"], "hf download meta-llama/Llama-3.1-8B-Instruct"),
        (["tiny-llama", "--to", "triton", "--weights", str(tmp_path / "nowhere")], "no such checkpoint"),
    ]
    for args, message in cases:
        assert main(["export", *args, "-o", str(tmp_path / "out")]) == 1, args
        err = capsys.readouterr().err
        assert err.startswith("linnet: error: ") and message in err, (args, err)
        assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    # flags that do not go together: argparse's answer (the usage, then the line; exit status 2)
    with pytest.raises(SystemExit, match="2"):
        main(["export", "tiny-llama", "--to", "vllm", "--weights", "random", "--batch", "4", "--name", "x", "-o",
              str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert err.startswith("usage: linnet export") and "linnet export: error: --name, --batch: for --to triton only" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_weights_whose_own_tokenizer_cannot_be_read_are_refused(tmp_path, capsys):
    """A tokenizer.json cut short (a download that stopped) beside sound weights: a load warns and
    goes on without it, and the export wrote a vLLM folder or a Triton model with no tokenizer
    (exit 0) or refused a GGUF as coming without one. Now one line naming the file, for every
    target, and nothing written; another tokenizer given in its place is taken."""
    src = tmp_path / "src"
    assert main(["export", "tiny-llama", "--to", "vllm", "-o", str(src), "--weights", "random", "--dtype", "f32"]) == 0
    (src / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a"')
    capsys.readouterr()
    for target in ("vllm", "llama.cpp", "triton"):
        assert main(["export", "tiny-llama", "--to", target, "--weights", str(src), "-o", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"linnet: error: {src / 'tokenizer.json'}: cannot load (") and err.count("\n") == 1, err
        assert "Traceback" not in err and not (tmp_path / "out").exists(), target
    tok = tmp_path / "tok"  # a sound one of the same words, in its place
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1}, "unk_token": "a"},
        "pre_tokenizer": {"type": "Whitespace"}, "added_tokens": []}))
    assert main(["export", "tiny-llama", "--to", "vllm", "--weights", str(src), "--tokenizer", str(tok), "-o",
                 str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "tokenizer.json").read_text())["model"]["vocab"] == {"a": 0, "b": 1}


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_the_weights_own_tokenizer_is_read_once(tmp_path, monkeypatch):
    """It is read to refuse one that cannot be read before the weights are (`check_own_tokenizer`), and that
    one is written: it had been read again with the weights (0.3-0.5 s a real model's)."""
    from linnet.nest.tokenizer import Tokenizer

    src = tmp_path / "src"
    assert main(["export", "tiny-llama", "--to", "vllm", "-o", str(src), "--weights", "random", "--dtype", "f32"]) == 0
    vocab = {"a": 0, "b": 1}
    (src / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "a"},
        "pre_tokenizer": {"type": "Whitespace"}, "added_tokens": []}))
    reads = []
    read = Tokenizer.from_dir.__func__
    monkeypatch.setattr(Tokenizer, "from_dir", classmethod(lambda cls, path: reads.append(path) or read(cls, path)))
    assert main(["export", "tiny-llama", "--to", "vllm", "--weights", str(src), "-o", str(tmp_path / "out")]) == 0
    assert reads == [src] and json.loads((tmp_path / "out" / "tokenizer.json").read_text())["model"]["vocab"] == vocab


def test_the_model_py_is_clean_python(tmp_path):
    import ast

    from linnet.export.triton import write_repository

    model_dir = write_repository("tiny-llama", tmp_path, weights="random", name="tiny")
    source = open(f"{model_dir}/1/model.py").read()
    assert source.startswith('"""Triton')
    tree = ast.parse(source)
    assert [n.names[0].name for n in tree.body if isinstance(n, ast.ImportFrom)] == ["TritonPythonModel"]


def test_a_triton_model_is_named_by_the_whole_card_name(tmp_path, recwarn):
    """Card names hold dots (llama-3.1-8b-instruct): the model is not cut to `llama-3`. Nothing is
    loaded, so a big card costs nothing here; random weights, which take the tokenizer of the card's own
    weights, warn that those are not on this machine."""
    from linnet.export.triton import write_repository

    model_dir = write_repository("llama-3.2-1b-instruct", tmp_path, weights="random")
    assert model_dir.endswith("llama-3.2-1b-instruct")
    assert 'name: "llama-3.2-1b-instruct"' in (tmp_path / "llama-3.2-1b-instruct" / "config.pbtxt").read_text()
    assert any("which are not on this machine, and the Triton model takes text" in str(w.message) for w in recwarn)


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_a_seed_is_refused_where_no_weights_are_drawn(tmp_path, capsys):
    """--seed draws random weights and nothing else: with weights that are read (the card's own, a
    checkpoint) it would be dropped without a word, so it is argparse's error (exit 2), for each
    target, before anything is read or written. With --weights random it chooses the weights."""
    import torch
    from safetensors.torch import load_file

    from linnet.export import ExportError, export

    src = tmp_path / "src"
    assert main(["export", "tiny-llama", "--to", "vllm", "-o", str(src), "--weights", "random", "--seed", "3",
                 "--dtype", "f32"]) == 0
    capsys.readouterr()
    for target, weights in (("vllm", ["--weights", str(src)]), ("llama.cpp", ["--weights", str(src)]),
                            ("triton", ["--weights", str(src)]), ("vllm", [])):
        with pytest.raises(SystemExit, match="2"):
            main(["export", "tiny-llama", "--to", target, *weights, "--seed", "7", "-o", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert err.startswith("usage: linnet export") and "error: --seed: for --weights random only" in err, err
        assert not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match="seed 7: a seed draws random weights"):
        export("tiny-llama", "vllm", tmp_path / "out", weights=src, seed=7)
    assert not (tmp_path / "out").exists()
    # the seed is what draws them: another gives other weights, the same the same ones
    drawn = {}
    for seed in (3, 4):
        out = tmp_path / f"seed{seed}"
        assert main(["export", "tiny-llama", "--to", "vllm", "-o", str(out), "--weights", "random", "--seed",
                     str(seed), "--dtype", "f32"]) == 0
        drawn[seed] = load_file(out / "model.safetensors")
    first = load_file(src / "model.safetensors")
    assert all(torch.equal(first[k], drawn[3][k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], drawn[4]["model.embed_tokens.weight"])


@pytest.mark.parametrize("flag, says", [("--outtype", "use --dtype"), ("--outfile", "use -o")])
def test_convert_hf_to_ggufs_flags_name_linnets(tmp_path, capsys, flag, says):
    """llama.cpp's convert_hf_to_gguf.py spells the type and the file --outtype and --outfile."""
    with pytest.raises(SystemExit, match="2"):
        main(["export", "tiny-llama", "--to", "llama.cpp", "-o", str(tmp_path / "x.gguf"), flag, "f16"])
    assert f"linnet export: error: {flag} is not taken here: {says}" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
@pytest.mark.parametrize("target", ["vllm", "llama.cpp", "triton"])
def test_a_path_no_folder_can_be_made_at_is_said_before_the_weights_are_read(tmp_path, capsys, target):
    """A link to a folder that is not there (a drive not mounted, say), a folder under it, and a name
    longer than the file system takes: one line that says why, before the weights (which could not
    be read here) are read, and nothing made."""
    from linnet.export import export

    broken = export("tiny-llama", "vllm", tmp_path / "broken", weights="random", dtype="f32")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not safetensors")
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(tmp_path / "unmounted")
    cases = [(out / "link", r"link.* is a link to .*unmounted, which is not there"),
             (out / "link" / "sub", r"link.* is a link to .*unmounted, which is not there"),
             (out / "a" / ("x" * 300), "a name of 300 bytes, longer than the 255 its file system takes"),
             (out / ("x" * 300), r"cannot write there \(File name too long\)")]
    if target == "llama.cpp":  # the file's own name
        cases.append((out / ("x" * 250 + ".gguf"), "a name of 263 bytes, longer than the 255"))
    for path, says in cases:
        assert main(["export", "tiny-llama", "--to", target, "-o", str(path), "--weights", broken]) == 1, path
        err = capsys.readouterr().err
        assert err.startswith(f"linnet: error: {path}: ") and re.search(says, err) and err.count("\n") == 1, err
    assert [p.name for p in out.iterdir()] == ["link"] and not (tmp_path / "unmounted").exists()


@pytest.mark.parametrize("dtype", ["q4_0", "Q4_K_M", "iq4_xs"])
def test_a_quantized_type_is_refused_with_how_to_make_one(tmp_path, capsys, dtype):
    """llama.cpp's types (llama-quantize's names) other than Q8_0, which its converter writes too: the
    export says how to quantize the F16 file it writes; nothing is written. Its own types are still taken."""
    from linnet.export import ExportError, export

    out = tmp_path / "x.gguf"
    with pytest.raises(SystemExit, match="2"):
        main(["export", "tiny-llama", "--to", "llama.cpp", "-o", str(out), "--weights", "random", "--dtype", dtype])
    err = capsys.readouterr().err
    name = dtype.upper()
    assert err.startswith("usage: linnet export") and f"linnet export: error: argument --dtype: {dtype!r} is a " \
        f"llama.cpp quantized type that the export does not write (it writes bf16, f16, f32, q8_0; q8_0 to " \
        f"llama.cpp only)" in err and f"llama-quantize OUT.F16.gguf OUT.{name}.gguf {name}" in err, err
    with pytest.raises(ExportError, match=f"llama-quantize OUT.F16.gguf OUT.{name}.gguf {name}"):
        export("tiny-llama", "llama.cpp", out, weights="random", dtype=dtype)
    with pytest.raises(ExportError, match=r"unknown dtype 'f8'; one of bf16, f16, f32, q8_0$"):  # not llama.cpp's
        export("tiny-llama", "llama.cpp", out, weights="random", dtype="f8")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["vllm", "triton"])
def test_q8_0_is_written_to_llama_cpp_only(tmp_path, capsys, target):
    """Q8_0 is a GGUF block type: a vLLM directory (safetensors) and a Triton repository (served by
    Linnet from the weights where they are) are refused it before anything is read or written."""
    out = tmp_path / "out"
    assert main(["export", "tiny-llama", "--to", target, "-o", str(out), "--weights", "random", "--dtype",
                 "Q8_0"]) == 1
    err = capsys.readouterr().err
    assert err == (f"linnet: error: dtype 'q8_0': llama.cpp's block type, written to a GGUF only (--to llama.cpp); "
                   f"a {target} export holds weights in bf16, f16, f32\n"), err
    assert list(tmp_path.iterdir()) == []


GPT2 = Path(__file__).parents[1] / "compiler" / "from_the_doc" / "gpt2.linnet"  # an architecture of the user's


@pytest.mark.parametrize("target", ["vllm", "llama.cpp"])
def test_a_card_no_other_server_knows_is_sent_to_triton(tmp_path, capsys, target):
    """GPT-2 written in .linnet by a newcomer (its own config names, `arch gpt2` as Linnet's built-in is
    named): neither vLLM's config.json nor llama.cpp's GGUF, written for the built-in, is written for it, and
    the one line says so before the weights are read, pointing to the target that runs any card."""
    assert main(["export", str(GPT2), "--to", target, "-o", str(tmp_path / "out"), "--weights", "random"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("linnet: error: ") and err.count("\n") == 1, err
    assert "'gpt2'" in err and err.rstrip().endswith("(export it with --to triton, which runs any card on "
                                                      "Linnet's own engine)"), err
    assert list(tmp_path.iterdir()) == []
