"""`attnlab analyze <name> ...`: analyses of trained runs (one module each in attnlab/analyze/)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from attnlab import analyze
    from attnlab.cli import register_all

    parser = subparsers.add_parser("analyze", help="analyses of trained runs")
    register_all(parser.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS"), analyze)
