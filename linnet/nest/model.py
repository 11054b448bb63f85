"""`LoadedModel`: what `nest.load` returns and the engine runs.

It exposes the entries (prefill, decode, copy_rows) of the compiled module
over bound weights, plus what the engine needs to know to schedule: rows,
positions per row, vocabulary size. The engine knows nothing else of the
architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from linnet.ir.nodes import Module


@dataclass
class LoadedModel:
    runner: Any  # the generated `Model` instance (torch or JAX)
    module: Module  # the specialized IR it was generated from
    backend: str  # "torch" | "jax"
    device: Any
    tokenizer: Any = None
    card: str = ""
    numerics: str = "exact"
    compile: bool = False
    weights: str = ""
    info: dict = field(default_factory=dict)
    # where no tokenizer was loaded (tokenizer=False), the tokens its checkpoint says the model ends on
    # (`tokenizer.end_token_ids`), which the engine stops at as it would at the tokenizer's
    end_tokens: tuple = ()
    # a weakref to the engine that last ran a pass on it; None once the cache is emptied (`reset`)
    holder: Any = field(default=None, repr=False, compare=False)

    @property
    def batch(self) -> int:
        """Cache rows: how many requests can be in flight."""
        return self.module.bindings["Batch"]

    @property
    def max_seq(self) -> int:
        """Positions per cache row: prompt plus completion must fit."""
        return self.module.bindings["MaxSeq"]

    @property
    def vocab(self) -> int:
        return self.module.bindings["vocab"]

    @property
    def dtype(self) -> str:
        return self.module.bindings["T"]

    def prefill(self, tokens, positions, rows, last):
        return self.runner.prefill(tokens, positions, rows, last)

    def decode(self, tokens, positions):
        return self.runner.decode(tokens, positions)

    def call_then(self, entry: str, then, args: tuple, then_args: tuple):
        """JAX: `then(entry(*args), *then_args)` in one executable (`JaxModel.call_then`)."""
        return self.runner.call_then(entry, then, args, then_args)

    def copy_rows(self, src, dst, upto):
        return self.runner.copy_rows(src, dst, upto)

    def reset(self):
        """Empties the cache (every row). An engine over the model sees it at its next step and
        reuses no row it remembers (not while it has requests in flight: theirs are emptied too)."""
        self.runner.reset_state()
        self.holder = None

    def __repr__(self) -> str:
        return (f"LoadedModel({self.card!r}, backend={self.backend!r}, device={str(self.device)!r}, "
                f"Batch={self.batch}, MaxSeq={self.max_seq}, T={self.dtype}, numerics={self.numerics!r})")
