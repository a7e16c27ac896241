"""`attnlab verify FOLDER`: check a data, run or model folder in full, in one line."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "verify",
        help="check a data, run or model folder in full (every file's sha256, every token id)",
        description="Check FOLDER against its manifest, every file hashed, and what loading "
        "skips: every token id of a data folder against its tokenizer, a model's weights in "
        "its model, a run's checkpoints against its config.json. Prints one line; exit 2 "
        "names what is wrong.",
    )
    p.add_argument("folder", type=path_arg, metavar="FOLDER", help="a data, run or model folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.train.verify import verify

    print(verify(args.folder))
    return 0
