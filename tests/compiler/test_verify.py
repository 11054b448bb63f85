"""The verifier refuses IR that breaks an invariant, at the place that breaks it.

No `.linnet` source reaches these refusals (the checker refuses such source first): they guard the
passes and hand-built IR. Each case breaks one invariant of a checked module the way a pass could
(a name dropped, a statement lost, an op renamed) and names what the verifier must say, and where.
"""

from __future__ import annotations

import pytest

from linnet.errors import LinnetError
from linnet.frontend.load import load_source
from linnet.ir import nodes as ir
from linnet.ir.types import INT
from linnet.ir.verify import verify

SOURCE = """\
arch mini

config {
  dim: int = 8
}

params {
  embed: T[16, dim]
    from hf "embed.weight"
}

state {
  cache: T[Batch, dim]
}

fn double<n>(x: T[n, dim]) -> T[n, dim] {
  return x + x
}

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = double(embed[tokens])
  cache[iota(Batch)] = x
  return x + cache
}
"""


def _param_not_a_tensor(m: ir.Module):
    m.params["embed"].type = INT


def _tie_to_a_param_gone(m: ir.Module):
    m.params["embed"].tie = ("head", ir.Const(INT, m.params["embed"].loc, True))


def _local_bound_nowhere(m: ir.Module):
    m.entries["decode"].body.pop(0)  # `x = double(...)` lost


def _store_into_a_state_gone(m: ir.Module):
    del m.state["cache"]


def _read_of_a_state_gone(m: ir.Module):
    m.entries["decode"].body.pop(1)  # the store, then the buffer
    del m.state["cache"]


def _read_of_a_param_gone(m: ir.Module):
    del m.params["embed"]


def _op_renamed(m: ir.Module):
    m.entries["decode"].body[-1].value.op = "plus"


def _call_of_a_fn_gone(m: ir.Module):
    del m.fns["double"]


def _return_lost(m: ir.Module):
    m.entries["decode"].body.pop()


@pytest.mark.parametrize("break_it, line, col, message", [
    (_param_not_a_tensor, 8, 3, "param `embed` must be a tensor"),
    (_tie_to_a_param_gone, 8, 3, "param `embed` is tied to unknown `head`"),
    (_local_bound_nowhere, 22, 24, "`x` is used before it is defined"),
    (_store_into_a_state_gone, 22, 3, "store into unknown state `cache`"),
    (_read_of_a_state_gone, 23, 14, "unknown state `cache`"),
    (_read_of_a_param_gone, 21, 14, "unknown param `embed`"),
    (_op_renamed, 23, 10, "unknown op `plus`"),
    (_call_of_a_fn_gone, 21, 7, "call of unknown fn `double`"),
    (_return_lost, 20, 1, "`decode` does not end with return"),
], ids=lambda v: getattr(v, "__name__", "").strip("_") or None)
def test_a_broken_invariant_is_refused_where_it_breaks(break_it, line, col, message):
    module = load_source(SOURCE, "mini.linnet")
    verify(module)  # as the checker left it
    break_it(module)
    with pytest.raises(LinnetError) as err:
        verify(module)
    assert err.value.message == message
    assert (err.value.loc.path, err.value.loc.line, err.value.loc.col) == ("mini.linnet", line, col)
