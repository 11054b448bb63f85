"""A serving engine's counters in Prometheus' text format, for GET /metrics.

Counters run from the engine's start; the latencies' quantiles are over the
latest samples the engine keeps (engine.SERVING_WINDOW). The ones vLLM also
exports are given again under vLLM's names and `model_name` label
(`vllm:num_requests_running`, ...), so that dashboards and autoscalers written
for vLLM read them.
"""

from __future__ import annotations

from linnet.serve.stats import percentiles


def _line(name: str, value, labels: dict | None = None) -> str:
    tags = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    return f"{name}{tags} {'NaN' if value is None else value}"  # (a quantile of no samples: Prometheus' NaN)


# vLLM's finished_reason for an engine's finish reason (an "error" has none of vLLM's)
VLLM_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort"}


def prometheus_text(engine, model_name: str | None = None) -> str:
    s = engine.stats
    out = []

    def metric(name: str, kind: str, help_: str, samples: list, prefix: str = "linnet_"):
        out.append(f"# HELP {prefix}{name} {help_}")
        out.append(f"# TYPE {prefix}{name} {kind}")
        out.extend(_line(f"{prefix}{name}", value, labels) for labels, value in samples)

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
    # what the warmup did not cover: a pass size or a draw compiled while requests waited on it
    metric("compiles_total", "counter", "Executables compiled (XLA) or decode steps captured (CUDA, CPU graphs) "
                                        "since the warmup.", [(None, s.compiles)])
    for name, samples, help_ in (("time_to_first_token_seconds", s.ttft, "Submission to first token"),
                                 ("inter_token_latency_seconds", s.token_latency, "Between a request's tokens")):
        qs = percentiles(list(samples))
        metric(name, "gauge", f"{help_}, quantiles of the latest samples.",
               [({"quantile": f"0.{q[1:]}"}, v) for q, v in qs.items()])
    if model_name is not None:
        model = {"model_name": model_name}
        vllm = [("num_requests_running", "gauge", "Requests holding a cache row.", len(engine.live)),
                ("num_requests_waiting", "gauge", "Requests waiting for a cache row.", len(engine.waiting)),
                ("kv_cache_usage_perc", "gauge", "Cache rows in use, as a fraction (a request holds a whole row).",
                 len(engine.live) / engine.rows),
                ("prompt_tokens_total", "counter", "Prompt tokens submitted.", s.prompt_tokens),
                ("generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens)]
        for name, kind, help_, value in vllm:
            metric(name, kind, help_, [(model, value)], prefix="vllm:")
        ended = sorted((VLLM_REASONS[r], n) for r, n in s.finished.items() if r in VLLM_REASONS)  # one name each
        metric("request_success_total", "counter", "Requests ended, by vLLM's finished_reason.",
               [({**model, "finished_reason": r}, n) for r, n in ended], prefix="vllm:")
    return "\n".join(out) + "\n"
