"""Pieces the decoding commands (sample, chat) share: announced compiling and streamed text."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any

REPLACEMENT = "\ufffd"  # what a byte-level tokenizer decodes half a UTF-8 character to


def compile_announced(model: Any) -> Any:
    """compile_for_decoding, saying on stderr that it is compiling and how long it took."""
    from attnlab.model.generation import compile_for_decoding

    print("compiling the model for decoding (torch.compile) ...", file=sys.stderr, flush=True)
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
