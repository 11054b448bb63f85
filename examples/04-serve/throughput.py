"""Serves Llama 3.1 8B from Nest with `linnet.serve` under the benchmarks'
load: 256 requests of 128 to 512 prompt tokens, at most 64 in flight, each
generating 128 tokens. Prints the generated tokens per second.

Without a GPU or the weights, try a small card with random weights:
    python examples/04-serve/throughput.py --card smollm2-135m-instruct --weights random \\
        --requests 32 --rows 16 --min-prompt 32 --max-prompt 128 --new 32 --dtype f32
or the embedded SmolLM2 GGUF's Q4_1 linears run in their blocks (vLLM's --quantization gguf):
    python examples/04-serve/throughput.py --card smollm2-135m-instruct --quantization gguf \\
        --requests 32 --rows 16 --min-prompt 32 --max-prompt 128 --new 32
"""

import argparse
import random
import sys
import time

from linnet import nest
from linnet.serve import Engine, EngineSettingError, Request


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--card", default="llama-3.1-8b-instruct", help="a card's name (see `linnet cards`; llama-3.1-8b-instruct)")
parser.add_argument("--backend", choices=["torch", "jax"], default="torch", help="(torch)")
parser.add_argument("--requests", type=positive, default=256, help="how many requests (256)")
parser.add_argument("--rows", type=positive, default=64, help="requests in flight (64)")
parser.add_argument("--new", type=positive, default=128, help="tokens each request generates (128)")
parser.add_argument("--min-prompt", type=positive, default=128, help="fewest prompt tokens (128)")
parser.add_argument("--max-prompt", type=positive, default=512, help="most prompt tokens (512)")
parser.add_argument("--device", default=None,  # (nest.load's choice: torch is not imported before --help)
                    help="torch device (default: cuda when present)")
parser.add_argument("--weights", default=None,
                    help="a checkpoint path, or 'random' to benchmark without the files (default: the card's)")
parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"], help="the element type T (bf16)")
parser.add_argument("--token-budget", type=positive, default=None, help="most tokens in one pass (default: 2048 on a GPU, 512 on a CPU)")
parser.add_argument("--shards", type=positive, default=None, help="jax: spread the model over this many devices")
parser.add_argument("--quantization", "-q", choices=["gguf"], default=None,
                    help="gguf: a .gguf's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS "
                         "linears run in their blocks (torch on the CPU)")
args = parser.parse_args()
if args.min_prompt > args.max_prompt:
    parser.error(f"--min-prompt ({args.min_prompt}) is more than --max-prompt ({args.max_prompt})")
if args.shards is not None and args.backend != "jax":  # (as `linnet serve` refuses it: torch would ignore it)
    parser.error("--shards spreads a JAX model over devices: pass --backend jax")

# One cache row per request in flight, long enough for the longest prompt
# and its completion.
generics = {"Batch": args.rows, "MaxSeq": args.max_prompt + args.new, "T": args.dtype}
start = time.perf_counter()
try:
    if args.backend == "torch":
        # Generated PyTorch, each step replayed as one CUDA graph.
        model = nest.load(args.card, backend="torch", device=args.device, numerics="fast", compile=True,
                          generics=generics, cast_dtype=True, weights=args.weights, tokenizer=False,
                          quantization=args.quantization)
    else:
        # Every entry over one copy of the weights, compiled by XLA.
        model = nest.load(args.card, backend="jax_model", numerics="fast", generics=generics, cast_dtype=True,
                          weights=args.weights, tokenizer=False, shards=args.shards, quantization=args.quantization)
# the card, its weights, the device, or a quantization where it does not run: said why
except (nest.CardError, nest.WeightsError, nest.DeviceError, ValueError) as err:
    parser.exit(1, f"{parser.prog}: error: {err}\n")
print(f"loaded in {time.perf_counter() - start:.0f} s", file=sys.stderr)  # apart from the two lines

rng = random.Random(0)
top = min(20000, model.vocab)  # the seed's ids, 100 to 20000; a small test card's own vocabulary
prompts = [
    [rng.randrange(min(100, top // 2), top) for _ in range(rng.randint(args.min_prompt, args.max_prompt))]
    for _ in range(args.requests)
]
try:
    engine = Engine(model, token_budget=args.token_budget)
except EngineSettingError as err:  # a token budget too small for the rows
    parser.exit(1, f"{parser.prog}: error: {err}\n")
start = time.perf_counter()
engine.warmup(len(prompt) for prompt in prompts)
print(f"compiled in {time.perf_counter() - start:.0f} s", flush=True)

# No end token: every request generates all its tokens, as in the benchmarks.
done, stats = engine.run([Request(prompt=prompt, max_new_tokens=args.new, ignore_eos=True) for prompt in prompts])
failed = [c for c in done if c.finish_reason == "error"]
if failed:
    print(f"{len(failed)} requests failed; the first: {failed[0].error}")
rate = stats.generated_tokens / stats.seconds
# apart from the two lines: the passes the run made, and how its decode steps ran
if args.backend == "jax":  # the XLA options its entries compiled with (codegen_jax.runtime.compiler_options)
    from linnet.codegen_jax.runtime import compiler_options

    how = f", XLA options {compiler_options(model.runner.device.platform)}"
else:
    how = ", decode steps " + (
        "replayed" if engine.runner.replays else f"eager ({engine.runner.not_replayed or 'no capture on this device'})")
    if engine.runner.kernels_chosen:  # each choice of Linnet's Triton kernels, timed at the capture
        how += f"; kernels timed: {engine.runner.kernels_chosen}"
print(f"passes {stats.passes}{how}", file=sys.stderr)
print(f"{stats.generated_tokens} tokens in {stats.seconds:.2f} s: {rate:.0f} tokens/s")
