"""`attnlab eval`: loss and perplexity of a run over a whole data split, as JSON."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="loss and perplexity over a whole split (JSON)")
    p.add_argument("model", metavar="RUN_OR_FOLDER")
    p.add_argument("--split", choices=("val", "train"), default="val")
    p.add_argument("--data", help="prepared data folder (default: the run's own data)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from attnlab import from_pretrained
    from attnlab.analysis.loss import split_loss
    from attnlab.data.prepare import load_dataset
    from attnlab.device import resolve_device
    from attnlab.rundir import run_data_dir

    model, _ = from_pretrained(args.model, device=resolve_device(args.device))
    data = load_dataset(args.data or run_data_dir(args.model))
    result = split_loss(model, getattr(data, args.split), args.batch_size)
    print(json.dumps({"split": args.split, **result}, indent=2))
    return 0
