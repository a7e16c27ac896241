"""`attnlab import-nanogpt`: a nanoGPT train.py checkpoint as an attnlab model folder."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "import-nanogpt", help="convert a nanoGPT train.py checkpoint (ckpt.pt)"
    )
    p.add_argument("ckpt", type=path_arg, metavar="CKPT.pt")
    p.add_argument(
        "--meta",
        type=path_arg,
        metavar="meta.pkl",
        help="nanoGPT's char vocabulary, becomes tokenizer.json",
    )
    p.add_argument(
        "--out", type=path_arg, required=True, metavar="DIR", help="model folder to write"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.train.nanogpt import import_nanogpt

    model, tokenizer = import_nanogpt(args.ckpt, args.out, args.meta, args.overwrite)
    cfg = model.config
    note = f", {tokenizer.vocab_size}-char tokenizer" if tokenizer is not None else ", no tokenizer"
    print(
        f"imported {cfg.n_layer} layers x {cfg.n_embd}, vocab {cfg.vocab_size}, "
        f"{model.get_num_params() / 1e6:.2f}M parameters{note} -> {args.out}"
    )
    return 0
