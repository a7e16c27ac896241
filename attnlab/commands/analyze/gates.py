"""`attnlab analyze gates RUN`: gate values per layer and dimension (the paper's Figure 3)."""

from __future__ import annotations

import argparse

from attnlab.commands.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gates", help="boosting gate per layer and dimension (Figure 3)")
    add_common_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import gates
    from attnlab.analysis.inputs import load_inputs

    out = out_dir(args)
    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    means, csv_path, png = gates.analyze(inputs, out)
    for layer in range(means.shape[0]):
        print(
            f"layer {layer}: gate mean {means[layer].mean():.4f}  std over dims {means[layer].std():.4f}"
        )
    print(f"over {inputs.x.size(0)} sequences; wrote {csv_path} and {png}")
    return 0
