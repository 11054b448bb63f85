"""Symbolic dimensions: integer polynomials over names (config values, generics, entry sizes).

A `Dim` is kept in a canonical form (a sum of monomials with integer
coefficients), so two dims are equal exactly when their canonical forms are:
`heads * head_dim` and `head_dim * heads` compare equal, `n + n` is `2 * n`.
A division that is not exact symbolically (`dim / heads`) becomes an opaque
atom; specialization checks that it divides exactly once numbers are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

Atom = Union[str, "Quotient"]


@dataclass(frozen=True)
class Quotient:
    """`num / den` where the division could not be done symbolically."""

    num: "Dim"
    den: "Dim"

    def sort_key(self) -> str:
        return "~" + str(self)

    def __str__(self) -> str:
        return f"{_paren(self.num)} / {_paren(self.den)}"


def _paren(d: "Dim") -> str:
    """`d` as an operand of `/`: a name or a number as it is, anything else in parentheses (`2 * n`
    and `n / 3` too, so that `x / (2 * n)` is not read as `x / 2 * n`)."""
    s = str(d)
    return s if s.isidentifier() or s.isdigit() else f"({s})"


def _atom_key(a: Atom) -> str:
    return a if isinstance(a, str) else a.sort_key()


Monomial = tuple  # ((atom, power), ...) sorted by atom


@dataclass(frozen=True)
class Dim:
    terms: tuple  # ((Monomial, coeff), ...) sorted, no zero coefficients
    # How the source wrote it, as Python (`(heads + 2 * kv_heads) * head_dim`), for generated code
    # to read as its source; no part of its identity, and lost by arithmetic and by substituting.
    spelling: str | None = field(default=None, compare=False, repr=False)

    # -- construction
    @staticmethod
    def const(value: int) -> "Dim":
        return Dim(((((), int(value)),) if value else ()))

    @staticmethod
    def name(name: str) -> "Dim":
        return Dim(((((name, 1),), 1),))

    @staticmethod
    def of(value: "Dim | int | str") -> "Dim":
        if isinstance(value, Dim):
            return value
        if isinstance(value, str):
            return Dim.name(value)
        return Dim.const(value)

    @staticmethod
    def _from(acc: dict) -> "Dim":
        items = [(m, c) for m, c in acc.items() if c != 0]
        items.sort(key=lambda mc: tuple(_atom_key(a) + str(p) for a, p in mc[0]))
        return Dim(tuple(items))

    # -- queries
    def is_const(self) -> bool:
        return all(not m for m, _ in self.terms)

    def value(self) -> int:
        if not self.is_const():
            raise ValueError(f"dim {self} is not a number")
        return sum(c for _, c in self.terms)

    def names(self) -> set:
        out = set()
        for m, _ in self.terms:
            for a, _ in m:
                if isinstance(a, str):
                    out.add(a)
                else:
                    out |= a.num.names() | a.den.names()
        return out

    # -- arithmetic
    def __add__(self, other) -> "Dim":
        other = Dim.of(other)
        acc = dict(self.terms)
        for m, c in other.terms:
            acc[m] = acc.get(m, 0) + c
        return Dim._from(acc)

    __radd__ = __add__

    def __neg__(self) -> "Dim":
        return Dim(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other) -> "Dim":
        return self + (-Dim.of(other))

    def __rsub__(self, other) -> "Dim":
        return Dim.of(other) - self

    def __mul__(self, other) -> "Dim":
        other = Dim.of(other)
        acc: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = _mono_mul(m1, m2)
                acc[m] = acc.get(m, 0) + c1 * c2
        return Dim._from(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other) -> "Dim":
        """Exact division: symbolic where a single-term divisor divides every term."""
        other = Dim.of(other)
        if not other.terms:
            raise ZeroDivisionError("division of a dim by zero")
        if self.is_const() and other.is_const():
            return Dim.const(self.value() // other.value())
        if len(other.terms) == 1:
            (dm, dc), = other.terms
            acc = {}
            for m, c in self.terms:
                q = _mono_div(m, dm)
                if q is None or c % dc:
                    break
                acc[q] = c // dc
            else:
                return Dim._from(acc)
        return Dim._from({((Quotient(self, other), 1),): 1})

    __truediv__ = __floordiv__

    # -- specialization
    def substitute(self, values: Mapping[str, "Dim | int"]) -> "Dim":
        if not any(name in values for name in self.names()):
            return self  # (keeping its spelling)
        total = Dim.const(0)
        for m, c in self.terms:
            term = Dim.const(c)
            for a, p in m:
                if isinstance(a, str):
                    base = Dim.of(values[a]) if a in values else Dim.name(a)
                else:
                    base = a.num.substitute(values) // a.den.substitute(values)
                for _ in range(p):
                    term = term * base
            total = total + term
        return total

    def evaluate(self, values: Mapping[str, int]) -> int:
        d = self.substitute(values)
        if not d.is_const():
            raise KeyError(f"dim {self} needs values for {sorted(d.names())}")
        return d.value()

    def inexact_divisions(self, values: Mapping[str, int]) -> list:
        """The divisions in this dim that leave a remainder under `values`."""
        bad = []
        for m, _ in self.terms:
            for a, _ in m:
                if isinstance(a, Quotient):
                    try:
                        n, d = a.num.evaluate(values), a.den.evaluate(values)
                    except KeyError:
                        continue
                    if d == 0 or n % d:
                        bad.append((a, n, d))
        return bad

    # -- printing
    def __str__(self) -> str:
        if not self.terms:
            return "0"
        if len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1:
            (atom, power), = self.terms[0][0]
            if power == 1 and not isinstance(atom, str):
                return str(atom)  # a quotient alone: `dim / 3`, not `(dim / 3)`
        parts = []
        # the number last, as it is written (`dim - 40`, not `-40 + dim`)
        terms = sorted(self.terms, key=lambda t: not t[0]) if len(self.terms) > 1 else self.terms
        for i, (m, c) in enumerate(terms):
            factors = []
            for a, p in m:
                s = a if isinstance(a, str) else f"({a})"
                factors.extend([s] * p)
            if not factors:
                body = str(abs(c))
            elif abs(c) == 1:
                body = " * ".join(factors)
            else:
                body = " * ".join([str(abs(c))] + factors)
            sign = "-" if c < 0 else "+"
            parts.append((sign + " " if i else ("-" if c < 0 else "")) + body)
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Dim({self})"


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    acc = dict(a)
    for atom, p in b:
        acc[atom] = acc.get(atom, 0) + p
    return tuple(sorted(acc.items(), key=lambda ap: _atom_key(ap[0])))


def _mono_div(a: Monomial, b: Monomial) -> Monomial | None:
    acc = dict(a)
    for atom, p in b:
        if acc.get(atom, 0) < p:
            return None
        acc[atom] -= p
    return tuple(sorted(((k, v) for k, v in acc.items() if v), key=lambda ap: _atom_key(ap[0])))
