"""Token files: flat uint16/uint32 arrays of token ids, nanoGPT's ``.bin`` layout.

Kept apart from attnlab.data.bins (batch drawing, which needs torch) so that writing and
opening token files, as ``prepare`` does, never imports torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError

DTYPES = ("uint16", "uint32")
_COUNT_CHUNK = 1 << 24  # tokens per bincount in unigram_loss


def _dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


class TokenWriter:
    """A token file written batch by batch (``write``), in the smallest dtype that holds
    ``vocab_size``; it counts the tokens, keeps the largest id (None while empty) and the
    SHA-256 of the bytes written (``sha256``)."""

    def __init__(self, path: str | Path, vocab_size: int) -> None:
        self.path, self.vocab_size = Path(path), vocab_size
        self.dtype = _dtype_for(vocab_size)
        self.tokens, self.max_id = 0, None
        self._digest = hashlib.sha256()
        self._file = self.path.open("wb")

    def write(self, ids: Sequence[int] | np.ndarray) -> None:
        """Append ``ids``, refusing any outside [0, vocab_size)."""
        arr = np.asarray(ids, dtype=np.int64)
        if not arr.size:
            return
        low, high = int(arr.min()), int(arr.max())
        if not 0 <= low <= high < self.vocab_size:
            raise AttnlabError(f"{self.path}: token ids outside [0, {self.vocab_size})")
        data = arr.astype(self.dtype).tobytes()
        self._file.write(data)
        self._digest.update(data)
        self.tokens += arr.size
        self.max_id = high if self.max_id is None else max(self.max_id, high)

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the file's bytes so far."""
        return self._digest.hexdigest()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_tokens(path: str | Path, ids: Sequence[int] | np.ndarray, vocab_size: int) -> str:
    """Write ``ids`` as a flat array of the smallest dtype that holds ``vocab_size``; return it."""
    with TokenWriter(path, vocab_size) as writer:
        writer.write(ids)
    return writer.dtype


def read_tokens(path: str | Path, dtype: str, vocab_size: int | None = None) -> np.ndarray:
    """Memory-map a token file; with ``vocab_size``, check every id is below it."""
    path = Path(path)
    if dtype not in DTYPES:
        raise AttnlabError(f"{path}: unknown token dtype {dtype!r} (expected one of {DTYPES})")
    if not path.is_file():
        raise AttnlabError(f"{path}: token file not found")
    size, itemsize = path.stat().st_size, np.dtype(dtype).itemsize
    if size % itemsize:
        raise AttnlabError(f"{path}: {size} bytes is not a whole number of {dtype} tokens")
    # np.memmap refuses empty files; an empty split is still a valid (if useless) split.
    tokens = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype)
    if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
        raise AttnlabError(f"{path}: token id {int(tokens.max())} >= vocab size {vocab_size}")
    return tokens


def unigram_loss(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """The val tokens' mean cross-entropy (nats) under the train split's token frequencies
    (add-one smoothed): the loss of a model that learned nothing but how often each token is.

    Counted in chunks, so a memory-mapped split of gigabytes is never held whole.
    """
    counts = {}
    for name, ids in (("train", train), ("val", val)):
        total = np.zeros(vocab_size, dtype=np.int64)
        for start in range(0, len(ids), _COUNT_CHUNK):
            total += np.bincount(ids[start : start + _COUNT_CHUNK], minlength=vocab_size)
        counts[name] = total
    logp = np.log(counts["train"] + 1.0) - np.log(counts["train"].sum() + vocab_size)
    return float(-(counts["val"] * logp).sum() / max(1, counts["val"].sum()))
