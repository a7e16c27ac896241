"""Speaker headers in play text: find them, build the canonical cast, score generated names.

Two header styles are recognised, each a line of its own right after a blank line (or at the
start of the text) and followed by a line of speech:

- ``dot``: the embedded Project Gutenberg corpus, an upper-case name ending in a period at the
  start of the line, optionally followed by a bracketed stage direction
  (``"\\n\\nHELENA.\\nO, were that all!"``, ``"\\n\\nFIRST LORD.\\n"``, ``"\\n\\nPERICLES. [Aside.]\\n"``);
- ``colon``: tinyshakespeare, a capitalised name ending in a colon
  (``"\\n\\nFirst Citizen:\\nBefore we proceed"``, ``"\\n\\nROMEO:\\n"``).

Act/scene titles and bare roman numerals (sonnet numbers) also look like ``dot`` headers and
are excluded. Names are compared exactly (case kept, inner whitespace collapsed).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

STYLES = ("dot", "colon")
_NAME_RES = {
    # upper case words, digits ("1 CITIZEN"), joined by spaces, commas, '&' or inner periods
    "dot": re.compile(r"([A-Z0-9][A-Z0-9'\-]*(?:[ ,.&]+[A-Z0-9'\-]+)*)\.(?:[ \t]*\[[^\n]*)?"),
    # capitalised words, lower-case joining words allowed ("Duchess of York")
    "colon": re.compile(r"([A-Z][A-Za-z'\-]*(?: (?:[A-Z][A-Za-z'\-]*|of|the|and|de|du|la|le))*):"),
}
_NOT_A_SPEAKER = re.compile(r"(?:ACT|SCENE)\b.*|[IVXLC]+")


@dataclass(frozen=True)
class Header:
    """A speaker header: the name and where its line sits in the text (``end`` is the newline)."""

    name: str
    start: int
    end: int


def header_spans(text: str, style: str) -> list[Header]:
    """Every speaker header of ``style`` in ``text``, in order."""
    if style not in STYLES:
        raise ValueError(
            f"style={style!r} is not allowed; choose one of {', '.join(map(repr, STYLES))}"
        )
    name_re = _NAME_RES[style]
    found = []
    lines = text.split("\n")
    start = 0
    for i, line in enumerate(lines):
        after_blank = i == 0 or not lines[i - 1].strip()
        speech_follows = i + 1 < len(lines) and lines[i + 1].strip() != ""
        if after_blank and speech_follows:
            match = name_re.fullmatch(line)
            if match and not _NOT_A_SPEAKER.fullmatch(match.group(1)):
                found.append(Header(" ".join(match.group(1).split()), start, start + len(line)))
        start += len(line) + 1
    return found


def detect_style(text: str) -> str:
    """The style with more headers in ``text`` (``dot`` on a tie)."""
    return max(STYLES, key=lambda s: (len(header_spans(text, s)), s == "dot"))


def extract_headers(text: str, style: str = "auto") -> list[str]:
    """Speaker names in order of appearance; ``auto`` picks the style ``text`` uses most."""
    return [h.name for h in header_spans(text, detect_style(text) if style == "auto" else style)]


def canonical_speakers(train_text: str, style: str = "auto") -> tuple[set[str], str]:
    """(every speaker name heading a speech in the training text, the style used)."""
    style = detect_style(train_text) if style == "auto" else style
    return {h.name for h in header_spans(train_text, style)}, style


def score_names(samples: Iterable[str], canonical: set[str], style: str, top: int = 10) -> dict:
    """Headers found in ``samples`` and how many of them name a real speaker of the training text."""
    names = Counter(n for text in samples for n in extract_headers(text, style))
    total = sum(names.values())
    hits = sum(c for n, c in names.items() if n in canonical)
    invented = Counter({n: c for n, c in names.items() if n not in canonical})
    return {
        "headers": total,
        "canonical_headers": hits,
        "fraction_canonical": hits / total if total else None,
        "distinct_names": len(names),
        "distinct_canonical": sum(1 for n in names if n in canonical),
        "most_common": names.most_common(top),
        "invented": invented.most_common(top),
    }
