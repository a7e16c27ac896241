"""`attnlab presets`: list the named presets."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("presets", help="list the named presets")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.presets import PRESETS

    width = max(map(len, PRESETS))
    for name, preset in PRESETS.items():
        print(f"{name:<{width}}  {preset.description}")
    return 0
