"""`attnlab prepare`: tokenize a corpus into train.bin / val.bin / tokenizer.json / meta.json."""

from __future__ import annotations

import argparse
import sys

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus into a data folder",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
    )
    p.add_argument(
        "--corpus",
        type=path_arg,
        nargs="+",
        metavar="SOURCE",
        help="'shakespeare' (embedded Gutenberg works, the default), 'shakespeare_char' (nanoGPT's, "
        "split as nanoGPT splits it), files or folders (.txt, .jsonl, .parquet; .gz/.xz/.zst), "
        "a dataset saved with datasets' save_to_disk, or hf:NAME[:CONFIG][:SPLIT]",
    )
    p.add_argument(
        "--tokenizer",
        choices=("char", "bpe", "bytebpe"),  # attnlab.data.prepare.TOKENIZERS (kept lazy)
        help="char (the default); bpe over whitespace-split words (the GBA paper's); bytebpe: "
        "byte-level, lossless (keeps newlines and spacing)",
    )
    p.add_argument(
        "--tokenizer-from",
        type=path_arg,
        metavar="PATH",
        help="encode with this tokenizer.json (or the one in a data, run or model folder) "
        "instead of learning one: the same ids as that data or model; needs --out",
    )
    p.add_argument("--vocab-size", type=int, help="bpe/bytebpe vocabulary size (default 16384)")
    p.add_argument(
        "--tokenizer-sample",
        type=int,
        metavar="BYTES",
        help="bpe/bytebpe learn their merges on at most this many bytes of the train text, "
        "blocks of lines drawn with a fixed seed (default 100000000; a smaller corpus: all of it)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        help="tail of each document held out for validation, in (0, 1) (default 0.1)",
    )
    p.add_argument(
        "--out",
        type=path_arg,
        metavar="DIR",
        help="output folder (default for a shipped corpus: $ATTNLAB_HOME/data/shakespeare-char, "
        "shakespeare_char, ...); "
        "a prepared folder there is replaced, anything else is refused",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out even if it is not a data folder"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.data.prepare import prepare, read_meta

    out = prepare(
        args.corpus,
        args.tokenizer,
        args.vocab_size,
        args.out,
        args.val_fraction,
        args.overwrite,
        progress=True,
        tokenizer_sample=args.tokenizer_sample,
        tokenizer_from=args.tokenizer_from,
    )
    meta = read_meta(out)
    n_docs = len(meta["provenance"]["documents"])
    print(
        f"{meta['provenance']['name']} ({n_docs} documents): {meta['train_tokens']:,} train + "
        f"{meta['val_tokens']:,} val tokens, {meta['tokenizer']} vocab {meta['vocab_size']:,} "
        f"({meta['dtype']}) -> {out}"
    )
    if args.vocab_size and meta["vocab_size"] < args.vocab_size:  # BPE ran out of pairs to merge
        print(
            f"attnlab prepare: --vocab-size {args.vocab_size:,} asked for, {meta['vocab_size']:,} "
            "learned: the text has no more pairs to merge (more text gives more)",
            file=sys.stderr,
        )
    return 0
