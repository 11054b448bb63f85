"""How many positions a cache row holds where the caller names no MaxSeq: the model's own context.

vLLM's `--max-model-len` defaults to the model's length (its config's `max_position_embeddings`,
2048 where a config states none) and llama.cpp's `-c 0` to the GGUF's `context_length`; both then
fit it to memory (vLLM's `--max-model-len auto`, llama.cpp's `--fit`). Linnet's cache is dense,
Batch rows of MaxSeq positions allocated at load, so a 128k-context model at its own length would
take 128k positions in every row: Llama 3.2 1B's 8 rows, 34 GB in bf16. The model's length is
therefore cut to what its rows fit in `CACHE_SHARE` of the memory left free after the weights
(the rest is the passes' activations and logits, and on a CPU the other programs of the host),
in whole `GRANULE`s of positions; on a CPU, also in the cache space vLLM's CPU backend reserves
(`cpu_cache_space`: 4 GiB unless VLLM_CPU_KVCACHE_SPACE says otherwise), since the cache's pages
are all written at allocation (zeros), held from the start whether or not a row ever fills.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from linnet.ir.nodes import Module
from linnet.ir.specialize import learned_positions
from linnet.nest.errors import DeviceError
from linnet.nest.memory import footprint, human_bytes

FALLBACK = 2048  # vLLM's length for a config that states none
CACHE_SHARE = 0.5  # of the memory free after the weights: the cache's at most, where MaxSeq is chosen
GRANULE = 256  # positions: a chosen MaxSeq cut by memory is a multiple of this
GIB = 1 << 30
CPU_CACHE_SPACE = 4 * GIB  # vLLM's CPU backend's KV cache where VLLM_CPU_KVCACHE_SPACE is unset or 0
SPACE_VARIABLE = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's: the GiB its CPU backend gives the cache


@dataclass(frozen=True)
class Context:
    """MaxSeq as chosen (`choose_max_seq`) and why."""

    max_seq: int
    model: int  # the model's own length
    source: str  # where the model states it
    free: int | None = None  # the bytes free where memory cut it, else None
    space: int | None = None  # the bytes the cache may take where that (a CPU's `cpu_cache_space`) cut it

    def note(self, flag: str) -> str:
        """One line saying what was chosen, as vLLM logs its max_model_len; `flag` sets another."""
        if self.space is not None:
            return (f"{flag} {self.max_seq}: the model's context is {self.model} ({self.source}), cut to what the "
                    f"cache's rows fit in {self.space / GIB:g} GiB, the cache vLLM's CPU backend reserves "
                    f"({SPACE_VARIABLE}, in GiB, sets another); {flag} sets another")
        if self.free is None:
            return f"{flag} {self.max_seq}: the model's context ({self.source}); {flag} sets another"
        return (f"{flag} {self.max_seq}: the model's context is {self.model} ({self.source}), cut to what the "
                f"cache's rows fit in {CACHE_SHARE:.0%} of the memory its weights leave of {human_bytes(self.free)} "
                f"free; {flag} sets another")


def cpu_cache_space() -> int:
    """The bytes a CPU's cache may take where no MaxSeq is named: VLLM_CPU_KVCACHE_SPACE's GiB, as vLLM's
    CPU backend reads it (unset or 0: its 4 GiB). Its memory is written at allocation, so that a user of
    vLLM or llama.cpp (whose -c is allocated and cleared at once) gets a cache of the size they know."""
    text = os.environ.get(SPACE_VARIABLE, "").strip()
    try:
        gib = int(text or "0")
    except ValueError:
        gib = -1
    if gib < 0:
        raise DeviceError(f"{SPACE_VARIABLE}={text!r}: the GiB a cache on the CPU takes where no MaxSeq is named, "
                          f"a whole number (unset or 0: {CPU_CACHE_SPACE // GIB}, as vLLM's)")
    return gib * GIB if gib else CPU_CACHE_SPACE


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


def choose_max_seq(spec: Module, free: int | None, space: int | None = None) -> Context:
    """MaxSeq for `spec` (its sizes bound, by `specialize.bind` or `specialize`, at any MaxSeq: it
    is weighed at each length tried): the model's own length (`model_context`), or where its cache
    would take more than `CACHE_SHARE` of what the weights leave of `free` bytes (where known) or
    more than `space` bytes (where given: a CPU's `cpu_cache_space`), the most whole granules that
    fit both (at least one granule, or the model's length where shorter: a model that does not fit
    even so is refused by `memory.check_fits`)."""
    own, source = model_context(spec)
    if free is None and space is None:
        return Context(own, own, source)
    at = lambda n: footprint(replace(spec, bindings={**spec.bindings, "MaxSeq": n}))
    full, none = at(own), at(0)
    # the bytes for the state that grows with MaxSeq (none.state does not)
    by_free = None if free is None else (free - full.weights) * CACHE_SHARE - none.state
    by_space = None if space is None else space - none.state
    room = min(r for r in (by_free, by_space) if r is not None)
    per_position = (full.state - none.state) / own
    if per_position <= 0 or own * per_position <= room:
        return Context(own, own, source)
    fits = int(max(room, 0) // per_position) // GRANULE * GRANULE
    cut_by_space = by_space is not None and (by_free is None or by_space < by_free)
    return Context(max(fits, min(own, GRANULE)), own, source, free, space if cut_by_space else None)
