"""Chats with the embedded default model (SmolLM2-135M-Instruct), streaming the answer.

    python examples/02-generate/generate.py "What is the capital of France?" [--backend jax]
"""

import argparse
import asyncio
import sys
import time

from linnet import nest
from linnet.serve import Engine, Request, RequestError

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("prompt", nargs="?", default="What is the capital of France?",
                    help="the user's message (default: What is the capital of France?)")
parser.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens in the answer (64)")
args = parser.parse_args()
MAX_SEQ = 512  # positions of the one cache row: the prompt and its answer
if args.max_new_tokens < 1:
    parser.error(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")

# fast numerics and compile=True, as `linnet generate` and `linnet serve` load it: torch captures the
# decode step once and replays it (a CUDA graph, or a CPU graph of Linnet's kernels)
model = nest.load("smollm2-135m-instruct", backend=args.backend, numerics="fast", compile=True,
                  generics={"Batch": 1, "MaxSeq": MAX_SEQ})
tok = model.tokenizer
text = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
request = Request(prompt=tok.encode(text), max_new_tokens=args.max_new_tokens)
try:
    request.validate(model.vocab, MAX_SEQ)  # (the engine would refuse it too, at submission)
except RequestError as err:
    parser.exit(1, f"{parser.prog}: error: {err}\n")


async def main():
    engine = Engine(model)
    engine.warmup([len(request.prompt)])  # compiles (JAX) or captures what this prompt needs, before the clock
    engine.start()
    decoder = tok.incremental_decoder(skip_special_tokens=True, context=request.prompt)  # the text as it follows the prompt
    start, count = time.perf_counter(), 0
    async for new, _ in engine.stream(request):
        for t in new:
            sys.stdout.write(decoder.push(t))
            sys.stdout.flush()
        count += len(new)
    sys.stdout.write(decoder.flush() + "\n")
    engine.stop()
    print(f"[{count} tokens in {time.perf_counter() - start:.2f} s]", file=sys.stderr)


asyncio.run(main())
