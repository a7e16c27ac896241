"""`attnlab analyze attention RUN`: attention of chosen tokens per round, head-averaged (Figure 6).

Tokens are ``--tokens`` positions of validation window ``--sequence``, or (with ``--baseline``)
the ``--top`` tokens where the boosted run's loss beats the baseline's by the most, or else
``--top`` evenly spaced positions with a full ``--window`` of context.
"""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg
from attnlab.commands.analyze import add_common_args, out_dir
from attnlab.errors import AttnlabError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "attention", help="attention weights of chosen tokens per round (Figure 6)"
    )
    add_common_args(p)
    p.add_argument(
        "--baseline",
        type=path_arg,
        metavar="RUN",
        help="a standard model to compare with (same data)",
    )
    p.add_argument(
        "--tokens",
        help="comma-separated query positions in window --sequence (default: with --baseline "
        "the --top tokens boosting fixes most, else --top positions with a full --window of "
        "context)",
    )
    p.add_argument(
        "--sequence", type=int, default=0, help="validation window of --tokens (default 0)"
    )
    p.add_argument("--top", type=int, default=2, help="tokens to pick when --tokens is not given")
    p.add_argument(
        "--layer",
        type=int,
        help="layer to show, from 0 (default 1, as in the paper; 0 in a 1-layer model)",
    )
    p.add_argument("--window", type=int, default=16, help="context positions shown per token")
    p.set_defaults(func=run)


def positions(text: str | None) -> list[int] | None:
    """--tokens as a list of positions (None when not given)."""
    if not text:
        return None
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise AttnlabError(f"--tokens must be comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import attention
    from attnlab.analysis.inputs import load_baseline, load_inputs

    tokens = positions(args.tokens)
    out = out_dir(args, attention.FILES)
    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    baseline = load_baseline(args.baseline, inputs.model, args.device) if args.baseline else None
    panels, csv_path, png = attention.analyze(
        inputs,
        out,
        baseline,
        tokens,
        args.sequence,
        args.top,
        args.layer,
        args.window,
        str(args.baseline),
    )
    for panel in panels:
        print(panel["title"])
    print(f"wrote {csv_path} and {png}")
    return 0
