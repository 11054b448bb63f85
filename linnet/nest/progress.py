"""A progress bar on standard error, drawn only when it is a terminal.

    bar = Progress("weights", total=272)
    for ...: bar.update(note=name)
    bar.close()

Nothing is written when the stream is not a terminal (pipes, logs, CI), so
output that is read by programs stays clean.
"""

from __future__ import annotations

import sys
import time


class Progress:
    WIDTH = 28

    def __init__(self, label: str, total: int = 0, stream=None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self.label, self.total, self.done = label, total, 0
        self.start = self._drawn = time.perf_counter()
        self._shown = False
        if self.enabled:
            self._draw("")

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._drawn >= 0.1 or self.done >= self.total):
            self._drawn = now
            self._draw(note)

    def close(self, note: str = "") -> None:
        if self.enabled:
            self.done = max(self.done, self.total)
            self._draw(note or (f"{time.perf_counter() - self.start:.1f}s" if self.total else "done"))
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, note: str) -> None:
        if self.total:
            frac = min(1.0, self.done / self.total)
            fill = int(frac * self.WIDTH)
            bar = f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {self.done}/{self.total}"
        else:  # unknown length: elapsed time only
            bar = f"{time.perf_counter() - self.start:.1f}s"
        line = f"{self.label} {bar} {note}"[:_columns(self.stream) - 1]
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self._shown = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _columns(stream) -> int:
    import shutil

    return max(20, shutil.get_terminal_size((100, 24)).columns)
