"""What Gemma 2's cap on attention scores costs in Linnet's CPU attention kernel: one layer of a
decode step (16 rows, 9 query heads over 3 KV heads of 64, a bf16 cache, SmolLM2-135M's shapes)
at a few positions, uncapped and capped at 50 (Gemma 2's), the two alternating in one process.
Prints the median microseconds of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from bench_args import count
from decode_step import timed
from linnet.kernels import cpu_attention


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(prog="capped_attention.py", description=__doc__)
    parser.add_argument("--positions", type=count, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=count, default=5, help="rounds alternating the two (the median is printed)")
    args = parser.parse_args(argv)
    if cpu_attention.library() is None:
        raise SystemExit("Linnet's CPU kernels do not run here")
    g = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, head_dim = 16, 9, 3, 64
    for pos in args.positions:
        k = torch.randn(rows, pos + 1, kv_heads, head_dim, generator=g).bfloat16()
        v = torch.randn(rows, pos + 1, kv_heads, head_dim, generator=g).bfloat16()
        q = torch.randn(rows, heads, head_dim, generator=g).bfloat16()
        at, positions = torch.arange(rows), torch.full((rows,), pos, dtype=torch.int32)
        taken = {0.0: [], 50.0: []}
        for _ in range(args.rounds):
            for cap in taken:
                taken[cap].append(1000 * timed(lambda: cpu_attention.attend_rows(q, k, v, at, positions, 0, None,
                                                                               head_dim ** -0.5, cap), 200))
        plain, capped = (statistics.median(taken[cap]) for cap in taken)
        print(f"position {pos}: uncapped {plain:.0f} us, capped at 50 {capped:.0f} us, {capped / plain:.2f}x")


if __name__ == "__main__":
    main()
