"""Do generated speaker names belong to the real cast? Headers in play text, the cast, the test.

The seed's name-generation test: sample long texts, pull out every speaker header, and count
how many name a speaker of the training text. Samples are drawn in cached segments: whenever
the context fills the block, the cache is primed again with the last half block, so every
token sees at least block_size / 2 tokens of context at KV-cache speed (``exact_window``
recomputes nanoGPT's full sliding window at every step instead, block_size / 2 times the work).
Same seed, same runs, same device: the same samples and the same report.

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
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.inputs import check_not_file, token_pieces, write_csv
from attnlab.config import check_seed
from attnlab.data.prepare import load_dataset
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.model.generation import generate
from attnlab.plotting import legend_outside, pyplot, save_figure
from attnlab.rundir import shared_data_dir
from attnlab.train.checkpoint import load_pretrained

STYLES = ("dot", "colon")
_NAME_RES = {
    # upper case words, digits ("1 CITIZEN"), joined by spaces, commas, '&' or inner periods
    "dot": re.compile(r"([A-Z0-9][A-Z0-9'\-]*(?:[ ,.&]+[A-Z0-9'\-]+)*)\.(?:[ \t]*\[[^\n]*)?"),
    # capitalised words, lower-case joining words allowed ("Duchess of York")
    "colon": re.compile(r"([A-Z][A-Za-z'\-]*(?: (?:[A-Z][A-Za-z'\-]*|of|the|and|de|du|la|le))*):"),
}
_NOT_A_SPEAKER = re.compile(r"(?:ACT|SCENE)\b.*|[IVXLC]+")

# what it writes into its folder, checked before the work (inputs.check_analysis_out)
FILES = ("names.csv", "names_top.csv", "names.png")


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


def sample_texts(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    samples: int,
    length: int,
    seed: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    prompt: str = "\n",
    exact_window: bool = False,
) -> list[str]:
    """``samples`` texts of ``length`` new tokens after ``prompt``, drawn as one seeded batch."""
    _check_sizes(samples, length)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    # a model whose vocab_size is padded above the tokenizer's would draw ids with no text
    opts = dict(
        temperature=temperature, top_k=top_k, generator=gen, vocab_limit=tokenizer.vocab_size
    )
    out = torch.tensor([tokenizer.encode(prompt)] * samples, dtype=torch.long, device=device)
    start = out.size(1)
    if exact_window:
        out = generate(model, out, length, **opts)
    block, keep = model.config.block_size, max(1, model.config.block_size // 2)
    while out.size(1) - start < length:  # cached segments, each primed with the last half block
        context = out[:, -keep:]
        new = min(length - (out.size(1) - start), block - context.size(1))
        out = torch.cat([out, generate(model, context, new, **opts)[:, context.size(1) :]], dim=1)
    return [tokenizer.decode(row) for row in out.tolist()]


def _check_sizes(samples: int, length: int) -> None:
    if samples < 1 or length < 1:
        raise AttnlabError(f"--samples and --length must be >= 1, got {samples} and {length}")


def _require_char(tokenizer: Tokenizer, source: str | Path) -> None:
    if tokenizer.kind != "char":
        raise AttnlabError(
            f"{source}: the name test needs a char tokenizer (bpe drops the newlines)"
        )


def training_cast(data: str | Path) -> tuple[set[str], str, str]:
    """(canonical speaker names, header style, where they came from) of a data folder's train
    split."""
    dataset = load_dataset(data)
    _require_char(dataset.tokenizer, data)
    text, source = "".join(token_pieces(dataset.tokenizer, dataset.train)), str(dataset.dir)
    names, style = canonical_speakers(text)
    if not names:
        raise AttnlabError(
            f"no speaker headers (NAME. or Name: lines) in the training text of {source}"
        )
    return names, style, source


def name_test(
    runs: list[str | Path],
    samples: int = 30,
    length: int = 2000,
    seed: int = 1337,
    temperature: float = 0.8,
    top_k: int | None = None,
    data: str | Path | None = None,
    exact_window: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """The name test for each run (same seed for all): the cast and one score per run."""
    _check_sizes(samples, length)
    check_seed("seed", seed)
    for run in runs:  # before their data is looked for
        check_not_file(run)
    data_dir = shared_data_dir([str(run) for run in runs], data)
    if data_dir is None:  # the cast of some other text would score the runs against it
        raise AttnlabError(f"{runs[0]} is not a run folder, so its data is unknown: pass --data")
    cast, style, source = training_cast(data_dir)
    report: dict[str, Any] = {
        "samples": samples,
        "length": length,
        "seed": seed,
        "temperature": temperature,
        "top_k": top_k,
        "exact_window": exact_window,
        "style": style,
        "cast_source": source,
        "cast_size": len(cast),
        "runs": {},
    }
    for run in runs:
        model, tokenizer = load_pretrained(run, device=device)
        if tokenizer is None:
            raise AttnlabError(f"{run} has no tokenizer.json; cannot decode samples")
        _require_char(tokenizer, run)  # a model folder of a bpe run: its data was not checked
        texts = sample_texts(
            model, tokenizer, samples, length, seed, temperature, top_k, exact_window=exact_window
        )
        report["runs"][str(run)] = score_names(texts, cast, style)
    return report


def summary_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run: headers found, how many name the cast, distinct names."""
    keys = ("headers", "canonical_headers", "fraction_canonical", "distinct_names")
    return [
        {"run": run, **{k: score[k] for k in (*keys, "distinct_canonical")}}
        for run, score in report["runs"].items()
    ]


def name_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The most common names of each run, each marked canonical or invented."""
    rows = []
    for run, score in report["runs"].items():
        invented = {name for name, _ in score["invented"]}
        rows += [
            {"run": run, "name": name, "count": count, "canonical": name not in invented}
            for name, count in score["most_common"]
        ]
    return rows


def run_labels(runs: Iterable[str]) -> list[str]:
    """Each run folder by the fewest trailing path parts that tell the runs apart: ``seed0``
    alone, but ``vanilla-128/seed0`` and ``kv-bias-112/seed0`` side by side."""
    parts = [Path(run).absolute().parts for run in runs]
    for k in range(1, max(map(len, parts), default=0) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return ["/".join(p) for p in parts]  # the same folder twice


def plot(report: dict[str, Any], path: str | Path) -> Any:
    """Per run, stacked bars of headers (left) and of distinct names (right) naming the real
    cast or invented, the fraction canonical written on each. Returns the Figure."""
    plt = pyplot()
    runs = list(report["runs"])
    labels = run_labels(runs)
    fig, axes = plt.subplots(1, 2, figsize=(4 + 2 * len(runs), 4), layout="constrained")
    for ax, total_key, real_key, what in (
        (axes[0], "headers", "canonical_headers", "speaker headers"),
        (axes[1], "distinct_names", "distinct_canonical", "distinct names"),
    ):
        real = [report["runs"][r][real_key] for r in runs]
        invented = [report["runs"][r][total_key] - n for r, n in zip(runs, real, strict=True)]
        ax.bar(labels, real, color="tab:green", label="in the training cast")
        ax.bar(labels, invented, bottom=real, color="tab:orange", label="invented")
        for x, (n, m) in enumerate(zip(real, invented, strict=True)):
            share = f"{100 * n / (n + m):.0f}% real" if n + m else "none found"
            ax.annotate(share, (x, n + m), ha="center", va="bottom", fontsize=8)
        ax.set(xlabel="run", ylabel=f"{what} (count)", title=f"{what} in the samples")
        ax.margins(y=0.15)
    legend_outside(fig, list(axes), ncol=2)
    fig.suptitle(
        f"name test of {' and '.join(labels)}: {report['samples']} samples x {report['length']} "
        f"tokens, cast of {report['cast_size']}",
        fontsize=9,
    )
    save_figure(fig, path)
    return fig


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    """names.csv (per run), names_top.csv (most common names) and names.png in ``out``."""
    written = [
        write_csv(out / FILES[0], summary_rows(report)),
        write_csv(out / FILES[1], name_rows(report)),
    ]
    plot(report, out / FILES[2])
    return [*written, out / FILES[2]]
