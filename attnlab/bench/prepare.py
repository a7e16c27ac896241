"""`attnlab bench prepare`: prepare's speed and peak memory against the tokenizers library's
batch encode of the same text, in the same process.

Each corpus size gets a corpus made of perturbed copies of the embedded one (in every copy a
seeded 1 % of the lowercase letters changed, so each copy brings new words), written to a
scratch folder and deleted afterwards. Each (corpus, tokenizer) runs in a fresh process:
``prepare`` (its wall time, and the process's peak RSS once it returns), then
``encode_batch_fast`` of the library on the same text, cut in the same pieces, with the
tokenizer prepare wrote (the encode calls alone are timed). The ratio is prepare's whole time
(reading, tokenizer training, encoding, writing) over the library's encode time; CPU seconds
are given beside wall seconds, since a busy machine stretches the latter.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from attnlab.data.corpus import embedded_documents
from attnlab.data.prepare import prepare
from attnlab.data.tokenizer import BATCH_PIECES, PIECE_CHARS, Tokenizer

PERTURBED = 0.01  # share of a copy's lowercase letters changed


def make_corpus(path: Path, nbytes: int) -> int:
    """Write about ``nbytes`` of perturbed copies of the embedded corpus to ``path``, ending at a
    line boundary; return the bytes written."""
    base = np.frombuffer("\n\n".join(t for _, t in embedded_documents()).encode(), dtype=np.uint8)
    letters = np.flatnonzero((base >= ord("a")) & (base <= ord("z")))
    written, copy = 0, 0
    with path.open("wb") as f:
        while written < nbytes:
            rng = np.random.default_rng(copy)
            text = base.copy()
            changed = rng.choice(letters, size=int(len(letters) * PERTURBED), replace=False)
            text[changed] = rng.integers(ord("a"), ord("z") + 1, size=len(changed), dtype=np.uint8)
            data = text[: nbytes - written].tobytes()
            if len(data) < len(text):  # the last copy: cut at a line boundary
                data = data[: data.rfind(b"\n") + 1]
            f.write(data)
            written, copy = written + len(data), copy + 1
            if len(data) < len(text):
                break
    return written


def _usage() -> tuple[int, float]:
    """This process's peak resident memory in bytes and CPU seconds so far (all its threads:
    the library encodes on every core)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = usage.ru_maxrss * 1024  # Linux reports kB
    status = Path("/proc/self/status")
    if status.is_file():  # ru_maxrss survives exec: it would count the parent that forked us
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
        peak = int(line.split()[1]) * 1024
    return peak, usage.ru_utime + usage.ru_stime


def _library_encode(corpus: Path, tok: Tokenizer) -> tuple[float, float]:
    """Wall and CPU seconds the library's ``encode_batch_fast`` takes over ``corpus``'s text,
    cut where prepare cuts it, in batches as large (reading and cutting not counted)."""
    wall = cpu = 0.0
    batch, rest = [], ""

    def encode(pieces: list[str]) -> None:
        nonlocal wall, cpu
        started, cpu_started = time.perf_counter(), _usage()[1]
        tok.hf.encode_batch_fast(pieces, add_special_tokens=False)
        wall, cpu = wall + time.perf_counter() - started, cpu + _usage()[1] - cpu_started

    with corpus.open(encoding="utf-8") as f:
        while text := f.read(1 << 20):
            rest, start = rest + text, 0
            while (cut := tok.safe_cut(rest, start + PIECE_CHARS)) is not None:
                batch.append(rest[start:cut])
                start = cut
                if len(batch) == BATCH_PIECES:
                    encode(batch)
                    batch = []
            rest = rest[start:]
    encode([*batch, rest])
    return wall, cpu


def _measure_one(corpus: Path, tokenizer: str, vocab_size: int | None, out: Path) -> dict:
    """prepare then the library's encode, in this (fresh) process."""
    imports_rss, cpu_started = _usage()
    started = time.perf_counter()
    prepare([str(corpus)], tokenizer, vocab_size, out)
    prepare_s = time.perf_counter() - started
    peak, cpu = _usage()
    encode_s, encode_cpu = _library_encode(corpus, Tokenizer.load(out))
    return {
        "prepare_s": prepare_s,
        "prepare_cpu": cpu - cpu_started,
        "peak_rss": peak,
        "imports_rss": imports_rss,
        "encode_s": encode_s,
        "encode_cpu": encode_cpu,
    }


def measure(corpus: Path, tokenizer: str, vocab_size: int | None, scratch: Path) -> dict:
    """``_measure_one`` in a fresh process, so that its peak memory is prepare's alone."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        out = scratch / f"data-{tokenizer}"
        return pool.submit(_measure_one, corpus, tokenizer, vocab_size, out).result()


def row(size: int, tokenizer: str, vocab_size: int | None, result: dict) -> list[str]:
    """A table row: corpus MB, tokenizer; prepare's wall and CPU seconds, MB/s, peak RSS (and the
    imports' share); the library encode's wall and CPU seconds and MB/s; prepare's wall time
    over the encode's."""
    mb = size / 1e6
    return [
        f"{mb:,.0f}",
        tokenizer if vocab_size is None else f"{tokenizer} {vocab_size:,}",
        f"{result['prepare_s']:.1f}",
        f"{result['prepare_cpu']:.1f}",
        f"{mb / result['prepare_s']:.1f}",
        f"{result['peak_rss'] / 1e6:,.0f}",
        f"{result['imports_rss'] / 1e6:,.0f}",
        f"{result['encode_s']:.1f}",
        f"{result['encode_cpu']:.1f}",
        f"{mb / result['encode_s']:.1f}",
        f"{result['prepare_s'] / result['encode_s']:.2f}x",
    ]


HEADER = [
    "corpus MB",
    "tokenizer",
    "prepare s",
    "CPU s",
    "MB/s",
    "peak RSS MB",
    "imports MB",
    "batch encode s",
    "CPU s",
    "MB/s",
    "prepare/encode",
]
