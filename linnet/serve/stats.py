"""Counters and latencies of one `Engine.run`, or of a serving engine since it started."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def percentiles(values: list, qs=(50, 90, 99)) -> dict:
    """{"p50": ..., ...} of `values`; each None where there are none (no request has had a token yet)."""
    if not values:
        return {f"p{q}": None for q in qs}
    s = sorted(values)
    return {f"p{q}": s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] for q in qs}


@dataclass
class Stats:
    generated_tokens: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (shared prefixes are copied, not recomputed)
    copied_tokens: int = 0
    seconds: float = 0.0  # `Engine.run`'s wall time; an engine stepped otherwise (a server's), its steps' time
    # passes sent out, by kind: a decode step sent ahead (JAX, CUDA) counts though its draws are dropped
    # where every request in it has ended
    passes: dict = field(default_factory=lambda: {"prefill": 0, "mixed": 0, "decode": 0, "copy": 0})
    ttft: list = field(default_factory=list)  # seconds from submission to first token, per request
    token_latency: list = field(default_factory=list)  # seconds between a request's tokens
    occupancy: list = field(default_factory=list)  # rows in use / rows, per pass
    compiles: int = 0  # new executables or graphs made during the run (0 after a complete warmup)
    compiled: list = field(default_factory=list)  # what those were, call by call: the pass size or draw a warmup missed
    finished: dict = field(default_factory=dict)  # requests ended, by finish reason
    window: int | None = None  # a server's: latencies and occupancy kept for the latest `window` samples only

    def __post_init__(self):
        if self.window is not None:  # a server runs for weeks: its samples must not grow without end
            self.ttft, self.token_latency, self.occupancy = (deque(x, maxlen=self.window) for x in
                                                             (self.ttft, self.token_latency, self.occupancy))

    def ended(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def summary(self) -> dict:
        return {
            "generated_tokens": self.generated_tokens, "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens, "copied_tokens": self.copied_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(self.generated_tokens / self.seconds, 2) if self.seconds else 0.0,
            "passes": dict(self.passes),
            "ttft_s": percentiles(self.ttft), "token_latency_s": percentiles(self.token_latency),
            "occupancy": round(sum(self.occupancy) / len(self.occupancy), 3) if self.occupancy else 0.0,
            "compiles": self.compiles, "compiled": list(self.compiled), "finished": dict(self.finished),
        }
