"""Build the shipped fine-tuning sets attnlab/data/sft/{instruct,chat}.jsonl.xz.

Both are derived from the embedded corpus, from the TRAIN part of each play only (the held-out
tail that `attnlab prepare` uses for validation never appears), so pretrain -> SFT -> chat SFT
runs offline. Deterministic: the same corpus and seed give byte-identical files.

- instruct: {"prompt", "response"} pairs: continue a speech, name the play of a line, name its
  speaker.
- chat: ChatML conversations of one to three turns about a line (play, speaker, continuation),
  some with a system message.

Usage: python scripts/build_sft.py [--pairs 2400] [--chats 1200] [--seed 0]
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import random
import re
from dataclasses import dataclass
from pathlib import Path

from attnlab.data.chat import SHIPPED
from attnlab.data.corpus import embedded_documents, split_document

# "HAMLET." or "FIRST GENTLEMAN. Some twenty years." (speech on the same line)
SPEAKER = re.compile(r"^([A-Z][A-Z' \-]*[A-Z])\.(?:\s+(.*))?$")
SMALL_WORDS = {"of", "the", "and", "a", "that", "for", "in", "or", "to", "at"}
ROMAN = re.compile(r"^[ivx]+\b")
SYSTEM = "You are a Shakespeare scholar. Answer briefly."


@dataclass
class Speech:
    title: str
    speaker: str
    lines: list[str]


def nice(name: str) -> str:
    """'THE TRAGEDY OF KING LEAR' -> 'The Tragedy of King Lear'; 'HENRY IV,' -> 'Henry IV,'."""

    def word(i: int, w: str) -> str:
        if ROMAN.match(w):
            return w.upper()
        return w if i and w in SMALL_WORDS else w[:1].upper() + w[1:]

    return " ".join(word(i, w) for i, w in enumerate(name.lower().split()))


def speeches(title: str, text: str) -> list[Speech]:
    """Speeches of at least two lines, stage directions dropped."""
    found: list[Speech] = []
    current: Speech | None = None
    for raw in text.splitlines():
        line = raw.strip()
        match = SPEAKER.match(line)
        if match and len(match.group(1)) <= 30:
            current = Speech(nice(title), nice(match.group(1)), [])
            found.append(current)
            line = match.group(2) or ""
        elif not line:
            current = None
        if current is not None and line and not line.startswith("["):
            current.lines.append(line)
    return [s for s in found if len(s.lines) >= 2]


def pair(rng: random.Random, s: Speech) -> dict[str, str]:
    kind = rng.randrange(3)
    i = rng.randrange(len(s.lines) - 1)
    if kind == 0:
        given = s.lines[: i + 1][-2:]
        rest = s.lines[i + 1 : i + 3]
        return {
            "prompt": f"Continue this speech of {s.speaker} from {s.title}:\n" + "\n".join(given),
            "response": "\n".join(rest),
        }
    if kind == 1:
        return {"prompt": f"Which play is this line from?\n{s.lines[i]}", "response": s.title}
    return {"prompt": f"Who speaks this line in {s.title}?\n{s.lines[i]}", "response": s.speaker}


def chat(rng: random.Random, s: Speech) -> dict[str, list[dict[str, str]]]:
    i = rng.randrange(len(s.lines) - 1)
    turns = [
        (f"Which play is this line from?\n{s.lines[i]}", f"It is from {s.title}."),
        ("Who speaks it?", f"{s.speaker} says it."),
        ("How does the speech go on?", "\n".join(s.lines[i + 1 : i + 3])),
    ]
    messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.5 else []
    for user, assistant in turns[: rng.randint(1, 3)]:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


def write_xz(path: Path, records: list[dict]) -> None:
    buf = io.StringIO()
    for r in records:
        buf.write(json.dumps(r, ensure_ascii=False) + "\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    # fixed preset and no filename/mtime in the .xz container: reproducible bytes
    path.write_bytes(lzma.compress(buf.getvalue().encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2400)
    ap.add_argument("--chats", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pool = [
        s
        for title, text in embedded_documents()
        for s in speeches(title, split_document(text, 0.1)[0])
    ]
    rng = random.Random(args.seed)
    write_xz(SHIPPED["instruct"], [pair(rng, rng.choice(pool)) for _ in range(args.pairs)])
    write_xz(SHIPPED["chat"], [chat(rng, rng.choice(pool)) for _ in range(args.chats)])
    for path in SHIPPED.values():
        print(f"{path}: {path.stat().st_size:,} bytes")
    print(f"from {len(pool):,} speeches")


if __name__ == "__main__":
    main()
