"""Supervised fine-tuning data: JSONL records, the ChatML template, and response-only targets.

Two record kinds, detected per record:

- instruction pairs ``{"prompt": ..., "response": ...}``, written as ``prompt + "\\n"`` then
  ``response + "<|im_end|>"`` (the end marker is the stop token the model learns to emit);
- conversations ``{"messages": [{"role": ..., "content": ...}, ...]}`` in ChatML::

      <|im_start|>user\\nHello<|im_end|>\\n<|im_start|>assistant\\nHi<|im_end|>\\n

With ``chat=True`` pairs are written as a one-turn ChatML conversation instead.
Only response / assistant tokens (and the ``<|im_end|>`` that closes them) are trained on:
``encode_record`` returns a mask and ``targets`` turns it into next-token targets with -1
(the model's ``ignore_index``) everywhere else.

Only the markup written here (``Markup``) becomes ChatML's control tokens: the text of a prompt,
response or message is encoded as plain text (``Tokenizer.encode_plain``), so ``<|im_end|>``
quoted in the data, or typed by a chat user, is its characters and cannot end or forge a turn.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.data.tokenizer import IM_END, Tokenizer
from attnlab.errors import AttnlabError

IM_START = "<|im_start|>"
SPECIAL_TOKENS = [IM_START, IM_END]
ROLES = ("system", "user", "assistant")
SHIPPED_DIR = Path(__file__).with_name("sft")
SHIPPED = {"instruct": SHIPPED_DIR / "instruct.jsonl.xz", "chat": SHIPPED_DIR / "chat.jsonl.xz"}

Message = dict[str, str]
Segments = list[tuple[str, bool]]  # (text, trained?)


class Markup(str):
    """ChatML's own markup (``<|im_start|>user\\n``, ``<|im_end|>``): the one text encoded with
    its control tokens; every other segment is plain text."""


def chatml_segments(messages: Sequence[Message], add_generation_prompt: bool = False) -> Segments:
    """ChatML as (text, trained) pieces: an assistant's content and closing marker are trained."""
    segments: Segments = []
    for m in messages:
        trained = m["role"] == "assistant"
        segments += [
            (Markup(f"{IM_START}{m['role']}\n"), False),
            (m["content"], trained),
            (Markup(IM_END), trained),
            ("\n", False),
        ]
    if add_generation_prompt:
        segments.append((Markup(f"{IM_START}assistant\n"), False))
    return segments


def format_chatml(messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """The ChatML text of ``messages``, optionally ending with an open assistant turn."""
    return "".join(text for text, _ in chatml_segments(messages, add_generation_prompt))


def record_segments(record: dict[str, Any], chat: bool = False) -> Segments:
    """Segments of one JSONL record (pair or conversation); ``chat`` writes pairs in ChatML."""
    if "messages" in record:
        return chatml_segments(record["messages"])
    if chat:
        return chatml_segments(
            [
                {"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": record["response"]},
            ]
        )
    return [(record["prompt"] + "\n", False), (record["response"], True), (Markup(IM_END), True)]


def segment_ids(tokenizer: Tokenizer, segments: Segments) -> list[list[int]]:
    """Each segment's token ids: control tokens for Markup, plain text for anything else."""
    return [
        tokenizer.encode(text) if isinstance(text, Markup) else tokenizer.encode_plain(text)
        for text, _ in segments
    ]


def response_texts(record: dict[str, Any]) -> list[str]:
    """What a record trains on: its response, or its assistant messages' contents."""
    if "messages" in record:
        return [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    return [record["response"]]


def encode_segments(tokenizer: Tokenizer, segments: Segments) -> tuple[list[int], list[bool]]:
    """Token ids and, per token, whether it is trained on."""
    ids: list[int] = []
    mask: list[bool] = []
    for piece, (_, trained) in zip(segment_ids(tokenizer, segments), segments, strict=True):
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def encode_record(
    tokenizer: Tokenizer, record: dict[str, Any], chat: bool = False
) -> tuple[list[int], list[bool]]:
    """(token ids, trained mask) of one SFT record, in ChatML when ``chat``."""
    return encode_segments(tokenizer, record_segments(record, chat))


def targets(ids: Sequence[int], mask: Sequence[bool]) -> list[int]:
    """Next-token targets for ``ids[:-1]``: ``ids[i + 1]`` where that token is trained, else -1."""
    return [t if m else -1 for t, m in zip(ids[1:], mask[1:], strict=True)]


def _check_record(record: Any, where: str) -> dict[str, Any]:
    """A record must be a pair or a conversation of known roles with string contents."""
    if not isinstance(record, dict):
        raise AttnlabError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        both = [k for k in ("prompt", "response") if k in record]
        if both:  # one of the two would be dropped without a word
            raise AttnlabError(
                f"{where}: holds both messages and {' and '.join(both)}; give a record one or "
                "the other"
            )
        msgs = record["messages"]
        ok = (
            isinstance(msgs, list)
            and msgs
            and all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
                for m in msgs
            )
        )
        if not ok:
            raise AttnlabError(
                f"{where}: messages must be a non-empty list of "
                f"{{'role': one of {'/'.join(ROLES)}, 'content': text}}"
            )
        if not any(m["role"] == "assistant" for m in msgs):
            raise AttnlabError(f"{where}: conversation has no assistant message to train on")
        return record
    if isinstance(record.get("prompt"), str) and isinstance(record.get("response"), str):
        return record
    if "prompt" in record and "response" in record:  # the keys are right, a value is not
        kinds = {k: type(record[k]).__name__ for k in ("prompt", "response")}
        raise AttnlabError(
            f"{where}: prompt and response must be text, got {kinds['prompt']} and "
            f"{kinds['response']}"
        )
    raise AttnlabError(
        f"{where}: expected {{'prompt', 'response'}} or {{'messages': [...]}}, "
        f"got keys {sorted(record)}"
    )


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` (or ``.jsonl.xz``) file, validated; blank lines are skipped."""
    path = Path(path).expanduser()
    opener = lzma.open if path.suffix == ".xz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise AttnlabError(f"{path}: no such file") from None
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise AttnlabError(f"{path}: cannot read ({e})") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise AttnlabError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        records.append(_check_record(record, f"{path}:{n}"))
    if not records:
        raise AttnlabError(f"{path}: no records")
    return records


def _chatml_ids(tokenizer: Tokenizer, messages: Sequence[Message]) -> list[int]:
    """ChatML ids of ``messages`` followed by an open assistant turn."""
    return encode_segments(tokenizer, chatml_segments(messages, add_generation_prompt=True))[0]


def framing_tokens(tokenizer: Tokenizer, system: Sequence[Message], role: str = "user") -> int:
    """Tokens a prompt spends before a single token of a ``role`` message: the system
    message, if any, and the ChatML markers."""
    return len(_chatml_ids(tokenizer, [*system, {"role": role, "content": ""}]))


def _system_and_rest(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """A leading system message (kept whatever is cut), and the messages after it."""
    lead = 1 if len(messages) > 1 and messages[0]["role"] == "system" else 0
    return list(messages[:lead]), list(messages[lead:])


def message_fit(tokenizer: Tokenizer, messages: Sequence[Message], budget: int) -> tuple[int, int]:
    """(tokens of the latest message's text, how many of them a prompt of ``budget`` tokens
    holds): fewer held than there are means fit_history keeps only its last ones."""
    system, rest = _system_and_rest(messages)
    room = budget - framing_tokens(tokenizer, system, rest[-1]["role"])
    tokens = len(tokenizer.encode_plain(rest[-1]["content"]))
    return tokens, min(tokens, room)


def fit_history(tokenizer: Tokenizer, messages: Sequence[Message], budget: int) -> list[int]:
    """ChatML ids of ``messages`` plus an open assistant turn, at most ``budget`` tokens.

    The oldest exchanges go first; a leading system message always stays. If the latest message
    is still too long, the oldest tokens of its text are cut (its ChatML markers stay, so the
    prompt keeps the shape the model was tuned on). Raises AttnlabError when the system message
    and the markers leave no room for a single token of the latest message.
    """
    system, rest = _system_and_rest(messages)
    framing = framing_tokens(tokenizer, system, rest[-1]["role"])
    if framing >= budget:
        held = "the system message and the ChatML markers" if system else "the ChatML markers"
        raise AttnlabError(
            f"no room for the message: {held} take {framing} of the {budget} tokens the prompt "
            "may have"
        )
    while True:
        ids = _chatml_ids(tokenizer, system + rest)
        if len(ids) <= budget:
            return ids
        if len(rest) <= 1:
            break
        rest = rest[2:] if len(rest) > 2 else rest[-1:]
    # the latest message alone is too long: cut the oldest tokens of its text to what fits
    pieces = segment_ids(tokenizer, chatml_segments(system + rest, add_generation_prompt=True))
    at = len(chatml_segments(system)) + 1  # its text: after its "<|im_start|>role\n"
    pieces[at] = pieces[at][len(pieces[at]) - (budget - framing) :]
    return [t for piece in pieces for t in piece]
