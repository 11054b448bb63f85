"""A small serving loop: requests arrive over time, stream back, and one is cancelled.

    python examples/03-serve-loop/serve_loop.py [--backend jax]

Uses random weights on the tiny test card, so it runs anywhere in seconds; the
engine is the same one `linnet serve` and throughput.py use.
"""

import argparse
import asyncio
import random

from linnet import nest
from linnet.serve import Engine, Request

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
args = parser.parse_args()

model = nest.load("tiny-llama", backend=args.backend, weights="random", generics={"Batch": 4, "MaxSeq": 128})
engine = Engine(model)
engine.warmup([8, 16, 32])
rng = random.Random(0)


async def client(i: int, delay: float, cancel_after: int | None = None):
    await asyncio.sleep(delay)
    prompt = [rng.randrange(1, model.vocab) for _ in range(rng.randint(4, 30))]
    request = Request(prompt=prompt, max_new_tokens=20, temperature=0.8, seed=i)
    got = []
    async for new, reason in engine.stream(request):
        got += new
        if cancel_after is not None and len(got) >= cancel_after:
            engine.cancel(request.id)
        if reason:
            print(f"request {i}: {len(prompt)} prompt tokens -> {len(got)} tokens, finished: {reason}")


async def main():
    engine.start()
    await asyncio.gather(*(client(i, 0.05 * i, cancel_after=5 if i == 3 else None) for i in range(10)))
    engine.stop()


asyncio.run(main())
