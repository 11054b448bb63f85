"""Where a torch serving step's time goes on the GPU: the parts of throughput.py's load timed apart.

Random weights of a card (default Llama 3.1 8B, bf16) with throughput.py's rows and MaxSeq, its
cache filled with noise; then, each the median of --steps:
- the decode step alone: replayed from its CUDA graph (where decoding tokens attend through flash
  attention's variable-length kernel; also with SDPA instead, and with Linnet's Triton kernels: its
  attention, its small ops, both), and run eagerly (launch-bound where the two differ by much more
  than the weights' bytes over the memory's bandwidth);
- a whole engine step: the step sent ahead and its draws read back (what the engine waits for);
- a pass of packed prompts (--pack tokens in prompts of --prompt) and a mixed pass (every row's
  decode token and one prompt), both eager, as the engine runs them (also with Triton's small ops);
then torch's profiler over one of each: the kernels that took the most GPU time.
With --backend jax, the same timings of JAX's executables (the engine step, the packed and the mixed
pass, each compiled first; on a GPU the engine step also with XLA's attention in place of cuDNN's),
without the kernel tables.

    python benchmarks/gpu_profile.py [--card llama-3.1-8b-instruct] [--rows 64] [--max-seq 640] [--backend jax]
    python benchmarks/gpu_profile.py --card smollm2-135m-instruct --device cpu --rows 8 --dtype f32  # the script itself
"""

import argparse
import os
import statistics
import time
from unittest import mock

import numpy as np
import torch

from bench_args import count  # this folder's
from cuda_needed import require_cuda, require_jax_gpu  # this folder's
from linnet import nest
from linnet.codegen_torch import runtime as rt
from linnet.kernels import triton_attention
from linnet.serve.runners import TorchRunner, make_runner
from linnet.serve.sampling import SamplingBatch
from linnet.serve import Request

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--card", default="llama-3.1-8b-instruct", help="the card, with random weights (%(default)s)")
parser.add_argument("--rows", type=count, default=64, help="cache rows, each decoded in a step (64)")
parser.add_argument("--max-seq", type=count, default=640, help="positions per row (640)")
parser.add_argument("--pack", type=count, default=2048, help="tokens in the packed-prompt pass")
parser.add_argument("--prompt", type=count, default=512, help="tokens in each of its prompts")
parser.add_argument("--steps", type=count, default=20, help="steps timed (20)")
parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"], help="the element type T (bf16)")
parser.add_argument("--device", default="cuda",
                    help="torch's device (cuda; cpu: to try the script itself, with a small card)")
parser.add_argument("--kernels", type=count, default=12, help="kernels listed per profile")
parser.add_argument("--backend", default="torch", choices=["torch", "jax"], help="(torch)")
args = parser.parse_args()
(require_jax_gpu if args.backend == "jax" else require_cuda)("gpu_profile.py", args.device)  # the GPU it runs on
cuda = args.device.startswith("cuda")
jax_backend = args.backend == "jax"


def sync():
    if cuda and not jax_backend:
        torch.cuda.synchronize()


def median_ms(run, steps=args.steps) -> float:
    run()  # (first calls: captures, allocations)
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def profiled(name: str, run) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        run()
        sync()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    print(f"\n-- {name}: the kernels that took most {'GPU' if cuda else 'CPU'} time")
    print(prof.key_averages().table(sort_by=key, row_limit=args.kernels, max_name_column_width=70))


def weight_copies(jax_model, tokens, positions) -> str:
    """Whether XLA copies what a GPU's layer loop should read in place, in the decode step as
    compiled: a layer of a stacked weight taken out before it is multiplied by (a copy doubles the
    weights' reads), a layer of a cache read out of its stack before attention reads it, or a whole
    cache copied (the loop carries the caches, which copy insertion may duplicate). Counts the
    instructions of its optimized HLO, outside fusions' bodies, that make an array of a weight
    layer's or a cache layer's shape (other than views), and the copies of a cache."""
    import re

    import jax

    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), jax_model.state_bits)
    text = jax_model.compiled["decode"].lower(jax_model.weights, state, tokens, positions).compile().as_text()
    layers = {tuple(a.shape[1:]) for a in jax.tree.leaves(jax_model.weights) if a.ndim == 3}
    caches = {tuple(a.shape) for a in jax.tree.leaves(jax_model.state_bits)}
    cache_layers = {shape[1:] for shape in caches}
    made, copied, cache_made, inside = [], [], [], ""
    for line in text.splitlines():
        header = re.match(r"(ENTRY )?%?([\w.-]+) .*\{$", line)
        if header:  # a computation: a fusion's body makes nothing of its own in memory
            inside = header.group(2)
            continue
        m = re.match(r"\s*(ROOT )?%?[\w.-]+ = \w+\[([\d,]*)\]\S* ([\w-]+)\(", line)
        if not m or re.search(r"fused|fusion|wrapped|computation", inside):
            continue
        dims, op, shown = tuple(int(d) for d in m.group(2).split(",") if d), m.group(3), line.strip()[:160]
        makes = op not in ("parameter", "get-tuple-element", "bitcast", "tuple")  # (not a view)
        squeezed = tuple(d for d in dims if d != 1)
        if makes and squeezed in layers:
            made.append(shown)
        if makes and squeezed in cache_layers:  # a layer of a cache, read out of its stack
            cache_made.append(shown)
        if op == "copy" and dims in caches:
            copied.append(shown)
    fused = sorted({k for k in ("dynamic_slice_fusion", "address_computation", "DynamicSliceFusion") if k in text})
    head = (f"weight layers made in the decode step: {len(made)} instructions (dynamic-slice fusion: "
            f"{fused or 'none'}); cache layers made: {len(cache_made)}; whole caches copied: {len(copied)}")
    return head + "".join(f"\n    {line}" for line in (made[:3] + cache_made[:2] + copied[:2]))


start = time.perf_counter()
model = nest.load(args.card, backend="jax_model" if jax_backend else "torch", device=args.device, numerics="fast",
                  compile=True, weights="random", generics={"Batch": args.rows, "MaxSeq": args.max_seq, "T": args.dtype},
                  cast_dtype=True, tokenizer=False)
print(f"loaded in {time.perf_counter() - start:.0f} s")
runner, rows, max_seq = make_runner(model), args.rows, args.max_seq
for name in [] if jax_backend else model.runner.state:  # a cache of noise: every row's keys as a long prompt's would be
    getattr(model.runner, name).normal_()
rng = np.random.default_rng(0)
tokens = rng.integers(100, min(20000, model.vocab), size=rows).astype(np.int32)
positions = rng.integers(max_seq // 4, max_seq - 1, size=rows).astype(np.int32)
greedy = SamplingBatch.of([Request([0])] * rows, [0] * rows, [0] * rows)
on_rows = list(range(rows))

# the packed pass: prompts of args.prompt tokens end to end, each in a row of its own
prompt = min(args.prompt, max_seq - 1)
count = max(1, min(rows, args.pack // prompt))
pack = (rng.integers(100, min(20000, model.vocab), size=count * prompt).astype(np.int32),
        np.tile(np.arange(prompt, dtype=np.int32), count), np.repeat(np.arange(count, dtype=np.int32), prompt),
        (np.arange(count, dtype=np.int32) + 1) * prompt - 1)
# the mixed pass: rows 1.. decode, and row 0 takes a prompt
mixed = (np.r_[tokens[1:], pack[0][:prompt]], np.r_[positions[1:], np.arange(prompt, dtype=np.int32)],
         np.r_[np.arange(1, rows, dtype=np.int32), np.zeros(prompt, np.int32)],
         np.r_[np.arange(rows - 1, dtype=np.int32), [rows - 1 + prompt - 1]].astype(np.int32))

engine_step = lambda: runner.decode_sample(tokens, positions, greedy, on_rows).result()
if jax_backend:  # a pass's logits made ready on the device, as the engine's draw after it waits for them
    packed = lambda: runner.prefill(*pack).block_until_ready()
    joined = lambda: runner.prefill(*mixed).block_until_ready()
    print(f"{args.card}, {args.dtype}, {rows} rows, MaxSeq {max_seq}, JAX on {model.runner.device}")
    for name, run, steps in (("engine step (+ greedy)", engine_step, args.steps),
                             (f"packed pass, {len(pack[0])} tokens", packed, max(3, args.steps // 4)),
                             (f"mixed pass, {rows - 1} + {prompt}", joined, max(3, args.steps // 4))):
        compiled = time.perf_counter()
        run()  # (its compile)
        compiled = time.perf_counter() - compiled
        print(f"{name:<26}{median_ms(run, steps):8.2f} ms  (first call, compiling: {compiled:.1f} s)")
    print(weight_copies(model.runner, tokens, positions))
    if model.runner.device.platform == "gpu" and args.dtype != "f32":
        # the step again with XLA's own attention in place of cuDNN's (LINNET_JAX_CUDNN=0), traced anew
        import jax

        os.environ["LINNET_JAX_CUDNN"] = "0"
        jax.clear_caches()
        model.runner.ahead.clear()
        engine_step()  # (its compile)
        print(f"engine step, XLA attention{median_ms(engine_step):8.2f} ms  (LINNET_JAX_CUDNN=0)")
    raise SystemExit(0)
replayed = lambda: runner.decode(tokens, positions)
eager = lambda: model.decode(tokens, positions)
packed = lambda: runner.prefill(*pack)
joined = lambda: runner.prefill(*mixed)

weights = model.runner.weight_bytes()
print(f"{args.card}, {args.dtype}, {rows} rows, MaxSeq {max_seq}, on {args.device}"
      f"{' (' + torch.cuda.get_device_name() + ')' if cuda else ''}: weights {weights / 1e9:.1f} GB")
replay_ms = median_ms(replayed)
bandwidth = f", {weights / replay_ms / 1e6:.0f} GB/s of weights" if cuda else ""
print(f"decode step, replayed     {replay_ms:8.2f} ms{bandwidth}"
      f"{'' if runner.replays else '  (not replayed: ' + str(runner.not_replayed) + ')'}")
if runner.kernels_chosen:  # (LINNET_TRITON_* unset: each choice of kernels timed at the capture)
    print(f"  kernels kept: {runner.triton.describe()}; timed: {runner.kernels_chosen}")


def step_with(label: str, how_set: str, kernels) -> None:
    """The decode step with these of Linnet's Triton kernels (runtime.TritonKernels, as their
    LINNET_* variables would ask for them), captured anew by a runner of its own."""
    with mock.patch.object(rt, "TRITON_ASKED", kernels):
        other = TorchRunner(model)
        ms = median_ms(lambda: other.decode(tokens, positions))
        how = "replayed" if other.replays else f"not replayed: {other.not_replayed}"
        print(f"decode step, {label:<13}{ms:8.2f} ms ({how}; {how_set})")


cache = getattr(model.runner, "k_cache", None)  # (a Llama-like card's: the check asks of its type and device)
runtime_kernels = rt.TritonKernels(attention=False, ops=False)
if cache is not None and rt.flash_decodes(torch.zeros(1, 1, 128, dtype=cache.dtype, device=args.device), cache):
    # SDPA reading every row's whole cache in place of flash's kernel
    with mock.patch.multiple(rt, _FLASH_TAKES_USED_KEYS=False):
        step_with("SDPA", "LINNET_FLASH_DECODE=0", runtime_kernels)
triton_here = cuda and triton_attention.available()
if triton_here:  # Linnet's Triton kernels: attention in place of flash's; the small ops in place of torch's
    step_with("runtime's", "LINNET_TRITON_DECODE=0 LINNET_TRITON_OPS=0", runtime_kernels)
    step_with("Triton attn.", "LINNET_TRITON_DECODE=1 LINNET_TRITON_OPS=0", runtime_kernels._replace(attention=True))
    step_with("Triton ops", "LINNET_TRITON_DECODE=0 LINNET_TRITON_OPS=1", runtime_kernels._replace(ops=True))
    step_with("Triton both", "both =1", rt.TritonKernels(attention=True, ops=True))
print(f"decode step, eager        {median_ms(eager):8.2f} ms")
print(f"engine step (+ greedy)    {median_ms(engine_step):8.2f} ms")
print(f"packed pass, {len(pack[0])} tokens  {median_ms(packed, max(3, args.steps // 4)):8.2f} ms  "
      f"({count} prompts of {prompt})")
print(f"mixed pass, {rows - 1} + {prompt}     {median_ms(joined, max(3, args.steps // 4)):8.2f} ms")
if triton_here:
    for ops in (False, True):
        with mock.patch.object(runner, "triton", runner.triton._replace(ops=ops)):
            how = f"LINNET_TRITON_OPS={int(ops)}"
            print(f"packed pass, Triton ops={int(ops)} {median_ms(packed, max(3, args.steps // 4)):8.2f} ms ({how})")
            print(f"mixed pass, Triton ops={int(ops)}  {median_ms(joined, max(3, args.steps // 4)):8.2f} ms ({how})")
for name, run in (("decode step, replayed", replayed), ("decode step, eager", eager),
                  (f"packed pass of {len(pack[0])} tokens", packed)):
    profiled(name, run)
