"""Fixtures shared by the tests of several parts: a GGUF writer, and a SentencePiece vocabulary in a
GGUF, which Nest reads (tests/nest) and the llama.cpp export writes back (tests/export); JAX's
compiles counted from none kept (`compiles_counted`); the run's parity table, gathered from xdist's
workers. Also Triton's interpreter, asked for on a machine without CUDA, OpenMP's passive wait, and
JAX's persistent cache set back after a test that sets it."""

import os
import sys
from collections import Counter

# The suite runs in two xdist workers on two cores (README.md): OpenMP threads that spin while they
# wait for work would take the other worker's core (three files took 289 s so, 222 s waiting
# passively). Read as torch loads its OpenMP runtime, so set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


def _interpreter_rounds_to_nearest_bf16() -> None:
    """Triton's interpreter casts f32 to bf16 by dropping the low bits (its own round-to-nearest
    adds the cut bit without carrying it into the exponent), where a GPU rounds to nearest even:
    its casts are made torch's, so the kernels are checked for the numbers a GPU gives."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    truncating = interpreter._convert_float

    def convert(data, from_type, to_type, rounding_mode):
        if from_type == tl.float32 and to_type == tl.bfloat16:
            values = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
            return values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return truncating(data, from_type, to_type, rounding_mode)
    interpreter._convert_float = convert


if not torch.cuda.is_available():
    # Linnet's Triton kernels run on CPU tensors in Triton's interpreter: asked for before anything
    # imports triton (Linnet's kernels, or torch's Inductor), whose own library functions are made
    # for the interpreter or for a GPU as it is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _interpreter_rounds_to_nearest_bf16()

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
CORPUS = ("the quick brown fox jumps over the lazy dog . the dog sleeps , the fox runs away from the dog "
          "and then the quick fox returns to the brown house where the lazy dog waits for the fox") * 3


def learn_pieces(corpus: str, merges: int) -> list:
    """SentencePiece-style BPE: words are "▁" + word; the most frequent adjacent pair is joined,
    `merges` times. Returns the learned pieces, first learned first."""
    words = Counter(tuple("▁" + w) for w in corpus.split())
    learned = []
    for _ in range(merges):
        pairs = Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        learned.append(a + b)
        joined = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == (a, b):
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            joined[tuple(out)] += n
        words = joined
    return learned


@pytest.fixture
def no_home(monkeypatch):
    """No place for the user cache: LINNET_CACHE and XDG_CACHE_HOME unset, and no home directory
    (as for a user without an entry in the password file)."""
    from pathlib import Path

    for var in ("LINNET_CACHE", "XDG_CACHE_HOME", "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)

    def home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(home))


def _write_gguf(path, arch: str, keys, tensors):
    """A GGUF file at `path`: `keys(writer)` adds its metadata; `tensors` yields (name, array,
    llama.cpp quantization type or None), each quantized by gguf's own routine where a type is given."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    keys(w)
    for name, a, qtype in tensors:
        if qtype is None:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="session")
def write_gguf():
    """write_gguf(path, arch, keys, tensors): `_write_gguf`."""
    pytest.importorskip("gguf")
    return _write_gguf


@pytest.fixture(scope="session")
def spm_vocabulary():
    """A learned SentencePiece vocabulary, (tokens, types, scores): <unk> <s> </s>, the 256 bytes,
    the corpus's characters, then the learned pieces; a piece's score falls with when it was learned."""
    chars = sorted(set(CORPUS.replace(" ", "")) | {"▁"})
    pieces = learn_pieces(CORPUS, 60)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + pieces
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * (len(chars) + len(pieces))
    scores = [0.0] * 259 + [-1000.0 - i for i in range(len(chars))] + [-float(i) for i in range(len(pieces))]
    return tokens, types, scores


@pytest.fixture(scope="session")
def spm_gguf(tmp_path_factory, spm_vocabulary):
    """A GGUF holding `spm_vocabulary`, as llama.cpp's converter writes a SentencePiece one."""
    pytest.importorskip("gguf")
    return _write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf", *spm_vocabulary)


@pytest.fixture(scope="session")
def write_spm_gguf():
    """write_spm_gguf(path, tokens, types, scores, name=None): `_write_spm_gguf`."""
    pytest.importorskip("gguf")
    return _write_spm_gguf


def _write_spm_gguf(path, tokens, types, scores, name=None):
    """A GGUF at `path` holding a SentencePiece vocabulary (tokens, types, scores; <unk> <s> </s>
    first), as llama.cpp's converter writes one; `name`: its general.name."""

    def keys(w):
        if name is not None:
            w.add_name(name)
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_feed_forward_length(16)
        w.add_head_count(2)
        w.add_head_count_kv(2)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

    _write_gguf(path, "llama", keys, [("token_embd.weight", np.zeros((len(tokens), 8), np.float32), None)])
    return path


def imports_dynamo(script: str) -> bool:
    """Whether `script`, run in a fresh Python process, leaves torch._dynamo imported (1.5-3 s of a
    process's start on this CPU, which only a torch.compile should cost)."""
    import subprocess
    import sys

    probe = script + "\nimport sys\nprint('torch._dynamo' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


# Parity errors the compiler tests measure (row -> max|a-b| / max|ref|), printed at the end of the run.
# Under xdist each worker hands its own to pytest's process, which prints them all.
_PARITY = pytest.StashKey[dict]()


def pytest_configure(config):
    config.stash[_PARITY] = {}


@pytest.fixture(scope="session")
def parity(request) -> dict:
    """The run's parity table, which tests/compiler's `kit.PARITY` fills."""
    return request.config.stash[_PARITY]


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: sent to pytest's process as it ends
        session.config.workeroutput["parity"] = {k: float(v) for k, v in session.config.stash[_PARITY].items()}


@pytest.hookimpl(optionalhook=True)  # xdist's: a worker has ended
def pytest_testnodedown(node, error):
    node.config.stash[_PARITY].update(getattr(node, "workeroutput", {}).get("parity", {}))


def pytest_terminal_summary(terminalreporter, config):
    table = config.stash[_PARITY]
    if not table:
        return
    terminalreporter.section("linnet parity (max|a-b| / max|ref|)")
    width = max(len(k) for k in table)
    for key in sorted(table):
        terminalreporter.write_line(f"{key:<{width}}  {table[key]:.3e}")


def _set_jax_cache_option(name: str, value) -> None:
    """jax.config's `name` set, and JAX's persistent cache made to decide again whether it is used: it
    decides once, at the first compile, and reads neither the flag nor the folder again."""
    import jax
    from jax._src import compilation_cache

    jax.config.update(name, value)
    compilation_cache.reset_cache()


@pytest.fixture(autouse=True)
def jax_compile_cache_as_it_was():
    """A test that runs `linnet serve` or `generate` in-process with the jax backend points JAX's
    persistent compilation cache at the user's cache (`cli._use_compile_cache`), which would then
    answer every later test's compiles in that process from earlier runs' executables: put back."""
    jax = sys.modules.get("jax")
    before = jax.config.jax_compilation_cache_dir if jax else None
    yield
    jax = sys.modules.get("jax")
    if jax is not None and jax.config.jax_compilation_cache_dir != before:
        _set_jax_cache_option("jax_compilation_cache_dir", before)


@pytest.fixture
def compiles_counted():
    """JAX compiles what a test's engine asks for, and counts it as a compile: the executables
    earlier tests' models compiled, kept in this process (jax.clear_caches) or read back from the
    persistent cache (not a compile, `runners._xla_compiles`), would otherwise answer its passes."""
    import jax

    cache = jax.config.jax_enable_compilation_cache
    jax.clear_caches()
    _set_jax_cache_option("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        _set_jax_cache_option("jax_enable_compilation_cache", cache)
