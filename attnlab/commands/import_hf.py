"""`attnlab import-hf`: a local Hugging Face GPT-2 or Llama folder as an attnlab model folder."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "import-hf",
        help="convert a local transformers GPT-2 / Llama folder into an attnlab model folder",
    )
    p.add_argument(
        "folder", type=path_arg, metavar="FOLDER", help="config.json + model.safetensors or .bin"
    )
    p.add_argument(
        "--out", type=path_arg, required=True, metavar="DIR", help="attnlab model folder to write"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a non-empty --out that is not a model"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.export.hf import import_hf

    model, out, tokenizer = import_hf(args.folder, args.out, overwrite=args.overwrite)
    c = model.config
    backbone = "Llama" if c.pos == "rope" else "GPT-2"
    kept = f"{tokenizer} tokenizer" if tokenizer else "no tokenizer (none attnlab reads)"
    print(
        f"import-hf: {backbone} {c.n_layer} layers x {c.n_embd}, vocab {c.vocab_size}, "
        f"block {c.block_size}, {kept} -> {out}"
    )
    return 0
