"""`attnlab analyze hull RUN`: distance of the boosted output to the round-0 value hull (Figure 4)."""

from __future__ import annotations

import argparse

from attnlab.commands.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "hull", help="distance of boosted outputs to the round-0 value hull (Figure 4)"
    )
    add_common_args(p, sequences=5)
    p.add_argument(
        "--positions",
        type=int,
        default=30,
        help="positions per sequence, evenly spaced (default 30)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import hull
    from attnlab.analysis.inputs import load_inputs

    out = out_dir(args, hull.FILES)
    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    rows, csv_path, png = hull.analyze(inputs, out, args.positions, progress=True)
    for layer, mean in hull.layer_means(rows).items():
        print(f"layer {layer}: mean distance {mean:.4g}")
    positive = sum(r["distance"] > hull.INSIDE_TOL for r in rows)
    print(
        f"{positive} of {len(rows)} outputs outside the hull (distance > {hull.INSIDE_TOL:g}); wrote {csv_path} and {png}"
    )
    return 0
