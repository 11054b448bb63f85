"""A serving engine's counters in Prometheus' text format, for GET /metrics.

Counters run from the engine's start; the latencies' quantiles are over the
latest samples the engine keeps (engine.SERVING_WINDOW).
"""

from __future__ import annotations

from linnet.serve.stats import percentiles


def _line(name: str, value, labels: dict | None = None) -> str:
    tags = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    return f"{name}{tags} {value}"


def prometheus_text(engine) -> str:
    s = engine.stats
    out = []

    def metric(name: str, kind: str, help_: str, samples: list):
        out.append(f"# HELP linnet_{name} {help_}")
        out.append(f"# TYPE linnet_{name} {kind}")
        out.extend(_line(f"linnet_{name}", value, labels) for labels, value in samples)

    metric("requests_running", "gauge", "Requests holding a cache row.", [(None, len(engine.live))])
    metric("requests_waiting", "gauge", "Requests waiting for a cache row.", [(None, len(engine.waiting))])
    metric("cache_rows", "gauge", "Cache rows (requests in flight at most).", [(None, engine.rows)])
    metric("requests_finished_total", "counter", "Requests ended, by finish reason.",
           [({"reason": r}, n) for r, n in sorted(s.finished.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens submitted.", [(None, s.prompt_tokens)])
    metric("prefill_tokens_total", "counter", "Prompt tokens computed (shared prefixes are copied).",
           [(None, s.prefill_tokens)])
    metric("generation_tokens_total", "counter", "Tokens generated.", [(None, s.generated_tokens)])
    metric("passes_total", "counter", "Model passes, by kind.", [({"kind": k}, n) for k, n in s.passes.items()])
    for name, samples, help_ in (("time_to_first_token_seconds", s.ttft, "Submission to first token"),
                                 ("inter_token_latency_seconds", s.token_latency, "Between a request's tokens")):
        qs = percentiles(list(samples))
        metric(name, "gauge", f"{help_}, quantiles of the latest samples.",
               [({"quantile": f"0.{q[1:]}"}, v) for q, v in qs.items()])
    return "\n".join(out) + "\n"
