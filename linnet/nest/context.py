"""How many positions a cache row holds where the caller names no MaxSeq: the model's own context.

vLLM's `--max-model-len` defaults to the model's length (its config's `max_position_embeddings`,
2048 where a config states none) and llama.cpp's `-c 0` to the GGUF's `context_length`; both then
fit it to memory (vLLM's `--max-model-len auto`, llama.cpp's `--fit`). Linnet's cache is dense,
Batch rows of MaxSeq positions allocated at load, so a 128k-context model at its own length would
take 128k positions in every row: Llama 3.2 1B's 8 rows, 34 GB in bf16. The model's length is
therefore cut to what its rows fit in `CACHE_SHARE` of the memory left free after the weights
(the rest is the passes' activations and logits, and on a CPU the other programs of the host),
in whole `GRANULE`s of positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from linnet.ir.nodes import Module
from linnet.ir.specialize import learned_positions
from linnet.nest.memory import footprint, human_bytes

FALLBACK = 2048  # vLLM's length for a config that states none
CACHE_SHARE = 0.5  # of the memory free after the weights: the cache's at most, where MaxSeq is chosen
GRANULE = 256  # positions: a chosen MaxSeq cut by memory is a multiple of this


@dataclass(frozen=True)
class Context:
    """MaxSeq as chosen (`choose_max_seq`) and why."""

    max_seq: int
    model: int  # the model's own length
    source: str  # where the model states it
    free: int | None = None  # the bytes free where memory cut it, else None

    def note(self, flag: str) -> str:
        """One line saying what was chosen, as vLLM logs its max_model_len; `flag` sets another."""
        if self.free is None:
            return f"{flag} {self.max_seq}: the model's context ({self.source}); {flag} sets another"
        return (f"{flag} {self.max_seq}: the model's context is {self.model} ({self.source}), cut to what the "
                f"cache's rows fit in {CACHE_SHARE:.0%} of the memory its weights leave of {human_bytes(self.free)} "
                f"free; {flag} sets another")


def model_context(module: Module) -> tuple[int, str]:
    """(the positions the model holds, where it says so): its learned position table's rows where
    that is shorter than its meta's max_context (the card's; a checkpoint's config's
    max_position_embeddings or its GGUF's context_length), else that, else vLLM's 2048."""
    table = learned_positions(module)
    stated = module.meta.get("max_context")
    if table is not None and (stated is None or table < int(stated)):
        return table, f"its learned position table's {table} rows"
    if stated is not None:
        return int(stated), "its meta max_context"
    return FALLBACK, f"{FALLBACK}, vLLM's where a model states none"


def choose_max_seq(spec: Module, free: int | None) -> Context:
    """MaxSeq for `spec` (its sizes bound at the model's own length, `model_context`: by
    `specialize.bind` or `specialize`): that length, or where `free` bytes are known and its cache
    would take more than `CACHE_SHARE` of what the weights leave, the most whole granules that fit
    (at least one granule, or the model's length where shorter: a model that does not fit even so
    is refused by `memory.check_fits`)."""
    own, source = model_context(spec)
    at = lambda n: footprint(replace(spec, bindings={**spec.bindings, "MaxSeq": n}))
    if free is None:
        return Context(own, own, source)
    full, none = at(own), at(0)
    room = (free - full.weights) * CACHE_SHARE - none.state  # (state that does not grow with MaxSeq: none.state)
    per_position = (full.state - none.state) / own
    if per_position <= 0 or own * per_position <= room:
        return Context(own, own, source)
    fits = int(max(room, 0) // per_position) // GRANULE * GRANULE
    return Context(max(fits, min(own, GRANULE)), own, source, free)
