"""Requests' own chat templates, rendered in worker processes bounded in time and memory.

A template a client sends runs in Jinja's sandbox with its sizes bounded
(`bounded_template`), but loops nested deep or a macro fanning out can still
run for hours, and memory can be heaped up a little at a time; a Python thread
cannot be stopped, and whatever it holds the server holds. So each render runs
in a worker process (`template_worker`) capped at `memory` bytes beyond what it
starts with, and a render not answered within `seconds` has its worker killed:
the request gets a TemplateLimitError naming the bound, and the server, its
engine and every other request go on. At most `workers` renders run at once
(the others wait for one); a worker serves render after render, and a new one
starts where one was killed.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from .bounded_template import TemplateLimitError
from .errors import TokenizerError

START_SECONDS = 60.0  # for a worker to import Jinja and say it is ready, on a loaded machine


class _Worker:
    def __init__(self, memory: int):
        import linnet

        # this process's linnet, wherever it was imported from; one thread for the libraries it imports
        path = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(linnet.__file__)),
                                           os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "linnet.nest.template_worker", str(memory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._buffer = b""
        ready = self.read(time.monotonic() + START_SECONDS)
        if ready != {"ready": True}:
            self.kill()
            raise RuntimeError(f"the chat template worker did not start: {ready}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read(self, deadline: float) -> dict | None:
        """The next line, as JSON; None where the deadline passes first; {} where the worker ended."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return {}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


class TemplateSandbox:
    """Renders templates in up to `workers` processes, each render held to `seconds` and `memory` bytes."""

    def __init__(self, seconds: float = 5.0, memory: int = 512 << 20, workers: int = 2):
        self.seconds, self.memory, self.workers = seconds, memory, workers
        self._slots = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._closed = False

    def render(self, source: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               special_tokens: dict[str, str | None] | None = None, **extra: Any) -> str:
        """`source` rendered for `messages` as `chat_template.render_chat_template` renders it, in a
        worker: a TemplateLimitError past a bound, a TokenizerError where the template fails."""
        job = json.dumps({"template": source, "messages": messages, "add_generation_prompt": add_generation_prompt,
                          "special_tokens": special_tokens or {}, "extra": extra}).encode() + b"\n"
        with self._slots:
            worker = self._worker()
            try:
                worker.proc.stdin.write(job)
                worker.proc.stdin.flush()
                reply = worker.read(time.monotonic() + self.seconds)
            except (BrokenPipeError, ValueError):
                reply = {}
            if reply is None:
                worker.kill()
                raise TemplateLimitError(f"it did not finish within {self.seconds:g} s, the longest a request's "
                                         f"template may render")
            if not reply:
                code = worker.proc.wait()
                worker.kill()
                raise TemplateLimitError(f"its renderer stopped (exit status {code}): it may have needed more "
                                         f"than {self.memory >> 20} MiB of memory")
            with self._lock:
                kept = not reply.get("exiting") and not self._closed
                if kept:
                    self._idle.append(worker)
            if not kept:
                worker.kill()
        if "error" in reply:
            raise (TemplateLimitError if reply.get("limit") else TokenizerError)(reply["error"])
        return reply["text"]

    def warm(self) -> None:
        """Start a worker ahead of the first render (a worker's start: about half a second)."""
        with self._slots:
            worker = self._worker()
            with self._lock:
                kept = not self._closed
                if kept:
                    self._idle.append(worker)
            if not kept:
                worker.kill()

    def _worker(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return _Worker(self.memory)

    def close(self) -> None:
        """End the workers (one rendering now, when its render is answered)."""
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for worker in idle:
            worker.kill()
