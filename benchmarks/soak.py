"""A long-running `linnet serve`: does its memory and latency stay flat over thousands of requests?

Starts `linnet serve smollm2-135m-instruct --batch 8 --max-seq 1024` (the embedded GGUF) as a
subprocess, for each `--backend`, and drives it over HTTP with the mix a real user's clients send
at once: completions and chat completions, streamed and not, with n > 1, logprobs and
top_logprobs, the prompt's logprobs (echo), stop strings, seeds and penalties; tools (a forced
call: a structure), response_format json_schema (a few schemas again and again, and some new ones),
the Responses API with and without `store` (and its GET, DELETE and previous_response_id);
clients that go away mid-stream or before the reply (a cancel); and, at a small rate, bad requests
(bad JSON, a prompt too long, an unknown model, wrong types).

Every window of `--window` requests it reads the server's VmRSS (/proc/PID/status) and its
/metrics (compiles since the warmup: on JAX, each one a stall for every request in flight), and
prints a row: RSS, time to first token and time between tokens (p50/p99, streamed requests),
whole-request latency (p50/p99, unstreamed), and the statuses other than 200 ("left": a client that
went away on purpose); under it, what the server logged meanwhile of compiles while serving (each
named), of JAX's compiles ahead ending, and of errors. Then a verdict: the RSS slope per 1000
requests by least squares, over the windows after the first `--warmup-windows` (under JAX, and
after its compiles ahead have ended: each adds executables), and over their later half; it grows
where both pass `--flat-mib` (the C allocator's heap grows in steps, then stays). Some growth is
bounded and expected until it fills: the engine's latency windows (65,536 samples each; about 10 a
request between tokens) and the Responses kept (1024). Not a timed test: the latencies are what
this machine gave.

    python benchmarks/soak.py [--backend torch jax] [--requests 3000] [--minutes 10] [--window 250]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from bench_args import count  # this folder's

CARD = "smollm2-135m-instruct"
WORDS = ("river cloud apple train paper light stone music garden window bridge winter coffee market "
         "forest letter silver candle harbor mirror planet thunder lantern meadow").split()
SYSTEM = "You are a helpful assistant. Answer briefly, in one or two sentences, and never use lists."
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


class Result:
    """One request's outcome: its HTTP status (0: the client went away on purpose), its time to
    first token and the gaps between its chunks (streamed), or its whole time (unstreamed)."""

    def __init__(self, kind: str, status: int, total: float, ttft: float | None = None, gaps: list = ()):
        self.kind, self.status, self.total, self.ttft, self.gaps = kind, status, total, ttft, list(gaps)


class Client:
    """Requests to one server, each on its own connection (as many clients' are)."""

    def __init__(self, port: int, rng: random.Random):
        self.port, self.rng = port, rng
        self.stored: list = []  # ids of Responses kept (store: true), for previous_response_id, GET, DELETE
        self.lock = threading.Lock()

    def words(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(lo, hi)))

    def messages(self) -> list:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Write about {self.words(2, 12)}."}]

    def post(self, kind: str, path: str, body, stream: bool = False, leave_after: int | None = None,
             leave_after_s: float | None = None) -> Result:
        """POSTs `body` (a dict, or bytes sent as they are); a streamed reply is read chunk by chunk.
        `leave_after`: close the connection after that many streamed events; `leave_after_s`: after
        that many seconds without the reply (a client that gives up: its request is cancelled)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=leave_after_s or 600)
        start = time.perf_counter()
        try:
            conn.request("POST", path, data, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if not stream or resp.status != 200:
                payload = resp.read()
                if kind.startswith("responses-store") and resp.status == 200:
                    with self.lock:
                        self.stored.append(json.loads(payload)["id"])
                return Result(kind, resp.status, time.perf_counter() - start)
            ttft, last, gaps, events = None, None, [], 0
            for line in resp:
                if not line.startswith(b"data: {"):
                    continue
                events += 1
                if carries_tokens(json.loads(line[6:])):  # (not a role's chunk, nor the usage's)
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - start
                    else:
                        gaps.append(now - last)
                    last = now
                if leave_after is not None and events >= leave_after:
                    return Result(kind, 0, time.perf_counter() - start, ttft, gaps)  # it goes away mid-stream
            return Result(kind, 200, time.perf_counter() - start, ttft, gaps)
        except (socket.timeout, TimeoutError):
            if leave_after_s is None:
                raise
            return Result(kind, 0, time.perf_counter() - start)  # it gave up waiting: the server cancels it
        finally:
            conn.close()

    def get(self, kind: str, path: str, method: str = "GET") -> Result:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        start = time.perf_counter()
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            resp.read()
            return Result(kind, resp.status, time.perf_counter() - start)
        finally:
            conn.close()

    # ------------------------------------------------------------ the mix, each kind one request

    def completion(self) -> Result:
        body = {"model": CARD, "prompt": f"{SYSTEM}\n{self.words(3, 20)}", "max_tokens": self.rng.randint(4, 16),
                "temperature": self.rng.choice([0, 0.7, 1.0]), "seed": self.rng.randint(0, 1 << 20)}
        return self.post("completion", "/v1/completions", body)

    def completion_stream(self) -> Result:
        body = {"model": CARD, "prompt": f"List {self.words(2, 8)}:\n1.", "max_tokens": 16, "stream": True,
                "logprobs": 2, "stop": ["\n3.", "."], "temperature": 0.8, "top_k": 40,
                "stream_options": {"include_usage": True}}
        return self.post("completion-stream", "/v1/completions", body, stream=True)

    def completion_echo(self) -> Result:  # the prompt's logprobs, as lm-evaluation-harness asks
        body = {"model": CARD, "prompt": self.words(4, 30), "max_tokens": 1, "echo": True, "logprobs": 1,
                "temperature": 0}
        return self.post("completion-echo", "/v1/completions", body)

    def chat(self) -> Result:
        body = {"model": CARD, "messages": self.messages(), "max_tokens": self.rng.randint(4, 16), "n": 2,
                "temperature": 0.9, "seed": self.rng.randint(0, 1 << 20), "presence_penalty": 0.5,
                "frequency_penalty": 0.3, "repetition_penalty": 1.1}
        return self.post("chat-n2-penalties", "/v1/chat/completions", body)

    def chat_stream(self) -> Result:
        body = {"model": CARD, "messages": self.messages(), "max_tokens": 16, "stream": True, "logprobs": True,
                "top_logprobs": 3, "stop": ["\n\n"], "stream_options": {"include_usage": True}}
        return self.post("chat-stream-logprobs", "/v1/chat/completions", body, stream=True)

    def chat_tools(self) -> Result:
        choice = self.rng.choice(["required", {"type": "function", "function": {"name": "get_weather"}}])
        body = {"model": CARD, "messages": [{"role": "user", "content": f"Weather in {self.rng.choice(WORDS)}?"}],
                "tools": [WEATHER_TOOL], "tool_choice": choice, "max_tokens": 24,
                "stream": self.rng.random() < 0.5}
        return self.post("chat-tools", "/v1/chat/completions", body, stream=body["stream"])

    def chat_json(self) -> Result:
        if self.rng.random() < 0.5:  # the same schema again, as an application sends it
            schema = PERSON
        else:  # a schema of its own: another field's name, as many applications' schemas differ
            field = "".join(self.rng.choice("abcdefghij") for _ in range(6))
            schema = {"type": "object", "properties": {field: {"type": "string", "maxLength": 8}},
                      "required": [field], "additionalProperties": False}
        body = {"model": CARD, "messages": self.messages(), "max_tokens": 24,
                "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}}
        return self.post("chat-json-schema", "/v1/chat/completions", body)

    def responses(self) -> Result:
        store = self.rng.random() < 0.6
        body = {"model": CARD, "input": f"Say something about {self.words(1, 6)}.", "max_output_tokens": 12,
                "store": store}
        with self.lock:
            previous = self.rng.choice(self.stored) if self.stored and self.rng.random() < 0.3 else None
        if previous is not None:
            body["previous_response_id"] = previous
        stream = self.rng.random() < 0.3
        if stream:
            body["stream"] = True
            return self.post("responses-stream", "/v1/responses", body, stream=True)
        return self.post("responses-store" if store else "responses-nostore", "/v1/responses", body)

    def responses_kept(self) -> Result:
        with self.lock:
            if not self.stored:
                return self.completion()
            rid = self.rng.choice(self.stored)
            delete = self.rng.random() < 0.3
            if delete:
                self.stored.remove(rid)
        if delete:
            return self.get("responses-delete", f"/v1/responses/{rid}", "DELETE")
        return self.get("responses-get", f"/v1/responses/{rid}")

    def disconnect(self) -> Result:
        body = {"model": CARD, "messages": self.messages(), "max_tokens": 200, "stream": True,
                "stream_options": {"include_usage": True}}
        return self.post("disconnect-mid-stream", "/v1/chat/completions", body, stream=True,
                         leave_after=self.rng.randint(1, 6))

    def cancelled(self) -> Result:
        body = {"model": CARD, "prompt": self.words(5, 20), "max_tokens": 300, "ignore_eos": True, "n": 2}
        return self.post("cancelled", "/v1/completions", body, leave_after_s=self.rng.uniform(0.05, 0.5))

    def bad(self) -> Result:
        which = self.rng.randrange(4)
        if which == 0:
            return self.post("bad-json", "/v1/chat/completions", b'{"model": "x", "messages": [')
        if which == 1:
            return self.post("bad-too-long", "/v1/completions",
                             {"model": CARD, "prompt": "word " * 1100, "max_tokens": 4})
        if which == 2:
            return self.post("bad-model", "/v1/chat/completions",
                             {"model": "no-such-model", "messages": self.messages()})
        return self.post("bad-type", "/v1/chat/completions",
                         {"model": CARD, "messages": self.messages(), "temperature": "hot", "max_tokens": "ten"})

    def one(self) -> Result:
        kinds = [(self.completion, 12), (self.completion_stream, 12), (self.completion_echo, 3), (self.chat, 10),
                 (self.chat_stream, 14), (self.chat_tools, 6), (self.chat_json, 8), (self.responses, 10),
                 (self.responses_kept, 4), (self.disconnect, 6), (self.cancelled, 5), (self.bad, 4)]
        pick = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        try:
            return pick()
        except (OSError, http.client.HTTPException) as err:  # the server broke the connection: counted apart
            return Result(f"{pick.__name__}: {type(err).__name__}", -1, 0.0)


def carries_tokens(event: dict) -> bool:
    """Whether a streamed event brings generated text (a chat's role chunk, a usage chunk, a Responses
    event that opens an item, do not): what time to first token and the gaps between tokens time."""
    if event.get("type") in ("response.output_text.delta", "response.function_call_arguments.delta"):
        return True
    choices = event.get("choices") or []
    if not choices:
        return False
    delta = choices[0].get("delta")
    if delta is not None:
        return bool(delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"))
    return bool(choices[0].get("text"))


def percentile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def metric(port: int, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def slope(xs: list, ys: list) -> float:
    """Least squares' dy/dx."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


class ServerLog:
    """The server's output (uvicorn's access log: a line a request), in a file of its own; `news` gives
    the lines a soak reports that came since it was last asked: each compile while serving (the
    engine's warning, naming its pass), the end of JAX's compiles ahead, and errors."""

    TOLD = ("compiled while serving", "compiled ahead", "ERROR", "Traceback")

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="linnet-soak-", suffix=".log")
        self.writer = os.fdopen(fd, "ab")  # the server's (appended: our reads move no offset of its)
        self.reader = open(self.path, "rb")
        self.ahead_done = False  # whether JAX's compiles ahead (prompt logprobs' passes) have ended

    def news(self) -> list:
        lines = [line.decode(errors="replace").rstrip() for line in self.reader.readlines()]
        told = [line for line in lines if any(word in line for word in self.TOLD)]
        self.ahead_done = self.ahead_done or any("compiled ahead" in line for line in told)
        return told

    def close(self) -> int:
        size = os.path.getsize(self.path)
        self.writer.close()
        self.reader.close()
        os.unlink(self.path)
        return size


def start_server(backend: str, log: ServerLog) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # JAX without its persistent cache: the server's count of compiles leaves out an executable read back from
    # it, and one made mid-run for a shape the warmup missed is a stall either way
    cold = ["--compile-cache", "none"] if backend == "jax" else []
    server = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", CARD, "--batch", "8", "--max-seq", "1024",
                               "--backend", backend, "--port", str(port), *cold],
                              stdout=log.writer, stderr=subprocess.STDOUT)
    deadline = time.time() + 900
    while time.time() < deadline:
        if server.poll() is not None:
            with open(log.path, "rb") as f:
                raise SystemExit(f"the {backend} server stopped: {f.read()[-3000:].decode(errors='replace')}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return server, port
        except OSError:
            pass
        time.sleep(0.5)
    server.kill()
    raise SystemExit(f"the {backend} server did not start in 900 s")


def soak(backend: str, args) -> None:
    log = ServerLog()
    server, port = start_server(backend, log)
    for line in log.news():
        print(f"       server: {line}", flush=True)
    print(f"\n== {backend}: linnet serve {CARD} --batch 8 --max-seq 1024 (pid {server.pid}), {args.requests} "
          f"requests or {args.minutes} min, {args.concurrency} at once, windows of {args.window}", flush=True)
    client = Client(port, random.Random(args.seed))
    header = (f"{'window':>6} {'reqs':>6} {'s':>6} {'RSS MiB':>8} {'ttft p50/p99 ms':>16} {'tok p50/p99 ms':>15} "
              f"{'whole p50/p99 ms':>17} {'compiles':>8}  statuses other than 200")
    print(header, flush=True)
    rows, done, window, began = [], 0, [], time.perf_counter()
    stop_at = began + 60 * args.minutes
    compiles_before = metric(port, "linnet_compiles_total")
    try:
        with ThreadPoolExecutor(args.concurrency) as pool:
            pending = set()
            while done < args.requests:
                while len(pending) < args.concurrency and done + len(pending) < args.requests \
                        and time.perf_counter() < stop_at:
                    pending.add(pool.submit(client.one))
                if not pending:
                    break
                finished = [f for f in list(pending) if f.done()]
                if not finished:
                    time.sleep(0.005)
                    continue
                for f in finished:
                    pending.discard(f)
                    window.append(f.result())
                    done += 1
                    if len(window) == args.window:
                        rows.append(report(len(rows), done, began, server.pid, port, window, compiles_before, log))
                        window = []
        if window:
            rows.append(report(len(rows), done, began, server.pid, port, window, compiles_before, log))
    finally:
        server.terminate()
        server.wait()
        print(f"server log: {log.close() / 1024:.0f} KiB written", flush=True)
    verdict(rows, args, backend)


def report(index: int, done: int, began: float, pid: int, port: int, window: list, compiles_before: float,
           log: ServerLog) -> tuple:
    rss = rss_mib(pid)
    compiles = metric(port, "linnet_compiles_total") - compiles_before
    ttft = [r.ttft for r in window if r.ttft is not None]
    gaps = [g for r in window for g in r.gaps]
    whole = [r.total for r in window if r.ttft is None and r.status == 200]
    statuses = Counter(r.status for r in window if r.status != 200)
    named = " ".join(f"{'left' if s == 0 else 'conn-error' if s == -1 else s}:{n}" for s, n in sorted(statuses.items()))
    ms = lambda xs: f"{percentile(xs, 50) * 1e3:.0f}/{percentile(xs, 99) * 1e3:.0f}"  # noqa: E731
    print(f"{index:>6} {done:>6} {time.perf_counter() - began:>6.0f} {rss:>8.1f} {ms(ttft):>16} {ms(gaps):>15} "
          f"{ms(whole):>17} {compiles:>8.0f}  {named}", flush=True)
    # what a client did not ask for: a good request's error, a bad one's 200 or 5xx, a broken connection
    odd = Counter(f"{r.kind}:{r.status}" for r in window
                  if (r.status not in (0, 200)) != r.kind.startswith("bad") or r.status == -1 or r.status >= 500)
    if odd:
        print(f"       unexpected: {dict(odd)}", flush=True)
    for line in log.news():
        print(f"       server: {line}", flush=True)
    return done, rss, compiles, log.ahead_done


def verdict(rows: list, args, backend: str) -> None:
    # the windows after the warm-up ones, and under JAX after its compiles ahead have ended (each adds executables)
    first = args.warmup_windows
    if backend == "jax":
        first = max(first, next((i for i, r in enumerate(rows) if r[3]), len(rows)))
    after = rows[first:]
    compiles = rows[-1][2] if rows else 0
    if len(after) < 2:
        print(f"verdict: too few windows after warm-up for a slope (from window {first}, {len(rows)} in all); "
              f"compiles while serving: {compiles:.0f}", flush=True)
        return
    per_k = slope([r[0] for r in after], [r[1] for r in after]) * 1000
    # A leak grows throughout; the allocator's heap grows in steps (a new arena, a larger one) and then
    # stays: its windows' slope is steep where the later half's is flat
    later = after[len(after) // 2:] if len(after) >= 4 else after
    later_k = slope([r[0] for r in later], [r[1] for r in later]) * 1000
    grows = per_k > args.flat_mib and later_k > args.flat_mib
    print(f"verdict: RSS slope {per_k:+.2f} MiB per 1000 requests over windows {first}..{len(rows) - 1} "
          f"({after[0][1]:.1f} -> {after[-1][1]:.1f} MiB, {after[-1][0] - after[0][0]} requests), "
          f"{later_k:+.2f} over their later half: {'GROWS' if grows else 'flat'} (threshold {args.flat_mib} "
          f"MiB/1000, both); compiles while serving: {compiles:.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", nargs="+", choices=["torch", "jax"], default=["torch", "jax"])
    parser.add_argument("--requests", type=count, default=3000, help="requests a backend (3000)")
    parser.add_argument("--minutes", type=float, default=10.0, help="or stop sending after this long (10)")
    parser.add_argument("--window", type=count, default=250, help="requests a row of the table (250)")
    parser.add_argument("--warmup-windows", type=int, default=2, help="windows left out of the slope (2)")
    parser.add_argument("--concurrency", type=count, default=12, help="requests in flight at once (12: 8 rows + 4)")
    parser.add_argument("--flat-mib", type=float, default=1.0, help="a slope above this MiB/1000 requests grows (1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.warmup_windows < 0 or args.minutes <= 0:
        parser.error(f"--warmup-windows must be 0 or more and --minutes more than 0, not {args.warmup_windows} "
                     f"and {args.minutes}")
    for backend in args.backend:
        soak(backend, args)


if __name__ == "__main__":
    main()
