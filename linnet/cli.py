"""The `linnet` command: compile | check | ir (and, as they land, generate | serve | export | cards)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linnet.errors import LinnetError


def _generics(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"linnet: error: --generic takes NAME=VALUE, not {pair!r}")
        k, v = pair.split("=", 1)
        out[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else v.strip()
    return out


def cmd_check(args) -> int:
    from linnet.compiler import check_file

    module = check_file(args.file)
    complete = all(name in module.config_values or c.default is not None for name, c in module.config.items())
    if args.generic or module.card is not None or complete:
        # What only numbers can tell (a missing config value, an inexact division) is checked
        # whenever the config is known: for a card, or an architecture whose every value has a default.
        from linnet.ir.specialize import specialize

        specialize(module, _generics(args.generic), args.numerics)
    print(f"{args.file}: ok ({len(module.params)} params, {len(module.entries)} entries)")
    return 0


def cmd_ir(args) -> int:
    from linnet.compiler import check_file
    from linnet.ir.printer import print_module

    sys.stdout.write(print_module(check_file(args.file)))
    return 0


def cmd_compile(args) -> int:
    from linnet.compiler import compile_file

    source = compile_file(args.file, args.backend, _generics(args.generic), args.numerics)
    if args.output:
        Path(args.output).write_text(source)
    else:
        sys.stdout.write(source)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="linnet", description="Compile and serve language models written in Linnet.")
    sub = p.add_subparsers(dest="command", required=True)

    def source_cmd(name, help_text):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("file", help="a .linnet card or architecture")
        s.add_argument("--generic", action="append", metavar="NAME=VALUE",
                       help="bind a generic: Batch=8, MaxSeq=256, T=bf16 (repeatable)")
        s.add_argument("--numerics", choices=["exact", "fast"], default="exact")
        return s

    c = source_cmd("compile", "write the Python source of a model for one backend")
    c.add_argument("--backend", choices=["torch", "jax"], default="torch")
    c.add_argument("-o", "--output", help="write here instead of standard output")
    c.set_defaults(run=cmd_compile)
    source_cmd("check", "parse and check a model, print nothing else").set_defaults(run=cmd_check)
    source_cmd("ir", "print the checked IR").set_defaults(run=cmd_ir)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except LinnetError as err:
        print(err.render(), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
