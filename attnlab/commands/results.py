"""`attnlab results`: the Results table (results/README.md) from the published studies."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "results",
        help="write the Results table from the published studies and results/claims.toml",
        description="Write ROOT/README.md: each seed claim in ROOT/claims.toml beside the "
        "numbers of its study under ROOT, with the verdict the rule in docs/verdicts.md gives. "
        "No training: it reads the studies' published data.",
    )
    p.add_argument("--root", type=path_arg, default="results", help="the published studies")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 2 when ROOT/README.md differs from what would be written",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnlab.studies.results_table import check, write

    root = Path(args.root)
    if args.check:
        check(root)
        print(f"{root / 'README.md'} is up to date")
    else:
        print(f"wrote {write(root)}")
    return 0
