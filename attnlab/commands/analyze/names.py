"""`attnlab analyze names RUN [RUN_B]`: do generated speaker names belong to the real cast?

The test itself is attnlab.analysis.names.name_test; this prints its report.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from attnlab.commands._common import path_arg
from attnlab.commands.analyze import out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("names", help="speaker names in generated text vs the training cast")
    p.add_argument("run", type=path_arg, metavar="RUN")
    p.add_argument(
        "run_b",
        type=path_arg,
        metavar="RUN_B",
        nargs="?",
        help="a second run, reported side by side",
    )
    p.add_argument("--samples", type=int, default=30, help="samples per run (default 30)")
    p.add_argument("--length", type=int, default=2000, help="tokens per sample (default 2000)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument(
        "--data",
        type=path_arg,
        help="prepared data folder for the cast (default: the run's own data)",
    )
    p.add_argument(
        "--exact-window",
        action="store_true",
        help="recompute the full sliding window every step (nanoGPT's sampling, slow)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--out",
        type=path_arg,
        help="folder for names.csv, names_top.csv and names.png (default: RUN/analysis; needed "
        "when RUN is a model folder)",
    )
    p.set_defaults(func=run)


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_report(report: dict[str, Any], labels: list[str]) -> None:
    """The report as a table, one column per run (``labels``: the runs' names, in order)."""
    runs = report["runs"]
    print(
        f"name test: {report['samples']} samples x {report['length']} tokens, temperature "
        f"{report['temperature']}, seed {report['seed']}; cast of {report['cast_size']} speakers "
        f"({report['style']} headers) from {report['cast_source']}"
    )
    rows = [
        ("headers found", "headers"),
        ("canonical headers", "canonical_headers"),
        ("fraction canonical", "fraction_canonical"),
        ("distinct names", "distinct_names"),
        ("distinct canonical", "distinct_canonical"),
    ]
    width = max(12, *map(len, labels))
    print(" " * 20 + "".join(f"{label:>{width + 2}}" for label in labels))
    for label, key in rows:
        cells = [
            _percent(s[key]) if key == "fraction_canonical" else str(s[key]) for s in runs.values()
        ]
        print(f"{label:<20}" + "".join(f"{c:>{width + 2}}" for c in cells))
    for run, score in zip(labels, runs.values(), strict=True):
        print(
            f"\n{run}: most common {', '.join(f'{n} ({c})' for n, c in score['most_common']) or '-'}"
        )
        print(f"{run}: invented {', '.join(f'{n} ({c})' for n, c in score['invented']) or '-'}")


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis.names import FILES, name_test, run_labels, write_report
    from attnlab.device import resolve_device

    runs = [args.run] + ([args.run_b] if args.run_b else [])
    out = out_dir(args, FILES)
    report = name_test(
        runs,
        args.samples,
        args.length,
        args.seed,
        args.temperature,
        args.top_k,
        args.data,
        args.exact_window,
        str(resolve_device(args.device)),
    )
    written = write_report(report, out)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report, run_labels(report["runs"]))
        print(f"\nwrote {', '.join(map(str, written))}")
    return 0
