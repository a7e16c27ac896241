"""Turn a corpus into a prepared data folder, and load one back.

A prepared folder holds ``train.bin`` and ``val.bin`` (token ids, see attnlab.data.bins),
``tokenizer.json`` and ``meta.json``::

    {"vocab_size": 84, "dtype": "uint16", "train_tokens": ..., "val_tokens": ...,
     "tokenizer": "char", "provenance": {...}}   # provenance: see attnlab.data.corpus

Folders are written to a temporary sibling and renamed into place, so a reader never sees a
half-written dataset. The char vocabulary covers train and val text (nanoGPT's convention);
BPE merges are learned on train text only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.data.bins import read_tokens, write_tokens
from attnlab.data.corpus import EMBEDDED, load_corpus
from attnlab.data.tokenizer import FILENAME as TOKENIZER_FILE
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import replace_folder

DEFAULT_BPE_VOCAB = 16384
META_FILE = "meta.json"
META_KEYS = ("vocab_size", "dtype", "train_tokens", "val_tokens", "tokenizer", "provenance")
TOKENIZERS = ("char", "bpe", "bytebpe")


def attnlab_home() -> Path:
    """``$ATTNLAB_HOME``, by default ``~/.cache/attnlab``."""
    return Path(os.environ.get("ATTNLAB_HOME") or "~/.cache/attnlab").expanduser()


def _check_tokenizer_args(tokenizer: str, vocab_size: int | None) -> int | None:
    """Validate the tokenizer choice; return the BPE vocabulary size (None for char)."""
    if tokenizer not in TOKENIZERS:
        raise AttnlabError(f"unknown tokenizer {tokenizer!r} (expected {', '.join(TOKENIZERS)})")
    if tokenizer == "char":
        if vocab_size is not None:
            raise AttnlabError("--vocab-size applies to the bpe tokenizers only")
        return None
    return DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size


def default_data_dir(tokenizer: str = "char", vocab_size: int | None = None) -> Path:
    """Where the embedded corpus is prepared: ``$ATTNLAB_HOME/data/shakespeare-char`` etc."""
    bpe_vocab = _check_tokenizer_args(tokenizer, vocab_size)
    name = f"{EMBEDDED}-char" if bpe_vocab is None else f"{EMBEDDED}-{tokenizer}{bpe_vocab}"
    return attnlab_home() / "data" / name


def is_data_folder(folder: Path) -> bool:
    """True for a folder ``prepare`` wrote (it has a meta.json), which it may replace."""
    return (folder / META_FILE).is_file()


def prepare(
    sources: Sequence[str] | None = None,
    tokenizer: str = "char",
    vocab_size: int | None = None,
    out: str | Path | None = None,
    val_fraction: float = 0.1,
    overwrite: bool = False,
) -> Path:
    """Load, split, tokenize and write ``sources`` into the folder ``out``; return ``out``.

    A prepared folder at ``out`` is replaced; any other non-empty folder only with ``overwrite``.
    """
    bpe_vocab = _check_tokenizer_args(tokenizer, vocab_size)
    if out is None:
        if sources and list(sources) != [EMBEDDED]:
            raise AttnlabError("preparing a custom corpus needs an output folder (--out)")
        out = default_data_dir(tokenizer, vocab_size)
    out = Path(out).expanduser()
    # written beside ``out`` and swapped in: a reader never sees a half-written dataset
    with replace_folder(out, "prepared data folder", overwrite, is_data_folder) as tmp:
        corpus = load_corpus(sources, val_fraction)
        if bpe_vocab is None:
            tok = Tokenizer.train_char(corpus.train_text + corpus.val_text)
        elif tokenizer == "bytebpe":  # bytes: nothing in the held-out text can be unknown
            tok = Tokenizer.train_byte_bpe(corpus.train_text, bpe_vocab)
        else:
            tok = Tokenizer.train_bpe(corpus.train_text, bpe_vocab, alphabet=corpus.val_text)
        counts = {}
        for split, text in (("train", corpus.train_text), ("val", corpus.val_text)):
            ids = tok.encode(text)
            dtype = write_tokens(tmp / f"{split}.bin", ids, tok.vocab_size)
            counts[f"{split}_tokens"] = len(ids)
        tok.save(tmp / TOKENIZER_FILE)
        meta = {"vocab_size": tok.vocab_size, "dtype": dtype, **counts, "tokenizer": tok.kind}
        meta["provenance"] = corpus.provenance
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


@dataclass
class Dataset:
    """A prepared data folder, loaded: token arrays are read-only memory maps."""

    dir: Path
    meta: dict
    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnlabError(f"{path}: not found (run `attnlab prepare` first)") from None
    except (OSError, ValueError) as e:
        raise AttnlabError(f"{path}: unreadable ({e})") from None
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise AttnlabError(f"{path}: missing {', '.join(missing)}")
    return meta


def load_dataset(data_dir: str | Path | None = None) -> Dataset:
    """Load a prepared folder; ``None`` is the embedded char corpus, prepared on first use."""
    if data_dir is None:
        data_dir = default_data_dir()
        if not (data_dir / META_FILE).is_file():
            print(
                f"attnlab: preparing the embedded Shakespeare corpus in {data_dir}", file=sys.stderr
            )
            prepare(out=data_dir)
    data_dir = Path(data_dir).expanduser()
    meta = _read_meta(data_dir / META_FILE)
    tok = Tokenizer.load(data_dir / TOKENIZER_FILE)
    vocab_size = meta["vocab_size"]
    if tok.vocab_size != vocab_size:
        raise AttnlabError(
            f"{data_dir / TOKENIZER_FILE}: {tok.vocab_size} tokens, meta.json says {vocab_size}"
        )
    splits = {}
    for split in ("train", "val"):
        path = data_dir / f"{split}.bin"
        splits[split] = read_tokens(path, meta["dtype"], vocab_size)
        if len(splits[split]) != meta[f"{split}_tokens"]:
            raise AttnlabError(
                f"{path}: {len(splits[split])} tokens, meta.json says {meta[f'{split}_tokens']}"
            )
    return Dataset(data_dir, meta, tok, splits["train"], splits["val"])
