"""`attnlab analyze per-position RUN_A RUN_B`: where on the validation text does B beat A?

The comparison is attnlab.analysis.per_position; this prints its tables and writes its CSVs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "per-position", help="per-position validation loss of two runs, B vs A"
    )
    p.add_argument("run_a", type=path_arg, metavar="RUN_A")
    p.add_argument("run_b", type=path_arg, metavar="RUN_B")
    p.add_argument("--top", type=int, default=20, help="positions to list (default 20)")
    p.add_argument(
        "--data", type=path_arg, help="prepared data folder (default: the runs' own data)"
    )
    p.add_argument(
        "--out",
        type=path_arg,
        help="CSV of the top positions; the grouped tables and the PNG go next to it "
        "(default: RUN_B/analysis/per_position.csv; needed when RUN_B is a model folder)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=None, help="score only the first N validation tokens"
    )
    p.add_argument(
        "--context", type=int, default=12, help="characters of context shown (default 12)"
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=run)


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Numbers right-aligned, text left-aligned."""
    cells = [
        [f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows
    ]
    widths = [max([len(c)] + [len(row[j]) for row in cells]) for j, c in enumerate(columns)]
    text = [bool(rows) and isinstance(rows[0][c], str) for c in columns]
    for line in [columns, *cells]:
        print(
            "  ".join(
                v.ljust(w) if t else v.rjust(w) for v, w, t in zip(line, widths, text, strict=True)
            )
        )


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis.inputs import check_not_file, default_analysis_dir
    from attnlab.analysis.per_position import check_listing, check_out, compare, write_tables
    from attnlab.device import resolve_device

    for run in (args.run_a, args.run_b):
        check_not_file(run)

    check_listing(args.top, args.context)  # before the runs are scored
    out = (
        Path(args.out)
        if args.out
        else default_analysis_dir(args.run_b, "RUN_B") / "per_position.csv"
    )
    check_out(out)
    cmp = compare(
        args.run_a,
        args.run_b,
        args.data,
        args.max_tokens,
        args.batch_size,
        str(resolve_device(args.device)),
    )
    a, b = float(cmp.loss_a.mean()), float(cmp.loss_b.mean())
    print(
        f"A {args.run_a}: loss {a:.4f} | B {args.run_b}: loss {b:.4f} | B - A {b - a:+.4f} "
        f"over {len(cmp.loss_a)} validation tokens (block {cmp.block_size})"
    )
    top, groups, written = write_tables(cmp, out, args.top, args.context, (args.run_a, args.run_b))
    print(f"\ntop {args.top} positions where B beats A (context -> target):")
    shown = [{**row, "shown": f"{row['context']} -> {row['target']}"} for row in top]
    _print_table(shown, ["rank", "position", "shown", "loss_a", "loss_b", "a_minus_b"])
    for name, rows in groups.items():
        print(f"\nB - A {name.replace('_', ' ')}:")
        _print_table(rows, ["group", "count", "loss_a", "loss_b", "b_minus_a"])
    print(f"\nwrote {', '.join(map(str, written))}")
    return 0
