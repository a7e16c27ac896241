"""Turn a corpus into a prepared data folder, and load one back.

A prepared folder holds ``train.bin`` and ``val.bin`` (token ids, see attnlab.data.bins),
``tokenizer.json`` and ``meta.json``::

    {"vocab_size": 84, "dtype": "uint16", "train_tokens": ..., "val_tokens": ...,
     "max_token_id": 83, "tokenizer": "char", "provenance": {...}}   # see attnlab.data.corpus

(a BPE folder also records ``tokenizer_sample``: the most bytes of train text its merges were
learned on, the seed that drew them, the bytes drawn and the train text's size).

Folders are written to a temporary sibling and renamed into place, so a reader never sees a
half-written dataset. The char vocabulary covers train and val text (nanoGPT's convention);
BPE merges are learned on train text only: all of it up to ``tokenizer_sample`` bytes, else
blocks of whole lines drawn with a fixed seed until that many. The corpus is streamed
(attnlab.data.corpus.CorpusStream) and encoded batch by batch straight into the token files,
so memory does not grow with the corpus; the ids equal those of encoding each split whole.
Loading checks the recorded largest id against the tokenizer instead of reading every token
(folders from before it was recorded are read in full, as then).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows: no lock; concurrent first runs race there)
    fcntl = None  # type: ignore[assignment]

from attnlab.data.corpus import (
    CHUNK,
    EMBEDDED,
    NAMED,
    NANOGPT_CHAR,
    SPLITS,
    CorpusStream,
    check_val_fraction,
)
from attnlab.data.token_files import TokenWriter, read_tokens
from attnlab.data.tokenizer import FILENAME as TOKENIZER_FILE
from attnlab.data.tokenizer import StreamEncoder, Tokenizer, check_bpe_vocab, listed
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_manifest, holds_only, replace_folder
from attnlab.reporting import STDERR, inline, silenced

logger = logging.getLogger(__name__)

DEFAULT_BPE_VOCAB = 16384
# the most bytes of train text BPE learns its merges on: training time and memory stay flat
# beyond it, while a smaller corpus (the shipped ones) is learned on whole, as before
DEFAULT_TOKENIZER_SAMPLE = 100_000_000
SAMPLE_SEED = 0
SAMPLE_BLOCK = 1 << 16  # characters of whole lines drawn (or not) at a time into the sample
PROGRESS_EVERY_S = 10.0  # off a terminal, a long stage prints how far it is this often
META_FILE = "meta.json"
IDS_SHA = "_ids_sha256"  # meta.json's "train_ids_sha256": the SHA-256 of train.bin as written
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


def _given_tokenizer(
    path: str | Path | None,
    tokenizer: str | None,
    vocab_size: int | None,
    sample: int | None,
    out: str | Path | None,
) -> Tokenizer | None:
    """The tokenizer at ``path`` (None: none given), refused beside the options of a learned
    one, without ``out``, or with ``out`` the folder it is read from (whose files ``out``
    replaces)."""
    if path is None:
        return None
    if tokenizer is not None or vocab_size is not None or sample is not None:
        raise AttnlabError(
            "--tokenizer-from encodes with the given tokenizer: leave out --tokenizer, "
            "--vocab-size and --tokenizer-sample"
        )
    if out is None:  # the shipped corpus's default folder is not its
        raise AttnlabError("--tokenizer-from needs an output folder (--out)")
    source = Path(path).expanduser()
    given = Tokenizer.load(source)
    folder = source if source.is_dir() else source.parent
    if Path(out).expanduser().resolve() == folder.resolve():
        raise AttnlabError(
            f"--out {out} is the folder --tokenizer-from reads, which it would replace; "
            "name another folder"
        )
    return given


def _check_sample(bpe_vocab: int | None, tokenizer_sample: int | None) -> int:
    """The BPE sample size to use: ``tokenizer_sample`` checked, or the default."""
    if tokenizer_sample is None:
        return DEFAULT_TOKENIZER_SAMPLE
    if bpe_vocab is None:
        raise AttnlabError("--tokenizer-sample applies to the bpe tokenizers only")
    if tokenizer_sample < 1:
        raise AttnlabError(f"--tokenizer-sample must be at least 1 byte, got {tokenizer_sample}")
    return tokenizer_sample


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
    folder = default_data_dir(corpus=corpus)
    if is_data_folder(folder):
        return int(read_meta(folder)["vocab_size"])
    text = CorpusStream([corpus])  # not prepared yet: count the characters prepare would find
    text.scan()
    return len(text.characters)


def is_data_folder(folder: Path) -> bool:
    """True for a folder ``prepare`` wrote (it has a meta.json), which it may replace."""
    return (folder / META_FILE).is_file()


DEFAULT_VAL_FRACTION = 0.1  # the tail of each document held out, unless --val-fraction

# what prepare writes (besides attnlab.fsutil's manifest): a file it adds must be named here
DATA_FILES = ("train.bin", "val.bin", TOKENIZER_FILE, META_FILE)


def _own_data_folder(folder: Path) -> bool:
    """A data folder holding prepare's files and nothing else: prepare's to replace without
    --overwrite (what else one holds is named first, from its manifest: attnlab.fsutil)."""
    return is_data_folder(folder) and holds_only(folder, DATA_FILES)


def prepare(
    sources: Sequence[str] | None = None,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    out: str | Path | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    overwrite: bool = False,
    progress: bool = False,
    tokenizer_sample: int | None = None,
    chunk: int = CHUNK,
    tokenizer_from: str | Path | None = None,
) -> Path:
    """Load, split, tokenize and write ``sources`` into the folder ``out``; return ``out``.

    A prepared folder at ``out`` is replaced; any other non-empty folder only with ``overwrite``.
    ``progress`` reports each stage and its time on stderr, and how far a long one is: a bar on
    a terminal (the tokenizers library's own while a BPE trains), else a line now and then.
    ``tokenizer_sample``: the most bytes of train text BPE learns on (None:
    DEFAULT_TOKENIZER_SAMPLE). ``chunk``: the size of the pieces the corpus is read in
    (characters; bytes from a file). ``tokenizer``: char (None), bpe or bytebpe.
    ``tokenizer_from``: a tokenizer.json (or a folder holding
    one: a data, run or model folder) to encode with instead of learning one, e.g. to rebuild a
    data folder's bins exactly, or to score new text in a model's vocabulary.
    """
    given = _given_tokenizer(tokenizer_from, tokenizer, vocab_size, tokenizer_sample, out)
    tokenizer = tokenizer or "char"
    bpe_vocab = _check_tokenizer_args(tokenizer, vocab_size)
    check_val_fraction(val_fraction)  # before anything is written
    tokenizer_sample = _check_sample(bpe_vocab, tokenizer_sample)
    flag = "--out" if out is not None else "ATTNLAB_HOME"  # what to change if out is refused
    if out is None:
        named = list(sources or [EMBEDDED])
        if len(named) != 1 or named[0] not in NAMED:
            raise AttnlabError("preparing a custom corpus needs an output folder (--out)")
        out = default_data_dir(tokenizer, vocab_size, named[0])
    out = Path(out).expanduser()
    shipped = shipped_default(out)
    if shipped is not None and (
        given is not None
        or list(sources or [EMBEDDED]) != [shipped["corpus"]]
        or default_data_dir(tokenizer, vocab_size, shipped["corpus"]) != out
        or val_fraction != DEFAULT_VAL_FRACTION
    ):  # presets and studies would train on it as that corpus
        raise AttnlabError(
            f"--out {out} is where attnlab keeps the shipped corpus {_shipped_name(shipped)}, "
            "which presets and studies train on; name another folder"
        )
    corpus = CorpusStream(sources, val_fraction, chunk)
    names = ", ".join(corpus.sources)
    # written beside ``out`` and swapped in: a reader never sees a half-written dataset
    # not hf: or a shipped corpus (a file named like one in the working folder is not read)
    files = [s for s in sources or [] if s not in NAMED and Path(s).expanduser().exists()]
    with replace_folder(
        out, "prepared data folder", overwrite, _own_data_folder, flag, sources=files
    ) as tmp:
        with _stage(progress, f"reading {names}") as stage:
            corpus.scan(stage.advance)
            _check_split(corpus, val_fraction, names)
            missing = given.missing(corpus.characters) if given is not None else []
            if missing:  # refused now, not once encoding (a bpe's as <unk>, silently)
                raise AttnlabError(
                    f"{len(missing)} character(s) of {names} are not in --tokenizer-from's "
                    f"vocabulary: {listed(missing)}; leave out --tokenizer-from to learn this "
                    "corpus's own"
                )
            stage.done.append(
                f"{len(corpus.parts)} documents, "
                f"{_mb(corpus.train_bytes)} train + {_mb(corpus.val_bytes)} val text"
            )
        what = "char" if bpe_vocab is None else f"{tokenizer} (vocab {bpe_vocab:,})"
        title = f"training the {what} tokenizer"
        if given is not None:
            title = f"loading the given {given.kind} tokenizer"
        bars = progress and sys.stderr.isatty()  # the library's bars only draw on a terminal
        with _stage(
            progress,
            title,
            corpus.train_bytes,
            bpe_vocab is not None and not bars,
        ) as stage:
            if given is not None:
                tok, sample = given, None
            elif bpe_vocab is None:
                tok, sample = Tokenizer.from_chars(corpus.characters), None
            else:
                sample = _Sample(corpus, tokenizer_sample, tokenizer == "bytebpe", stage.advance)
                tok = _train_bpe(tokenizer, sample, bpe_vocab, corpus.characters, bars)
            done = f"{tok.vocab_size:,} tokens"
            if sample is not None and sample.taken < corpus.train_bytes:
                done += f" (learned on a {_mb(sample.taken)} sample)"
            stage.done.append(done)
        sizes = f"{_mb(corpus.train_bytes)} train + {_mb(corpus.val_bytes)} val"
        with _stage(
            progress, f"encoding ({sizes})", corpus.train_bytes + corpus.val_bytes
        ) as stage:
            writers = _encode(corpus, tok, tmp, stage.advance)
            stage.done.append(f"{writers['train'].tokens:,} + {writers['val'].tokens:,} tokens")
        for split, writer in writers.items():
            if writer.tokens < 2:  # not one (input, target) pair to train or score on
                raise AttnlabError(
                    f"{names}: the {split} split has {writer.tokens} token(s), need at least 2; "
                    f"{FEWER[split]}"
                )
        tok.save(tmp / TOKENIZER_FILE)
        meta = {
            "vocab_size": tok.vocab_size,
            "dtype": writers["train"].dtype,
            **{f"{split}_tokens": writer.tokens for split, writer in writers.items()},
            **{f"{split}{IDS_SHA}": writer.sha256 for split, writer in writers.items()},
            "max_token_id": max(writer.max_id for writer in writers.values()),
            "tokenizer": tok.kind,
        }
        if sample is not None:
            meta["tokenizer_sample"] = sample.record()
        if given is not None:
            meta["tokenizer_from"] = {
                "path": str(Path(tokenizer_from).expanduser().resolve()),
                "sha256": hashlib.sha256(given.hf.to_str().encode()).hexdigest(),
            }
        meta["provenance"] = corpus.provenance()
        write_meta(tmp, meta)
    return out


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """A prepared folder's meta.json, written last: ``load_dataset`` trusts the recorded
    ``max_token_id`` only for bins not changed after it."""
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _check_split(corpus: CorpusStream, val_fraction: float, names: str) -> None:
    """Refuse a split far from ``val_fraction``: each document is cut at the line break nearest
    its share, so one of a few long lines can leave almost nothing to train on."""
    asked = 1 - val_fraction
    share = corpus.train_bytes / (corpus.train_bytes + corpus.val_bytes)
    if share < asked / 2:
        raise AttnlabError(
            f"{names}: the split leaves {corpus.train_bytes:,} bytes of text for training and "
            f"{corpus.val_bytes:,} for validation ({share:.0%} train, not about {asked:.0%}): "
            f"the text has too few line breaks to cut near --val-fraction {val_fraction}; break "
            "it into lines, or into several files"
        )


class _Sample:
    """Batches of train-text lines for BPE to learn on: the whole train text when it holds at
    most ``max_bytes``, else blocks of whole lines spread evenly over it (the first drawn with
    SAMPLE_SEED), until ``max_bytes`` are kept. ``advance(n)``: the bytes of train text read."""

    def __init__(
        self, corpus: CorpusStream, max_bytes: int, keepends: bool, advance: Callable[[int], None]
    ) -> None:
        self.corpus, self.max_bytes = corpus, max_bytes
        self.keepends, self.advance = keepends, advance
        self.taken = 0  # bytes handed out so far

    def __iter__(self) -> Iterator[list[str]]:
        share = self.max_bytes / self.corpus.train_bytes
        # every 1/share-th block from a seeded start: spread evenly over the whole text
        credit = np.random.default_rng(SAMPLE_SEED).random()
        texts = (text for _, text in self.corpus.split_pieces(("train",), self.advance))
        for block in _line_blocks(texts, SAMPLE_BLOCK):
            credit += share
            if credit < 1:
                continue
            credit -= 1
            yield block.splitlines(keepends=self.keepends)
            self.taken += len(block.encode("utf-8"))
            if self.taken >= self.max_bytes:
                return

    def record(self) -> dict[str, int]:
        """What meta.json records of the sample."""
        return {
            "max_bytes": self.max_bytes,
            "seed": SAMPLE_SEED,
            "bytes": self.taken,
            "train_bytes": self.corpus.train_bytes,
        }


def _line_blocks(texts: Iterable[str], size: int) -> Iterator[str]:
    """The text of ``texts`` in blocks of whole lines, each ending at the first newline after
    ``size`` characters (the last where the text ends)."""
    rest = ""
    for text in texts:
        rest += text
        start = 0
        while len(rest) - start > size and (end := rest.find("\n", start + size)) >= 0:
            yield rest[start : end + 1]
            start = end + 1
        rest = rest[start:]
    if rest:
        yield rest


def _train_bpe(
    kind: str, sample: _Sample, vocab_size: int, characters: str, bars: bool
) -> Tokenizer:
    if kind == "bytebpe":  # bytes: nothing in the held-out text can be unknown
        return Tokenizer.train_byte_bpe(sample, vocab_size, bars)
    # every character of the corpus gets tokens, those of the held-out text and unsampled lines too
    return Tokenizer.train_bpe(sample, vocab_size, alphabet=characters, show_progress=bars)


def _encode(
    corpus: CorpusStream, tok: Tokenizer, folder: Path, advance: Callable[[int], None]
) -> dict[str, TokenWriter]:
    """Encode both splits in one read of the corpus into ``folder``'s token files."""
    encoders = {split: StreamEncoder(tok) for split in SPLITS}
    with contextlib.ExitStack() as files:
        writers = {
            split: files.enter_context(TokenWriter(folder / f"{split}.bin", tok.vocab_size))
            for split in SPLITS
        }
        for split, text in corpus.split_pieces(advance=advance):
            for ids in encoders[split].feed(text):
                writers[split].write(ids)
        for split, encoder in encoders.items():
            for ids in encoder.finish():
                writers[split].write(ids)
    return writers


def _mb(nbytes: int) -> str:
    """A size in bytes as 4.5 MB, 48 kB."""
    return f"{nbytes / 1e6:,.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.0f} kB"


class _Stage:
    """How far a stage is: ``advance(n)`` adds ``n`` bytes done, of ``total`` (None: unknown).
    Shown as a bar on a terminal (``bar``), else as a line every PROGRESS_EVERY_S seconds;
    ``done`` collects what the finished stage gave (the caller appends)."""

    def __init__(self, show: bool, what: str, total: int | None, bar: bool) -> None:
        self.show, self.what, self.total = show, what, total
        self.done: list[str] = []
        self.count = 0
        self.started = self._shown = time.perf_counter()
        self.bar = None
        # off a terminal, lines; on one, a bar unless the stage draws its own (the library's)
        self.lines = show and not sys.stderr.isatty()
        if show and bar and not self.lines:
            self.bar = tqdm(
                total=total,
                desc=what,
                unit="B",
                unit_scale=True,
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )

    def advance(self, n: int) -> None:
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.perf_counter()
        if self.lines and now - self._shown >= PROGRESS_EVERY_S:
            self._shown = now
            logger.info(self.line(now), extra=STDERR)

    def line(self, now: float) -> str:
        """Bytes done, rate and time left: "encoding (...): 120.0 MB of 1,000.0 MB, 60.0 MB/s,
        15 s left"."""
        rate = self.count / max(now - self.started, 1e-9)
        line = f"{self.what}: {_mb(self.count)}"
        if self.total:
            line += f" of {_mb(self.total)}"
        line += f", {rate / 1e6:.1f} MB/s"
        if self.total and rate:
            line += f", {max(self.total - self.count, 0) / rate:.0f} s left"
        return line


@contextlib.contextmanager
def _stage(show: bool, what: str, total: int | None = None, bar: bool = True) -> Iterator[_Stage]:
    """One stderr line per finished stage: what, what it gave (the caller appends), its time.

    On a terminal the line appears when the stage starts (ending in "...", or as a bar while it
    advances) and is completed in place; elsewhere only finished stages print, with progress
    lines between on a long one, so a failure early on stays a one-line error.
    """
    show = show and not silenced()  # a silenced attnlab: no bar either
    stage = _Stage(show, what, total, bar)
    live = show and sys.stderr.isatty() and stage.bar is None
    if live:
        logger.info(f"{what} ...", extra=inline())
    try:
        yield stage
    except BaseException:
        if live:
            logger.info("", extra=STDERR)
        raise
    finally:
        if stage.bar is not None:
            stage.bar.close()
    if show:
        took = time.perf_counter() - stage.started
        end = f"{what}: {', '.join(stage.done)} ({took:.1f} s)"
        logger.info(f"\r{end}" if live else end, extra=STDERR)


def fingerprint(meta: dict) -> dict[str, Any]:
    """What tells a prepared folder's token streams apart: their lengths and, where ``prepare``
    recorded them, the SHA-256 of each split's text and of its token file. A run records it, so
    that resuming (or a study reusing the run) notices data prepared again with another split,
    corpus or tokenizer (the same text under other ids)."""
    keys = ("train_tokens", "val_tokens", f"train{IDS_SHA}", f"val{IDS_SHA}")
    out = {key: meta[key] for key in keys if key in meta}
    provenance = meta.get("provenance")
    if isinstance(provenance, dict):
        out.update({k: provenance[k] for k in ("train_sha256", "val_sha256") if k in provenance})
    return out


def read_fingerprint(data_dir: str | Path) -> dict[str, Any]:
    """``fingerprint`` of a prepared folder, from its meta.json alone."""
    return fingerprint(read_meta(data_dir))


def fingerprint_change(then: dict[str, Any], now: dict[str, Any]) -> str | None:
    """How a folder's token streams differ from those a run recorded, in words (None: alike).

    A token file's SHA-256 that only the run recorded tells nothing (an older ``prepare`` wrote
    the folder); the text's does: its provenance changed."""
    changed = sorted(
        {
            key.split("_")[0]
            for key in then
            if now.get(key) != then[key] and (key in now or not key.endswith(IDS_SHA))
        }
    )
    if not changed:
        return None
    sizes = [d.get(k) for d in (then, now) for k in ("train_tokens", "val_tokens")]
    if not all(isinstance(n, int) for n in sizes):  # a hand-edited record: no sizes to show
        return f"its {' and '.join(changed)} tokens differ"
    if sizes[:2] == sizes[2:]:  # other tokens in the same number: only the sha256 tells
        return (
            f"its {' and '.join(changed)} tokens differ (another sha256, the same "
            f"{sizes[0]:,} train / {sizes[1]:,} val tokens)"
        )
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


def read_meta(folder: str | Path) -> dict:
    """A prepared folder's meta.json, checked to hold the keys every reader needs."""
    path = Path(folder).expanduser() / META_FILE
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
    # one token: the split memory-mapped alone (load_dataset opens both, and checks the ids)
    data_dir = Path(data_dir).expanduser()
    val = read_tokens(data_dir / "val.bin", read_meta(data_dir)["dtype"])
    if not val.size:  # a valid split (a tiny corpus), but one with no token to start from
        raise AttnlabError(f"{data_dir / 'val.bin'}: no tokens to start from")
    return [int(val[0])]


def shipped_default(folder: Path) -> dict[str, Any] | None:
    """``{corpus, tokenizer, vocab_size}`` when ``folder`` is the default folder
    (``default_data_dir``) of a shipped corpus, else None: prepared on first use."""
    if folder.parent != attnlab_home() / "data":
        return None
    for corpus in NAMED:
        if folder.name == default_data_dir(corpus=corpus).name:
            return {"corpus": corpus}
        for tokenizer in TOKENIZERS[1:]:
            vocab = folder.name.removeprefix(f"{corpus}-{tokenizer}")
            if vocab != folder.name and vocab.isdigit():
                return {"corpus": corpus, "tokenizer": tokenizer, "vocab_size": int(vocab)}
    return None


def data_vocab_size(data_dir: str | Path) -> int:
    """The vocabulary of the prepared folder ``data_dir``, or of the shipped corpus it is the
    default folder of, without preparing it (what a plan needs, which writes nothing)."""
    folder = Path(data_dir).expanduser()
    shipped = None if is_data_folder(folder) else shipped_default(folder)
    if shipped is None:
        return int(load_dataset(folder).meta["vocab_size"])
    return shipped.get("vocab_size") or shipped_char_vocab_size(shipped["corpus"])


def prepare_once(out: Path, corpus: str = EMBEDDED, **options: Any) -> None:
    """Prepare a shipped corpus into its default folder ``out`` unless it is there, once however
    many processes ask at the same time: torchrun's ranks (on every node, with a shared
    $ATTNLAB_HOME) each prepared it and swapped in their own copy. The first to take the lock
    file beside ``out`` prepares; the others wait for it and find the folder ready."""
    if is_data_folder(out):
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.parent / f".{out.name}.prepare.lock", "a")  # noqa: SIM115 - closed below
    except OSError as e:  # a read-only mount, or ATTNLAB_HOME naming a file
        raise AttnlabError(
            f"cannot prepare the shipped corpus in {out} ({e.strerror or e}): set ATTNLAB_HOME "
            "to a folder you can write, or pass --data"
        ) from None
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process ends)
        if not is_data_folder(out):
            logger.info(f"attnlab: preparing the shipped corpus {corpus!r} in {out}", extra=STDERR)
            prepare([corpus], out=out, **options)


def _shipped_name(shipped: dict[str, Any]) -> str:
    """``shakespeare_char``, ``shakespeare (bpe, vocab 2048)``: a shipped_default, in words."""
    tokenizer = shipped.get("tokenizer")
    return shipped["corpus"] + (
        f" ({tokenizer}, vocab {shipped['vocab_size']})" if tokenizer else ""
    )


def _refuse_other_data(data_dir: Path, meta: dict[str, Any], shipped: dict[str, Any]) -> None:
    """Refuse a shipped corpus's default folder that holds other data (prepared there by hand
    before prepare refused it): presets and studies would train on it as that corpus."""
    provenance = meta.get("provenance") or {}
    held = {
        "corpus": provenance.get("name"),
        "tokenizer": meta.get("tokenizer"),
        "vocab_size": meta.get("vocab_size"),
        "val_fraction": provenance.get("val_fraction"),
    }
    want = {"tokenizer": "char", "vocab_size": held["vocab_size"], **shipped}
    want["val_fraction"] = DEFAULT_VAL_FRACTION
    # a field an older prepare did not record is not held against the folder
    if any(value is not None and value != want[key] for key, value in held.items()):
        raise AttnlabError(
            f"{data_dir} is the folder of the shipped corpus {_shipped_name(shipped)} but holds "
            f"{held['corpus']} ({held['tokenizer']}, vocab {held['vocab_size']}, val fraction "
            f"{held['val_fraction']}); move it away: the corpus is prepared there again on "
            "first use"
        )


def load_dataset(data_dir: str | Path | None = None) -> Dataset:
    """Load a prepared folder; ``None`` is the embedded char corpus, prepared on first use."""
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    shipped = shipped_default(data_dir)
    if shipped is not None and not is_data_folder(data_dir):
        prepare_once(data_dir, **shipped)
    meta = read_meta(data_dir)
    if shipped is not None:
        _refuse_other_data(data_dir, meta, shipped)
    tok = Tokenizer.load(data_dir / TOKENIZER_FILE)
    vocab_size = meta["vocab_size"]
    if tok.vocab_size != vocab_size:
        raise AttnlabError(
            f"{data_dir / TOKENIZER_FILE}: {tok.vocab_size} tokens, meta.json says {vocab_size}"
        )
    max_id = meta.get("max_token_id")  # None: a folder from before prepare recorded it
    if max_id is not None and not (isinstance(max_id, int) and 0 <= max_id < vocab_size):
        raise AttnlabError(
            f"{data_dir / META_FILE}: max_token_id {max_id!r} does not fit the tokenizer's "
            f"{vocab_size} tokens"
        )
    splits = {}
    written = (data_dir / META_FILE).stat().st_mtime  # prepare writes meta.json last
    for split in SPLITS:
        path = data_dir / f"{split}.bin"
        # the recorded largest id stands for a scan of every token (slow on a large corpus), unless
        # the file changed after prepare finished (edited, copied over): then it is read
        trusted = max_id is not None and path.is_file() and path.stat().st_mtime <= written
        splits[split] = read_tokens(path, meta["dtype"])
        if len(splits[split]) != meta[f"{split}_tokens"]:  # a cut file: said before any scan
            raise AttnlabError(
                f"{path}: {len(splits[split])} tokens, meta.json says {meta[f'{split}_tokens']}"
            )
        if not trusted:
            read_tokens(path, meta["dtype"], vocab_size)  # the scan: refuses an id too large
    # after the checks that name what is wrong in the data's own terms: the rest (a tokenizer or
    # meta.json edited, a bin swapped) is a file that is not what prepare wrote
    check_manifest(data_dir)
    return Dataset(data_dir, meta, tok, splits["train"], splits["val"])
