"""Generated code is a product: deterministic, importable on its own, and traceable to its source.

`linnet compile` is run in-process (`linnet.cli.main`) and as a command in
fresh interpreters with different hash seeds; the file it writes is loaded
by path in a fresh interpreter and run; and its `# llama.linnet:<line>`
comments are held against the lines of llama.linnet.
"""

from __future__ import annotations

import functools
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyflakes.api
import pytest
import torch
from pyflakes.reporter import Reporter

from linnet import cli
from linnet.compiler import BACKENDS, check_file, compile_file, generate, import_source
from linnet.frontend.load import load_source
from linnet.ir.specialize import specialize
from linnet.nest.bind import bind_weights

GENERIC_ARGS = ["--generic", "Batch=3", "--generic", "MaxSeq=24"]
GENERICS = {"Batch": 3, "MaxSeq": 24}
CARDS_DIR = Path(__file__).resolve().parents[2] / "linnet" / "nest" / "cards"


def compile_args(kit, backend, card="tiny-llama", numerics="exact"):
    return ["compile", str(kit.CARDS / f"{card}.linnet"), "--backend", backend, "--numerics", numerics, *GENERIC_ARGS]


def run_cli(kit, backend, capsys, **kw) -> str:
    assert cli.main(compile_args(kit, backend, **kw)) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


@pytest.fixture(scope="module")
def sources(kit):
    """{backend: source} of tiny-llama as the library generates it."""
    module = check_file(kit.CARDS / "tiny-llama.linnet")
    return {b: generate(module, b, GENERICS) for b in BACKENDS}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("card", ["tiny-llama", "tiny-llama-tied"])
@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_compile_is_deterministic_in_process(backend, card, numerics, kit, capsys, tmp_path):
    first = run_cli(kit, backend, capsys, card=card, numerics=numerics)
    second = run_cli(kit, backend, capsys, card=card, numerics=numerics)
    assert first == second and first.strip()
    out = tmp_path / "model.py"
    assert cli.main(compile_args(kit, backend, card=card, numerics=numerics) + ["-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert out.read_bytes() == first.encode()
    compile(first, str(out), "exec")  # valid Python


@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_compile_says_when_t_does_not_apply(numerics, kit, capsys):
    """Exact numerics compute in f32: a T=bf16 asked for with them is named in a note, not dropped silently."""
    assert cli.main(compile_args(kit, "jax", numerics=numerics) + ["--generic", "T=bf16"]) == 0
    out, err = capsys.readouterr()
    if numerics == "exact":
        assert "T=f32" in out and "exact numerics compute in f32; T=bf16 takes effect with --numerics fast" in err
    else:
        assert "T=bf16" in out and err == ""


def test_compile_is_deterministic_across_processes(kit, sources, tmp_path):
    """The command in fresh interpreters, under different hash seeds, writes the same bytes as the library."""
    seeds = [s for s in ("0", "4242", "7") if s != os.environ.get("PYTHONHASHSEED")]  # not this process's
    for backend, seed in zip(BACKENDS, seeds):
        out = tmp_path / f"generated_{backend}.py"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-m", "linnet.cli", *compile_args(kit, backend), "-o", str(out)],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes() == sources[backend].encode()


RUNNER = textwrap.dedent("""
    import importlib.util, sys
    import numpy as np
    import torch

    out = {}
    weights = dict(np.load(sys.argv[1]))
    for backend, path in (("torch", sys.argv[2]), ("jax", sys.argv[3])):
        spec = importlib.util.spec_from_file_location("generated_" + backend, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        model = mod.Model({k: torch.from_numpy(v) for k, v in weights.items()})
        tokens = np.array([5, 6, 7, 8, 9], np.int32)
        positions = np.array([0, 1, 2, 0, 1], np.int32)
        rows = np.array([0, 0, 0, 2, 2], np.int32)
        out[backend + "_prefill"] = np.asarray(model.prefill(tokens, positions, rows, np.array([2, 4], np.int32)))
        model.copy_rows(np.array([0], np.int32), np.array([1], np.int32), np.array([3], np.int32))
        out[backend + "_decode"] = np.asarray(model.decode(np.array([10, 10, 11], np.int32),
                                                           np.array([3, 3, 2], np.int32)))
    np.savez(sys.argv[4], **out)
    print("ran", " ".join(sorted(out)))
""")


def test_written_file_runs_on_its_own(kit, tmp_path):
    """`linnet compile -o` output, loaded by path in a fresh interpreter, runs prefill, copy_rows and decode."""
    paths = {}
    for backend in BACKENDS:
        paths[backend] = tmp_path / f"tiny_llama_{backend}.py"
        assert cli.main(compile_args(kit, backend) + ["-o", str(paths[backend])]) == 0
    module = check_file(kit.CARDS / "tiny-llama.linnet")
    spec = specialize(module, GENERICS)
    weights = bind_weights(spec, kit.random_checkpoint(spec, seed=21).__getitem__)
    np.savez(tmp_path / "weights.npz", **{k: v.numpy() for k, v in weights.items()})
    (tmp_path / "runner.py").write_text(RUNNER)
    proc = subprocess.run([sys.executable, "runner.py", "weights.npz", str(paths["torch"]), str(paths["jax"]),
                           "out.npz"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ran", "jax_decode", "jax_prefill", "torch_decode", "torch_prefill"]
    got = dict(np.load(tmp_path / "out.npz"))
    assert got["torch_prefill"].shape == got["jax_prefill"].shape == (2, 128)
    assert got["torch_decode"].shape == got["jax_decode"].shape == (3, 128)

    # the same steps in this process: row 1 decodes from its copy of row 0, so it must equal row 0
    model = import_source(paths["torch"].read_text()).Model(weights)
    prefill = model.prefill(*kit.as_inputs("torch", [5, 6, 7, 8, 9], [0, 1, 2, 0, 1], [0, 0, 0, 2, 2], [2, 4]))
    model.copy_rows(*kit.as_inputs("torch", [0], [1], [3]))
    decode = model.decode(*kit.as_inputs("torch", [10, 10, 11], [3, 3, 2]))
    for backend in BACKENDS:
        assert kit.rel_err(got[backend + "_prefill"], prefill) <= 1e-5
        assert kit.rel_err(got[backend + "_decode"], decode) <= 1e-5
        assert kit.rel_err(got[backend + "_decode"][1], got[backend + "_decode"][0]) <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_that_do_not_fit_the_params_are_refused_naming_the_param(backend, kit):
    """The generated Model(weights), as a user who imports `linnet compile`'s output calls it: a param missing from
    the weights, or given in another shape or type, is refused with the param's name and what it must be."""
    module = check_file(kit.CARDS / "tiny-llama.linnet")
    spec = specialize(module, GENERICS)
    weights = {k: v.numpy() for k, v in bind_weights(spec, kit.random_checkpoint(spec, seed=3).__getitem__).items()}
    model_class = import_source(generate(module, backend, GENERICS)).Model
    shape = list(weights["wq"].shape)
    if backend == "torch":
        weights = {k: torch.from_numpy(v) for k, v in weights.items()}
    cases = {"missing": ({k: v for k, v in weights.items() if k != "wq"}, KeyError,
                         f"no weights for param `wq` {shape} f32"),
             "shape": ({**weights, "wq": weights["wq"][:, :-1]}, ValueError,
                       f"param `wq` must be {shape}, but the weights given are {[shape[0], shape[1] - 1, shape[2]]}"),
             "type": ({**weights, "wq": weights["wq"].astype(np.float16) if backend == "jax"
                       else weights["wq"].half()}, TypeError, "param `wq` must be f32, but the weights given are")}
    for given, error, message in cases.values():
        with pytest.raises(error, match=re.escape(message)):
            model_class(given)

# ---------------------------------------------------------------- source comments

# the statement's line; and where its value is an inlined fn's result, the line that returns it (and
# those of fns inlined within it)
COMMENT = re.compile(r"^\s*# (llama\.linnet):(\d+)(?: \(value from llama\.linnet:(\d+)(?:, llama\.linnet:\d+)*\))?"
                     r"(?: \((\w+), called at llama\.linnet:(\d+)\))?$")
WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
# names of the generated code's libraries, not of the model
PLUMBING = {"self", "rt", "F", "torch", "jax", "jnp", "nn", "params", "at", "set", "to", "astype", "range",
            "reshape", "shape", "float32", "int32", "dtype", "device", "arange", "return", "in", "for", "None"}
# what a generated statement must find on the line its comment names
STATEMENTS = {
    "torch": [
        (r"rt\.put_\(self\.k_cache, \(l, rows, positions\), k\)$", "k_cache[l, rows, positions] = k"),
        (r"rt\.put_\(self\.v_cache, \(l, rows, positions\), v\)$", "v_cache[l, rows, positions] = v"),
        (r"a = rt\.attention\(q, self\.k_cache\[l\]", "a = attention(q, k_cache[l], v_cache[l], positions"),
        (r"q = rt\.rope\(", "q = rotate(query_heads(h, l)"),
        (r"k = rt\.rope\(", "k = rotate(key_heads(h, l)"),
        (r"h = rt\.rmsnorm\(x, self\.attn_norm\[l\]", "h = rmsnorm(x, attn_norm[l]"),
        (r"h = rt\.rmsnorm\(x, self\.mlp_norm\[l\]", "h = rmsnorm(x, mlp_norm[l]"),
        (r"x = x \+ rt\.linear\(rt\.silu_mul", "x = x + mlp(h, l)"),  # the MLP fn, inlined where it is called
        (r"for l in range\(layers\):", "for l in layers {"),
        (r"return rt\.linear\(x\[last\], self\.lm_head\)", "return linear(x[last], lm_head) as f32"),
        (r"return rt\.linear\(x, self\.lm_head\)", "return linear(x, lm_head) as f32"),
        (r"rt\.copy_rows_\(self\.k_cache", "k_cache = copy_rows(k_cache, src, dst, upto)"),
        (r"rt\.copy_rows_\(self\.v_cache", "v_cache = copy_rows(v_cache, src, dst, upto)"),
    ],
    "jax": [
        (r"k_cache = rt\.put\(k_cache, \(l, rows, positions\), k\)$", "k_cache[l, rows, positions] = k"),
        (r"v_cache = rt\.put\(v_cache, \(l, rows, positions\), v\)$", "v_cache[l, rows, positions] = v"),
        (r"a = rt\.attention\(q, rt\.layer\(k_cache, l\), rt\.layer\(v_cache, l\)", "a = attention(q, k_cache[l], v_cache[l], positions"),
        (r"q = rt\.rope\(", "q = rotate(query_heads(h, l)"),
        (r"k = rt\.rope\(", "k = rotate(key_heads(h, l)"),
        (r"h = rt\.rmsnorm\(x, params\[\"attn_norm\"\]\[l\]", "h = rmsnorm(x, attn_norm[l]"),
        (r"h = rt\.rmsnorm\(x, params\[\"mlp_norm\"\]\[l\]", "h = rmsnorm(x, mlp_norm[l]"),
        (r"x = x \+ rt\.linear\(jax\.nn\.silu", "x = x + mlp(h, l)"),  # the MLP fn, inlined where it is called
        (r"def loop_l\(l, carry\):", "for l in layers {"),  # the layer loop's body, compiled once (rt.loop)
        (r"= rt\.loop\(layers, loop_l, ", "for l in layers {"),
        (r"return rt\.linear\(x\[last\], params\[\"lm_head\"\]\)", "return linear(x[last], lm_head) as f32"),
        (r"return rt\.linear\(x, params\[\"lm_head\"\]\)", "return linear(x, lm_head) as f32"),
        (r"k_cache = rt\.copy_rows\(k_cache", "k_cache = copy_rows(k_cache, src, dst, upto)"),
        (r"v_cache = rt\.copy_rows\(v_cache", "v_cache = copy_rows(v_cache, src, dst, upto)"),
    ],
}


# the same for any file: an architecture that extends another has code from both
ANY_COMMENT = re.compile(r"^\s*# ([\w.-]+\.linnet):(\d+)(?: \(value from ([\w.-]+\.linnet:\d+(?:, [\w.-]+\.linnet:\d+)*)\))?"
                         r"(?: \((\w+), called at [\w.-]+\.linnet:(\d+)\))?$")


def commented_statements(source: str, comment: re.Pattern = COMMENT) -> list:
    """[(line number named by the comment, generated statement)] for every statement under a comment
    (with ANY_COMMENT, [((file, line number, the "value from" places), statement)])."""
    out, current, depth = [], None, None
    for text in source.splitlines():
        m = comment.match(text)
        if m:
            values = tuple((f, int(n)) for f, n in (v.split(":") for v in (m.group(3) or "").split(", ") if v)) \
                if comment is ANY_COMMENT else ()
            current = int(m.group(2)) if comment is COMMENT else (m.group(1), int(m.group(2)), values)
            depth = len(text) - len(text.lstrip())
            continue
        indent = len(text) - len(text.lstrip())
        if text.strip() == "return None" or text.strip().endswith(" = carry"):
            continue  # code's own plumbing (an entry without a result; a compiled loop's carry), no source
        if current is not None and text.strip() and indent >= depth:
            out.append((current, text.strip()))
        else:  # a line less indented, or a blank one (a module-level table's comment ends with its line)
            current = None
    return out


def assert_names_its_line(lines: list, name: str, line: int, stmt: str, also: tuple = ()) -> None:
    """Line `line` of a file (`lines`, named `name`) is code, and shares a name with `stmt`, or one of
    `also`'s lines does ([(lines, line)]: where an inlined fn's result comes from, `return f(...)` in an
    entry being a call whose value the fn's return line writes)."""
    assert 1 <= line <= len(lines), f"{name}:{line} does not exist ({stmt})"
    text = lines[line - 1].split("#")[0]
    assert text.strip(), f"{name}:{line} is blank or a comment, yet names `{stmt}`"
    names = set(WORD.findall(stmt.replace('params["', "").replace('"]', ""))) - PLUMBING
    shared = set(WORD.findall(text)).union(*(WORD.findall(other[n - 1].split("#")[0]) for other, n in also))
    assert names & shared, f"{name}:{line} `{text.strip()}` shares nothing with `{stmt}`"


@pytest.mark.parametrize("backend", BACKENDS)
def test_comments_name_the_source_lines(backend, kit, sources):
    source = sources[backend]
    arch = kit.ARCH.read_text().splitlines()
    pairs = commented_statements(source)
    assert len(pairs) >= 30, "the generated code has lost its source comments"
    assert set(re.findall(r"# ([\w.-]+\.linnet):\d+", source)) == {"llama.linnet"}

    for line, stmt in pairs:  # every comment names a statement line, one sharing a name with the code
        assert_names_its_line(arch, "llama.linnet", line, stmt)

    for pattern, expected in STATEMENTS[backend]:  # and the statements that matter name exactly their line
        hits = [(line, stmt) for line, stmt in pairs if re.search(pattern, stmt)]
        assert hits, f"no generated statement matches {pattern!r}"
        for line, stmt in hits:
            assert expected in arch[line - 1], f"`{stmt}` is said to come from llama.linnet:{line}: " \
                                              f"`{arch[line - 1].strip()}`, not `{expected}`"


TINY_CARDS = sorted(p.stem for p in CARDS_DIR.glob("tiny-*.linnet"))


@functools.cache
def tiny_source(card: str, backend: str) -> str:
    return generate(check_file(CARDS_DIR / f"{card}.linnet"), backend, GENERICS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("card", TINY_CARDS)
def test_every_architectures_comments_name_their_source_lines(card, backend):
    """Every built-in architecture (through a tiny card that imports it; the others share these):
    each comment names a line of the file it names that is code, and shares a name with the statement
    under it, whichever file of an extension's chain that line is in."""
    source = tiny_source(card, backend)
    pairs = commented_statements(source, ANY_COMMENT)
    assert len(pairs) >= 25, "the generated code has lost its source comments"
    names = {f for (f, _, values), _ in pairs for f in [f, *(v for v, _ in values)]}
    files = {name: (CARDS_DIR / "arch" / name).read_text().splitlines() for name in names}
    for (name, line, values), stmt in pairs:
        assert_names_its_line(files[name], name, line, stmt, [(files[f], n) for f, n in values])
        for f, n in values:  # where a value comes from is an inlined fn's return, not an argument's line
            assert files[f][n - 1].lstrip().startswith("return "), (f"`{stmt}`'s value is said to come from "
                                                                    f"{f}:{n}: `{files[f][n - 1].strip()}`")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("card", TINY_CARDS)
def test_every_architectures_code_passes_pyflakes(card, backend):
    """The generated code imports and binds only what it reads (pyflakes finds no unused import, no
    unread local such as an entry's `K`, no undefined name), as a reader's own linter would want it."""
    report = io.StringIO()
    warnings = pyflakes.api.check(tiny_source(card, backend), f"{card}_{backend}.py", Reporter(report, report))
    assert warnings == 0, report.getvalue()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inlined_fns_result_names_the_line_that_returns_it(backend, kit, sources):
    # `x = layers_forward(...)` ends in the fn's `return rmsnorm(x, norm, ...)`: the final norm's
    # comment names both lines
    arch = kit.ARCH.read_text().splitlines()
    lines = sources[backend].splitlines()
    norms = [i for i, text in enumerate(lines) if re.search(r"x = rt\.rmsnorm\(x, (self\.norm|params\[.norm.\])", text)]
    assert norms
    for i in norms:
        m = COMMENT.match(lines[i - 1])
        assert m and m.group(3), lines[i - 1]
        assert "layers_forward(" in arch[int(m.group(2)) - 1] and "return rmsnorm(x, norm" in arch[int(m.group(3)) - 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fns_inlined_within_an_inlined_fn_name_their_lines_too(backend, kit):
    # qwen3's q is llama's `rotate(query_heads(h, l), positions)`, where rotate is llama's and
    # query_heads qwen3's own (its q_norm): the comment names both returns, rotate's first
    source = generate(check_file(kit.CARDS / "tiny-qwen3.linnet"), backend, GENERICS).splitlines()
    files = {name: (kit.ARCH.parent / name).read_text().splitlines() for name in ("llama.linnet", "qwen3.linnet")}
    for name, fn in (("q", "query_heads"), ("k", "key_heads")):
        found = [i for i, text in enumerate(source) if text.strip().startswith(f"{name} = rt.rope(rt.rmsnorm(")]
        assert len(found) == 2, found  # prefill's and decode's
        m = ANY_COMMENT.match(source[found[0] - 1])
        assert source[found[1] - 1] == source[found[0] - 1]
        i = found[0]
        assert m and m.group(1) == "llama.linnet", source[i - 1]
        assert f"{name} = rotate({fn}(h, l)" in files["llama.linnet"][int(m.group(2)) - 1]
        returns = [place.split(":") for place in m.group(3).split(", ")]
        assert [(f, files[f][int(n) - 1].strip().split("(")[0]) for f, n in returns] == \
            [("llama.linnet", "return rope"), ("qwen3.linnet", "return rmsnorm")], source[i - 1]
        defs = [files["qwen3.linnet"][j].strip() for j in range(int(returns[1][1]) - 1, -1, -1)
                if files["qwen3.linnet"][j].startswith("fn ")]
        assert defs[0].startswith(f"fn {fn}<"), defs[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inlined_fns_body_names_the_fn_and_its_call_where_it_begins(backend, kit, sources):
    # the layer loop is `layers_forward`'s first statement, inlined into each entry at the line
    # that calls it; the lines after it name only their own line
    arch = kit.ARCH.read_text().splitlines()
    marked = [COMMENT.match(t) for t in sources[backend].splitlines() if "called at" in t]
    assert len(marked) == 2 and all(marked)  # prefill's and decode's
    for m in marked:
        assert m.group(4) == "layers_forward" and arch[int(m.group(2)) - 1].strip() == "for l in layers {"
        assert "layers_forward(embed[tokens]" in arch[int(m.group(5)) - 1]


def test_comments_follow_the_source_when_it_moves(kit, tmp_path):
    """Lines are read from the source, not fixed: shift llama.linnet down and the comments shift with it."""
    shifted = tmp_path / "arch"
    shifted.mkdir()
    (shifted / "llama.linnet").write_text("# one\n# two\n\n" + kit.ARCH.read_text())
    card = tmp_path / "tiny-llama.linnet"
    card.write_text((kit.CARDS / "tiny-llama.linnet").read_text())
    before = generate(check_file(kit.CARDS / "tiny-llama.linnet"), "torch", GENERICS)
    after = generate(check_file(card), "torch", GENERICS)
    assert after == re.sub(r"llama\.linnet:(\d+)", lambda m: f"llama.linnet:{int(m.group(1)) + 3}", before)


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_compile_check_and_ir_take_a_checkpoint_as_generate_does(kit, sources, capsys, tmp_path):
    """A model directory is read as `generate` and `serve` read it: through the card written from its
    config, which `check` checks, `ir` prints and `compile` compiles; the module's docstring names that
    card whole. tiny-llama's export holds its values, so the code is tiny-llama's, its names aside."""
    from linnet.export import export

    folder = Path(export("tiny-llama", "vllm", tmp_path / "Tiny Llama", weights="random", dtype="f32"))
    assert cli.main(["check", str(folder)]) == 0
    assert capsys.readouterr().out == f"{folder}: ok (12 params, 3 entries)\n"
    assert cli.main(["ir", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "module llama" in printed and "w=wq[l]" in printed  # an index as the source writes it (not `index(l, x=wq)`)
    assert cli.main(["compile", str(folder), "--backend", "torch", *GENERIC_ARGS]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f'"""PyTorch module of `Tiny-Llama`, generated by Linnet from <card for {folder}> and '
                          f'llama.linnet.')
    strip = lambda source: re.sub(r"(?s)^\"\"\".*?\"\"\"|  # .*", "", source)  # noqa: E731  (docstring, comments)
    assert strip(out) == strip(sources["torch"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_written_from_0_is_the_plain_loop(backend, kit, tmp_path):
    """`for l in 0:layers` stacks the layers `for l in layers` does: the same module, its shapes `layers`
    (not `layers - 0`), and its names counted from 0 (no "starts past 0" demand on the pattern)."""
    arch = tmp_path / "arch"
    arch.mkdir()
    text = kit.ARCH.read_text()
    assert text.count("  for l in layers {\n    attn_norm") == 1
    (arch / "llama.linnet").write_text(text.replace("  for l in layers {\n    attn_norm", "  for l in 0:layers {\n    attn_norm"))
    card = tmp_path / "tiny-llama.linnet"
    card.write_text((kit.CARDS / "tiny-llama.linnet").read_text())
    plain = generate(check_file(kit.CARDS / "tiny-llama.linnet"), backend, GENERICS)
    assert generate(check_file(card), backend, GENERICS) == plain
    assert "'wq': ((layers, heads * head_dim, dim), 'f32')" in plain


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_names_with_quotes_and_backslashes_stay_inside_the_docstring(tmp_path, backend):
    """A card's file name goes into the module's docstring, escaped: the module imports and its
    docstring reads it as written. (A card's own name is a plain name: the checker refuses others.)"""
    source = (Path(__file__).parents[2] / "linnet/nest/cards/tiny-llama.linnet").read_text()
    path = tmp_path / 'we"""ird\\.linnet'
    path.write_text(source)
    module = import_source(compile_file(str(path), backend, {}, "exact"))
    assert module.__doc__.startswith('PyTorch module of `tiny-llama`' if backend == "torch" else "JAX")
    assert 'we"""ird\\.linnet' in module.__doc__


@pytest.mark.parametrize("backend", BACKENDS)
def test_dims_read_as_the_source_writes_them(backend, kit):
    # a dim is compared as a polynomial (`heads * head_dim` is `head_dim * heads`), but printed as
    # written; a dim's `/` is Python's `//` (exact, checked when specialized)
    phi3 = generate(check_file(kit.CARDS / "tiny-phi3.linnet"), backend, GENERICS)
    assert "'wqkv': ((layers, (heads + 2 * kv_heads) * head_dim, dim), 'f32')" in phi3
    assert "a.reshape(N, heads * head_dim)" in phi3 and "a.reshape(Batch, heads * head_dim)" in phi3
    text = (Path(__file__).parent / "from_the_doc" / "gpt2.linnet").read_text()
    text = text.replace("  wpe: T[max_pos, dim]", '  odd: T[max_pos - 1, (dim - 2) / 2 * 3]\n    from hf "odd"\n'
                                                   "  wpe: T[max_pos, dim]")
    source = generate(load_source(text, "gpt2.linnet"), backend, GENERICS)
    assert "'odd': ((max_pos - 1, (dim - 2) // 2 * 3), 'f32')" in source
    assert "math.sqrt(2.0 / 3.141592653589793)" in source  # a static sqrt's argument in one pair of parentheses
    # and the tables, computed from those expressions, hold the shapes the checker derives
    module = import_source(source)
    spec = specialize(load_source(text, "gpt2.linnet"), GENERICS)
    for name, (shape, _) in module.PARAMS.items():
        assert tuple(shape) == tuple(d.evaluate(spec.bindings) for d in spec.params[name].type.shape), name
    assert module.PARAMS["odd"][0] == (63, 45)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_quotient_of_a_sum_keeps_its_parentheses(backend):
    # `(n - 2) / 2` with n = Batch + 4 is the quotient (Batch + 2) / 2, written (2 + Batch) // 2:
    # printed as 2 + Batch // 2 it made a zeros of 4 rows where the type says 3
    text = """\
arch pairs
config {
  dim: int = 4
}
params {
  w: T[dim]
    from hf "w"
}
fn halves<n>(x: T[n]) -> T[(n - 2) / 2, 2] {
  return zeros((n - 2) / 2, 2)
}
entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[(Batch + 2) / 2, 2] {
  return halves(zeros(Batch + 4))
}
"""
    source = generate(load_source(text, "pairs.linnet"), backend, {"Batch": 4})
    assert "(2 + Batch) // 2" in source
    model = import_source(source).Model({"w": np.zeros(4, np.float32)})
    out = model.decode(np.zeros(4, np.int32), np.zeros(4, np.int32))
    out = out[0] if isinstance(out, tuple) else out
    assert tuple(out.shape) == ((4 + 2) // 2, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_product_widened_to_f32_keeps_its_f32_sums_in_a_16_bit_t(backend, kit):
    # `linear(x, lm_head) as f32` (a head's logits) and `linear(h, router[l]) as f32` (a router's scores)
    # with T=bf16: the runtime's linear gives f32 (its sums, not rounded to bf16 first), the cast gone;
    # in f32 the cast was the identity, and the source writes it as before
    f32 = {"torch": "torch.float32", "jax": "jnp.float32"}[backend]
    for card, product in (("tiny-llama", "rt.linear(x, {head}, out_dtype={f32})"),
                          ("tiny-mixtral", "rt.topk(rt.linear(h, {router}, out_dtype={f32}), ")):
        head, router = ("self.lm_head", "self.router[l]") if backend == "torch" else \
            ('params["lm_head"]', 'params["router"][l]')
        bf16 = generate(check_file(kit.CARDS / f"{card}.linnet"), backend, {**GENERICS, "T": "bf16"}, "fast")
        assert product.format(head=head, router=router, f32=f32) in bf16, card
        exact = generate(check_file(kit.CARDS / f"{card}.linnet"), backend, GENERICS)
        assert "out_dtype" not in exact


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_argument_bound_to_a_local_names_the_call_that_passes_it(backend, kit):
    """gemma3's `q = rotate(head_norm(linear(h, wq[l])...), positions, full)`: rotate reads its x twice, so
    head_norm's result is bound to a local first, named as rotate's x (`rotate_x`, the name x being taken); that
    line's comment names the call's line (123), and the value's, head_norm's `return` (100), not the other way
    round; the final norm names both returns it passes through (layers_forward's, then gemma_norm's)."""
    source = generate(check_file(kit.CARDS / "tiny-gemma3.linnet"), backend, GENERICS).splitlines()
    arch = (kit.ARCH.parent / "gemma3.linnet").read_text().splitlines()
    bound = [i for i, text in enumerate(source) if re.match(r"\s*rotate_x(_\d+)? = rt\.rmsnorm\(rt\.linear\(h, ", text)]
    assert len(bound) == 4, bound  # q's and k's, in prefill and decode
    for i in bound:
        m = ANY_COMMENT.match(source[i - 1])
        assert m and m.group(1) == "gemma3.linnet", source[i - 1]
        assert re.search(r"[qk] = rotate\(head_norm\(", arch[int(m.group(2)) - 1]), source[i - 1]
        (place,) = m.group(3).split(", ")
        assert arch[int(place.split(":")[1]) - 1].strip().startswith("return rmsnorm("), source[i - 1]
    final = [i for i, text in enumerate(source) if re.search(r"x = rt\.rmsnorm\(x.*(self\.norm|params\[.norm.\])", text)]
    assert final
    for i in final:
        m = ANY_COMMENT.match(source[i - 1])
        places = [int(p.split(":")[1]) for p in m.group(3).split(", ")]
        assert [arch[n - 1].strip() for n in places] == ["return gemma_norm(x, norm)",
                                                         "return rmsnorm(x as f32, 1.0 + w as f32, eps=norm_eps) as T"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_tables_are_spelled_as_the_card_gives_them(backend, kit):
    """Each rotary table is computed from the card's names, not numbers (gemma3's local table from
    `rope_local_theta`, its global one from `rope_theta`), passed only the arguments its scaling reads (none of
    llama3's or YaRN's where the scaling is none), under a comment naming the rope call's line."""
    source = generate(check_file(kit.CARDS / "tiny-gemma3.linnet"), backend, GENERICS).splitlines()
    arch = (kit.ARCH.parent / "gemma3.linnet").read_text().splitlines()
    tables = {i: text.strip() for i, text in enumerate(source) if "rt.rope_table(" in text}
    calls = [re.search(r"rt\.rope_table\((.*?)\)(\.to\(self\.device\))?$", text).group(1) for text in tables.values()]
    assert sorted(calls) == ["head_dim, MaxSeq, theta=rope_local_theta", "head_dim, MaxSeq, theta=rope_theta"]
    for i, text in tables.items():
        m = ANY_COMMENT.match(source[i - 1])
        assert m and m.group(1) == "gemma3.linnet", source[i - 1]
        theta = re.search(r"theta=(\w+)", text).group(1)
        assert f"theta={theta}" in arch[int(m.group(2)) - 1], (source[i - 1], text)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_module_says_how_to_call_it(backend, kit, sources):
    """The header names the constructor and an entry's call as a user writes them, and each entry's docstring
    carries the card's comment above its `entry` line and its arguments' and result's types (as the card
    writes them, sizes named; the JAX function's result paired with the new state)."""
    mod = import_source(sources[backend])
    assert "`model = Model(weights" in mod.__doc__ and "`model.prefill(tokens, positions, rows, last)`" in mod.__doc__
    arch = kit.ARCH.read_text().splitlines()
    for name in ("prefill", "decode", "copy_rows"):
        at = next(i for i, text in enumerate(arch) if text.startswith(f"entry {name}<") or
                  text.startswith(f"entry {name}("))
        comment = arch[at - 1]
        assert comment.startswith("# ")
        doc = (getattr(mod.Model, name) if backend == "torch" else getattr(mod, name)).__doc__
        said, _, typed = doc.partition("\n\n")
        assert " ".join(said.split()) == f"llama.linnet:{at + 1}: {comment[2:]}"
        signature = arch[at][arch[at].index("(") + 1:arch[at].rindex("{")].strip()
        args, arrow, ret = signature.partition(") -> ")
        args, ret = (args, ret.strip()) if arrow else (signature[:-1], "None")
        assert typed.strip() == (f"({args}) -> ({ret}, new state)" if backend == "jax" else
                                 f"({args}) -> {ret}"), (doc, signature)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_condition_on_config_values_alone_leaves_only_its_branch(backend, tmp_path):
    """gemma2's `if final_softcap > 0.0 then tanh(...) * final_softcap else logits` is known once the card is
    specialized: the code is the branch it takes (the cap with 3.0, plain logits with 0.0; test_parity_hf holds
    the capped one to transformers); a condition on a layer's own value (`full`) stays in the code."""
    card = (CARDS_DIR / "tiny-gemma2.linnet").read_text()
    for cap, expected in (("3.0", "* final_softcap"), ("0.0", "return logits")):
        path = tmp_path / f"cap{cap}.linnet"
        path.write_text(card.replace("final_softcap = 3.0", f"final_softcap = {cap}"))
        source = generate(check_file(path), backend, GENERICS)
        assert "if final_softcap" not in source and expected in source
        assert "window=0 if full else sliding_window" in source
