"""`attnlab eval`: loss and perplexity of a run over a whole data split, as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError
from attnlab.rundir import run_data_dir, run_data_splits


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="loss and perplexity over a whole split (JSON)")
    p.add_argument("model", type=path_arg, metavar="RUN_OR_FOLDER")
    p.add_argument("--split", choices=("val", "train"), default="val")
    p.add_argument(
        "--data", type=path_arg, help="prepared data folder (default: the run's own data)"
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab import from_pretrained
    from attnlab.analysis.loss import split_loss
    from attnlab.data.prepare import load_dataset
    from attnlab.device import resolve_device
    from attnlab.export.hf import added_token_ids
    from attnlab.train.checkpoint import model_folder

    model, tokenizer = from_pretrained(args.model, device=resolve_device(args.device))
    data_dir = args.data or run_data_dir(args.model)
    if data_dir is None:
        raise AttnlabError(f"{args.model} is not a run folder, so its data is unknown: pass --data")
    data = load_dataset(data_dir)
    data.check_model(args.model, model.config.vocab_size, tokenizer)
    if tokenizer is None:  # the ids fit; whether they mean the same tokens nothing here can say
        print(
            f"note: {args.model} has no tokenizer, so nothing checks that {data_dir}'s token ids "
            "are the ones it was trained on",
            file=sys.stderr,
        )
    change = None if args.data else data.changed_since(run_data_splits(args.model))
    if change:  # prepared again since: it scored other text as the run's own
        raise AttnlabError(
            f"{data_dir} no longer holds the data {args.model} was trained on ({change}); "
            "restore that data, or pass --data"
        )
    folder = model_folder(args.model)  # a run's best/, else its latest/: named in the output
    # an export's added tokens (never trained, never in the data) are not scored against
    added = added_token_ids(folder)
    result = split_loss(
        model, getattr(data, args.split), args.batch_size, progress=True, excluded=added
    )
    print(json.dumps({"checkpoint": str(folder), "split": args.split, **result}, indent=2))
    return 0
