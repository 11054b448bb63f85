"""What the HTTP server costs: one load through `Engine.run` and through `linnet serve`, one run.

The load is throughput_vs_peers.py's (64 requests of 32 to 128 random prompt tokens, 16 rows, 32
new tokens each, no end token) on SmolLM2-135M-Instruct in bf16 on torch. The server runs in its
own process, as users run it; this process sends every request at once to /v1/completions (the
prompts as token ids, greedy, `ignore_eos`), each on its own connection, non-streamed and then
streamed, and counts the tokens that come back. Prints tokens/s, median of `--repeats` runs, and
each server's ratio to the engine alone.

    python benchmarks/serve_vs_engine.py [--repeats 3] [--backend torch|jax] [--dtype bf16|f32]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from bench_args import count  # this folder's

from throughput_vs_peers import load_prompts

CARD = "smollm2-135m-instruct"
ROWS, NEW, MAX_SEQ = 16, 32, 256


def engine_rate(prompts: list, backend: str, dtype: str, repeats: int) -> float:
    from linnet import nest
    from linnet.serve import Engine, Request

    model = nest.load(CARD, backend=backend, numerics="fast", compile=True, cast_dtype=True, tokenizer=False,
                      generics={"Batch": ROWS, "MaxSeq": MAX_SEQ, "T": dtype})
    engine = Engine(model)
    engine.warmup()  # as `linnet serve` warms up
    rates = []
    for _ in range(repeats):
        model.reset()
        _, stats = engine.run([Request(prompt=p, max_new_tokens=NEW, ignore_eos=True) for p in prompts])
        rates.append(stats.generated_tokens / stats.seconds)
    return statistics.median(rates)


def _post(url: str, prompt: list, stream: bool) -> int:
    """The completion tokens one request got back."""
    body = json.dumps({"model": CARD, "prompt": prompt, "max_tokens": NEW, "ignore_eos": True, "temperature": 0,
                       "stream": stream, "stream_options": {"include_usage": True} if stream else None}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        if not stream:
            return json.load(response)["usage"]["completion_tokens"]
        tokens = 0
        for line in response:
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
        return tokens


def server_rates(prompts: list, backend: str, dtype: str, repeats: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", CARD, "--batch", str(ROWS),
                               "--max-seq", str(MAX_SEQ), "--backend", backend, "--dtype", dtype,
                               "--numerics", "fast", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen(base + "/health", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"the server stopped: {server.stderr.read()[-2000:]}")
                time.sleep(0.25)
        rates = {}
        with ThreadPoolExecutor(len(prompts)) as pool:
            for stream in (False, True):
                runs = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    got = sum(pool.map(lambda p: _post(base + "/v1/completions", p, stream), prompts))
                    runs.append(got / (time.perf_counter() - start))
                rates["server, streamed" if stream else "server"] = statistics.median(runs)
        return rates
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=count, default=3, help="runs of each; the median is printed (3)")
    parser.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
    parser.add_argument("--dtype", choices=["bf16", "f32"], default="bf16", help="the element type T (bf16)")
    args = parser.parse_args()
    prompts = load_prompts(64, 32, 128, 49152)
    engine = engine_rate(prompts, args.backend, args.dtype, args.repeats)
    print(f"{'engine.run':<20} {engine:7.1f} tokens/s", flush=True)
    for name, rate in server_rates(prompts, args.backend, args.dtype, args.repeats).items():
        print(f"{name:<20} {rate:7.1f} tokens/s  ({rate / engine:.2f}x the engine alone)", flush=True)


if __name__ == "__main__":
    main()
