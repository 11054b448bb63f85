"""The Nest registry: the cards that ship with Linnet, by name."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from linnet.frontend import load_file
from linnet.ir.nodes import Module
from linnet.nest.errors import CardError


def cards_dir() -> Path:
    return Path(str(resources.files("linnet").joinpath("nest/cards")))


@dataclass
class CardInfo:
    name: str
    path: Path

    def module(self) -> Module:
        """The checked card (parsed once per CardInfo)."""
        if "_module" not in self.__dict__:
            self.__dict__["_module"] = load_file(self.path)
        return self.__dict__["_module"]

    @property
    def hf_repo(self) -> str | None:
        """The Hugging Face repository the card's weights come from (None for test cards)."""
        return self.module().meta.get("hf_repo")

    def parameters(self) -> int:
        """How many numbers its weights hold (tied params counted once)."""
        from linnet.ir.specialize import evaluate, param_shape, specialize

        spec = specialize(self.module())
        total = 0
        for p in spec.params.values():
            if p.tie and evaluate(p.tie[1], spec.bindings):
                continue
            n = 1
            for d in param_shape(spec, p.name):
                n *= d
            total += n
        return total

    def weights(self) -> tuple[str | None, list]:
        """(where its weights were found or None, every place looked), in `nest.load`'s order."""
        from linnet.nest.load import find_card_weights

        return find_card_weights(self.name, self.module())


def cards() -> list[CardInfo]:
    """Every registered card, sorted by name (architectures under cards/arch are not cards)."""
    return [CardInfo(p.stem, p) for p in sorted(cards_dir().glob("*.linnet"))]


def card(name: str, also_looked: str = "") -> CardInfo:
    """The card named `name`; a CardError saying where it was looked for (`also_looked`: where else,
    before the registry) and the names nearest it."""
    known = {c.name: c for c in cards()}
    if name in known:
        return known[name]
    close = _close_names(name, list(known))
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known cards: {', '.join(known)}"
    raise CardError(f"unknown card {name!r}: no {name}.linnet among the cards in {cards_dir()}{also_looked}{hint}")


def card_for_repo(repo_id: str) -> CardInfo | None:
    """The card whose `hf_repo` is this Hugging Face repository (ids are matched as the hub matches
    them, whatever the case), or None."""
    for c in cards():
        if c.hf_repo is not None and c.hf_repo.lower() == repo_id.lower():
            return c
    return None


def _close_names(name: str, known: list) -> list:
    """The known names nearest `name`: those it begins, as a family's name begins its cards' (`smollm2`:
    smollm2-135m-instruct), or else those within a little of the best match (at most 3)."""
    lowered = name.lower()
    started = [k for k in known if k.lower().startswith(lowered + "-")] if lowered else []
    if started:
        return sorted(started, key=lambda k: (len(k), k))[:3]
    scored = sorted(((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known), reverse=True)
    if not scored or scored[0][0] < 0.6:
        return []
    best = scored[0][0]
    return [k for r, k in scored[:3] if r >= max(0.6, best - 0.08)]
