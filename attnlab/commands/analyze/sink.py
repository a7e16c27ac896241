"""`attnlab analyze sink RUN`: attention mass on the first token per layer and head."""

from __future__ import annotations

import argparse

from attnlab.commands.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sink", help="attention mass on the first token per layer and head (attention sink)"
    )
    add_common_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import sink
    from attnlab.analysis.inputs import load_inputs

    out = out_dir(args, sink.FILES)
    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    mass, paths = sink.analyze(inputs, out)
    for layer, heads in enumerate(mass):
        print(f"layer {layer}: mean {heads.mean():.4f}  heads {heads.min():.4f}-{heads.max():.4f}")
    block = inputs.x.size(1)
    print(
        f"over {inputs.x.size(0)} sequences of {block} tokens (uniform attention: "
        f"{sink.uniform_mass(block):.4f}); wrote {', '.join(map(str, paths))}"
    )
    return 0
