"""`arch NAME extends BASE [without A, B, ...]`: an architecture written as changes to another.

The derived file's declarations go over the base's by name: a config value, meta item, param,
state buffer, fn or entry it declares again replaces the base's in place (its type, sources and
body too: Qwen3-MoE's `w_gate`, stacked over experts, replaces Qwen3's dense one), and one the base
lacks is added after the base's. The names after `without` are the base's declarations the derived
architecture leaves out (Phi-3's checkpoints fuse Llama's q/k/v and gate/up projections, so its
file leaves Llama's separate ones out and declares the fused ones). Each declaration keeps the
location of the file it came from, so errors point into the file that wrote it.
"""

from __future__ import annotations

from linnet.errors import LinnetError, Loc
from linnet.frontend import ast
from linnet.frontend.scope import suggest

# the File fields that hold named declarations
_SECTIONS = ("config", "meta", "params", "state", "fns", "entries")
# those a `without` may name: the module's one namespace (a meta item is the card's to set)
_LEAVABLE = ("config", "params", "state", "fns", "entries")
_KIND = {"config": "config value", "params": "param", "state": "state buffer", "fns": "fn", "entries": "entry"}


def extend(base: ast.File, derived: ast.File) -> ast.File:
    """`derived` over `base` (itself already extended), as one architecture named as `derived`."""
    left_out = _left_out(base, derived)
    merged = ast.File(derived.path, derived.source, arch=derived.arch,
                      bases={**base.bases, base.path: base.source},
                      left_out={**base.left_out, **{name: loc for name, (loc, _) in left_out.items()}},
                      replaced={name: dict(by_path) for name, by_path in base.replaced.items()},
                      replaced_values=dict(base.replaced_values))
    for section in ("params", "state"):
        redeclared = {item.name for item in getattr(derived, section)}
        for item in getattr(base, section):
            if item.name in redeclared:
                merged.replaced_values.setdefault(item.name, item)
    again = {f.name for f in derived.fns}
    for f in base.fns:  # kept so that a call the base wrote is checked against the fn it was written for
        if f.name in again:
            merged.replaced.setdefault(f.name, {})[f.loc.path] = f
    for section in _SECTIONS:
        kept = [item for item in getattr(base, section) if item.name not in left_out or section == "meta"]
        setattr(merged, section, _over(kept, getattr(derived, section)))
    for name, (loc, section) in left_out.items():
        _refuse_uses(merged, name, loc, base.arch.name, section)
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


def _left_out(base: ast.File, derived: ast.File) -> dict:
    """{name: (its Loc in `without`, its section)}: each a declaration of the base that the derived
    file does not declare again (declaring it again is how a declaration is replaced)."""
    declared = {item.name: section for section in _LEAVABLE for item in getattr(base, section)}
    again = {item.name: item.loc for section in _LEAVABLE for item in getattr(derived, section)}
    out: dict = {}
    for name, loc in derived.arch.without:
        if name in out:
            raise LinnetError(loc, f"`{name}` is left out twice", [f"first at {out[name][0]}"])
        if name not in declared:
            raise LinnetError(loc, f"`{base.arch.name}` declares no `{name}` to leave out",
                              suggest(name, declared) or [f"`without` names config values, params, state, fns "
                                                          f"and entries of `{base.arch.name}` ({base.path})"])
        if name in again:
            raise LinnetError(loc, f"`{name}` is left out, but declared again at {again[name]}",
                              [f"declaring a {_KIND[declared[name]]} again replaces `{base.arch.name}`'s: "
                               f"drop `{name}` from `without`"])
        out[name] = (loc, declared[name])
    return out


def _refuse_uses(merged: ast.File, name: str, loc: Loc, base: str, section: str):
    """An error at `without`'s `name` where a declaration that stays still reads it."""
    users = list(_uses(merged, name, state=section == "state"))
    if not users:
        return
    notes = [f"used at {at}, in {what}" for what, at in users[:4]]
    notes += [f"and {len(users) - 4} more"] if len(users) > 4 else []
    whose = list(dict.fromkeys(what for what, _ in users))
    notes.append(f"declare {' and '.join(whose) if len(whose) <= 3 else 'those'} again without `{name}`, "
                 f"or leave {'it' if len(whose) == 1 else 'them'} out too")
    raise LinnetError(loc, f"`{name}` is left out of `{base}`, but is still used", notes)


def _uses(f: ast.File, name: str, state: bool):
    """(the declaration, Loc) of every reading of module-level `name` in `f`'s declarations: in
    config defaults, types and dims, weight transforms, ties, fn and entry bodies (a call, a
    store; for state, a whole-buffer assignment too). A fn's own local of that name (an argument,
    or a local bound before it is read) is not a reading."""
    for c in f.config:
        if isinstance(c, ast.ConfigDecl):
            yield from ((f"the default of config `{c.name}`", at) for at in _names(c.default, name))
            yield from ((f"the type of config `{c.name}`", at) for at in _names(c.lengths, name))
    for p in f.params:
        parts = [p.type, [count for _, count, _ in p.loops], [s.transforms for s in p.sources]]
        if p.tie is not None:
            if p.tie[0] == name:
                yield f"param `{p.name}`", p.tie[1]
            parts.append(p.tie[2])
        yield from ((f"param `{p.name}`", at) for at in _names(parts, name))
    for s in f.state:
        yield from ((f"state `{s.name}`", at) for at in _names(s.type, name))
    for fn in f.fns + f.entries:
        what = f"{fn.kind} `{fn.name}`"
        yield from ((what, at) for at in _names([[a.type for a in fn.args], fn.ret], name))
        if name not in {a.name for a in fn.args}:
            yield from ((what, at) for at in _body_reads(fn.body, name, state) if at is not None)


def _body_reads(body: list, name: str, state: bool):
    """Where statements read `name` before binding a local of it (in source order; a state
    buffer's whole-buffer assignment is a write to it, not a local); None once a local is bound."""
    for s in body:
        if isinstance(s, ast.For):
            yield from _names(s.count, name)
            if s.var == name:
                return
            for at in _body_reads(s.body, name, state):
                yield at
                if at is None:
                    return
            continue
        value = s.value if isinstance(s, (ast.Assign, ast.Store, ast.Return)) else s
        yield from _names([getattr(s, "indices", []), value], name)
        if isinstance(s, ast.Store) and s.target == name:
            yield s.target_loc
        if isinstance(s, ast.Assign) and any(t == name for t, _ in s.targets):
            if state and len(s.targets) == 1:
                yield s.targets[0][1]
            else:
                yield None  # a local of the name from here on
                return


def _names(nodes, name: str):
    """The Locs where `nodes` (expressions, types) read `name`: as a value, a dim or a called fn."""
    for n in _walk(nodes):
        if isinstance(n, ast.Name) and n.id == name:
            yield n.loc
        elif isinstance(n, ast.Call) and n.func == name:
            yield n.func_loc


def _walk(nodes):
    stack = [nodes]
    while stack:
        n = stack.pop()
        if isinstance(n, (list, tuple)):
            stack.extend(reversed(n))
        elif isinstance(n, ast.Node):
            yield n
            stack.extend(reversed([v for v in vars(n).values() if isinstance(v, (ast.Node, list, tuple))]))
