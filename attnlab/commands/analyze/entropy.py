"""`attnlab analyze entropy RUN [--baseline RUN]`: attention entropy per round and layer (Figure 5)."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg
from attnlab.commands.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("entropy", help="attention entropy per round and layer (Figure 5)")
    add_common_args(p)
    p.add_argument(
        "--baseline",
        type=path_arg,
        metavar="RUN",
        help="a standard model to compare with (same data)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import entropy
    from attnlab.analysis.inputs import load_baseline, load_inputs

    out = out_dir(args, entropy.FILES)
    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    baseline = load_baseline(args.baseline, inputs.model, args.device) if args.baseline else None
    rows, csv_path, png = entropy.analyze(inputs, out, baseline, str(args.baseline))
    for row in rows:
        if row["layer"] == "all":
            print(f"{row['source']:>8}: mean entropy {row['mean']:.4f} nats")
    print(f"over {inputs.x.size(0)} sequences; wrote {csv_path} and {png}")
    return 0
