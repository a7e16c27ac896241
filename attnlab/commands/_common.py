"""Pieces the decoding commands (sample, chat) share: announced compiling and streamed text;
and --threads, which bench takes too."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from attnlab.cli import silence_stdout
from attnlab.config import check_seed
from attnlab.errors import ConfigError

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes half a UTF-8 character to


def check_sampling_args(args: Any) -> None:
    """The sampling options of sample and chat, refused before the model is loaded."""
    from attnlab.model.generation import check_sampling

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    if getattr(args, "num_samples", 1) < 1:
        raise ConfigError(f"num_samples={args.num_samples} must be >= 1")
    check_seed("seed", args.seed)


def apply_threads(threads: int | None) -> None:
    """--threads: torch's intra-op threads, from 1 to this machine's CPU count (None: torch's)."""
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {threads}")
    cpus = os.cpu_count() or 1
    if threads > cpus:
        raise ConfigError(f"--threads {threads} is more than the {cpus} CPUs here")
    import torch

    torch.set_num_threads(threads)


@contextlib.contextmanager
def quiet_broken_pipe() -> Iterator[None]:
    """End quietly when the reader of stdout goes away (``attnlab sample | head``)."""
    try:
        yield
    except BrokenPipeError:  # unlike main's handler, the command still ends with status 0
        silence_stdout()


def compile_announced(model: Any) -> Any:
    """compile_for_decoding, saying on stderr that it is compiling and how long it took."""
    from attnlab.model.generation import compile_for_decoding

    print(
        "compiling the decoding step (torch.compile; slow the first time, then served from "
        "torch's compile cache) ...",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    model = compile_for_decoding(model)
    print(f"compiled in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return model


def echo_tokens(tokenizer: Any, before: list[int], tokens: Iterable[int], stop: set[int]) -> str:
    """Print the text of ``tokens`` as they arrive (stopping at one in ``stop``); return it.

    The whole text is decoded again each time (a BPE token's spacing depends on its neighbours)
    and only what is new is printed; a half-decoded character at the end waits for the next token.
    """
    ids, shown = list(before), tokenizer.decode(before)
    start = len(shown)
    for token in tokens:
        if token in stop:
            break
        ids.append(token)
        text = tokenizer.decode(ids).rstrip(REPLACEMENT)
        if text.startswith(shown):
            print(text[len(shown) :], end="", flush=True)
            shown = text
    final = tokenizer.decode(ids)
    print(final[len(shown) :] if final.startswith(shown) else "", end="", flush=True)
    return final[start:]
