"""The Nest registry: the cards that ship with Linnet, by name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from linnet.frontend import load_file
from linnet.ir.nodes import Module


def cards_dir() -> Path:
    return Path(str(resources.files("linnet").joinpath("nest/cards")))


@dataclass
class CardInfo:
    name: str
    path: Path

    def module(self) -> Module:
        return load_file(self.path)


def cards() -> list[CardInfo]:
    """Every registered card, sorted by name (architectures under cards/arch are not cards)."""
    return [CardInfo(p.stem, p) for p in sorted(cards_dir().glob("*.linnet"))]


def card(name: str) -> CardInfo:
    known = {c.name: c for c in cards()}
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known cards: {', '.join(known)}"
    raise KeyError(f"unknown card {name!r}{hint}")
