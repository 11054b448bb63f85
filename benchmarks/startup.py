"""Start-up time, from a cold `python` to the first token, against llama.cpp and transformers.

    python benchmarks/startup.py                     # torch and jax, peers, 3 runs each
    python benchmarks/startup.py --runs 5 --only torch llama.cpp
    python benchmarks/startup.py --profile torch     # cProfile of one `linnet generate` start, top 30
    python benchmarks/startup.py --cold --only jax serve-jax --baseline DIR  # a first JAX start, before/after

Every figure is a fresh process, timed from just before it is spawned (`time.time()` passed in), so
the interpreter's own start counts. Each kind runs once first, unmeasured, so that the caches a
user's second start finds (Linnet's built kernels and parser tables, XLA's executables, the OS's
page cache of the GGUF) are warm for every kind alike; then `--runs` runs, and medians.

- `import`: `import linnet`, and `from linnet import nest` (what a load starts with).
- `torch` / `jax`: `linnet generate smollm2-135m-instruct PROMPT -n 1` as the command line runs it
  (fast numerics, bf16, compile=True: nest.load, then the warm-up, then one greedy token), inside
  the child through `linnet.cli.main`, with timers around the stages of `nest.load`: parse + check
  (resolve_card), specialize, check_checkpoint, read (GGUF tensors read, dequantized: `dequantize`
  of it), bind (read + transform + convert into the params), tokenizer, codegen, import (the
  generated module), model (the runtime's __init__: `pack` of it, the linear weights laid out for
  the CPU kernel). Stages nest as listed; `first token` is when the last engine step returned.
- `serve`: `linnet serve CARD` (its defaults), from the spawn to /health answering, and to the
  reply of a one-token greedy /v1/completions request; `serve-jax`: the same with `--backend jax`.
- `--cold`: the JAX kinds with no persistent compilation cache (`--compile-cache none`,
  JAX_COMPILATION_CACHE_DIR unset), so that every start compiles all it runs, as a user's first does.
- `llama.cpp`: llama-cpp-python's `Llama(model_path=GGUF)` + a one-token greedy completion, GGUF
  the same weights in F16 (`llamacpp_peer.cached_gguf`, written once).
- `transformers`: AutoTokenizer and AutoModelForCausalLM.from_pretrained of a bf16 safetensors
  directory (written once by `linnet export --to vllm` from the same GGUF: transformers' own GGUF
  reader needs `accelerate`, and dequantizes in numpy) + generate(max_new_tokens=1), greedy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_args import count  # this folder's
from peers_installed import installed, not_installed

ROOT = Path(__file__).resolve().parent.parent
CARD = "smollm2-135m-instruct"
PROMPT = "The capital of France is"
HF_DIR = Path(tempfile.gettempdir()) / "linnet-startup-peer" / "SmolLM2-135M-Instruct-bf16"
# llama-cpp-python 0.3.36 here dies (SIGSEGV) at the first decode of the embedded Q4_1 file, so llama.cpp
# reads the same weights dequantized to F16 (`llamacpp_peer.cached_gguf`), a file twice the size
LLAMA_CPP_GGUF = Path(tempfile.gettempdir()) / "linnet-llamacpp-peer" / "SmolLM2-135M-Instruct.F16.gguf"

# (label, module, attribute) of what the Linnet child times; a method is "Class.method"
STAGES = [
    ("parse+check", "linnet.nest.load", "resolve_card"),
    ("specialize", "linnet.nest.load", "specialize"),
    ("check_checkpoint", "linnet.nest.bind", "check_checkpoint"),
    ("bind", "linnet.nest.bind", "bind_weights"),
    ("read", "linnet.nest.checkpoint", "GGUFCheckpoint.load"),
    ("dequantize", "linnet.nest.checkpoint", "dequantize"),
    ("tokenizer", "linnet.nest.load", "tokenizer_of"),
    ("codegen", "linnet.codegen_torch.emit", "generate"),
    ("codegen", "linnet.codegen_jax.emit", "generate"),
    ("import", "linnet.nest.load", "import_source"),
    ("model", "linnet.codegen_torch.runtime", "TorchModel.__init__"),
    ("model", "linnet.codegen_jax.runtime", "JaxModel.__init__"),
    ("pack", "linnet.codegen_torch.runtime", "TorchModel.pack_linear_weights"),
    ("pack", "linnet.codegen_jax.runtime", "JaxModel.pack_linear_weights"),
    ("nest.load", "linnet.nest", "load"),
    ("warm-up", "linnet.cli", "_warm_up"),
]


# -- the children: each prints one JSON line of {stage: seconds}

def child_import(t0: float) -> dict:
    import importlib

    importlib.import_module("linnet")
    out = {"import linnet": time.time() - t0}
    importlib.import_module("linnet.nest")
    out["from linnet import nest"] = time.time() - t0
    return out


def _timers(spent: dict, modules: tuple) -> None:
    """Wraps each of STAGES whose module is one of `modules` (imported here; the jax one only for jax) to
    add its wall time to spent[label]; a stage re-entered inside itself counts once."""
    import functools
    import importlib

    for label, module_name, attribute in STAGES:
        if not module_name.startswith(modules):
            continue
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name, None)
        if original is None:  # (a stage an older or newer tree has not)
            continue
        depth = [0]

        def timed(*args, __original=original, __label=label, __depth=depth, **kwargs):
            __depth[0] += 1
            start = time.perf_counter()
            try:
                return __original(*args, **kwargs)
            finally:
                __depth[0] -= 1
                if not __depth[0]:
                    spent[__label] = spent.get(__label, 0.0) + time.perf_counter() - start

        setattr(owner, name, functools.wraps(original)(timed))


def child_linnet(t0: float, backend: str) -> dict:
    spent: dict = {}
    started = time.time() - t0
    skip = "linnet.codegen_jax" if backend == "torch" else "linnet.codegen_torch"
    # the torch path must not import jax for its timers, nor the jax path torch
    modules = tuple(m for m in {m for _, m, _ in STAGES} if not m.startswith(skip))
    _timers(spent, modules)
    import linnet.serve.engine as engine

    step, last = engine.Engine.step, [0.0]

    def stepped(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        last[0] = time.time() - t0
        return result

    engine.Engine.step = stepped
    from linnet import cli

    imported = time.time() - t0
    with open(os.devnull, "w") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            code = cli.main(["generate", CARD, PROMPT, "-n", "1", "--backend", backend, *_cache_flags()])
        finally:
            sys.stdout = stdout
    if code:
        raise SystemExit(f"linnet generate failed ({code})")
    return {"python started": started, "imports (cli, engine)": imported - started, **spent, "first token": last[0]}


def child_llama_cpp(t0: float) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(LLAMA_CPP_GGUF), n_ctx=2048, verbose=False)
    loaded = time.time() - t0
    llm.create_completion(PROMPT, max_tokens=1, temperature=0.0)
    return {"Llama()": loaded, "first token": time.time() - t0}


def child_transformers(t0: float) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    imported = time.time() - t0
    tok = AutoTokenizer.from_pretrained(HF_DIR)
    model = AutoModelForCausalLM.from_pretrained(HF_DIR, dtype=torch.bfloat16)
    loaded = time.time() - t0
    ids = tok(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        model.generate(**ids, max_new_tokens=1, do_sample=False)
    return {"import": imported, "from_pretrained": loaded, "first token": time.time() - t0}


def write_hf_dir() -> None:
    """The peer's safetensors directory, from the same GGUF, once."""
    if (HF_DIR / "config.json").is_file():
        return
    from linnet.export import export

    export(CARD, "vllm", HF_DIR, dtype="bf16")


# -- the parent

KINDS = ("import", "torch", "jax", "serve", "serve-jax", "llama.cpp", "transformers")
COLD_ENV = "LINNET_STARTUP_COLD"  # "1" in the children of a --cold run


def _cache_flags() -> list:
    """The flags that keep a JAX start from XLA's persistent cache, under `--cold` (its children
    inherit COLD_ENV)."""
    return ["--compile-cache", "none"] if os.environ.get(COLD_ENV) == "1" else []


def run_serve(root: Path = ROOT, backend: str = "torch") -> dict:
    """`linnet serve CARD` as a user starts it (its defaults: torch, fast, bf16, 8 rows; or with
    `--backend jax`), timed from the spawn to /health answering and to the first token of a
    one-token completion."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile("w+")  # (not a pipe: the server's log lines would fill it)
    start = time.time()
    # cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    command = [sys.executable, "-m", "linnet.cli", "serve", CARD, "--port", str(port), "--backend", backend]
    server = subprocess.Popen([*command, *_cache_flags()], env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
                              cwd=str(root))
    try:
        while True:
            if server.poll() is not None:
                log.seek(0)
                raise SystemExit(f"serve: exit {server.returncode}\n{log.read()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        healthy = time.time() - start
        body = json.dumps({"model": CARD, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            json.load(r)
        return {"/health answers": healthy, "first token": time.time() - start}
    finally:
        server.terminate()
        server.wait()
        log.close()


def run_child(kind: str, root: Path = ROOT) -> dict:
    """One fresh process of `kind`, running the Linnet at `root`."""
    if kind in ("serve", "serve-jax"):
        return run_serve(root, "jax" if kind == "serve-jax" else "torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    start = time.time()
    done = subprocess.run([sys.executable, __file__, "--child", kind, repr(start)], env=env, capture_output=True,
                          text=True)
    wall = time.time() - start
    if done.returncode:
        raise SystemExit(f"{kind}: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process (to exit)"] = wall
    return result


def profile(kind: str) -> None:
    import cProfile
    import pstats

    with tempfile.NamedTemporaryFile(suffix=".prof") as f:
        start = time.time()
        cProfile.run(f"child_linnet({start!r}, {kind!r})", f.name)
        pstats.Stats(f.name).sort_stats("cumulative").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=count, default=3, help="measured runs of each kind (3)")
    parser.add_argument("--only", nargs="+", choices=KINDS, default=[k for k in KINDS if k != "serve-jax"])
    parser.add_argument("--profile", choices=["torch", "jax"], help="cProfile one start in this process instead")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="also run the Linnet kinds on the source tree at DIR (an older commit's, e.g. from "
                             "`git archive`), interleaved with this one's: before and after in one run")
    parser.add_argument("--cold", action="store_true",
                        help="JAX with no persistent compilation cache: every start compiles, as a first one")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold:  # (children inherit both)
        os.environ[COLD_ENV] = "1"
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    if args.child:
        kind, t0 = args.child[0], float(args.child[1])
        work = {"import": child_import, "llama.cpp": child_llama_cpp, "transformers": child_transformers}
        result = work[kind](t0) if kind in work else child_linnet(t0, kind)
        print(json.dumps(result))
        return
    if args.profile:
        profile(args.profile)
        return
    for kind, module in (("llama.cpp", "llama_cpp"), ("transformers", "transformers")):
        if kind in args.only and not installed(module):
            print(f"{kind}: {not_installed(module)}, skipped")
            args.only = [k for k in args.only if k != kind]
    if "transformers" in args.only:
        write_hf_dir()
    if "llama.cpp" in args.only:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from llamacpp_peer import cached_gguf

        assert Path(cached_gguf("f16")) == LLAMA_CPP_GGUF
    medians = {}
    for kind in args.only:
        roots = {kind: ROOT}
        if args.baseline and kind not in ("llama.cpp", "transformers"):
            roots[f"{kind}@baseline"] = args.baseline.resolve()
        for label, root in roots.items():
            run_child(kind, root)  # warm: caches as a second start finds them
        runs = {label: [] for label in roots}
        for _ in range(args.runs):  # interleaved, so that the machine's load falls on both alike
            for label, root in roots.items():
                runs[label].append(run_child(kind, root))
        for label, done in runs.items():
            keys = [k for k in done[0] if all(k in r for r in done)]
            medians[label] = {k: statistics.median(r[k] for r in done) for k in keys}
            print(f"\n{label} (median of {args.runs}; seconds since the process was spawned, stages as spent):")
            for k, v in medians[label].items():
                print(f"  {k:28s} {v:7.3f}   {[round(r[k], 2) for r in done]}")
    peers = [p for p in ("llama.cpp", "transformers") if p in medians]
    ours = [k for k in medians if k.split("@")[0] in ("torch", "jax", "serve", "serve-jax")]
    if peers and ours:
        print("\nfirst token, ratio to the peer's (same run):")
        for k in ours:
            mine = medians[k]["first token"]
            print(f"  linnet {k:15s} {mine:6.2f} s  " + "  ".join(
                f"{mine / medians[p]['first token']:.2f}x {p} ({medians[p]['first token']:.2f} s)" for p in peers))


if __name__ == "__main__":
    main()
