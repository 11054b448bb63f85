"""Reading a `.linnet` file: an architecture alone, or a card with the architecture it imports;
an architecture that extends another with that one under it."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from linnet.errors import LinnetError, Loc
from linnet.frontend.check import check
from linnet.frontend.extend import extend
from linnet.frontend.parser import parse
from linnet.frontend.scope import suggest
from linnet.ir.nodes import Module


def arch_dirs(near: Path | None) -> list[Path]:
    """Where `import NAME` looks, in order: beside the card, its arch/ folder, then the built-in architectures."""
    dirs = []
    if near is not None:
        dirs += [near, near / "arch"]
    dirs.append(Path(str(resources.files("linnet").joinpath("nest/cards/arch"))))
    return dirs


def load_file(path: str | Path) -> Module:
    path = Path(path)
    return load_source(_read(path), str(path), near=path.parent)


# A .linnet file is some kilobytes of text: past this it is something else (a checkpoint named by
# mistake, a device such as /dev/zero), refused before it is read whole into memory.
MAX_SOURCE_BYTES = 16 * 2 ** 20


def _read(path: Path, loc: Loc | None = None) -> str:
    """The text of `path`; an error at `loc` (an import that names it), else at the file itself."""
    where = loc or Loc(str(path), 0, 0, 0, 0)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
        if len(data) > MAX_SOURCE_BYTES:
            raise LinnetError(where, f"{path} is larger than {MAX_SOURCE_BYTES // 2 ** 20} MiB: not a .linnet "
                                     f"file, which is text of some kilobytes")
        # line ends as text mode reads them (`Path.read_text`): \r\n and a lone \r are each a \n
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except OSError as err:
        raise LinnetError(where, f"cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        data = err.object
        line = data.count(b"\n", 0, err.start) + 1
        line_start = data.rfind(b"\n", 0, err.start) + 1
        col = len(data[line_start:err.start].decode("utf-8")) + 1  # in characters, as every other column
        at = loc or Loc(str(path), line, col, line, col + 1)
        raise LinnetError(at, f"{path} is not UTF-8 text: byte {data[err.start]:#04x} at line {line}, "
                              f"column {col} (offset {err.start})") from None


def load_source(text: str, path: str = "<string>", near: Path | None = None) -> Module:
    f = parse(text, path)
    if f.card is None:
        if f.imports:
            raise LinnetError(f.imports[0].loc, "only a card imports an architecture; start the file with `card \"name\"`")
        return check(_with_bases(f, near))
    if f.arch is not None:
        raise LinnetError(f.arch.loc, "a card fills an architecture's config; it does not declare one itself")
    for items, what in ((f.params, "params"), (f.state, "state"), (f.fns, "functions"), (f.entries, "entries")):
        if items:
            raise LinnetError(items[0].loc, f"a card cannot declare {what}; they belong in the architecture")
    if len(f.imports) != 1:
        loc = f.imports[1].loc if f.imports else f.card.loc
        raise LinnetError(loc, "a card imports exactly one architecture: `import llama`")
    imp = f.imports[0]
    return check(_with_bases(_find_arch(imp.name, imp.loc, near), near), f)


def _find_arch(name: str, loc: Loc, near: Path | None):
    """The parsed file of architecture `name`, looked for where `import` looks (`arch_dirs`)."""
    looked = []
    for d in arch_dirs(near):
        candidate = d / f"{name}.linnet"
        looked.append(os.path.abspath(candidate))  # (a relative one is relative to a folder the user may not know)
        if _is_file(candidate):
            arch = parse(_read(candidate, loc), str(candidate))
            if arch.arch is None or arch.arch.name != name:
                found = (f"it declares `arch {arch.arch.name}`" if arch.arch is not None else
                         f"it is the card \"{arch.card.name}\": a card imports an architecture, not another card"
                         if arch.card is not None else f"it declares no architecture: one starts with `arch {name}`")
                raise LinnetError(loc, f"{candidate} does not declare `arch {name}`", [found])
            return arch
    there = sorted({p.stem for d in arch_dirs(near) if d.is_dir() for p in d.glob("*.linnet")})
    raise LinnetError(loc, f"cannot find architecture `{name}`",
                      [f"looked in {p}" for p in looked] + suggest(name, there))


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; a name the system cannot look up (longer than a file name may be) is none."""
    try:
        return path.is_file()
    except OSError:  # ENAMETOOLONG, which is_file does not take for "no such file"
        return False


def _with_bases(arch, near: Path | None, seen: tuple = ()):
    """An architecture file with what it extends merged under it, base by base (`extend`). A base is
    looked for as an import is, from the extending file's folder."""
    if arch.arch is None or arch.arch.base is None:
        return arch
    decl = arch.arch
    if decl.base in seen + (decl.name,):
        chain = " extends ".join(seen + (decl.name, decl.base))
        raise LinnetError(decl.base_loc, f"architectures extend each other in a circle: {chain}")
    here = Path(arch.path).parent if arch.path != "<string>" else near
    base = _find_arch(decl.base, decl.base_loc, here)
    return extend(_with_bases(base, here, seen + (decl.name,)), arch)
