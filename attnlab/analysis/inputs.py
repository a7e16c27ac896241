"""What the analyses read (a run, validation windows, token texts), and how they run a model with its attention captured.

A run (or model folder) and validation windows ``x`` [N, T]; ``captured`` runs the model with
``capture={}`` (see Context.keep: keys ``layer{L}.r{m}.weights|v|out|gate`` and ``layer{L}.F``)
in small batches, so no [N, H, T, T] tensor is held for all N at once. Used by
attnlab.analysis.gates, entropy, hull and attention, and by study reports.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from attnlab.data.prepare import load_dataset
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import atomic_path
from attnlab.plotting import check_figure_out
from attnlab.rundir import is_run_folder, run_data_dir
from attnlab.train.checkpoint import load_pretrained

BATCH = 8


@dataclass
class Inputs:
    """What an analysis reads: the model, its tokenizer and validation windows (x, y) [N, T],
    and the run's name for figure titles."""

    model: torch.nn.Module
    tokenizer: Any
    x: torch.Tensor
    y: torch.Tensor
    name: str = "model"


def validation_windows(
    tokens: np.ndarray, block_size: int, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` complete consecutive block_size windows of a split (no padding)."""
    n = min(n, (len(tokens) - 1) // block_size)
    if n < 1:
        raise AttnlabError(
            f"the split has {len(tokens)} tokens: fewer than one window of {block_size + 1}"
        )
    chunk = torch.from_numpy(np.asarray(tokens[: n * block_size + 1], dtype=np.int64))
    return chunk[:-1].view(n, block_size), chunk[1:].view(n, block_size)


def check_not_file(run: str | Path) -> None:
    """Refuse a RUN that is a plain file (a spec, a .pt), first: it was otherwise taken for a
    folder to write RUN/analysis into, or reported as a folder holding no checkpoint."""
    if Path(run).expanduser().is_file():
        raise AttnlabError(f"{run} is a file, not a run or model folder")


def load_inputs(run: str, data: str | None, sequences: int, device: str = "cpu") -> Inputs:
    """A run (or model folder) and ``sequences`` windows of its validation split (or ``data``'s)."""
    check_not_file(run)
    if sequences < 1:  # else validation_windows says the split is too short
        raise AttnlabError(f"--sequences must be >= 1, got {sequences}")
    model, tokenizer = load_pretrained(run, device=device)
    data_dir = data or run_data_dir(run)
    if data_dir is None:
        raise AttnlabError(f"{run} is not a run folder, so its data is unknown: pass --data")
    dataset = load_dataset(data_dir)
    dataset.check_model(run, model.config.vocab_size, tokenizer)
    x, y = validation_windows(dataset.val, model.config.block_size, sequences)
    return Inputs(model, tokenizer or dataset.tokenizer, x.to(device), y.to(device), str(run))


def load_baseline(path: str, like: torch.nn.Module, device: str = "cpu") -> torch.nn.Module:
    """A comparison model that can read the same windows (same block_size and vocabulary)."""
    check_not_file(path)
    model, _ = load_pretrained(path, device=device)
    for field in ("block_size", "vocab_size"):
        if getattr(model.config, field) != getattr(like.config, field):
            raise AttnlabError(
                f"baseline {path} has {field}={getattr(model.config, field)}, the run has "
                f"{getattr(like.config, field)}: they must read the same windows"
            )
    return model


def rounds_of(model: torch.nn.Module) -> int:
    """The model's boosting rounds (1 for plain attention)."""
    return int(model.config.boost_rounds)


def require_boosted(model: torch.nn.Module, what: str) -> None:
    """Refuse ``what`` (an analysis) for a model with a single attention round."""
    if rounds_of(model) < 2:
        raise AttnlabError(
            f"{what} needs a boosted model (boost_rounds >= 2); this one has 1 round"
        )


@torch.no_grad()
def captured(model: torch.nn.Module, x: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor, dict]]:
    """(rows, logits [b, T, V], capture) for consecutive batches of the windows x."""
    model.eval()
    for start in range(0, x.size(0), BATCH):
        rows = slice(start, min(start + BATCH, x.size(0)))
        capture: dict[str, torch.Tensor] = {}
        logits, _ = model(x[rows], capture=capture, all_logits=True)
        yield rows, logits, capture


def token_pieces(tokenizer: Tokenizer, tokens: np.ndarray) -> list[str]:
    """The text of each token: a lookup table over the vocabulary, not one decode per token."""
    table = np.array([tokenizer.decode([i]) for i in range(tokenizer.vocab_size)], dtype=object)
    return table[np.asarray(tokens, dtype=np.int64)].tolist()


def evenly_spaced(length: int, count: int) -> list[int]:
    """``count`` distinct positions spread over 0..length-1, always including the last."""
    return sorted({round(float(p)) for p in np.linspace(0, length - 1, min(count, length))})


# seconds before a progress bar appears: a quick analysis stays silent
PROGRESS_DELAY_S = 2.0


def terminal_bar(total: int, desc: str, unit: str, show: bool) -> tqdm:
    """A progress bar on stderr where stderr is a terminal and the work outlasts
    PROGRESS_DELAY_S, cleared when done; off a terminal nothing, as in training (a bar would be
    lines of carriage returns in a log)."""
    return tqdm(
        total=total,
        disable=not (show and sys.stderr.isatty()),
        file=sys.stderr,
        delay=PROGRESS_DELAY_S,
        leave=False,
        unit=unit,
        unit_scale=True,
        dynamic_ncols=True,
        desc=desc,
    )


# the file that marks a folder as analyses' output, which later analyses may write into again;
# it lists, one a line, the files they wrote there: the only ones a later analysis replaces
ANALYSIS_MARK = ".attnlab-analysis"


def is_analysis_folder(folder: Path) -> bool:
    """Whether ``folder`` was written by an analysis (it holds the ANALYSIS_MARK file)."""
    return (folder / ANALYSIS_MARK).is_file()


def analysis_files(folder: Path) -> set[str]:
    """The names of the files analyses wrote into ``folder`` (none: no mark, or unreadable)."""
    try:
        return set((folder / ANALYSIS_MARK).read_text(encoding="utf-8").splitlines())
    except (OSError, UnicodeDecodeError):
        return set()


def check_analysis_out(out: Path, names: Sequence[str]) -> None:
    """Refuse, before the work, to write ``names`` into ``out`` where one of them is a file no
    analysis wrote (a CSV not in the mark's list, a PNG without save_figure's mark)."""
    written = analysis_files(out)
    for name in names:
        path = out / name
        if path.suffix == ".png":
            check_figure_out(path)
        elif (path.exists() or path.is_symlink()) and name not in written:
            raise AttnlabError(
                f"{path} exists and was not written by an attnlab analysis; choose another "
                "--out or move it"
            )


def default_analysis_dir(run: str | Path, name: str = "RUN") -> Path:
    """RUN/analysis, the default output of an analysis of ``run``, for a run folder only.

    A model folder (an export, a run's best/) is replaced whole by the next export or
    checkpoint, and export refuses a folder holding anything else: an analysis written into it
    would be lost or in the way, so such a RUN needs --out.
    """
    check_not_file(run)
    folder = Path(run)
    if folder.is_dir() and not is_run_folder(folder):
        raise AttnlabError(
            f"{name} {run} is not a run folder (no {name}/analysis/ to write into); pass --out"
        )
    return folder / "analysis"


def write_csv(path: Path, rows: Sequence[dict[str, Any]], mark: bool = True) -> Path:
    """Rows of one shape to CSV (columns in the first row's order; no rows: an empty file);
    ``mark`` marks the folder as an analysis folder (see ANALYSIS_MARK)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mark and path.name not in analysis_files(path.parent):
        with (path.parent / ANALYSIS_MARK).open("a", encoding="utf-8") as f:
            f.write(f"{path.name}\n")
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        if rows:
            writer.writeheader()
        writer.writerows(rows)
    return path
