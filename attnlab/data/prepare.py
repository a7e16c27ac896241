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

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.bins import read_tokens, write_tokens
from attnlab.data.corpus import EMBEDDED, NAMED, NANOGPT_CHAR, check_val_fraction, load_corpus
from attnlab.data.tokenizer import FILENAME as TOKENIZER_FILE
from attnlab.data.tokenizer import Tokenizer, check_bpe_vocab
from attnlab.errors import AttnlabError
from attnlab.fsutil import replace_folder

DEFAULT_BPE_VOCAB = 16384
META_FILE = "meta.json"
META_KEYS = ("vocab_size", "dtype", "train_tokens", "val_tokens", "tokenizer", "provenance")
TOKENIZERS = ("char", "bpe", "bytebpe")
# what to change when a split tokenizes to fewer than 2 tokens
FEWER = {
    "train": "add text or lower --val-fraction",
    "val": "add text or raise --val-fraction",
}


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
    if vocab_size is None:
        return DEFAULT_BPE_VOCAB
    check_bpe_vocab(tokenizer, vocab_size)  # before the corpus is read
    return vocab_size


def default_data_dir(
    tokenizer: str = "char", vocab_size: int | None = None, corpus: str = EMBEDDED
) -> Path:
    """Where a shipped corpus is prepared: ``$ATTNLAB_HOME/data/shakespeare-char`` (the embedded
    Gutenberg corpus), ``.../shakespeare_char`` (nanoGPT's name for its own), ``...-bpe2048``."""
    if corpus not in NAMED:
        raise AttnlabError(f"unknown shipped corpus {corpus!r} (expected {', '.join(NAMED)})")
    bpe_vocab = _check_tokenizer_args(tokenizer, vocab_size)
    if bpe_vocab is None:
        name = NANOGPT_CHAR if corpus == NANOGPT_CHAR else f"{corpus}-char"
    else:
        name = f"{corpus}-{tokenizer}{bpe_vocab}"
    return attnlab_home() / "data" / name


def shipped_char_vocab_size(corpus: str = EMBEDDED) -> int:
    """The vocabulary of a shipped corpus as a char data folder (what char presets train on)."""
    meta = default_data_dir(corpus=corpus) / META_FILE
    if meta.is_file():
        return int(_read_meta(meta)["vocab_size"])
    text = load_corpus([corpus])  # not prepared yet: count the characters prepare would find
    return Tokenizer.train_char(text.train_text + text.val_text).vocab_size


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
    progress: bool = False,
) -> Path:
    """Load, split, tokenize and write ``sources`` into the folder ``out``; return ``out``.

    A prepared folder at ``out`` is replaced; any other non-empty folder only with ``overwrite``.
    ``progress`` reports each stage and its time on stderr (with the tokenizers library's own
    bars while a BPE trains, on a terminal).
    """
    bpe_vocab = _check_tokenizer_args(tokenizer, vocab_size)
    check_val_fraction(val_fraction)  # before anything is written
    flag = "--out" if out is not None else "ATTNLAB_HOME"  # what to change if out is refused
    if out is None:
        named = list(sources or [EMBEDDED])
        if len(named) != 1 or named[0] not in NAMED:
            raise AttnlabError("preparing a custom corpus needs an output folder (--out)")
        out = default_data_dir(tokenizer, vocab_size, named[0])
    out = Path(out).expanduser()
    # written beside ``out`` and swapped in: a reader never sees a half-written dataset
    # not hf: or a shipped corpus (a file named like one in the working folder is not read)
    files = [s for s in sources or [] if s not in NAMED and Path(s).expanduser().exists()]
    with replace_folder(
        out, "prepared data folder", overwrite, is_data_folder, flag, sources=files
    ) as tmp:
        with _stage(progress, f"reading {', '.join(sources or [EMBEDDED])}") as done:
            corpus = load_corpus(sources, val_fraction)
            done.append(
                f"{len(corpus.provenance['documents'])} documents, "
                f"{_mb(corpus.train_text)} train + {_mb(corpus.val_text)} val text"
            )
        what = "char" if bpe_vocab is None else f"{tokenizer} (vocab {bpe_vocab:,})"
        bars = progress and sys.stderr.isatty()  # the library's bars only draw on a terminal
        with _stage(progress, f"training the {what} tokenizer") as done:
            if bpe_vocab is None:
                tok = Tokenizer.train_char(corpus.train_text + corpus.val_text)
            elif tokenizer == "bytebpe":  # bytes: nothing in the held-out text can be unknown
                tok = Tokenizer.train_byte_bpe(corpus.train_text, bpe_vocab, bars)
            else:
                tok = Tokenizer.train_bpe(
                    corpus.train_text, bpe_vocab, alphabet=corpus.val_text, show_progress=bars
                )
            done.append(f"{tok.vocab_size:,} tokens")
        counts = {}
        for split, text in (("train", corpus.train_text), ("val", corpus.val_text)):
            with _stage(progress, f"encoding {split} ({_mb(text)})") as done:
                ids = tok.encode(text)
                if len(ids) < 2:  # not one (input, target) pair to train or score on
                    raise AttnlabError(
                        f"{', '.join(sources or [EMBEDDED])}: the {split} split has {len(ids)} "
                        f"token(s), need at least 2; {FEWER[split]}"
                    )
                dtype = write_tokens(tmp / f"{split}.bin", ids, tok.vocab_size)
                done.append(f"{len(ids):,} tokens")
            counts[f"{split}_tokens"] = len(ids)
        tok.save(tmp / TOKENIZER_FILE)
        meta = {"vocab_size": tok.vocab_size, "dtype": dtype, **counts, "tokenizer": tok.kind}
        meta["provenance"] = corpus.provenance
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def _mb(text: str) -> str:
    """The UTF-8 size of ``text``: 4.5 MB, 48 kB."""
    n = len(text.encode("utf-8"))
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


@contextlib.contextmanager
def _stage(show: bool, what: str) -> Iterator[list[str]]:
    """One stderr line per finished stage: what, what it gave (the caller appends), its time.

    On a terminal the line appears when the stage starts (ending in "...") and is completed in
    place; elsewhere only finished stages print, so a failure stays a one-line error.
    """
    live = show and sys.stderr.isatty()
    if live:
        print(f"{what} ...", end="", file=sys.stderr, flush=True)
    started, done = time.perf_counter(), []
    try:
        yield done
    except BaseException:
        if live:
            print(file=sys.stderr)
        raise
    if show:
        took = time.perf_counter() - started
        end = f"{what}: {', '.join(done)} ({took:.1f} s)"
        print(f"\r{end}" if live else end, file=sys.stderr, flush=True)


def fingerprint(meta: dict) -> dict[str, Any]:
    """What tells a prepared folder's token streams apart: their lengths and, where ``prepare``
    recorded them, the SHA-256 of each split's text. A run records it, so that resuming (or a
    study reusing the run) notices data prepared again with another split or corpus."""
    out = {key: meta[key] for key in ("train_tokens", "val_tokens")}
    provenance = meta.get("provenance")
    if isinstance(provenance, dict):
        out.update({k: provenance[k] for k in ("train_sha256", "val_sha256") if k in provenance})
    return out


def read_fingerprint(data_dir: str | Path) -> dict[str, Any]:
    """``fingerprint`` of a prepared folder, from its meta.json alone."""
    return fingerprint(_read_meta(Path(data_dir).expanduser() / META_FILE))


def fingerprint_change(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """How a folder's token streams differ from those a run recorded, in words (None: alike)."""
    changed = sorted({key.split("_")[0] for key in then if now.get(key) != then[key]})
    if not changed:
        return None
    sizes = [d.get(k) for d in (then, now) for k in ("train_tokens", "val_tokens")]
    if not all(isinstance(n, int) for n in sizes):  # a hand-edited record: no sizes to show
        return f"its {' and '.join(changed)} tokens differ"
    return (
        f"its {' and '.join(changed)} tokens differ: {sizes[0]:,} train / {sizes[1]:,} val "
        f"then, {sizes[2]:,} / {sizes[3]:,} now"
    )


@dataclass
class Dataset:
    """A prepared data folder, loaded: token arrays are read-only memory maps."""

    dir: Path
    meta: dict
    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray

    def changed_since(self, recorded: dict[str, Any] | None) -> str | None:
        """How this data differs from the fingerprint a run recorded, in words (None: alike, or
        nothing recorded)."""
        return fingerprint_change(recorded, fingerprint(self.meta)) if recorded else None

    def check_model(self, model: str | Path, vocab_size: int, tokenizer: Tokenizer | None) -> None:
        """Refuse a model that would read this data's token ids as other tokens.

        Every token of the data must have the same id in the model's tokenizer (which may add
        more, e.g. SFT's ChatML tokens); without a tokenizer, the ids must at least fit.
        """
        fix = "pass the data the model was trained on with --data"
        if int(self.meta["vocab_size"]) > vocab_size:
            raise AttnlabError(
                f"{self.dir} has {self.meta['vocab_size']:,} tokens, more than the vocab_size="
                f"{vocab_size:,} of {model}; {fix}"
            )
        if tokenizer is None:
            return
        theirs = tokenizer.hf.get_vocab()
        ours = self.tokenizer.hf.get_vocab()
        differ = sorted(t for t, i in ours.items() if theirs.get(t) != i)
        if differ:
            raise AttnlabError(
                f"{model} has another tokenizer than {self.dir} ({len(differ):,} of its "
                f"{len(ours):,} tokens differ, e.g. {differ[0]!r}); {fix}"
            )


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


def start_tokens(tokenizer: Tokenizer, data_dir: str | Path | None) -> list[int]:
    """Where sampling starts when no prompt is given: a newline; where the tokenizer has no token
    for one alone (bpe drops whitespace), the first validation token of ``data_dir``; [] when
    neither exists (no data folder known)."""
    ids = tokenizer.encode("\n")
    if ids or data_dir is None:
        return ids
    # one token: the split memory-mapped, not loaded (load_dataset scans both splits' ids)
    data_dir = Path(data_dir).expanduser()
    val = read_tokens(data_dir / "val.bin", _read_meta(data_dir / META_FILE)["dtype"])
    if not val.size:  # a valid split (a tiny corpus), but one with no token to start from
        raise AttnlabError(f"{data_dir / 'val.bin'}: no tokens to start from")
    return [int(val[0])]


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
