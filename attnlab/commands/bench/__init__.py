"""`attnlab bench <name> ...`: side-by-side benchmarks, one sub-command module each here.

The benchmarks themselves live in attnlab.bench; each module here registers its parser when the
CLI starts and imports its benchmark (and torch) only once it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from attnlab.commands._common import apply_threads, register_all
from attnlab.errors import AttnlabError
from attnlab.plotting import check_figure_out


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmarks that print ratios measured side by side"
    )
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCH")
    register_all(benchmarks, sys.modules[__name__])
    for benchmark in benchmarks.choices.values():
        benchmark.set_defaults(func=checking_device(benchmark.get_default("func")))


# the counts a benchmark takes, with their least sensible value (--batch 0 timed empty batches;
# --reps 0 was refused by the timer, after the progress lines)
LEAST = {"steps": 1, "batch": 1, "reps": 1, "warmup": 0}


def checking_device(func: Callable[[argparse.Namespace], int]) -> Callable:
    """``func`` with its --device checked first (one line naming the valid choices), its counts
    checked against LEAST and its --threads applied."""

    def run(args: argparse.Namespace) -> int:
        from attnlab.device import resolve_device

        if getattr(args, "device", None) is not None:
            args.device = str(resolve_device(args.device))
        for name, least in LEAST.items():
            value = getattr(args, name, None)  # None: not given, the benchmark's own size
            if value is not None and value < least:
                raise AttnlabError(f"--{name} must be at least {least}, got {value}")
        apply_threads(getattr(args, "threads", None))
        return func(args)

    return run


def add_timing_args(
    p: argparse.ArgumentParser, reps: int, reps_help: str, compile_help: str, quick_help: str
) -> None:
    """--reps, --warmup, --device, --compile, --quick and --threads: what every timed benchmark
    takes. --reps defaults to None; ``sizes`` resolves it (``reps`` without --quick)."""
    p.add_argument("--reps", type=int, help=f"{reps_help} (default {reps})")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--compile", action="store_true", help=compile_help)
    p.add_argument("--quick", action="store_true", help=quick_help)
    add_threads_arg(p)


def sizes(args: argparse.Namespace, full: dict, quick: dict) -> dict:
    """The sizes to run at, one per flag named in ``full`` (whose value is that flag's default):
    the flag's value where given (even with --quick), else ``quick``'s under --quick (a smoke
    test), else ``full``'s. Such flags default to None so that a given value can be told apart.
    """
    base = {**full, **quick} if args.quick else full
    return {
        name: base[name] if getattr(args, name) is None else getattr(args, name) for name in full
    }


def add_threads_arg(p: argparse.ArgumentParser, also: str = "") -> None:
    """--threads: CPU threads per op, applied by ``checking_device`` before the benchmark runs."""
    p.add_argument(
        "--threads",
        type=int,
        help=f"CPU threads per op{also} (default: torch's choice; the header says what was used)",
    )


def figure_path(out: str | None, name: str, quick: bool) -> str:
    """--out, else runs/bench/NAME.png; a --quick smoke test writes NAME-quick.png instead, so
    that it never replaces a measured figure. Call it before measuring: an --out that is not a
    .png path (matplotlib wrote a folder's figure beside it as FOLDER.png) is refused."""
    if out and (Path(out).suffix.lower() != ".png" or Path(out).is_dir()):
        raise AttnlabError(f"--out {out} must name a .png file to write")
    path = out or f"runs/bench/{name}{'-quick' if quick else ''}.png"
    check_figure_out(Path(path).expanduser())
    return path


def out_help(name: str) -> str:
    return f"PNG to write (default: runs/bench/{name}.png; with --quick {name}-quick.png)"
