"""`attnlab bench prepare`: prepare's MB/s and peak memory against the tokenizers library's batch
encode of the same text."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_writable
from attnlab.plotting import SMOKE

TOKENIZERS = ("char", "bpe", "bytebpe")  # attnlab.data.prepare.TOKENIZERS (kept lazy)
FULL_SIZES = "50,200"
QUICK_SIZES = "1"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "prepare", help="prepare's MB/s and peak RSS vs the tokenizers library's batch encode"
    )
    p.add_argument(
        "--sizes",
        help=f"corpus sizes in MB, comma-separated (default {FULL_SIZES}); each corpus is "
        "generated from perturbed copies of the embedded one and deleted afterwards",
    )
    p.add_argument(
        "--tokenizers",
        default=",".join(TOKENIZERS),
        help="comma-separated, of char, bpe, bytebpe (default: all three)",
    )
    p.add_argument("--vocab-size", type=int, default=4096, help="bpe/bytebpe vocabulary size")
    p.add_argument(
        "--scratch",
        type=path_arg,
        metavar="DIR",
        help="where the generated corpora and data folders go (default: the system's temp folder)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a {QUICK_SIZES} MB corpus: a smoke test, not a measurement (a given --sizes is kept)",
    )
    p.set_defaults(func=run)


def _sizes(text: str) -> list[int]:
    """--sizes as bytes; refused unless every entry is a positive number of MB."""
    try:
        sizes = [float(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise AttnlabError(
            f"--sizes must be positive MB, comma-separated (e.g. 50,200), got {text!r}"
        )
    return [int(mb * 1e6) for mb in sizes]


def run(args: argparse.Namespace) -> int:
    import os

    from attnlab.bench import prepare
    from attnlab.bench.timing import format_table
    from attnlab.data.tokenizer import check_bpe_vocab

    sizes = _sizes(args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES))
    kinds = args.tokenizers.split(",")
    unknown = [k for k in kinds if k not in TOKENIZERS]
    if unknown:
        raise AttnlabError(
            f"--tokenizers: unknown {', '.join(unknown)} (expected some of {', '.join(TOKENIZERS)})"
        )
    for kind in kinds:  # before a corpus is generated
        if kind != "char":
            check_bpe_vocab(kind, args.vocab_size)
    if args.scratch is not None:  # tempfile's own error is a traceback
        scratch = Path(args.scratch).expanduser()
        if not scratch.is_dir():
            what = "is not a folder" if scratch.exists() else "does not exist"
            raise AttnlabError(f"--scratch {args.scratch} {what}; give an existing folder")
        check_writable(scratch, "--scratch")
    if args.quick:
        print(SMOKE)
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-prepare-", dir=args.scratch) as scratch:
        for size in sizes:
            corpus = Path(scratch) / f"corpus-{size}.txt"
            written = prepare.make_corpus(corpus, size)
            for kind in kinds:
                vocab = None if kind == "char" else args.vocab_size
                result = prepare.measure(corpus, kind, vocab, Path(scratch))
                rows.append(prepare.row(written, kind, vocab, result))
                # each row as it comes: a long run stopped early keeps what it measured
                cells = zip(prepare.HEADER, rows[-1], strict=True)
                print(f"bench prepare: {', '.join(f'{h} {v}' for h, v in cells)}", file=sys.stderr)
            corpus.unlink()
    print(
        f"perturbed copies of the embedded corpus, one file each; {os.cpu_count()} CPUs; "
        "each row a fresh process (peak RSS: of the process, the imports' share beside it)"
    )
    print(format_table(prepare.HEADER, rows))
    return 0
