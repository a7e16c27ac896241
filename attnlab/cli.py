"""`attnlab <command>`: every module in attnlab/commands/ registers one sub-command.

A command module defines ``register(subparsers)`` which adds its parser and sets ``func``.
Heavy imports (torch, matplotlib, onnx) belong inside the command's function, so
`attnlab --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from attnlab.errors import AttnlabError


def register_all(subparsers: argparse._SubParsersAction, package: ModuleType) -> None:
    """Import every module of ``package`` (skipping private ones) and call its ``register``."""
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}").register(subparsers)


def build_parser() -> argparse.ArgumentParser:
    from attnlab import commands

    parser = argparse.ArgumentParser(prog="attnlab", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_all(sub, commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AttnlabError as e:  # anything else is a bug: let its traceback show
        if args.debug:
            raise
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
