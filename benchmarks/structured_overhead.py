"""What a structured output costs a decode: one request, 128 new tokens, SmolLM2-135M-Instruct
(Batch 4, MaxSeq 512, bf16, numerics "fast", compiled as `linnet serve` has it), greedy, free and then held to a JSON schema and to a
regular expression, each round in turn so that the machine's noise falls on all three alike.
Prints each one's median tokens/s over `--repeats` rounds, its ratio to the free run's of the
same rounds, and the host's median ms a token outside the model's step (what a structure adds is
there; the machine's noise mostly falls in the step); with `--profile`, where the host's time goes in the structured runs (cProfile's
cumulative seconds per call of the functions that matter, per token).

Both structures are long enough that neither ends before the 128th token (a schema of 64 integers,
a regex of 2000 letters and spaces), so every run times the same number of draws.

    python benchmarks/structured_overhead.py [--backend torch|jax] [--repeats 5] [--profile] [--tokens FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time

from bench_args import count  # this folder's

CARD = "smollm2-135m-instruct"
NEW = 128
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["primes"],
          "properties": {"primes": {"type": "array", "minItems": 64, "maxItems": 64,
                                    "items": {"type": "integer", "minimum": 0}}}}
REGEX = r"[a-z ]{2000}"
PROMPT = "List the first 64 prime numbers as JSON, then describe them in plain lowercase words."


def load(backend: str):
    from linnet import nest

    return nest.load(CARD, backend=backend, generics={"Batch": 4, "MaxSeq": 512, "T": "bf16"}, numerics="fast",
                     compile=True)  # as `linnet serve` loads it: decode replays its captured graph


def requests(model):
    from linnet.serve import Request
    from linnet.serve.structured import Structure

    text = model.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    prompt = model.tokenizer.encode(text, add_special_tokens=False)
    kinds = {"free": None, "json": Structure("json", SCHEMA), "regex": Structure("regex", REGEX)}
    return {name: (lambda s=s: Request(prompt=list(prompt), max_new_tokens=NEW, ignore_eos=s is None, structure=s))
            for name, s in kinds.items()}


class ModelTime:
    """Seconds spent waiting on the model's step: torch's decode call (on the CPU it returns once the
    step has run), JAX's read of a step's draws (its call returns at once); the rest of a token's
    time is the host's (the masks, the draw's own ops on torch, the engine)."""

    def __init__(self, runner):
        self.waits = []  # (start, seconds) of each
        name = "decode" if hasattr(runner, "_eager_decode") else "_to_host"
        inner = getattr(runner, name)

        def timed(*args):
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self.waits.append((start, time.perf_counter() - start))
        setattr(runner, name, timed)

    def since(self, start: float) -> float:
        return sum(seconds for at, seconds in self.waits if at >= start)


def rate(engine, make, model_time: ModelTime) -> tuple[float, float, list]:
    """Tokens/s of the request's decode (its first token, the prefill's, left out), the host's ms
    a token outside the model's step, and its tokens."""
    engine.model.reset()
    model_time.waits.clear()
    done, _ = engine.run([make()])
    times = done[0].token_times
    assert len(done[0].tokens) == NEW, (len(done[0].tokens), done[0].finish_reason, done[0].text)
    seconds = times[-1] - times[0]
    host = seconds - model_time.since(times[0])  # (the prefill's wait, before the first token, left out)
    return (len(times) - 1) / seconds, 1000 * host / (len(times) - 1), done[0].tokens


def main():
    from linnet.serve import Engine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax"], help="(torch)")
    parser.add_argument("--repeats", type=count, default=5, help="runs of each; the median is printed (5)")
    parser.add_argument("--profile", action="store_true", help="where the host's time goes in the structured runs (cProfile)")
    parser.add_argument("--tokens", help="a JSON file to write each run's tokens to (to compare two versions')")
    args = parser.parse_args()
    model = load(args.backend)
    engine = Engine(model)
    engine.warmup(structured=True)
    model_time = ModelTime(engine.runner)
    kinds = requests(model)
    outputs = {name: rate(engine, make, model_time)[2] for name, make in kinds.items()}  # a first run of each
    rates, host = {name: [] for name in kinds}, {name: [] for name in kinds}
    for _ in range(args.repeats):
        for name, make in kinds.items():
            r, h, tokens = rate(engine, make, model_time)
            assert tokens == outputs[name], f"{name}: greedy, yet not the same tokens twice"
            rates[name].append(r)
            host[name].append(h)
    if args.tokens:
        with open(args.tokens, "w") as f:
            json.dump(outputs, f)
    free = statistics.median(rates["free"])
    print(f"{args.backend}: {NEW} new tokens, median of {args.repeats} rounds")
    for name, rs in rates.items():
        median = statistics.median(rs)
        ratios = [r / f for r, f in zip(rs, rates["free"])]
        print(f"  {name:6s} {median:7.1f} tokens/s  x{median / free:.3f} of free (x{statistics.median(ratios):.3f}"
              f" median of rounds)  host {statistics.median(host[name]):.2f} ms a token outside the model's step"
              f"  runs: {' '.join(f'{r:.1f}' for r in rs)}")
    if args.profile:
        for name in ("free", "json"):
            profile = cProfile.Profile()
            start = time.perf_counter()
            profile.runcall(rate, engine, kinds[name], model_time)
            print(f"\nprofile, {name} ({time.perf_counter() - start:.2f} s under the profiler):")
            pstats.Stats(profile).sort_stats("cumulative").print_stats(
                r"engine.py.*(_sampling|_take|_finished|_dispatch)|runners.py.*(_draw|decode|logit_adjustments)"
                r"|structured.py|sampling_torch.py.*sample|sampling_jax.py.*sample|\{.*(consume|fill_next|cpu|"
                r"numpy|masked_fill)|upload|call_then", 30)


if __name__ == "__main__":
    main()
