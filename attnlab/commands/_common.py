"""Pieces the command modules share: registering sub-commands and typing path arguments; for
the decoding commands (sample, chat), announced compiling and streamed text; and --threads,
which bench takes too."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
import sys
import time
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from attnlab.config import check_seed
from attnlab.errors import ConfigError

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes half a UTF-8 character to


def path_arg(text: str) -> str:
    """The argparse ``type`` of every argument that names a file or folder: the CLI refuses an
    empty one (it meant the default or the current folder, silently) and one that is not UTF-8
    (it failed in tensorboard, JSON or tokenizers after writing had begun) before the command
    runs. The value stays the text given."""
    return text


def register_all(subparsers: argparse._SubParsersAction, package: ModuleType) -> None:
    """Import every module of ``package`` (skipping private ones) and call its ``register``."""
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}").register(subparsers)


def silence_stdout() -> None:
    """Point stdout at /dev/null once its reader went away: the interpreter's last flush would
    otherwise fail and complain."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


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
