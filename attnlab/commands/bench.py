"""`attnlab bench <name> ...`: side-by-side benchmarks (one module each in attnlab/bench/)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from attnlab import bench
    from attnlab.cli import register_all

    parser = subparsers.add_parser(
        "bench", help="benchmarks that print ratios measured side by side"
    )
    register_all(parser.add_subparsers(dest="benchmark", required=True, metavar="BENCH"), bench)
