"""The quantized CPU linear (`cpu_qlinear`, a GGUF's blocks as they are) against `cpu_linear`'s bf16
panels of the same weight decoded, at one row, a 16-row decode step and a long prompt's prefill.

SmolLM2-135M's shapes: [rows, 576] x [1536, 576] (gate, up), [rows, 1536] x [576, 1536] (down) and
the [rows, 576] x [49152, 576] head, and [rows, 1024] x [2048, 1024] (a K the K-quants take; each type
runs the shapes whose K its blocks divide); random blocks, x in bf16 as the model runs it. Prints each
kernel's median milliseconds and the quantized kernel's time over bf16's (below 1: faster), and the
least times' ratio (a host other work keeps busy slows some runs of either). For the head's shape, also
the tied embedding's gather of `rows` random ids from the head's panels (`cpu_qlinear.gather`) against
`cpu_ops.gather_rows` from the table decoded to bf16 (the copy it replaces).

    python benchmarks/qlinear_rows.py --rows 1 16 512 --types Q4_1 Q8_0 Q5_0 Q4_0 Q4_K Q5_K Q6_K --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np
import torch

from bench_args import count  # this folder's
from linnet.kernels import cpu_linear, cpu_ops, cpu_qlinear

SHAPES = [(1536, 576), (576, 1536), (49152, 576), (2048, 1024)]  # the last for the K-quants (K a multiple of 256)


def random_blocks(qtype, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random quants with finite f16 scales of a trained weight's size at each block's f16 fields."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n, k // gguf.GGML_QUANT_SIZES[qtype][0], size), dtype=np.uint8)
    for at in cpu_qlinear.HALVES[int(qtype)]:
        blocks[..., at:at + 2] = (rng.standard_normal(blocks.shape[:2] + (1,)) * 0.02).astype(np.float16).view(np.uint8)
    return blocks


def medians_ms(f, g, repeats: int) -> tuple:
    """f's and g's median and least milliseconds, their runs taken in turn (so that other work on the host slows
    both)."""
    f(), g()
    times = ([], [])
    for _ in range(repeats):
        for fn, out in zip((f, g), times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return tuple((statistics.median(t) * 1e3, min(t) * 1e3) for t in times)


def gather_rows(name: str, quant_table, table: torch.Tensor, args, rng: np.random.Generator) -> None:
    """Rows of a tied embedding (blocks of type `name`) gathered from its head's panels against the same rows
    of the decoded table."""
    n, k = table.shape
    for rows in args.rows:
        ids = torch.from_numpy(rng.integers(0, n, rows).astype(np.int32))
        (q, q_least), (b, b_least) = medians_ms(lambda: cpu_qlinear.gather(quant_table, ids, torch.bfloat16),
                                                lambda: cpu_ops.gather_rows(table, ids, torch.bfloat16), args.repeats)
        print(f"gather {rows:4d} of [{n}, {k}] {name:5s} {q:9.3f} ms   "
              f"bf16 {b:9.3f} ms   {q / b:5.2f}x   (least {q_least:.3f} and {b_least:.3f} ms)")


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(prog="qlinear_rows.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=count, nargs="+", default=[1, 16, 512])
    parser.add_argument("--types", nargs="+", default=["Q4_1", "Q8_0"], choices=[n for n in cpu_qlinear.READS.values()])
    parser.add_argument("--repeats", type=count, default=15)
    parser.add_argument("--threads", type=count, help="the kernels' threads (default: torch's, the cores)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"{torch.get_num_threads()} threads, ISA {cpu_linear.isa()}, median of {args.repeats}")
    for n, k in SHAPES:
        for name in args.types:
            qtype = gguf.GGMLQuantizationType[name]
            if k % gguf.GGML_QUANT_SIZES[qtype][0]:
                continue
            blocks = random_blocks(qtype, n, k, rng)
            quant = cpu_qlinear.pack(blocks, qtype, n, k)
            table = torch.from_numpy(gguf.quants.dequantize(blocks.reshape(n, -1), qtype)).reshape(n, k)
            table = table.to(torch.bfloat16)
            if n == SHAPES[2][0]:
                gather_rows(name, cpu_qlinear.QuantTable(quant, torch.bfloat16), table, args, rng)
            panels = cpu_linear.pack(table)
            for rows in args.rows:
                x = torch.randn(rows, k).to(torch.bfloat16)
                repeats = args.repeats if rows * n * k < 1e10 else 5
                (q, q_least), (b, b_least) = medians_ms(lambda: cpu_qlinear.matmul(x, quant),
                                                        lambda: cpu_linear.matmul(x, panels), repeats)
                print(f"[{rows:4d}, {k}] x [{n}, {k}] {name:5s} {q:9.3f} ms   bf16 {b:9.3f} ms   {q / b:5.2f}x   "
                      f"(least {q_least:.3f} and {b_least:.3f} ms: {q_least / b_least:.2f}x)")


if __name__ == "__main__":
    main()
