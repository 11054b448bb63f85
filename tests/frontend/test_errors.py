"""Bad source is reported as `path:line:col: error: message`, the source line and a caret: never a traceback.

Each case of the table is a small broken `.linnet` file (an architecture, or
a card with the architecture it imports written beside it) and where the
error must point. Every case runs through `linnet check` and through
`linnet compile --backend torch`, in-process, and both must say the same.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import linnet
from linnet.cli import main
from linnet.errors import LinnetError
from linnet.frontend.load import load_file, load_source


@dataclass(frozen=True)
class Case:
    id: str
    files: dict  # file name -> source; the first is the one checked and compiled
    line: int
    col: int
    message: str  # a substring of the first line's message
    at: str | None = None  # the file the error points into, when not the one checked
    args: tuple = ()  # more arguments for both commands, such as --generic
    note: str | None = None  # a substring of the notes under the caret, where they say what to do

    def __str__(self) -> str:
        return self.id


def arch(id: str, source: str, line: int, col: int, message: str, args: tuple = (), note: str | None = None) -> Case:
    return Case(id, {"model.linnet": source}, line, col, message, None, args, note)


def card(id: str, card_source: str, line: int, col: int, message: str, *, arch_source: str | None = None,
         at: str | None = None, args: tuple = (), note: str | None = None) -> Case:
    files = {"card.linnet": card_source}
    if arch_source is not None:
        files["mini.linnet"] = arch_source
    return Case(id, files, line, col, message, at, args, note)


# An architecture whose cases append to it. It is 19 lines long, so what a
# case appends starts on line 20.
HEAD = """\
arch mini

config {
  vocab: int = 16
  dim: int = 8
  heads: int = 2
  head_dim: int = dim / heads
}

params {
  embed: T[vocab, dim]
    from hf "embed.weight"
  wq: T[heads * head_dim, dim]
    from hf "wq.weight"
}

state {
  cache: T[Batch, MaxSeq, dim]
}
"""

# The architecture the cards import (`import mini`, found beside the card).
MINI = """\
arch mini

config {
  vocab: int
  dim: int
  heads: int
  kv_heads: int = heads
  head_dim: int = dim / heads
  rope_scaling: str = "none"
}

params {
  embed: T[vocab, dim]
    from hf "model.embed_tokens.weight"
  wq: T[heads * head_dim, dim]
    from hf "model.q_proj.weight"
  wk: T[kv_heads * head_dim, dim]
    from hf "model.k_proj.weight"
}

state {
  k_cache: T[Batch, MaxSeq, kv_heads, head_dim]
}

entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, heads, head_dim] {
  x = embed[tokens]
  q = rope(linear(x, wq).reshape(Batch, heads, head_dim), positions, theta=1e4, scaling=rope_scaling)
  k_cache[iota(Batch), positions] = linear(x, wk).reshape(Batch, kv_heads, head_dim)
  return attention(q, k_cache, k_cache, positions)
}
"""

# A card for MINI; its config block runs from line 4 to line 8.
CARD = """\
card "mini-test"
import mini

config {
  vocab = 16
  dim = 8
  heads = 2
}
"""


def with_config(text: str, *lines: str) -> str:
    """CARD with lines added at the end of its config block (from line 8 on)."""
    return text.replace("}\n", "".join(f"  {x}\n" for x in lines) + "}\n")


# HEAD with a tie, a fn and an entry that calls it, reads a param in a loop and stores into the state.
READER = HEAD.replace("  wq: T[", "  head: T[vocab, dim] = embed if true\n  wq: T[") + """\
fn double<n>(x: T[n, dim]) -> T[n, dim] {
  return x + x
}

entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, dim] {
  x = double(embed[tokens])
  for l in 2 {
    x = x + linear(x, head[0:dim])
  }
  cache[iota(Batch), positions] = x
  return x
}
"""

# An entry for the cases that break what comes before it.
ENTRY = "entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n  return embed[tokens]\n}\n"


# An entry the `statement` cases add one line to (line 25), with a value of each kind to misuse.
DECODE = HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  q = linear(x, wq).reshape(Batch, heads, head_dim)
  values, experts = topk(x, 2)
  kv = zeros(Batch, MaxSeq, heads, head_dim)
"""


def statement(id: str, text: str, col: int, message: str, note: str | None = None) -> Case:
    """DECODE with the statement `text` on line 25, then its return: an op's type rule refusing it."""
    return arch(id, DECODE + f"  {text}\n  return x\n}}\n", 25, col, message, note=note)


CASES = [
    # ---------------------------------------------------------------- syntax
    arch("missing-closing-brace", """\
arch mini
entry decode(tokens: i32[Batch]) -> f32[Batch] {
  x = tokens as f32
  return x
""", 4, 11, "unexpected end of file"),
    arch("config-left-open", """\
arch mini
config {
  dim: int = 8
params {
  w: T[dim]
    from hf "w"
}
""", 4, 1, "unexpected 'params'; expected '}' or more of what comes before it"),
    arch("params-left-open", """\
arch mini
params {
  w: T[8]
    from hf "w"
entry decode(tokens: i32[Batch]) -> T[Batch, 8] {
  return w[tokens]
}
""", 5, 1, "unexpected 'entry'; expected '.', 'for', 'from', '}' or a name"),
    arch("fn-body-left-open", HEAD + """\
fn f<n>(x: T[n, dim]) -> T[n, dim] {
  return x

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 23, 1, "unexpected 'entry'; expected '}' or more of what comes before it"),
    arch("fn-body-not-opened", HEAD + """\
fn f<n>(x: T[n, dim]) -> T[n, dim]
  return x
}
""", 21, 3, "unexpected 'return'; expected '{'"),
    arch("if-after-an-operator", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  y = x + if true then x else x
  return y
}
""", 22, 11, "unexpected 'if'; expected '(', '-', '[', 'false', 'true', a name, a number or a string"),
    arch("line-breaks-only-at-line-feeds", HEAD.replace("arch mini\n", "arch mini\n# a form feed \x0c, a vertical tab "
                                                          "\x0b, U+0085 \x85 and U+2028 \u2028 break no line\n") + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embd[tokens]
}
""", 22, 10, "unknown name `embd`"),
    arch("end-of-file-after-a-form-feed", "arch mini\n# \x0c\nconfig {\n  dim: int = 8\n", 4, 15,
         "unexpected end of file"),
    arch("stray-character", """\
arch mini
entry decode(tokens: i32[Batch]) -> f32[Batch] {
  x = tokens as f32 $
  return x
}
""", 3, 21, "unexpected character '$'"),
    arch("unexpected-end-in-expression", """\
arch mini
config {
  dim: int = 8 *""", 3, 17, "unexpected end of file"),
    arch("bad-token-operator", """\
arch mini
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens + * 2
}
""", 3, 19, "unexpected '*'"),
    arch("missing-closing-paren", """\
arch mini
entry decode(tokens: i32[Batch] -> f32[Batch] {
  return tokens as f32
}
""", 2, 33, "unexpected '->'"),
    arch("unterminated-string", """\
arch mini
config {
  name: str = "abc
}
""", 3, 15, "unterminated string: a string closes with `\"` on the line it opens"),
    arch("bad-escape-in-string", """\
arch mini
config {
  name: str = "a\\x"
}
""", 3, 15, "bad escape in string"),
    arch("positional-after-keyword", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return softmax(axis=0, embed[tokens])
}
""", 21, 26, "a positional argument cannot follow a keyword argument"),
    arch("two-arch-declarations", """\
arch mini
arch other
""", 2, 1, "at most one `arch`"),

    # ---------------------------------------------------------------- names
    arch("unknown-local", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return y
}
""", 22, 10, "unknown name `y`"),
    arch("unknown-param", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embedd[tokens]
}
""", 21, 10, "unknown name `embedd`"),
    arch("unknown-function", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return rmsnrom(embed[tokens], embed[0])
}
""", 21, 10, "unknown function `rmsnrom`"),
    arch("unknown-dim-in-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dimm] {
  return embed[tokens]
}
""", 20, 46, "unknown dim `dimm`"),
    arch("unknown-op-keyword", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return softmax(embed[tokens], axes=-1)
}
""", 21, 33, "`softmax` has no argument `axes`"),
    arch("unknown-fn-keyword", HEAD + """\
fn double<n>(x: T[n, dim]) -> T[n, dim] {
  return x + x
}

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return double(y=embed[tokens])
}
""", 25, 17, "`double` has no argument `y`"),
    arch("unknown-element-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> f64[Batch, dim] {
  return embed[tokens]
}
""", 20, 37, "unknown element type `f64`"),
    arch("unknown-cast-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens] as float32
}
""", 21, 27, "unknown element type `float32`"),
    arch("size-as-element-type", HEAD + """\
entry decode(tokens: Batch[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 20, 22, "unknown element type `Batch`", note="`Batch` is a size (a dim of a type, as in `T[Batch]`)"),
    arch("config-size-cast-to", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens] as dim
}
""", 21, 27, "unknown element type `dim`", note="`dim` is a size"),
    arch("scalar-type-as-element-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return zeros(Batch, dim, dtype=float)
}
""", 21, 34, "unknown element type `float`", note="`float` is the type of a static value"),
    arch("element-type-as-value", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens] * T
}
""", 21, 26, "`T` is an element type, not a value", note="`x as T`"),
    arch("value-called-as-function", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed(tokens)
}
""", 21, 10, "`embed` is a value, not a function"),
    card("unknown-config-value-in-card", with_config(CARD, "hidden = 3"), 8, 3,
         "has no config value `hidden`", arch_source=MINI),
    arch("unknown-state", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) {
  kache[iota(Batch), positions] = embed[tokens]
}
""", 21, 3, "unknown state `kache`"),
    arch("entry-called-by-the-model", HEAD + """\
entry prefill(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return prefill(tokens)
}
""", 25, 10, "`prefill` is an entry"),

    # ---------------------------------------------------------------- shapes
    arch("add-shape-mismatch", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return x + embed
}
""", 22, 10, "cannot add T[Batch, dim] and T[vocab, dim]"),
    arch("matmul-shape-mismatch", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {
  x = embed[tokens]
  return x @ embed
}
""", 22, 10, "cannot multiply T[Batch, dim] and T[vocab, dim]"),
    arch("linear-shape-mismatch", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {
  x = embed[tokens]
  return linear(x.transpose(1, 0), embed)
}
""", 22, 10, "cannot apply T[vocab, dim] to T[dim, Batch]"),
    arch("reshape-element-count", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, heads, dim] {
  return linear(embed[tokens], wq).reshape(Batch, heads, dim)
}
""", 21, 10, "the element counts differ", note="`dim` is not `heads * head_dim`, though head_dim = dim / heads"),
    arch("store-wrong-shape", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) {
  cache[iota(Batch), positions] = embed
}
""", 21, 35, "cannot store T[vocab, dim] into `cache[...]`, which is T[Batch, dim]"),
    arch("store-wrong-dtype", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) {
  cache[iota(Batch), positions] = embed[tokens] as f16
}
""", 21, 35, "cannot store f16[Batch, dim]"),
    arch("assign-state-wrong-type", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) {
  cache = embed
}
""", 21, 11, "state `cache` is T[Batch, MaxSeq, dim]; cannot assign T[vocab, dim]"),
    arch("return-type-mismatch", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {
  return embed[tokens]
}
""", 21, 10, "`decode` returns T[Batch, dim], but declares T[Batch, vocab]"),
    arch("fn-argument-shape", HEAD + """\
fn double<n>(x: T[n, dim]) -> T[n, dim] {
  return x + x
}

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return double(embed[tokens].transpose(1, 0))
}
""", 25, 17, "argument `x` of `double` must be T[dim, dim], not T[dim, Batch]"),
    arch("fn-argument-derived-dim", HEAD + """\
fn halves<n>(x: T[2 * n], y: T[n]) -> T[n] {
  return y
}

entry decode(tokens: i32[Batch]) -> T[3] {
  return halves(zeros(5), zeros(3))
}
""", 25, 17, "argument `x` of `halves` must be T[6], not T[5]"),
    arch("size-not-bound-by-arguments", HEAD + """\
entry decode<K>(tokens: i32[Batch]) -> T[K, dim] {
  return zeros(K, dim)
}
""", 20, 14, "the size `K` must be a dim of one of the arguments"),
    arch("axis-out-of-range", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return softmax(embed[tokens], axis=2)
}
""", 21, 38, "axis 2 is out of range"),
    arch("multi-assign-count", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 2] {
  v, i, j = topk(embed[tokens], 2)
  return v
}
""", 21, 3, "3 names are assigned, but the value has 2 part(s)"),
    arch("gelu-approximate-unknown", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return gelu(embed[tokens], approximate="erf")
}
""", 21, 42, "`approximate` of `gelu` is one of 'none', 'tanh', not 'erf'"),
    arch("gelu-tanh-of-a-static-number", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens] * gelu(dim * 1.0, approximate="tanh")
}
""", 21, 26, "`gelu` of a static number is the exact (erf) form"),
    arch("expert-weights-not-stacked", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 2, dim] {
  v, chosen = topk(embed[tokens], 2)
  return expert_linear(embed[tokens], wq, chosen)
}
""", 22, 39, "the weights of `expert_linear` must be [experts, out, in]"),
    arch("experts-of-another-batch", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 2, 8] {
  v, chosen = topk(embed, 2)
  return expert_linear(embed[tokens], zeros(2, 8, dim), chosen)
}
""", 22, 24, "the input of `expert_linear` must be [vocab, in] or [vocab, 2, in]"),
    arch("expert-indices-float", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 2, 8] {
  v, chosen = topk(embed[tokens], 2)
  return expert_linear(embed[tokens], zeros(2, 8, dim), v)
}
""", 22, 57, "the experts of `expert_linear` must be i32[n, k]"),

    # ---------------------------------------------------------------- element types
    arch("generic-plus-f32", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return x + x as f32
}
""", 22, 10, "element types differ"),
    arch("where-non-bool-condition", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return where(x, x, x)
}
""", 22, 16, "the condition of `where` must be bool, not T[Batch, dim]"),
    arch("float-op-on-ints", """\
arch mini
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return exp(tokens)
}
""", 3, 10, "`exp` needs a float tensor, not i32[Batch]"),
    arch("int-tensor-plus-float", """\
arch mini
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens + 0.5
}
""", 3, 10, "cannot add i32[Batch] and a float"),
    arch("integer-op-on-floats", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return x % x
}
""", 22, 10, "`%` needs integer tensors"),
    arch("int-tensor-true-division", """\
arch mini
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens / 2
}
""", 3, 10, "`/` of integer tensors makes fractions: divide whole numbers with `//`"),
    arch("bool-tensor-arithmetic", """\
arch mini
entry decode(tokens: i32[Batch]) -> bool[Batch] {
  return (tokens > 3) * (tokens > 4)
}
""", 3, 10, "cannot multiply bool tensors: convert them with `as` first"),
    arch("bool-tensor-negated", """\
arch mini
entry decode(tokens: i32[Batch]) -> bool[Batch] {
  return -(tokens > 3)
}
""", 3, 10, "`-` needs a number tensor, not bool[Batch]"),
    arch("float-tensor-plus-bool", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return x + true
}
""", 22, 10, "cannot add T[Batch, dim] and a bool"),
    arch("sum-of-bools", """\
arch mini
entry decode(tokens: i32[Batch]) -> bool[Batch] {
  return sum((tokens > 3).unsqueeze(1), axis=1)
}
""", 3, 10, "`sum` of bool[Batch, 1] is no bool"),
    arch("mean-of-ints", """\
arch mini
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return mean(tokens.unsqueeze(1), axis=1)
}
""", 3, 10, "`mean` of i32[Batch, 1] is no i32"),
    arch("int-tensor-floordiv-by-a-zero-config", HEAD + """\
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  x = embed[tokens]
  return tokens // (heads - 2)
}
""", 22, 10, "an integer tensor // 0: division by zero"),
    arch("int-tensor-to-a-negative-power", """\
arch mini
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens ** -1
}
""", 3, 10, "an integer tensor ** -1 is not a whole number"),
    arch("if-non-bool-condition", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return if dim then embed[tokens] else embed[tokens]
}
""", 21, 13, "`if` needs a static bool condition, not int"),
    arch("keepdim-not-literal", HEAD.replace("  heads: int = 2\n", "  heads: int = 2\n  keep: bool = true\n") + """\
entry decode(tokens: i32[Batch]) -> T[Batch] {
  return embed[tokens].sum(axis=1, keepdim=keep)
}
""", 22, 44, "keepdim must be true or false"),
    arch("zeros-dtype-string", HEAD + """\
entry decode(tokens: i32[Batch]) -> f32[Batch] {
  return zeros(Batch, dtype="f32")
}
""", 21, 29, "the dtype of `zeros` is an element type"),

    # ---------------------------------------------------------------- generics and config values
    card("missing-config-value", CARD.replace("  heads = 2\n", ""), 1, 1, "config value `heads` has no value",
         arch_source=MINI),
    card("missing-config-value-under-a-comment", "# a card's comment comes first\n" + CARD.replace("  heads = 2\n", ""),
         2, 1, "config value `heads` has no value", arch_source=MINI),
    card("config-value-wrong-type", CARD.replace("dim = 8", "dim = 8.0"), 6, 9, "`dim` is int, but is set to 8.0",
         arch_source=MINI),
    card("config-value-not-literal", CARD.replace("dim = 8", "dim = 4 * 2"), 6, 9, "must be a literal",
         arch_source=MINI),
    card("config-value-set-twice", with_config(CARD, "dim = 16"), 8, 3, "`dim` is set twice", arch_source=MINI),
    card("config-value-spelled-as-linnet-spells-it", CARD.replace("dim = 8", "dim = 8\n  rope_scaling = true"), 7, 18,
         "`rope_scaling` is str, but is set to true", arch_source=MINI),
    card("config-string-spelled-as-linnet-spells-it", CARD.replace("dim = 8", 'dim = "8"'), 6, 9,
         '`dim` is int, but is set to "8"', arch_source=MINI),
    card("meta-set-twice", CARD + 'meta {\n  max_context = 8\n}\nmeta {\n  max_context = 16\n}\n', 13, 3,
         "meta `max_context` is set twice", arch_source=MINI),
    arch("meta-set-twice-in-an-architecture", HEAD + 'meta {\n  hf_repo = "a/b"\n  hf_repo = "a/c"\n}\n'
         + "entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n  return embed[tokens]\n}\n", 22, 3,
         "meta `hf_repo` is set twice"),
    Case("declared-twice-in-an-extension", {"model.linnet": """\
arch derived extends mini
params {
  head: T[vocab, dim]
    from hf "h"
  head: T[vocab, dim]
    from hf "h2"
}
""", "mini.linnet": HEAD + "entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n  return embed[tokens]\n}\n"},
         5, 3, "`head` is already defined"),
    card("float-too-large", CARD.replace("heads = 2", "heads = 2\n  eps = 1e999"), 8, 9,
         "1e999 is too large for a float: it would be infinite", arch_source=MINI),
    card("int-too-large", CARD.replace("heads = 2", "heads = 2\n  dim = 99999999999999999999"), 8, 9,
         "99999999999999999999 is too large for a static int", arch_source=MINI),
    card("meta-max-context-not-a-number", CARD + 'meta {\n  max_context = "lots"\n}\n', 10, 17,
         "meta `max_context` must be a whole number of positions, above 0, not \"lots\"", arch_source=MINI),
    card("meta-parser-not-a-string", CARD + "meta {\n  tool_call_parser = 3\n}\n", 10, 22,
         "meta `tool_call_parser` must be a string", arch_source=MINI),
    card("meta-item-misspelled", CARD + "meta {\n  max_contxt = 8192\n}\n", 10, 3,
         "meta `max_contxt` is not an item Linnet reads; did you mean `max_context`?", arch_source=MINI),
    card("config-declared-in-card", with_config(CARD, "extra: int = 3"), 8, 3, "it does not declare them",
         arch_source=MINI),
    card("inexact-division", CARD.replace("heads = 2", "heads = 3"), 8, 19, "8 / 3 is not a whole number",
         arch_source=MINI, at="mini.linnet"),
    card("heads-not-multiple-of-kv-heads", with_config(CARD.replace("dim = 8", "dim = 16").replace("heads = 2", "heads = 4"),
                                                       "kv_heads = 3"),
         29, 10, "4 query heads cannot share 3 key/value heads evenly", arch_source=MINI, at="mini.linnet",
         note="card.linnet:8:14"),  # `kv_heads` is 3, set at the card's own line, beside the arch's
    card("unknown-rope-scaling", with_config(CARD, 'rope_scaling = "yarnn"'), 27, 89,
         "unknown rope scaling 'yarnn'", arch_source=MINI, at="mini.linnet"),
    card("rope-odd-head-dim", CARD.replace("dim = 8", "dim = 6"), 27, 7, "head_dim must be even, not 3",
         arch_source=MINI, at="mini.linnet"),
    card("size-not-positive", CARD.replace("vocab = 16", "vocab = 0"), 5, 11, "`vocab` is a size and must be positive",
         arch_source=MINI, note="`vocab` sizes dims of the model (declared at"),  # the card's line to change
    # (a vocabulary of 2 ** 63 - 1 rows of 8: it failed only as the weights were laid out)
    card("param-too-large", CARD.replace("vocab = 16", "vocab = 9223372036854775807"), 13, 3,
         "param `embed`: T[vocab, dim] holds 73786976294838206456 elements, more than a tensor can (2 ** 63)",
         arch_source=MINI, at="mini.linnet", note="card.linnet:5:11"),
    arch("config-division-by-zero", """\
arch mini
config {
  dim: int = 8
  eps: float = 1.0 / 0
}
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens
}
""", 4, 16, "cannot evaluate 1.0 / 0"),
    arch("config-default-wrong-type", """\
arch mini
config {
  dim: int = 8.5
}
""", 3, 14, "the default of `dim` is float, not int"),
    arch("unknown-config-type", """\
arch mini
config {
  dim: double = 8
}
""", 3, 8, "unknown config type `double`"),
    arch("config-set-in-architecture", """\
arch mini
config {
  dim = 8
}
""", 3, 3, "an architecture declares config values with a type"),

    # ---------------------------------------------------------------- cards and imports
    card("unknown-architecture", CARD.replace("import mini", "import lama"), 2, 1, "cannot find architecture `lama`"),
    # longer than a file name may be: the lookup's OSError (File name too long) was a traceback
    card("import-name-longer-than-a-file-name", CARD.replace("import mini", "import " + "m" * 300), 2, 1,
         "cannot find architecture `mmmm"),
    card("import-names-another-arch", CARD, 2, 1, "does not declare `arch mini`",
         arch_source=MINI.replace("arch mini", "arch mini2")),
    arch("architecture-imports", """\
arch mini
import llama
""", 2, 1, "only a card imports an architecture"),
    card("card-name-a-path", CARD.replace('"mini-test"', '"../../etc/passwd"'), 1, 1,
         "a card's name is letters, digits, '.', '_' and '-'", arch_source=MINI),
    card("card-name-empty", CARD.replace('"mini-test"', '""'), 1, 1, "not \"\"", arch_source=MINI),
    card("card-declares-params", CARD + """\

params {
  w: T[dim]
    from hf "w"
}
""", 11, 3, "a card cannot declare params", arch_source=MINI),

    # ---------------------------------------------------------------- extends
    arch("extends-an-unknown-architecture", """\
arch mini2 extends nothing
""", 1, 20, "cannot find architecture `nothing`"),
    Case("architectures-extend-in-a-circle", {"model.linnet": "arch mini2 extends mini\n",
                                              "mini.linnet": "arch mini extends mini2\n"},
         1, 19, "architectures extend each other in a circle: mini2 extends mini extends mini2", at="mini.linnet"),
    Case("error-in-a-base-points-into-it", {"model.linnet": "arch mini2 extends mini\n",
                                            "mini.linnet": MINI.replace("x = embed[tokens]", "x = embed[tokenz]")},
         26, 13, "unknown name `tokenz`", at="mini.linnet"),
    Case("extension-conflicts-with-a-base-name", {"model.linnet": "arch mini2 extends mini\nfn wq() -> int {\n  return 1\n}\n",
                                                  "mini.linnet": MINI},
         2, 1, "`wq` is already defined", at="model.linnet"),
    Case("left-out-of-a-base-but-still-used", {"model.linnet": "arch mini2 extends mini\n  without wk, wq\n",
                                               "mini.linnet": MINI},
         2, 11, "`wk` is left out of `mini`, but is still used", note="mini.linnet:28:47, in entry `decode`"),
    Case("left-out-of-a-base-that-lacks-it", {"model.linnet": "arch mini2 extends mini\n  without w_k\n",
                                              "mini.linnet": MINI},
         2, 11, "`mini` declares no `w_k` to leave out", note="did you mean 'wk'?"),

    # ---------------------------------------------------------------- weights
    arch("unknown-loop-variable-in-pattern", """\
arch mini
config {
  dim: int = 8
  layers: int = 2
}
params {
  for l in layers {
    w: T[dim]
      from hf "layers.{layer}.w"
  }
}
""", 9, 23, "names `{layer}`, which is not a loop variable"),
    arch("stacked-pattern-without-loop-variable", """\
arch mini
config {
  dim: int = 8
  layers: int = 2
}
params {
  for l in layers {
    w: T[dim]
      from hf "layers.w"
  }
}
""", 9, 15, "needs `{l}` in its name pattern"),
    arch("pattern-names-inner-loop-without-outer", """\
arch mini
config {
  dim: int = 8
  layers: int = 2
  experts: int = 4
}
params {
  for l in layers {
    for e in experts {
      w: T[dim]
        from hf "layers.{l}.w"
        from gguf "experts.{e}.w"
    }
  }
}
""", 12, 19, "needs `{l}` in its name pattern"),
    arch("pattern-skips-a-loop", """\
arch mini
config {
  dim: int = 8
  layers: int = 2
}
params {
  for l in layers {
    for e in 4 {
      for h in 2 {
        w: T[dim]
          from hf "layers.{l}.experts.{h}.w"
      }
    }
  }
}
""", 11, 19, "names `{h}` but not `{e}`, the loop around it"),
    arch("inner-loop-shadows-outer", """\
arch mini
config {
  dim: int = 8
  layers: int = 2
}
params {
  for l in layers {
    for l in 2 {
      w: T[dim]
        from hf "layers.{l}.w"
    }
  }
}
""", 8, 9, "`l` already names an enclosing loop's variable"),
    arch("unknown-escape-in-a-string", """\
arch mini
config {
  dim: int = 8
}
params {
  w: T[dim, dim]
    from hf "layers\\q.w"
}
""", 7, 13, "unknown escape \\q in string"),
    arch("transform-without-parentheses", """\
arch mini
config {
  dim: int = 8
}
params {
  w: T[dim, dim]
    from hf "w" .transpose
}
""", 7, 18, "unexpected end of line after `.transpose`; expected '('"),  # (it was said at the `}` below)
    arch("stacked-transpose-counts-stored-dims", """\
arch mini
config {
  dim: int = 8
  layers: int = 2
  experts: int = 4
}
params {
  for l in layers {
    for e in experts {
      w: T[dim, 2 * dim]
        from hf "layers.{l}.experts.{e}.w" .transpose(1, 2)
    }
  }
}
""", 11, 44, "`.transpose` needs two different dims of the stored tensor (rank 2)"),
    arch("unknown-weight-transform", """\
arch mini
config {
  dim: int = 8
}
params {
  w: T[dim, dim]
    from gguf "w.weight" .transpos()
}
""", 7, 26, "unknown weight transform `transpos`"),
    arch("weight-transform-arity", """\
arch mini
config {
  dim: int = 8
}
params {
  w: T[dim, dim]
    from gguf "w.weight" .unpermute_rope()
}
""", 7, 26, "`unpermute_rope` takes 1 or 2 argument(s), not 0"),
    arch("weight-transpose-dim-outside", """\
arch mini
config {
  dim: int = 8
}
params {
  for l in 2 {
    w: T[4, dim, dim]
      from hf "w.{l}" .transpose(1, 3)
  }
}
""", 8, 23, "`.transpose` needs two different dims of the stored tensor (rank 3)"),
    arch("unknown-checkpoint-format", """\
arch mini
config {
  dim: int = 8
}
params {
  w: T[dim]
    from safetensors "w.weight"
}
""", 7, 10, "unknown checkpoint format `safetensors`"),
    arch("param-without-source", """\
arch mini
config {
  dim: int = 8
}
params {
  w: T[dim]
}
""", 6, 3, "param `w` says nowhere where its weights come from"),
    arch("tie-to-unknown-param", HEAD.replace('    from hf "wq.weight"\n', '    from hf "wq.weight"\n  head: T[vocab, dim] = embd if true\n    from hf "h"\n'),
         15, 25, "unknown param `embd`"),
    arch("tie-of-another-type", HEAD.replace('    from hf "wq.weight"\n', '    from hf "wq.weight"\n  head: T[dim, vocab] = embed if true\n    from hf "h"\n'),
         15, 25, "a tied param must have the same type"),
    arch("tie-to-itself", HEAD.replace('    from hf "wq.weight"\n', '    from hf "wq.weight"\n  head: T[vocab, dim] = head if true\n    from hf "h"\n'),
         15, 25, "`head` is tied to itself"),
    arch("ties-in-a-circle", HEAD.replace("  embed: T[vocab, dim]\n", "  embed: T[vocab, dim] = head if true\n")
         .replace('    from hf "wq.weight"\n', '    from hf "wq.weight"\n  head: T[vocab, dim] = embed if true\n    from hf "h"\n'),
         11, 26, "`embed` is tied to `head`, which is itself tied to `embed`"),
    arch("tie-that-never-holds-without-source", HEAD.replace('    from hf "wq.weight"\n', '    from hf "wq.weight"\n  head: T[vocab, dim] = embed if false\n'),
         15, 3, "param `head` has no source, and its tie to `embed` does not always hold"),
    arch("tie-on-a-config-value-without-source",
         HEAD.replace("  head_dim: int = dim / heads\n", "  head_dim: int = dim / heads\n  tie: bool = true\n")
         .replace('    from hf "wq.weight"\n', '    from hf "wq.weight"\n  head: T[vocab, dim] = embed if tie\n'),
         16, 3, "param `head` has no source, and its tie to `embed` does not always hold"),

    # ---------------------------------------------------------------- definitions and statements
    arch("duplicate-definition", HEAD + """\
fn f(x: T[dim]) -> T[dim] {
  return x
}

fn f(x: T[dim]) -> T[dim] {
  return x
}
""", 24, 1, "`f` is defined twice", note="model.linnet:20:1"),
    arch("duplicate-param", HEAD.replace("  wq: T[heads", "  embed: T[heads"), 13, 3, "`embed` is already defined"),
    arch("fn-without-result", HEAD + """\
fn write<n>(x: T[n, dim], rows: i32[n]) {
  cache[rows, 0] = x
}
""", 20, 1, "fn `write` declares no result"),
    arch("rope-without-theta", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, heads, head_dim] {
  return rope(linear(embed[tokens], wq).reshape(Batch, heads, head_dim), positions)
}
""", 21, 10, "`rope` needs its argument `theta`"),
    arch("local-shadows-param", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  embed = embed[tokens]
  return embed
}
""", 21, 3, "`embed` is a param; a local cannot take its name"),
    arch("local-shadows-state", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 2] {
  cache, i = topk(embed[tokens], 2)
  return cache
}
""", 21, 3, "`cache` is state; a local cannot take its name"),
    arch("argument-shadows-generic", HEAD + """\
entry decode(Batch: i32[4]) -> T[4, dim] {
  return embed[Batch]
}
""", 20, 14, "argument `Batch` hides another name"),
    arch("recursion", HEAD + """\
fn f<n>(x: T[n, dim]) -> T[n, dim] {
  return g(x)
}

fn g<n>(x: T[n, dim]) -> T[n, dim] {
  return f(x)
}
""", 21, 10, "`f` calls itself through `g`: a model's functions cannot be recursive"),
    arch("loop-carried-type-change", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  for i in 2 {
    x = x.sum(axis=-1)
  }
  return x
}
""", 23, 5, "`x` is T[Batch, dim] before the loop but T[Batch] inside it"),
    arch("loop-variable-assigned", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  for l in 2 {
    l = 3
  }
  return x
}
""", 23, 5, "`l` is a loop variable; it cannot be assigned"),
    arch("return-not-last", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
  x = 1
}
""", 21, 3, "`return` must be the last statement"),
    arch("missing-return", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
}
""", 20, 1, "`decode` must end with `return` of T[Batch, dim]"),
    arch("store-into-undeclared-state", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) {
  v_cache[iota(Batch), positions] = embed[tokens]
}
""", 21, 3, "unknown state `v_cache`"),
    arch("store-into-param", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) {
  embed[tokens] = embed[tokens]
}
""", 21, 3, "only state can be written in place"),
    arch("no-entry", """\
arch mini
config {
  dim: int = 8
}
""", 1, 1, "architecture `mini` defines no entry"),

    # ---------------------------------------------------------------- words and limits
    arch("keyword-as-a-local", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  then = embed[tokens]
  return then
}
""", 21, 3, "`then` is a keyword: it cannot name anything"),
    arch("keyword-as-a-config-name", """\
arch mini
config {
  true: bool = false
}
""", 3, 3, "`true` is a keyword"),
    arch("keyword-as-an-argument", HEAD + """\
entry decode(in: i32[Batch]) -> T[Batch, dim] {
  return embed[in]
}
""", 20, 14, "`in` is a keyword"),
    arch("expression-nested-too-deeply", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return """ + " + ".join(["x"] * 300) + """
}
""", 22, 10, "expression nested too deeply (over 200 levels)"),
    arch("negative-norm-eps", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return rmsnorm(embed[tokens], embed[0], eps=-0.5)
}
""", 21, 47, "eps of `rmsnorm` must be at least 0"),
    arch("layer-norm-weight-of-another-width", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return layer_norm(embed[tokens], weight=embed[:, 0])
}
""", 21, 43, "cannot normalize T[Batch, dim] with a weight T[vocab]", note="the weight must be [dim]"),
    arch("layer-norm-bias-of-another-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return layer_norm(embed[tokens], embed[0], bias=embed[0] as f32)
}
""", 21, 51, "cannot normalize T[Batch, dim] and f32[dim]: element types differ"),
    arch("layer-norm-of-integers", HEAD + """\
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return layer_norm(tokens)
}
""", 21, 21, "`layer_norm` needs a float tensor, not i32[Batch]", note="convert it first"),
    arch("negative-layer-norm-eps", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return layer_norm(embed[tokens], eps=-1e-5)
}
""", 21, 40, "eps of `layer_norm` must be at least 0"),
    arch("layernorm-spelt-as-torch-does", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return layernorm(embed[tokens])
}
""", 21, 10, "unknown function `layernorm`", note="Linnet calls this `layer_norm`"),

    # ---------------------------------------------------------------- bounds known once numbers are bound
    arch("slice-past-a-dim", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[vocab, 100] {
  return embed[:, 0:100]
}
""", 21, 19, "the slice 0:100 runs past the end of a dim of size 8"),
    arch("slice-ending-before-it-starts", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[vocab, 0 - 3] {
  return embed[:, 5:2]
}
""", 21, 19, "the slice 5:2 ends before it starts"),
    arch("index-past-a-dim", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[dim] {
  return embed[100]
}
""", 21, 16, "index 100 is out of range for a dim of size 16"),
    arch("negative-index-past-a-dim", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[dim] {
  return embed[-17]
}
""", 21, 16, "index -17 is out of range for a dim of size 16"),
    arch("store-slice-past-a-dim", HEAD + """\
entry decode(tokens: i32[Batch]) {
  cache[0, 250:260] = zeros(10, dim)
}
""", 21, 12, "the slice 250:260 runs past the end of a dim of size 256"),
    arch("topk-past-the-last-dim", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[vocab, 9] {
  values, indices = topk(embed, 9)
  return values
}
""", 21, 21, "`topk` cannot take the 9 largest of 8 values"),

    # ---------------------------------------------------------------- numbers
    arch("int-to-a-negative-power", """\
arch mini
config {
  half: int = 2 ** -1
}
""", 3, 15, "an int to a negative power is not a whole number"),
    arch("int-config-gets-a-float-with-numbers", """\
arch mini
config {
  e: int = 0 - 1
  half: int = 2 ** e
}
params {
  w: f32[4]
    from hf "w"
}
entry f(x: f32[4]) -> f32[4] {
  return x * half
}
""", 4, 15, "2 ** -1 is not a whole number"),
    arch("static-log-of-zero", """\
arch mini
config {
  tiny: float = log(0.0)
}
params {
  w: f32[4]
    from hf "w"
}
entry f(x: f32[4]) -> f32[4] {
  return x * tiny
}
""", 3, 17, "cannot evaluate log(0.0): math domain error"),
    # Python's (-16) ** -0.5 is a complex number: the generated code scaled attention by it
    arch("static-negative-to-fractional-power", """\
arch mini
config {
  scalar: int = -16
}
params {
  w: f32[4]
    from hf "w"
}
entry f(x: f32[4]) -> f32[4] {
  return x * scalar ** -0.5
}
""", 10, 14, "cannot evaluate (-16) ** -0.5: a negative number to a fractional power is not a real number"),
    arch("exponent-without-digits", """\
arch mini
config {
  dim: int = 1e
}
""", 3, 14, "`1e` is not a number: an exponent needs its digits"),
    arch("digits-grouped-with-underscores", """\
arch mini
config {
  dim: int = 1_000
}
""", 3, 14, "`1_000` is not a number: digits are written without `_`"),
    arch("number-with-two-points", """\
arch mini
config {
  dim: float = 8.5.3
}
""", 3, 16, "`8.5.3` is not a number"),

    # ---------------------------------------------------------------- names the generated code uses
    arch("size-declared-twice", HEAD + """\
entry decode<n, n>(x: T[n, dim]) -> T[n, dim] {
  return x
}
""", 20, 17, "the size `n` is declared twice"),
    arch("config-named-like-a-module", """\
arch mini
config {
  math: float = 2.0
}
""", 3, 3, "`math` is reserved (a module the generated code imports)"),
    arch("config-named-like-a-constant", """\
arch mini
config {
  TIED: int = 2
}
""", 3, 3, "`TIED` is reserved (a constant of the generated module)"),
    arch("local-named-like-a-builtin", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  slice = embed[tokens]
  return slice
}
""", 21, 3, "`slice` is reserved (a Python built-in the generated code calls)"),
    arch("param-named-like-a-model-attribute", HEAD.replace("  wq: T[", "  device: T[dim]\n    from hf \"d\"\n  wq: T["), 13, 3,
         "`device` is an attribute of the generated torch model class; a param cannot take its name"),
    arch("entry-named-like-a-model-attribute", HEAD + """\
entry compiled(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 20, 1, "`compiled` is an attribute of the generated JAX model class; an entry cannot take its name"),
    arch("entry-named-like-a-torch-method", HEAD + """\
entry reset_state(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 20, 1, "`reset_state` is an attribute of the generated torch and JAX model classes"),
    # mistakes of a newcomer writing GPT-2 from the language's page: each says what to do
    arch("linear-weight-stored-in-out", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {
  return linear(embed[tokens], embed.transpose(1, 0))
}
""", 21, 10, "the input's last dim is not the weight's `in` dim",
         note="a weight stored [in, out] is declared [out, in] ([vocab, dim] here) and read with `.transpose()`"),
    arch("attention-over-a-cache-of-every-layer", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, heads, head_dim] {
  q = linear(embed[tokens], wq).reshape(Batch, heads, head_dim)
  kv = zeros(2, Batch, MaxSeq, heads, head_dim)
  return attention(q, kv, kv, positions)
}
""", 23, 23, "caches must be [rows, positions, kv_heads, head_dim]",
         note="a cache stacked over layers is read a layer at a time: `k_cache[l]`"),
    arch("return-of-another-element-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> f32[Batch, dim] {
  return embed[tokens]
}
""", 21, 10, "`decode` returns T[Batch, dim], but declares f32[Batch, dim]", note="convert it: `return ... as f32`"),
    arch("broadcast-of-other-dims", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens] + embed[tokens].transpose(1, 0)
}
""", 21, 10, "cannot add T[Batch, dim] and T[dim, Batch]", note="axis -1: dim vs Batch (dims broadcast when equal"),
    # PyTorch's and NumPy's habits: refused where they stand, with Linnet's way
    arch("torch-dim-argument", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch] {
  return embed[tokens].sum(dim=-1)
}
""", 21, 28, "`sum` has no argument `dim`", note="Linnet calls this `axis`"),
    arch("torch-repeat-interleave", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, MaxSeq, dim] {
  return cache.repeat_interleave(2, axis=1)
}
""", 21, 16, "unknown function `repeat_interleave`", note="so a cache needs no repeating"),
    arch("torch-view", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, heads, head_dim] {
  return linear(embed[tokens], wq).view(Batch, heads, head_dim)
}
""", 21, 36, "unknown function `view`", note="Linnet calls this `reshape`"),
    arch("python-true", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 1] {
  return embed[tokens].sum(axis=-1, keepdim=True)
}
""", 21, 45, "unknown name `True`", note="Linnet's booleans are `true`"),
    arch("slice-from-the-end", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, 2] {
  return embed[tokens][:, -2:]
}
""", 21, 27, "a dim is never negative", note="a slice bound does not count from the end"),
    arch("attribute-shape", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return zeros(embed[tokens].shape[0], dim)
}
""", 21, 35, "unexpected '['", note="Linnet has no attributes; a tensor's sizes are the dims of its type"),
    arch("attribute-transpose", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, vocab] {
  return embed[tokens] @ embed.T
}
""", 21, 32, "unexpected end of line after `.T`; expected '('", note="`x.transpose(1, 0)` swaps two dims"),

    arch("chained-comparison", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return if 1 < heads < 8 then embed[tokens] else embed[tokens]
}
""", 21, 23, "unexpected '<'", note="comparisons do not chain as Python's do"),
    arch("ellipsis-index", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch] {
  return embed[tokens][..., 0]
}
""", 21, 24, "unexpected '.'", note="Linnet has no `...`"),
    # -------------------------------------------- a first card's mistakes: another language's way, told Linnet's
    arch("def-for-fn", HEAD + """\
def decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 20, 1, "unexpected 'def'", note="a function is declared with `fn`"),
    arch("def-in-a-body", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  def double(x) {
    return x + x
  }
  return embed[tokens]
}
""", 21, 7, "unexpected 'double'", note="a function is declared with `fn`"),
    arch("let-before-a-local", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  let x = embed[tokens]
  return x
}
""", 21, 7, "unexpected 'x'", note="a local is bound with `x = ...`: Linnet has no `let`"),
    arch("local-with-a-type", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x: T[Batch, dim] = embed[tokens]
  return x
}
""", 21, 4, "unexpected ':'", note="a local takes its type from its value: write `x = ...`"),
    # (a comment that ends in `.` is not read as `.card`, an attribute)
    card("card-name-unquoted", "# My model.\n" + CARD.replace('card "mini-test"', "card mini-test"), 2, 6,
         "unexpected 'mini'; expected a string", arch_source=MINI,
         note='a card\'s name is a string: `card "mini-test"`'),
    card("card-extends-its-architecture", CARD.replace('"mini-test"\nimport mini', '"mini-test" extends mini'), 1, 18,
         "unexpected 'extends'", arch_source=MINI, note="a card imports its architecture"),
    card("card-value-set-with-a-colon", CARD.replace("vocab = 16", "vocab: 16"), 5, 10, "unexpected '16'",
         arch_source=MINI, note="a card sets a value with `=` (`vocab = 16`)"),
    card("card-value-computed", CARD.replace("dim = 8", "dim = 4 * 2"), 6, 9, "the value of `dim` must be a literal",
         arch_source=MINI, note="a card gives values, not computations: write the number it comes to, `8`"),
    card("card-value-computed-from-a-name", CARD.replace("dim = 8", "dim = heads * 4"), 6, 9,
         "the value of `dim` must be a literal", arch_source=MINI,
         note="write the number it comes to (an architecture's default may compute one"),
    # a card's value that is no literal, added on line 8: the note says the literal likely meant
    *[card(f"card-value-{id}", with_config(CARD, f"{name} = {value}"), 8, 6 + len(name),
           f"the value of `{name}` must be a literal", arch_source=MINI, note=note)
      for id, name, value, note in [
          ("string-unquoted", "rope_scaling", "llama3", 'a string is written in double quotes: `"llama3"`'),
          ("names-another", "kv_heads", "heads", "a card gives values, not names"),
          ("none", "rope_scaling", "None", "Linnet has no `None`: leave the value out to take the architecture's "
                                           "default")]],
    arch("config-default-reads-one-below", """\
arch mini
config {
  kv_heads: int = heads
  heads: int = 2
}
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens
}
""", 3, 19, "`heads` is declared below `kv_heads`, at", note="move `heads` above `kv_heads`"),
    arch("config-default-reads-itself", """\
arch mini
config {
  heads: int = heads
}
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens
}
""", 3, 16, "the default of `heads` cannot read `heads` itself"),
    # a weight name is looked up as written: a brace that names no loop variable, or no name, finds no tensor
    arch("weight-name-brace-not-closed", HEAD.replace('"embed.weight"', '"embed{.weight"') + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 12, 19, "this `{` in the weight's name is not closed", note="names a loop variable as `{l}`"),
    arch("weight-name-brace-closes-nothing", HEAD.replace('"wq.weight"', '"wq}.weight"') + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 14, 16, "this `}` in the weight's name closes no `{`"),
    arch("weight-name-empty", HEAD.replace('"embed.weight"', '""') + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 12, 13, "a weight's name is empty"),
    arch("reshape-with-minus-one", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, heads, head_dim] {
  return linear(embed[tokens], wq).reshape(Batch, -1, head_dim)
}
""", 21, 51, "a dim is never negative", note="`reshape` takes every size by name, with no -1 to infer one"),
    arch("concat-of-tensors-not-a-list", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  return concat(x, x, axis=-1)
}
""", 22, 23, "argument `axis` is given twice", note="`concat` takes a list of tensors: concat([a, b], axis=-1)"),
    arch("block-after-a-colon", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  for i in 2:
    x = x + x
  return x
}
""", 22, 13, "unexpected ':'; expected '{'", note="a block is written in braces"),
    # after a result type or an entry's parentheses, where more than a `{` could follow
    arch("fn-block-after-a-colon", HEAD + """\
fn double<n>(x: T[n, dim]) -> T[n, dim]:
  return x + x
""", 20, 40, "unexpected ':'", note="a block is written in braces"),
    arch("entry-block-after-a-colon", HEAD + """\
entry copy_rows<K>(src: i32[K]):  # a note
  return
""", 20, 32, "unexpected ':'", note="a block is written in braces"),
    arch("if-statement", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  if heads > 1 {
    x = x + x
  }
  return x
}
""", 22, 3, "unexpected 'if'", note="Linnet has no `if` statement"),
    arch("misspelt-block-keyword", HEAD.replace("params {", "parmas {") + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 10, 1, "unexpected 'parmas'", note="did you mean `params` for `parmas`?"),
    card("import-of-an-architecture-named-otherwise", CARD, 2, 1, "does not declare `arch mini`",
         arch_source=MINI.replace("arch mini", "arch Mini"), note="it declares `arch Mini`"),
    arch("cache-indices-in-another-order", HEAD + """\
entry decode(tokens: i32[Batch], positions: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  cache[positions, iota(Batch)] = x
  return x
}
""", 22, 9, "this index reaches 255, past the end of a dim of size 1",
         note="dim 0 counts Batch, not MaxSeq: are the indices in the order of `cache`'s dims?"),
    card("import-of-a-file-name", CARD.replace("import mini", "import mini.linnet"), 2, 12, "unexpected '.'",
         arch_source=MINI, note="`import` takes the architecture's name, as its `arch` line gives it"),
    arch("python-conditional-in-a-default", """\
arch mini
config {
  heads: int = 2
  kv_heads: int = heads if heads > 1 else 1
}
entry decode(tokens: i32[Batch]) -> i32[Batch] {
  return tokens
}
""", 4, 25, "unexpected 'if'", note="Linnet writes a choice as `if c then a else b`"),
    arch("comment-with-slashes", HEAD + """\
// the model
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]
}
""", 20, 1, "unexpected '//'", note="a comment starts with `#`"),
    # in a body, `// ...` reads as a division of the line before: its second word is refused, or the
    # next line's first token; one word after it is an unknown name
    arch("comment-with-slashes-in-a-body", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  // the embeddings
  return x
}
""", 23, 3, "unexpected 'return'", note="a comment starts with `#`"),
    arch("comment-with-slashes-after-a-statement", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]  // the embeddings
  return x
}
""", 22, 3, "unexpected 'return'", note="a comment starts with `#`"),
    arch("comment-with-slashes-of-one-word", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return embed[tokens]  // embedded
}
""", 21, 28, "unknown name `embedded`", note="a comment starts with `#` (`//` divides)"),
    arch("result-after-a-fat-arrow", HEAD + """\
entry decode(tokens: i32[Batch]) => T[Batch, dim] {
  return embed[tokens]
}
""", 20, 34, "unexpected '='", note="a fn's result type follows `->`"),
    arch("fn-sizes-in-square-brackets", HEAD + """\
fn double[n](x: T[n, dim]) -> T[n, dim] {
  return x + x
}
""", 20, 10, "unexpected '['", note="a fn's sizes are written in angle brackets"),
    arch("sizes-written-at-a-call", HEAD + """\
fn double<n>(x: T[n, dim]) -> T[n, dim] {
  return x + x
}

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return double<Batch, dim>(embed[tokens])
}
""", 25, 22, "unexpected ','", note="a call does not write its sizes: `double(...)` takes them from its arguments' "
                                    "types"),
    arch("one-size-written-at-a-call", HEAD + """\
fn double<n>(x: T[n, dim]) -> T[n, dim] {
  return x + x
}

entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return double<Batch>(embed[tokens])
}
""", 25, 22, "unexpected '>'", note="a call does not write its sizes: `double(...)` takes them from its arguments' "
                                    "types"),
    arch("a-spaced-chained-comparison-is-one", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  y = if vocab < dim > (heads) then 1.0 else 2.0
  return embed[tokens] * y
}
""", 21, 22, "unexpected '>'", note="comparisons do not chain"),
    arch("stacked-weight-read-whole", HEAD.replace("  wq:", "  for h in heads {\n    norm: T[dim]\n"
                                                            "      from hf \"layers.{h}.norm.weight\"\n"
                                                            "  }\n  wq:") + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  return rmsnorm(embed[tokens], norm, eps=1e-5)
}
""", 25, 10, "cannot normalize T[Batch, dim] with a weight T[heads, dim]",
         note="`norm` is declared in `for h in heads`, so it is T[heads, dim]: one `h`'s is `norm[h]`"),
    # an extension's fn that the base's calls no longer fit: at the replacement, not at the base's call
    Case("replacement-of-another-signature", {
        "model.linnet": "arch ext extends mini\n\nfn scale<n>(x: T[n, dim], by: float) -> T[n, dim] {\n"
                        "  return x * by\n}\n",
        "mini.linnet": HEAD + "fn scale<n>(x: T[n, dim]) -> T[n, dim] {\n  return x * 2.0\n}\n\n"
                              "entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n"
                              "  return scale(embed[tokens])\n}\n"},
         3, 1, "`scale` replaces `scale(x: T[n, dim]) -> T[n, dim]` with another signature",
         note="entry `decode` calls it at "),
    # ------------------------------------------- the checker's own refusals: declarations, dims, calls
    arch("fn-named-after-an-op", HEAD + """\
fn softmax(x: T[Batch, dim]) -> T[Batch, dim] {
  return x
}
""", 20, 1, "`softmax` is a built-in op; choose another name"),
    arch("list-default-not-a-list", HEAD.replace("  head_dim: int = dim / heads\n",
                                                 "  head_dim: int = dim / heads\n  adds: bool[heads] = true\n") + ENTRY,
         8, 23, "the default of a bool[heads] list is a list: `[...]`, `[... for l in heads]` or another list config, "
                "not bool"),
    arch("list-default-too-long", HEAD.replace("  head_dim: int = dim / heads\n",
                                               "  head_dim: int = dim / heads\n  layers: int = 2000000\n"
                                               "  adds: bool[layers] = [l % 2 == 0 for l in layers]\n") + ENTRY,
         9, 24, "a list of 2000000 items is too long for a static list",  # (not an hour laying it out)
         note="static lists hold at most 1048576 items"),
    arch("two-sources-in-one-format", HEAD.replace('from hf "wq.weight"', 'from hf "wq.weight"\n    from hf "w2"')
         + ENTRY, 15, 10, "`wq` names two `hf` sources"),
    arch("tie-condition-not-a-bool", HEAD.replace("  wq:", "  lm: T[vocab, dim] = embed if 1\n  wq:") + ENTRY, 13, 32,
         "the condition of a tie must be a static bool, not int"),
    *[arch(f"dim-{id}", HEAD.replace("  head_dim: int = dim / heads\n",
                                     '  head_dim: int = dim / heads\n  nm: str = "a"\n')
           .replace("cache: T[Batch, MaxSeq, dim]", f"cache: T[Batch, MaxSeq, {dim}]") + ENTRY, 19, 27, message)
      for id, dim, message in [
          ("a-float", "1.5", "a dim must be a non-negative integer, not 1.5"),
          ("a-str-config-value", "nm", "`nm` is a str config value; a dim must be an int"),
          ("the-element-type", "T", "`T` is the element type, not a size"),
          ("divided-by-zero", "dim // (2 - 2)", "division of a dim by zero"),
          ("remainder", "dim % 2", "a dim must be built from numbers, config values and generics with + - * /")]],
    arch("argument-declared-twice", HEAD + """\
fn f<n>(x: T[n, dim], x: T[n, dim]) -> T[n, dim] {
  return x
}
""" + ENTRY, 20, 23, "argument `x` is declared twice"),
    arch("entry-argument-static", HEAD + """\
entry decode(tokens: i32[Batch], k: int) -> T[Batch, dim] {
  return embed[tokens]
}
""", 20, 37, "entry arguments must be tensors"),
    arch("entry-without-a-result-returns-one", HEAD + """\
entry fill(tokens: i32[Batch]) {
  return embed[tokens]
}
""" + ENTRY, 21, 3, "`fill` declares no result, but returns one"),
    arch("loop-over-a-float", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  for i in 1.5 {
    x = x + x
  }
  return x
}
""", 22, 12, "a loop runs over a static int count, not float"),
    arch("misspelt-local-in-a-loop", HEAD + """\
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
  x = embed[tokens]
  for i in 2 {
    x = xx + x
  }
  return x
}
""", 23, 9, "unknown name `xx`", note="did you mean 'x'?"),
    statement("parts-to-one-name", "y = topk(x, 2)", 3, "the value has 2 parts; assign them to as many names"),
    statement("slice-bound-a-float", "y = x[0:1.5]", 11, "slice bounds must be static ints, not float"),
    statement("if-branches-of-unlike-kinds", 'y = if true then 1 else "a"', 7,
              "the branches of `if` differ: int vs str"),
    statement("reshape-without-sizes", "y = x.reshape()", 7, "`reshape` needs at least one size: `reshape(x, n, d)`"),
    statement("iota-of-two-sizes", "y = iota(2, 3)", 15, "`iota` takes at most 1 argument(s)"),
    statement("iota-size-given-twice", "y = iota(2, n=3)", 15, "argument `n` is given twice"),
    statement("iota-without-a-size", "y = iota()", 7, "`iota` needs its size `n`"),
    statement("op-argument-named-twice", "y = softmax(x, axis=0, axis=1)", 26, "argument `axis` is given twice"),
    statement("op-given-too-many-arguments", "y = softmax(x, 0, 1)", 21, "`softmax` takes at most 2 argument(s)"),
    *[arch(f"fn-call-{id}", HEAD + """\
fn scaled<n>(x: T[n, dim], by: float) -> T[n, dim] {
  return x * by
}
entry decode(tokens: i32[Batch]) -> T[Batch, dim] {
""" + f"  return {call}\n}}\n", 24, col, message)
      for id, call, col, message in [
          ("of-too-many-arguments", "scaled(embed[tokens], 1.0, 2)", 10, "`scaled` takes 2 argument(s), not 3"),
          ("argument-given-twice", "scaled(embed[tokens], 1.0, by=2.0)", 37, "argument `by` is given twice"),
          ("argument-missing", "scaled(embed[tokens])", 10, "`scaled` needs its argument `by`"),
          ("static-argument-of-another-kind", 'scaled(embed[tokens], "a")', 32,
           "argument `by` of `scaled` is float, not str")]],
    card("card-declaring-an-architecture", CARD.replace("import mini\n", "import mini\narch other\n"), 3, 1,
         "a card fills an architecture's config; it does not declare one itself", arch_source=MINI),
    card("card-named-twice", CARD.replace("import mini\n", 'import mini\ncard "again"\n'), 3, 1,
         "a file declares at most one `card`", arch_source=MINI),
    # a card's bool written as another language writes it
    *[card(f"card-bool-{id}", with_config(CARD, f"tied = {value}"), 8, 10, "the value of `tied` must be a literal",
           arch_source=MINI.replace('  rope_scaling: str = "none"\n',
                                    '  rope_scaling: str = "none"\n  tied: bool = false\n'),
           note=note)
      for id, value, note in [("capitalized", "True", "Linnet's booleans are `true`"),
                              ("as-a-word", "yes", "a bool is `true` or `false`")]],
    # a name left out (`without`) that a declaration which stays still reads: a tie, a call, a loop's body, a store
    *[Case(f"left-out-{id}-still-used",
           {"model.linnet": f"arch ext extends mini without {name}\n", "mini.linnet": READER}, 1, 31, f"`{name}` is left out of `mini`, but is still used", note=note)
      for id, name, note in [("param-a-tie-names", "embed", ":13:25, in param `head`"),
                             ("fn", "double", ":26:7, in entry `decode`"),
                             ("param-read-in-a-loop", "head", ":28:23, in entry `decode`"),
                             ("state-stored-into", "cache", ":30:3, in entry `decode`")]],
    # ------------------------------------------- each op's type rule, misused in one statement of DECODE
    statement("adding-a-list-of-parts", "y = x + topk(x, 2)", 7,
              "cannot add T[Batch, dim] and (T[Batch, 2], i32[Batch, 2])"),
    statement("adding-a-string-to-a-tensor", 'y = x + "a"', 7, "cannot add T[Batch, dim] and a string"),
    statement("and-of-float-tensors", "y = x and x", 7,
              "`and` needs bool tensors, not T[Batch, dim] and T[Batch, dim]"),
    statement("and-of-static-ints", "y = 1 and 2", 7, "`and` needs bools, not int and int"),
    statement("adding-a-string-to-an-int", 'y = "a" + 1', 7, "cannot add str and int"),
    statement("adding-a-bool-to-an-int", "y = true + 1", 7, "cannot add bool and int"),
    statement("remainder-of-a-static-float", "y = 1.5 % 2", 7, "`%` needs ints, not float and int"),
    statement("floor-division-by-a-static-float", "y = 1 // 2.0", 7, "`//` needs ints, not int and float"),
    statement("not-of-a-static-int", "y = not 1", 7, "`not` needs a bool, not int"),
    statement("exp-of-a-string", 'y = exp("a")', 7, "`exp` needs a tensor or a number, not str"),
    statement("negating-a-string", 'y = -"a"', 7, "`-` needs a tensor or a number, not str"),
    statement("negating-a-list-of-parts", "y = -topk(x, 2)", 8,
              "the argument of `-` must be a tensor, not (T[Batch, 2], i32[Batch, 2])"),
    statement("not-of-a-float-tensor", "y = not x", 7, "`not` needs a bool tensor, not T[Batch, dim]"),
    statement("cast-to-an-unknown-type-by-name", 'y = cast(x, "int8")', 15,
              "cannot convert to 'int8': the element type is one of T, f32"),
    statement("where-between-unlike-types", "y = where(x > x, x, tokens)", 7,
              "cannot choose between T[Batch, dim] and i32[Batch]: element types differ", note="convert one with `as`"),
    statement("where-between-numbers", "y = where(x > x, 1.0, 2.0)", 7,
              "`where` needs at least one tensor to choose from"),
    statement("matmul-of-a-rank-0-tensor", "y = sum(sum(x)) @ x", 7,
              "cannot multiply T[] and T[Batch, dim]: `@` needs tensors of rank >= 1"),
    statement("linear-bias-of-another-size", "y = linear(x, wq, embed[0])", 21,
              "the bias must be [head_dim * heads], not T[dim]"),
    statement("expert-linear-of-another-in-dim", "y = expert_linear(x, zeros(4, 3, 5), experts)", 7,
              "cannot apply T[4, 3, 5] to T[Batch, dim]",
              note="the input's last dim (dim) must equal the weights' `in` dim (5)"),
    statement("expert-linear-bias-of-another-shape",
              "y = expert_linear(x, zeros(4, 3, dim), experts, bias=zeros(4))", 56,
              "the bias must be [4, 3] (one row per expert), not T[4]"),
    statement("einsum-spec-not-a-string", "y = einsum(1, x)", 14,
              "the first argument of `einsum` must be a string literal"),
    statement("einsum-spec-without-an-output", 'y = einsum("ab", x)', 14,
              'an einsum spec needs an explicit output: "ab,bc->ac"'),
    statement("einsum-operands-of-unlike-types", 'y = einsum("a,ab->b", tokens, x)', 33,
              "einsum operands must share an element type: i32 vs T"),
    statement("einsum-letters-for-another-rank", 'y = einsum("a,ab->b", x, x)', 25,
              "`a` does not fit T[Batch, dim]: one letter per dim"),
    statement("einsum-letter-of-two-sizes", 'y = einsum("ab,ab->a", x, wq)', 29,
              "einsum index `a` is Batch in one operand and head_dim * heads in another"),
    statement("softmax-of-integers", "y = softmax(tokens)", 7, "`softmax` needs a float tensor, not i32[Batch]"),
    statement("rope-of-a-rank-2-tensor", "y = rope(x, positions, theta=1e4)", 12,
              "`rope` takes x as [n, heads, head_dim], not T[Batch, dim]"),
    statement("rope-positions-not-integers", "y = rope(q, x, theta=1e4)", 15,
              "the positions of `rope` must be i32[Batch], not T[Batch, dim]"),
    statement("rope-scaling-unknown", 'y = rope(q, positions, theta=1e4, scaling="foo")', 45,
              "unknown rope scaling 'foo'; one of none, llama3, yarn, linear"),
    statement("attention-queries-of-rank-2", "y = attention(x, kv, kv, positions)", 17,
              "queries must be [n, heads, head_dim], not T[Batch, dim]"),
    statement("attention-caches-that-disagree", "y = attention(q, kv, kv[0:1], positions)", 7,
              "the key and value caches disagree"),
    statement("attention-of-another-head-dim", "y = attention(q, kv[:, :, :, 0:1], kv[:, :, :, 0:1], positions)", 7,
              "differ in head_dim: head_dim vs 1"),
    statement("attention-positions-not-integers", "y = attention(q, kv, kv, tokens as f32)", 28,
              "positions must be i32[Batch], not f32[Batch]"),
    statement("attention-without-rows-on-fewer-rows", "y = attention(q, kv[0:1], kv[0:1], positions)", 7,
              "without `rows`, token i attends to cache row i, so n (Batch) must equal the cache's rows (1)",
              note="pass rows=..."),
    statement("attention-rows-not-integers", "y = attention(q, kv[0:1], kv[0:1], positions, rows=x)", 54,
              "rows must be i32[Batch], not T[Batch, dim]"),
    statement("attention-sinks-not-one-per-head", "y = attention(q, kv, kv, positions, sinks=x)", 45,
              "sinks must be one per head, [heads], not T[Batch, dim]"),
    statement("transpose-not-a-permutation", "y = x.transpose(0, 0)", 7,
              "transpose of T[Batch, dim] needs a permutation of 0..1, not [0, 0]"),
    statement("concat-of-a-tensor-not-a-list", "y = concat(x)", 14, "`concat` takes a list of tensors"),
    statement("concat-of-an-empty-list", "y = concat([])", 14, "`concat` takes a list of tensors"),
    statement("concat-of-a-number", "y = concat([x, 1])", 14, "`concat` takes tensors, not int"),
    statement("concat-of-unlike-shapes", "y = concat([x, tokens as T], axis=0)", 7,
              "cannot concatenate T[Batch, dim] and T[Batch] along dim 0"),
    statement("take-at-float-indices", "y = take(x, x)", 15, "indices must be integers, not T[Batch, dim]"),
    statement("copy-rows-of-a-rank-2-cache", "y = copy_rows(x, tokens, tokens, tokens)", 17,
              "`copy_rows` needs a cache [layers, Batch, MaxSeq, ...], not T[Batch, dim]"),
    # its rows are dim 1: a cache without a layers dim had its positions copied as rows, its tokens changed
    statement("copy-rows-of-a-cache-without-layers", "y = copy_rows(kv, tokens, tokens, tokens)", 17,
              "`copy_rows` copies the rows of a cache [layers, Batch, MaxSeq, ...]: this one is "
              "T[Batch, MaxSeq, heads, head_dim], whose dim 1 is MaxSeq, not Batch",
              note="a cache of one layer is declared `T[1, Batch, MaxSeq, ...]`"),
    statement("copy-rows-of-unlike-lengths", "y = copy_rows(kv.unsqueeze(0), tokens, tokens, iota(3))", 50,
              "src, dst and upto must be i32 vectors of one length, not i32[Batch] and i32[3]"),
    statement("too-many-indices", "y = x[0, 0, 0]", 7, "too many indices for T[Batch, dim]: 3 for rank 2"),
    statement("adding-a-dim-divided-by-a-product", "y = zeros(Batch, dim / (2 * heads)) + x", 7,
              "cannot add T[Batch, dim / (2 * heads)] and T[Batch, dim]"),
    statement("index-by-a-static-float", "y = x[1.5]", 9, "an index must be an int or an integer tensor, not float"),
    statement("index-by-a-bool", "y = x[true]", 9, "an index must be an int or an integer tensor, not bool"),
    statement("static-index-apart-from-a-gather", "y = q[tokens, 0:1, 1]", 22, "gathered indices must be adjacent"),
    statement("gather-apart-from-a-static-index", "y = q[0, 0:1, tokens]", 17, "gathered indices must be adjacent"),
    statement("index-by-a-float-tensor", "y = x[x]", 9, "an index tensor must hold integers, not T[Batch, dim]"),
    statement("index-by-a-list-of-parts", "y = x[topk(x, 2)]", 9, "cannot index with (T[Batch, 2], i32[Batch, 2])"),
    statement("index-into-a-list-of-parts", "y = topk(x, 2)[1]", 7,
              "cannot index (T[Batch, 2], i32[Batch, 2]): a value of 2 parts is no tensor",
              note="assign its parts to as many names"),
]


def test_the_table_is_large_and_its_ids_unique():
    assert len(CASES) >= 35
    assert len({c.id for c in CASES}) == len(CASES)


def test_head_is_19_lines():
    assert HEAD.count("\n") == 19


@pytest.fixture(scope="module")
def valid_card(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("valid")
    (d / "mini.linnet").write_text(MINI)
    (d / "card.linnet").write_text(CARD)
    return d / "card.linnet"


def test_the_bases_are_valid(valid_card, tmp_path, capsys):
    """What the cases break is valid as it stands, so each case fails for its own reason."""
    head = tmp_path / "head.linnet"
    head.write_text(HEAD + "entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n  return embed[tokens]\n}\n")
    for path in (valid_card, head):
        assert main(["check", str(path)]) == 0, capsys.readouterr().err
        assert main(["compile", str(path), "--backend", "torch"]) == 0, capsys.readouterr().err


def _write(case: Case, tmp_path: Path) -> tuple[Path, Path]:
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    target = tmp_path / next(iter(case.files))
    return target, tmp_path / (case.at or target.name)


def _assert_rendered(err: str, case: Case, at: Path):
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) >= 3, err
    assert re.match(rf"^{re.escape(str(at))}:{case.line}:{case.col}: error: ", lines[0]), err
    assert case.message in lines[0], err
    source_line = at.read_text().split("\n")[case.line - 1].rstrip().expandtabs(1)
    caret = lines[2]
    assert set(caret.strip()) == {"^"}, err
    if len(source_line) > 160:  # a long line, quoted in part: `...` where it is cut
        lead = 3 if lines[1].startswith("    ...") else 0
        cut = lines[1][4 + lead:].removesuffix("...")
        first = caret.index("^") - 4 - lead  # the caret's place in the cut
        assert len(cut) <= 160 and source_line[case.col - 1 - first:].startswith(cut), err
    else:
        assert lines[1] == "    " + source_line, err
        assert caret.index("^") == 4 + case.col - 1, err
    assert case.note is None or case.note in "\n".join(lines[3:]), err


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("command", ["check", "compile"])
def test_error(case: Case, command: str, tmp_path, capsys):
    target, at = _write(case, tmp_path)
    argv = [command, str(target), *case.args] + (["--backend", "torch"] if command == "compile" else [])
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 1, captured.err
    assert "Traceback" not in captured.out
    _assert_rendered(captured.err, case, at)


@pytest.mark.parametrize("generics, message, numerics", [
    ({"Batch": 0}, "generic `Batch` must be a positive integer, not 0", "exact"),
    ({"T": "i32"}, "generic `T` must be a float type", "exact"),
    ({"MaxSeq": "abc"}, "generic `MaxSeq` must be a positive integer, not 'abc'", "exact"),
    ({"Seq": 4}, "unknown generic `Seq`", "exact"),
    ({}, "numerics must be 'exact' or 'fast', not 'fats'", "fats"),
])
def test_a_bad_generic_from_python_is_the_cards_error(generics, message, numerics, tmp_path):
    """Generics (and numerics) passed in Python (nest.load's) are checked at specialization, the error
    at the card's `card` line (the command line refuses bad ones as its flags' errors)."""
    from linnet.ir.specialize import specialize

    case = card("generic", "# a comment first\n" + CARD, 2, 1, message, arch_source=MINI)
    target, at = _write(case, tmp_path)
    with pytest.raises(LinnetError) as err:
        specialize(load_file(target), generics, numerics)
    _assert_rendered(str(err.value).rstrip("\n") + "\n", case, at)


def test_t_takes_the_names_torch_numpy_and_vllm_give_the_float_types(tmp_path):
    """generics={"T": "bfloat16"} (vLLM's --dtype word), torch.float16 and numpy's float32 are T's own
    bf16, f16 and f32; a type that is not a float is still refused."""
    import numpy as np
    import torch

    from linnet.ir.specialize import specialize

    case = card("generic", CARD, 2, 1, "", arch_source=MINI)
    target, _ = _write(case, tmp_path)
    module = load_file(target)
    for given, want in (("bfloat16", "bf16"), ("half", "f16"), ("float", "f32"), (torch.float16, "f16"),
                        (torch.bfloat16, "bf16"), (np.dtype("float32"), "f32"), (np.float16, "f16"), ("f16", "f16")):
        assert specialize(module, {"T": given}, "fast").bindings["T"] == want, given
    for bad in (torch.int32, np.dtype("float64"), np.int32, "float64"):
        with pytest.raises(LinnetError, match="generic `T` must be a float type"):
            specialize(module, {"T": bad}, "fast")


_BY_ID = {c.id: c for c in CASES}


@pytest.mark.parametrize("case_id, command", [
    ("missing-closing-brace", "check"),
    ("bad-escape-in-string", "check"),
    ("fn-argument-shape", "compile"),
    ("missing-config-value", "check"),
    ("inexact-division", "compile"),
])
def test_error_in_a_subprocess(case_id: str, command: str, tmp_path):
    """End to end: the real command line exits 1 and shows the error, never a traceback."""
    case = _BY_ID[case_id]
    target, at = _write(case, tmp_path)
    argv = [sys.executable, "-m", "linnet.cli", command, str(target), *case.args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    _assert_rendered(proc.stderr, case, at)


def _check_changed(tmp_path, capsys, source: str, old: str, new: str) -> str:
    """`linnet check` of a built-in .linnet file (a path under linnet/nest/cards) with `old` replaced by
    `new`, which must fail: its standard error."""
    path = tmp_path / Path(source).name
    path.write_text((Path(__file__).parents[2] / "linnet/nest/cards" / source).read_text().replace(old, new))
    assert main(["check", str(path)]) == 1
    return capsys.readouterr().err


def test_a_value_set_below_its_floor_is_named_with_its_value(tmp_path, capsys):
    """A card's negative sliding window (an int like any other to the type checker) is an error at
    the attention that would use it, with the value the card gave."""
    err = _check_changed(tmp_path, capsys, "tiny-llama.linnet", "config {\n", "config {\n  sliding_window = -4\n")
    assert "error: window of `attention` must be at least 0" in err and "`sliding_window` is -4" in err, err
    assert "llama.linnet:" in err.splitlines()[0]


def test_a_negative_attention_softcap_is_named_with_its_value(tmp_path, capsys):
    """Gemma 2's cap on attention scores is a static float, 0 for none: a negative one (which would flip
    every score's sign through tanh) is an error at the attention, naming the card's value; a tensor
    is no cap at all."""
    err = _check_changed(tmp_path, capsys, "tiny-gemma2.linnet", "attn_softcap = 2.0", "attn_softcap = -2.0")
    assert "error: softcap of `attention` must be at least 0" in err and "`attn_softcap` is -2.0" in err, err
    assert "gemma2.linnet:" in err.splitlines()[0]
    err = _check_changed(tmp_path, capsys, "arch/gemma2.linnet", "softcap=attn_softcap", "softcap=positions")
    assert "error: softcap must be a static float, not i32[n]" in err, err


_ABOVE_0 = " of `rope` must be greater than 0"


@pytest.mark.parametrize("source, old, new, message", [
    ("tiny-llama.linnet", "rope_low_freq_factor = 1.0", "rope_low_freq_factor = 0", "low_freq_factor" + _ABOVE_0),
    ("tiny-llama.linnet", "rope_high_freq_factor = 4.0", "rope_high_freq_factor = 0", "high_freq_factor" + _ABOVE_0),
    ("tiny-llama.linnet", "rope_original_max = 32", "rope_original_max = -1", "original_max" + _ABOVE_0),
    ("tiny-gpt-oss.linnet", "config {\n", "config {\n  rope_beta_slow = 0\n", "beta_slow" + _ABOVE_0),  # yarn
    ("tiny-qwen2.linnet", "rope_theta = 10000.0", "rope_theta = 1", "theta of `rope` must not be 1 under yarn"),
])
def test_a_rope_scalings_value_below_its_floor_is_named(source, old, new, message, tmp_path, capsys):
    """llama3's and yarn's settings divide or take a log of themselves as the model builds its tables: at
    0 that was a ZeroDivisionError or math domain error from the generated model, and a negative one
    computed nonsense frequencies; yarn divides by log(theta). Each is an error at the rope, where the
    scaling reads it."""
    err = _check_changed(tmp_path, capsys, source, old, new)
    assert f"error: {message}" in err, err


def test_a_rope_setting_its_scaling_does_not_read_has_no_floor(tmp_path):
    """llama3's factors are no error under plain rope, which never reads them."""
    cards = Path(__file__).parents[2] / "linnet/nest/cards"
    card = tmp_path / "tiny-llama.linnet"
    card.write_text((cards / "tiny-llama.linnet").read_text().replace('rope_scaling = "llama3"', 'rope_scaling = "none"')
                    .replace("rope_low_freq_factor = 1.0", "rope_low_freq_factor = 0"))
    assert main(["check", str(card)]) == 0


def test_the_grouped_query_note_names_the_numbers(tmp_path, capsys):
    """The heads that do not divide are named with the numbers the card gave them."""
    target, _ = _write(_BY_ID["heads-not-multiple-of-kv-heads"], tmp_path)
    assert main(["check", str(target)]) == 1
    assert capsys.readouterr().err.splitlines()[3] == "  heads = 4 must be a multiple of kv_heads = 3"


def test_the_caret_stands_under_its_token_after_wide_characters(tmp_path, capsys):
    """Columns count characters, as Python's do; the caret counts terminal columns, two for each
    CJK character, so that it stands under the name it marks."""
    path = tmp_path / "model.linnet"
    path.write_text(HEAD + 'entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n  x = "名前" + missing\n  return x\n}\n')
    assert main(["check", str(path)]) == 1
    first, source, caret = capsys.readouterr().err.splitlines()[:3]
    assert first.endswith("21:14: error: unknown name `missing`")
    assert source == '      x = "名前" + missing'
    wide = 2 * 2  # two CJK characters, two columns each
    assert caret == "    " + " " * (len('  x = "') + wide + len('" + ')) + "^" * len("missing")


def test_every_keyword_is_a_literal_of_the_grammar_and_no_rule_name_is_missing():
    """The parser's keyword set and its list of expression rules follow the grammar."""
    from linnet.frontend import parser

    grammar = parser._grammar()
    assert {"if", "then", "else", "for", "in", "return", "true", "false", "and", "or", "not", "as"} <= parser._KEYWORDS
    assert all(f'"{word}"' in grammar for word in parser._KEYWORDS)
    named = set(re.findall(r"->\s*([a-z_]+)", grammar))
    assert parser._EXPRESSIONS <= named | {"name"}


@pytest.mark.parametrize("command", ["check", "compile"])
def test_unreadable_files(command: str, tmp_path, capsys):
    """A missing file or one that is not UTF-8 text is an error message, not a traceback."""
    binary = tmp_path / "binary.linnet"
    binary.write_bytes(b"arch mini \xff\xfe\n")
    for path, message in ((tmp_path / "missing.linnet", "cannot read"), (binary, "is not UTF-8 text")):
        assert main([command, str(path)]) == 1
        err = capsys.readouterr().err
        assert message in err and str(path) in err
        assert "Traceback" not in err


@pytest.mark.parametrize("before, after", [(3000, 20), (2, 3000), (3000, 3000), (100, 0), (0, 0)])
def test_a_long_line_is_quoted_around_the_place(before, after):
    """A line of thousands of characters is quoted in part (`...` where it is cut), and the caret
    still stands under the character the column names, as the source text has it."""
    line = "  x = [" + ", ".join(["tokens"] * before + ["tokenz"] + ["tokens"] * after) + "]"  # (a list is flat)
    source = "arch mini\nentry decode(tokens: i32[Batch]) -> i32[Batch] {\n" + line + "\n  return x\n}\n"
    with pytest.raises(LinnetError) as err:
        load_source(source, "model.linnet")
    col = line.index("tokenz") + 1
    assert err.value.loc.line == 3 and err.value.loc.col == col
    first, quoted, carets = err.value.render().splitlines()[:3]
    assert first.startswith(f"model.linnet:3:{col}: error: unknown name `tokenz`")
    assert len(quoted) <= 4 + 3 + 160 + 3 and quoted.startswith("    ")
    at = carets.index("^")
    assert quoted[at:at + 6] == "tokenz" and carets[at:].strip() == "^" * 6
    assert quoted.startswith("    ...") == (col - 1 > 40) and quoted.endswith("...") == (len(line) > 160 + max(0, col - 41))


@pytest.mark.parametrize("command", ["check", "compile"])
def test_a_file_far_larger_than_a_model_is_refused_unread(command: str, tmp_path, capsys):
    """A checkpoint named by mistake (here a sparse file of zeros; a .gguf or a folder is read as the
    checkpoint it is) is refused after 16 MiB, not read whole; a device that never ends (/dev/zero) too."""
    big = tmp_path / "model.bin"
    with open(big, "wb") as f:
        f.truncate(2 ** 34)  # 16 GiB that take no room on disk
    for path in (big, Path("/dev/zero")):
        if not path.exists():
            continue
        assert main([command, str(path)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"{path}: error: {path} is larger than 16 MiB"), err


def test_line_ends_are_read_as_text_mode_reads_them(tmp_path):
    # Python's text mode (newline=None) is the reference: \r\n and a lone \r each end a line
    path = tmp_path / "model.linnet"
    path.write_bytes(b"arch mini\r\nconfig {\r  dim: int = 8 +\n}\r\n")
    with pytest.raises(LinnetError) as err:
        load_file(path)
    assert (err.value.loc.line, err.value.loc.col) == (4, 1)
    assert path.read_text().splitlines()[3] == "}"


@pytest.mark.parametrize("command", ["check", "compile", "ir"])
def test_a_card_is_named_as_generate_and_serve_name_it(command: str, tmp_path, capsys, monkeypatch):
    """`linnet compile tiny-llama` reads the registry's card; a file of that name here comes first; a
    misspelt name is an error that gives the names near it."""
    from linnet.nest.registry import card

    assert main([command, str(card("tiny-llama").path)]) == 0
    by_path = capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert main([command, "tiny-llama"]) == 0
    assert capsys.readouterr().out.replace("tiny-llama:", "") == by_path.replace(str(card("tiny-llama").path) + ":", "")
    (tmp_path / "tiny-llama").write_text("arch broken {\n")
    assert main([command, "tiny-llama"]) == 1
    assert "tiny-llama:1:" in capsys.readouterr().err
    assert main([command, "tiny-lama"]) == 1
    err = capsys.readouterr().err
    assert "unknown card 'tiny-lama'" in err and "did you mean tiny-llama" in err and "Traceback" not in err


def test_a_mistyped_import_is_given_the_architectures_near_it(tmp_path, capsys):
    """`import mimi` beside mini.linnet (and `import lama` among the built-in ones): the places looked,
    then the names that were meant."""
    for name, meant in (("mimi", "'mini'"), ("lama", "'llama'")):
        target, _ = _write(card("typo", CARD.replace("import mini", f"import {name}"), 2, 1, "", arch_source=MINI),
                           tmp_path)
        assert main(["check", str(target)]) == 1
        err = capsys.readouterr().err
        assert f"cannot find architecture `{name}`" in err and err.rstrip().endswith(f"did you mean {meant}?"), err


def test_the_places_an_import_was_looked_for_are_absolute(tmp_path, capsys, monkeypatch):
    """A card named by a relative path: each place looked is a whole path (beside the card, its arch/
    folder, the built-in ones), not one relative to a folder the message does not name."""
    target, _ = _write(card("typo", CARD.replace("import mini", "import mimi"), 2, 1, "", arch_source=MINI), tmp_path)
    monkeypatch.chdir(target.parent)
    assert main(["check", target.name]) == 1
    looked = [line.strip()[len("looked in "):] for line in capsys.readouterr().err.splitlines()
              if line.strip().startswith("looked in ")]
    builtin = Path(linnet.__file__).parent / "nest" / "cards" / "arch" / "mimi.linnet"
    assert looked == [str(target.parent / "mimi.linnet"), str(target.parent / "arch" / "mimi.linnet"), str(builtin)]


@pytest.mark.parametrize("typo, note", [("retrun", "did you mean `return` for `retrun`?"), ("foo", None)])
def test_a_misspelt_keyword_is_named_where_the_parse_fails(tmp_path, capsys, typo, note):
    """`retrun x` reads as a name, then fails at `x`: the error there, and the keyword meant; a name
    near no keyword gets no guess."""
    source = MINI.replace("  return attention", f"  {typo} attention")
    target, _ = _write(arch("typo", source, 0, 0, ""), tmp_path)
    assert main(["check", str(target)]) == 1
    err = capsys.readouterr().err
    assert "unexpected 'attention'" in err and (note in err if note else "did you mean" not in err), err


def test_a_keywords_longer_form_is_not_taken_for_a_typo(tmp_path, capsys):
    source = MINI.replace("  return attention", "  states attention")
    target, _ = _write(arch("plural", source, 0, 0, ""), tmp_path)
    assert main(["check", str(target)]) == 1
    err = capsys.readouterr().err
    assert "unexpected 'attention'" in err and "did you mean" not in err, err


def test_a_byte_order_mark_is_skipped(tmp_path, capsys):
    """Some editors start a UTF-8 file with U+FEFF: it is no character of the text, so line 1's
    columns count from what follows it, and the quoted line leaves it out."""
    path = tmp_path / "model.linnet"
    path.write_text("\ufeff" + HEAD + "entry decode(tokens: i32[Batch]) -> T[Batch, dim] {\n  return embed[tokens]\n}\n")
    assert main(["check", str(path)]) == 0, capsys.readouterr().err
    path.write_text("\ufeffarch mini 3\n")
    assert main(["check", str(path)]) == 1
    first, source, caret = capsys.readouterr().err.splitlines()[:3]
    assert first == f"{path}:1:11: error: unexpected '3'"
    assert source == "    arch mini 3" and caret == "    " + " " * 10 + "^"


def test_meta_items_linnet_does_not_read_are_notes(tmp_path):
    # a misspelling of an item Linnet reads is an error (the case table); other names are the card's notes
    (tmp_path / "mini.linnet").write_text(MINI)
    notes = 'meta {\n  license = "apache-2.0"\n  hf_revision = "main"\n  max_context = 64\n}\n'
    (tmp_path / "card.linnet").write_text(CARD + notes)
    module = load_file(tmp_path / "card.linnet")
    assert module.meta == {"license": "apache-2.0", "hf_revision": "main", "max_context": 64}


def test_a_ranged_loop_must_be_named_by_its_pattern(tmp_path, capsys):
    """A param loop that starts past 0 (`for l in a:b`) names its stored tensors from a: a pattern
    that leaves its variable out (one tensor holding them all) is an error at the pattern."""
    err = _check_changed(tmp_path, capsys, "arch/deepseek_v2.linnet", '''      expert_down: T[dim, moe_ffn]
        from hf "model.layers.{l}.mlp.experts.{e}.down_proj.weight"''', '''      expert_down: T[dim, moe_ffn]
        from hf "model.mlp.experts.down_proj.weight"''')
    assert "error: a param stacked over `l` needs `{l}` in its name pattern" in err, err
    err = _check_changed(tmp_path, capsys, "arch/deepseek_v2.linnet", '''
      from hf "model.layers.{l}.mlp.gate.weight"
      from gguf "blk.{l}.ffn_gate_inp.weight"''', '''
      from hf "model.layers.{l}.mlp.gate.weight"
      from gguf "blk.{l}.ffn_gate_inp.weight"
    for e in 1:experts {
      bad: T[dim]
        from hf "model.layers.{l}.mlp.gate.bias"
    }''')
    assert "the loop over `e` starts past 0 (`for e in a:b`), so the name pattern must name `{e}`" in err, err
    assert 'from hf "model.layers.{l}.mlp.gate.bias"' in err and "deepseek_v2.linnet:" in err.splitlines()[0]


def test_a_rope_attention_factor_below_its_floor_is_named(tmp_path, capsys):
    """rope's `attention_factor` scales cos and sin: one at 0 or below is an error at the rope, with the
    card's value (checked with numbers: the card beside the changed architecture, which it imports)."""
    cards = Path(__file__).parents[2] / "linnet/nest/cards"
    arch = (cards / "arch/deepseek_v2.linnet").read_text()
    (tmp_path / "deepseek_v2.linnet").write_text(arch.replace("attention_factor=rope_attention_factor()",
                                                              "attention_factor=rope_mscale"))
    card = tmp_path / "tiny-deepseek-v2.linnet"
    card.write_text((cards / "tiny-deepseek-v2.linnet").read_text().replace("rope_mscale = 0.707", "rope_mscale = 0"))
    assert main(["check", str(card)]) == 1
    err = capsys.readouterr().err
    assert "error: attention_factor of `rope` must be greater than 0" in err and "`rope_mscale` is 0.0" in err, err
    err = _check_changed(tmp_path, capsys, "arch/deepseek_v2.linnet", "attention_factor=rope_attention_factor()",
                         "attention_factor=positions")
    assert "error: attention_factor must be a static float, not i32[n]" in err, err


def test_split_heads_comes_first(tmp_path, capsys):
    """`.split_heads` reads the stored tensor's rows (its export puts them back there), so it is the
    first transform of its source."""
    err = _check_changed(tmp_path, capsys, "arch/deepseek_v2.linnet",
                         ".split_heads(heads, qk_nope_head_dim + v_head_dim, 0, qk_nope_head_dim) .transpose(1, 2)",
                         ".transpose() .split_heads(heads, qk_nope_head_dim + v_head_dim, 0, qk_nope_head_dim)")
    assert "error: `.split_heads` reads the stored tensor's rows: it comes first, before `.transpose`" in err, err
