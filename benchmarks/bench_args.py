"""The benchmarks' shared argument type: a count that must be at least 1 (requests, rows, repeats, threads),
refused by argparse's one error line instead of an empty median's traceback later."""

from __future__ import annotations

import argparse


def count(text: str) -> int:
    """An int of at least 1, for `type=` of an argparse flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
