"""`attnlab analyze gates RUN`: every gate's scores per layer and channel, sparsity, distribution."""

from __future__ import annotations

import argparse

from attnlab.commands.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gates", help="every gate's scores per layer and channel: mean, std, sparsity, figure"
    )
    add_common_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import gates
    from attnlab.analysis.inputs import load_inputs

    out = out_dir(args, gates.FILES)
    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    stats, paths = gates.analyze(inputs, out)
    for g in stats.values():
        for i, layer in enumerate(g.layers):
            print(
                f"{g.name} layer {layer}: mean {g.mean[i]:.4f}  std {g.std[i]:.4f}  "
                f"below {gates.SPARSE_BELOW}: {g.sparsity[i]:.3f}"
            )
    print(f"over {inputs.x.size(0)} sequences; wrote {', '.join(map(str, paths))}")
    return 0
