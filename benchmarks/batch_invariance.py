"""Which requests a card serves otherwise beside others than alone: a check of batch invariance.

For each card, backend, numerics and type: 16 requests of 1 to 30 random prompt tokens (or
`--prompt-tokens LO HI`: spans of 512 and more take the attention kernel's parts) through an
Engine of 16 rows together (greedy; seeded top-p / top-k; seeded min-p with penalties; logprobs
with 5 alternatives, every other one its prompt's scores), then each alone, then two copies of each
of the first three. Prints the requests whose tokens, logprobs, alternatives or prompt scores
differ, bit for bit, and where the first difference lies. Random weights (the tiny cards); exact
numerics run f32 only (it computes in f32 whatever T).

    python benchmarks/batch_invariance.py --cards tiny-llama tiny-gpt-oss --backends jax --numerics fast
"""

from __future__ import annotations

import argparse
import random
import time

from linnet import nest
from linnet.serve import Engine, Request


def prompts(n: int, lo: int, hi: int, seed: int, vocab: int) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def ask(prompt, i: int) -> Request:
    kind = [dict(),
            dict(temperature=0.9, top_p=0.8, top_k=20, seed=100 + i),
            dict(temperature=1.3, min_p=0.05, seed=7 + i, repetition_penalty=1.2, presence_penalty=0.3,
                 frequency_penalty=0.2)][i % 3]
    return Request(prompt=prompt, max_new_tokens=6, logprobs=5, prompt_logprobs=5 if i % 2 == 0 else None, **kind)


def outcome(c) -> tuple:
    return (c.tokens, [(lp.token, lp.logprob, lp.top) for lp in c.logprobs],
            [None if x is None else (x.token, x.logprob, x.top) for x in c.prompt_logprobs or []])


def check(card: str, backend: str, numerics: str, dtype: str, lo: int = 1, hi: int = 30, rows: int = 16) -> str:
    start = time.perf_counter()
    max_seq = 64 * -(-(hi + 8) // 64)  # the longest prompt and its new tokens, in a multiple of 64
    model = nest.load(card, backend=backend, weights="random", seed=1, numerics=numerics, tokenizer=False,
                      generics={"Batch": rows, "MaxSeq": max_seq, "T": dtype})
    ps = prompts(16, lo, hi, seed=5, vocab=model.vocab)
    engine = Engine(model, token_budget=max(64, hi))
    together, _ = engine.run([ask(p, i) for i, p in enumerate(ps)])
    alone = [outcome(engine.run([ask(p, i)])[0][0]) for i, p in enumerate(ps)]
    differ = [i for i, (c, a) in enumerate(zip(together, alone)) if outcome(c) != a]
    copies = [i for i in range(3)
              if [outcome(c) for c in engine.run([ask(ps[i], i), ask(ps[i], i)])[0]] != [alone[i], alone[i]]]
    first = ""
    if differ:
        i = differ[0]
        for what, x, y in zip(("tokens", "logprobs", "prompt scores"), outcome(together[i]), alone[i]):
            if x != y:
                first = f"; request {i} first differs in its {what}"
                break
    return (f"{card:14s} {backend:5s} {numerics:5s} {dtype:4s} differ alone: {differ or 'none'}; "
            f"copies differ: {copies or 'none'}{first} ({time.perf_counter() - start:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cards", nargs="+", default=["tiny-llama", "tiny-mixtral"],
                        help="the cards run, with random weights (tiny-llama tiny-mixtral)")
    parser.add_argument("--backends", nargs="+", default=["torch", "jax"], choices=["torch", "jax"],
                        help="(torch jax)")
    parser.add_argument("--numerics", nargs="+", default=["fast", "exact"], choices=["fast", "exact"],
                        help="(fast exact)")
    parser.add_argument("--types", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"],
                        help="the element types T (f32 bf16)")
    parser.add_argument("--prompt-tokens", nargs=2, type=int, default=[1, 30], metavar=("LO", "HI"),
                        help="each prompt's length, drawn from LO to HI (1 30)")
    args = parser.parse_args()
    lo, hi = args.prompt_tokens
    if not 1 <= lo <= hi:
        parser.error(f"--prompt-tokens wants 1 <= LO <= HI, not {lo} {hi}")
    for card in args.cards:  # every name checked before the first card's minutes
        try:
            nest.card(card)
        except nest.CardError as err:
            parser.exit(1, f"{parser.prog}: error: {err}\n")
    for card in args.cards:
        for backend in args.backends:
            for numerics in args.numerics:
                for dtype in args.types if numerics == "fast" else ["f32"]:
                    print(check(card, backend, numerics, dtype, *args.prompt_tokens), flush=True)


if __name__ == "__main__":
    main()
