"""The public compile path: source file -> checked IR -> specialized -> Python source -> module.

One function per stage, so that each can be used (and tested) on its own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from pathlib import Path

from linnet.frontend import load_file, load_source
from linnet.ir.nodes import Module
from linnet.ir.specialize import specialize
from linnet.ir.verify import verify

BACKENDS = ("torch", "jax")


def check_file(path: str | Path) -> Module:
    """Parses and checks a `.linnet` file (a card or an architecture); raises `LinnetError`."""
    module = load_file(path)
    verify(module)
    return module


def generate(module: Module, backend: str, generics: dict | None = None, numerics: str = "exact") -> str:
    """The Python source of `module` for `backend`, specialized to `generics`."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; one of {', '.join(BACKENDS)}")
    spec = specialize(module, generics, numerics)
    if backend == "torch":
        from linnet.codegen_torch.emit import generate as gen
    else:
        from linnet.codegen_jax.emit import generate as gen
    return gen(spec)


def compile_file(path: str | Path, backend: str, generics: dict | None = None, numerics: str = "exact") -> str:
    return generate(check_file(path), backend, generics, numerics)


def import_source(source: str, name: str | None = None) -> types.ModuleType:
    """Imports generated source as a module (named after its hash, so equal sources share it)."""
    name = name or "linnet_generated_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = f"<{name}>"
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def build(module_or_path, backend: str, generics: dict | None = None, numerics: str = "exact") -> types.ModuleType:
    """The imported generated module for a checked module, a file path, or source text."""
    if isinstance(module_or_path, Module):
        module = module_or_path
    elif isinstance(module_or_path, Path) or (isinstance(module_or_path, str) and module_or_path.endswith(".linnet")
                                               and "\n" not in module_or_path):
        module = check_file(module_or_path)
    else:
        module = load_source(module_or_path)
    return import_source(generate(module, backend, generics, numerics))
