"""`attnlab bench <name> ...`: side-by-side benchmarks (one module each in attnlab/bench/)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def register(subparsers: argparse._SubParsersAction) -> None:
    from attnlab import bench
    from attnlab.cli import register_all

    parser = subparsers.add_parser(
        "bench", help="benchmarks that print ratios measured side by side"
    )
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCH")
    register_all(benchmarks, bench)
    for benchmark in benchmarks.choices.values():
        benchmark.set_defaults(func=checking_device(benchmark.get_default("func")))


def checking_device(func: Callable[[argparse.Namespace], int]) -> Callable:
    """``func`` with its --device checked first (one line naming the valid choices)."""

    def run(args: argparse.Namespace) -> int:
        from attnlab.device import resolve_device

        if getattr(args, "device", None) is not None:
            args.device = str(resolve_device(args.device))
        return func(args)

    return run
