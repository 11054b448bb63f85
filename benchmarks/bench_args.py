"""The benchmarks' shared argument type: a count that must be at least 1 (requests, rows, repeats, threads),
refused by argparse's one error line instead of an empty median's traceback later."""

from __future__ import annotations

from linnet.cli import _number  # the command line's own argparse type for a bounded number

count = _number(1, None, "must be at least 1, not {}")  # an int of at least 1, for `type=` of an argparse flag
