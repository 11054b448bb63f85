"""A dim in a message is printed as Python reads it: the printed text, evaluated with numbers, is the
dim's value (Python's precedence is the reference), and a quotient alone is not put in parentheses.

(`dim / (2 * heads)` used to print as `dim / 2 * heads`, which is (dim / 2) * heads.)
"""

from __future__ import annotations

import pytest

from linnet.ir.dims import Dim

DIM, HEADS = Dim.name("dim"), Dim.name("heads")


@pytest.mark.parametrize("dim, text", [
    (DIM // 3, "dim / 3"),
    ((DIM - 3) // 3, "(dim - 3) / 3"),  # the number last, as written (it printed `-3 + dim`)
    (3 - DIM, "-dim + 3"),
    (DIM // (2 * HEADS), "dim / (2 * heads)"),
    (DIM // (HEADS * HEADS), "dim / (heads * heads)"),
    (2 * (DIM // 3), "2 * (dim / 3)"),
    ((DIM // 3) // HEADS, "(dim / 3) / heads"),
    (DIM // 3 + HEADS, "heads + (dim / 3)"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_dim_prints_as_python_reads_it(dim: Dim, text: str):
    assert str(dim) == text
    values = {"dim": 48, "heads": 4}  # each division exact, as specialization requires
    assert eval(text, {}, dict(values)) == dim.evaluate(values)
