"""`arch NAME extends BASE`: an architecture written as changes to another.

The derived file's declarations go over the base's by name: a config value, meta item, param,
state buffer, fn or entry it declares again replaces the base's in place (its type, sources and
body too: Qwen3-MoE's `w_gate`, stacked over experts, replaces Qwen3's dense one), and one the base
lacks is added after the base's. Nothing is removed, so a base written with its variable parts as
fns (`fn mlp`) lets a derived architecture change one part. Each declaration keeps the location
of the file it came from, so errors point into the file that wrote it.
"""

from __future__ import annotations

from linnet.frontend import ast

# the File fields that hold named declarations
_SECTIONS = ("config", "meta", "params", "state", "fns", "entries")


def extend(base: ast.File, derived: ast.File) -> ast.File:
    """`derived` over `base` (itself already extended), as one architecture named as `derived`."""
    merged = ast.File(derived.path, derived.source, arch=derived.arch,
                      bases={**base.bases, base.path: base.source})
    for section in _SECTIONS:
        setattr(merged, section, _over(getattr(base, section), getattr(derived, section)))
    return merged


def _over(base: list, derived: list) -> list:
    out = list(base)
    at = {item.name: i for i, item in enumerate(out)}
    mine = set()
    for item in derived:
        if item.name in at and item.name not in mine:
            out[at[item.name]] = item
        else:  # (one the derived file declares twice stays twice: the checker says so, as without `extends`)
            at[item.name] = len(out)
            out.append(item)
        mine.add(item.name)
    return out
