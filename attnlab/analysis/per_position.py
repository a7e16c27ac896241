"""Per-position loss of two runs on the same text, and where on it B beats A.

Windows are the same sequential ``block_size`` windows as attnlab.analysis.loss.split_loss, so
the mean of the per-position losses is that function's loss. Positions are targets: entry ``i``
is the loss of predicting ``tokens[i + 1]``. Both runs score every validation token in the same
windows (the smaller of the two block sizes); the positions where B's loss is lowest relative to
A's are listed with their context (``\\n\\nCUR -> T``), and B - A is grouped by column in the
line and by distance from the start of the latest speaker header (the seed's finding: K/V-bias
wins mid-name).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import token_pieces, write_csv
from attnlab.analysis.names import detect_style, header_spans
from attnlab.data.bins import sequential_windows
from attnlab.data.prepare import is_data_folder, load_dataset
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_writable
from attnlab.plotting import legend_outside, pyplot, save_figure
from attnlab.rundir import is_run_folder, shared_data_dir
from attnlab.train.checkpoint import CONFIG, load_pretrained

# groups beyond these are pooled into one last bucket, so a table stays readable
MAX_COLUMN = 80
MAX_HEADER_DISTANCE = 40
GROUPINGS = ("by_region", "by_column", "by_header_distance")
# the first line of each table write_tables writes: a file that starts otherwise is not its own
TOP_HEADER = "rank,position,context,target,loss_a,loss_b,a_minus_b"
GROUP_HEADER = "group,count,loss_a,loss_b,b_minus_a"


@torch.no_grad()
def per_position_losses(
    model: torch.nn.Module, tokens: np.ndarray, block_size: int | None = None, batch_size: int = 16
) -> np.ndarray:
    """Cross-entropy of every target ``tokens[1:]`` (float64, length ``len(tokens) - 1``).

    ``block_size`` (at most the model's) sets the window; pass the same value to compare models
    with different context lengths on identical contexts.
    """
    block = block_size or model.config.block_size
    if block > model.config.block_size:
        raise ValueError(f"block_size={block} exceeds the model's {model.config.block_size}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        for x, y in sequential_windows(tokens, block, batch_size, device):
            logits, _ = model(x, all_logits=True)
            losses = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)).float(),
                y.view(-1),
                ignore_index=-1,
                reduction="none",
            )
            out.append(losses[y.view(-1) != -1].double().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out).numpy()


def char_offsets(pieces: Sequence[str]) -> np.ndarray:
    """Start offset of each token in ``"".join(pieces)``."""
    return np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]]).astype(np.int64)


def line_columns(text: str, offsets: np.ndarray) -> np.ndarray:
    """Column (characters since the last newline) of the character at each offset."""
    newline = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == ord("\n")
    # index of the last newline at or before each character, -1 if none
    last = np.maximum.accumulate(np.where(newline, np.arange(len(text)), -1))
    before = np.concatenate([[-1], last[:-1]])  # the last newline strictly before each character
    return offsets - before[offsets] - 1


def header_distances(text: str, offsets: np.ndarray, style: str) -> tuple[np.ndarray, np.ndarray]:
    """(characters since the start of the latest speaker header line, -1 before any; in-header flag)."""
    starts = np.full(len(text) + 1, -1, dtype=np.int64)
    ends = np.full(len(text) + 1, -1, dtype=np.int64)
    for h in header_spans(text, style):
        starts[h.start], ends[h.start] = h.start, h.end
    starts, ends = np.maximum.accumulate(starts), np.maximum.accumulate(ends)
    latest, latest_end = starts[offsets], ends[offsets]
    distance = np.where(latest >= 0, offsets - latest, -1)
    return distance, (latest >= 0) & (offsets <= latest_end)


def difference_row(
    label: str, mask: np.ndarray, loss_a: np.ndarray, loss_b: np.ndarray
) -> dict[str, Any]:
    """Count, mean losses and B - A over the targets in ``mask``."""
    a, b = float(loss_a[mask].mean()), float(loss_b[mask].mean())
    return {"group": label, "count": int(mask.sum()), "loss_a": a, "loss_b": b, "b_minus_a": b - a}


def grouped_difference(
    keys: np.ndarray, loss_a: np.ndarray, loss_b: np.ndarray, cap: int
) -> list[dict[str, Any]]:
    """One difference_row per key (keys >= cap pooled as "cap+"; negative keys as "none")."""
    labels = np.where(keys < 0, -1, np.minimum(keys, cap))
    return [
        difference_row(
            "none" if key < 0 else (f"{cap}+" if key == cap else str(int(key))),
            labels == key,
            loss_a,
            loss_b,
        )
        for key in np.unique(labels)
    ]


@dataclass
class Comparison:
    """Per-target losses of two models on one token stream (target i is token i + 1)."""

    loss_a: np.ndarray
    loss_b: np.ndarray
    pieces: list[str]  # text of every token, targets included
    block_size: int

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def escape(text: str) -> str:
    """One-line form of a text snippet: backslash, newline and tab spelled out."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def compare(
    run_a: str | Path,
    run_b: str | Path,
    data: str | Path | None = None,
    max_tokens: int | None = None,
    batch_size: int = 16,
    device: str = "cpu",
) -> Comparison:
    """Score the validation split of ``data`` (default: the runs' data) with both runs."""
    if max_tokens is not None and max_tokens < 1:
        raise AttnlabError(f"--max-tokens must be >= 1, got {max_tokens}")
    if Path(run_a).expanduser().resolve() == Path(run_b).expanduser().resolve():
        raise AttnlabError(f"RUN_A and RUN_B are both {run_a}; compare two different runs")
    dataset = load_dataset(shared_data_dir([str(run_a), str(run_b)], data))
    tokens = dataset.val if max_tokens is None else dataset.val[: max_tokens + 1]
    models = []
    for run in (run_a, run_b):
        model, tokenizer = load_pretrained(run, device=device)
        if tokenizer is not None and tokenizer.hf.get_vocab() != dataset.tokenizer.hf.get_vocab():
            raise AttnlabError(f"{run} uses another tokenizer than the data folder {dataset.dir}")
        models.append(model)
    block = min(m.config.block_size for m in models)
    loss_a, loss_b = (per_position_losses(m, tokens, block, batch_size) for m in models)
    return Comparison(loss_a, loss_b, token_pieces(dataset.tokenizer, tokens), block)


def top_positions(cmp: Comparison, n: int = 20, context: int = 12) -> list[dict[str, Any]]:
    """The ``n`` targets where B's loss is lowest relative to A's, with their context."""
    check_listing(n, context)
    gain = cmp.loss_a - cmp.loss_b
    rows = []
    for rank, i in enumerate(np.argsort(-gain, kind="stable")[:n], start=1):
        before = "".join(cmp.pieces[max(0, int(i) + 1 - context) : i + 1])[-context:]
        rows.append(
            {
                "rank": rank,
                "position": int(i) + 1,
                "context": escape(before),
                "target": escape(cmp.pieces[i + 1]),
                "loss_a": float(cmp.loss_a[i]),
                "loss_b": float(cmp.loss_b[i]),
                "a_minus_b": float(gain[i]),
            }
        )
    return rows


def groupings(cmp: Comparison) -> dict[str, list[dict[str, Any]]]:
    """B - A inside speaker headers vs speech, by column in the line, and by distance from the
    first character of the latest speaker header line."""
    text = cmp.text
    offsets = char_offsets(cmp.pieces)[1:]  # targets only
    distance, in_header = header_distances(text, offsets, detect_style(text))
    regions = [
        ("header", in_header),
        ("speech", (distance >= 0) & ~in_header),
        ("before any header", distance < 0),
    ]
    return {  # the keys are GROUPINGS
        "by_region": [
            difference_row(name, mask, cmp.loss_a, cmp.loss_b)
            for name, mask in regions
            if mask.any()
        ],
        "by_column": grouped_difference(
            line_columns(text, offsets), cmp.loss_a, cmp.loss_b, MAX_COLUMN
        ),
        "by_header_distance": grouped_difference(
            distance, cmp.loss_a, cmp.loss_b, MAX_HEADER_DISTANCE
        ),
    }


def plot(groups: dict[str, list[dict[str, Any]]], path: str | Path, run_a: str, run_b: str) -> Any:
    """B - A by region (bars), by column in the line and by distance from the latest speaker
    header (lines), each with the zero line; counts under the region bars. Returns the Figure."""
    plt = pyplot()
    fig, (ax_r, ax_c, ax_h) = plt.subplots(
        1, 3, figsize=(13, 4.2), layout="constrained", gridspec_kw={"width_ratios": [1.6, 2, 2]}
    )
    regions = groups["by_region"]
    ax_r.bar(  # names wrapped: side by side, "speech (479,828)" ran into "before any header"
        [f"{textwrap.fill(r['group'], 10)}\n({r['count']:,})" for r in regions],
        [r["b_minus_a"] for r in regions],
        color="tab:purple",
        alpha=0.7,
        label="B - A per region (targets)",
    )
    ax_r.set(ylabel="loss B - A (nats per token)", xlabel="region (targets)", title="by region")
    for ax, name, xlabel, title in (
        (ax_c, "by_column", "column in the line (characters)", "by column"),
        (ax_h, "by_header_distance", "characters since the header began", "by header"),
    ):
        rows = [r for r in groups[name] if r["group"] != "none"]
        xs = [int(r["group"].rstrip("+")) for r in rows]
        ax.plot(xs, [r["b_minus_a"] for r in rows], marker=".", color="tab:purple", label="B - A")
        ax.set(xlabel=xlabel, ylabel="loss B - A (nats per token)", title=title)
        ax.set_xlabel(xlabel + (f" ({rows[-1]['group']} pooled)" if rows else ""))
    for ax in (ax_r, ax_c, ax_h):
        ax.axhline(0, color="gray", lw=0.8, ls="--", label="no difference (below: B better)")
    legend_outside(fig, [ax_r, ax_c, ax_h], ncol=3)
    fig.suptitle(f"per-position validation loss: B = {run_b} against A = {run_a}", fontsize=10)
    save_figure(fig, path)
    return fig


def check_listing(top: int, context: int) -> None:
    """Refuse a --top or --context that lists nothing or slices backwards."""
    if top < 1 or context < 0:
        raise AttnlabError(f"--top must be >= 1 and --context >= 0, got {top} and {context}")


def table_paths(out: Path) -> list[Path]:
    """What write_tables writes for ``out``: the top CSV, one CSV per grouping, the PNG."""
    return [
        out,
        *(out.with_name(f"{out.stem}_{g}.csv") for g in GROUPINGS),
        out.with_suffix(".png"),
    ]


def _first_line(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError):  # a folder, unreadable, binary
        return None


def check_out(out: Path) -> None:
    """Refuse an --out that write_tables cannot write, or whose files it did not write: a .csv
    path, and every existing file there empty or a table it wrote (its PNG only beside its CSV)."""
    if out.suffix != ".csv":
        raise AttnlabError(
            f"--out {out} must name a .csv file (the grouped tables and the PNG go next to it)"
        )
    # folders attnlab writes whole and replaces whole: tables put there would later be lost
    folder = out.parent
    kind = (
        "a prepared data folder"
        if is_data_folder(folder)
        else "a model folder"
        if (folder / CONFIG).is_file() and not is_run_folder(folder)
        else None
    )
    if kind is not None:
        raise AttnlabError(
            f"--out {out} would put tables into {folder}, {kind} that attnlab replaces whole; "
            "choose another --out"
        )
    for path in table_paths(out):
        if not (path.exists() or path.is_symlink()):
            continue
        if path.suffix == ".png":
            ours = path.is_file() and _first_line(out) == TOP_HEADER
        else:
            ours = _first_line(path) in ("", TOP_HEADER if path == out else GROUP_HEADER)
        if not ours:
            raise AttnlabError(
                f"{path} exists and is not one of analyze per-position's files; choose another --out or move it"
            )
    check_writable(out.parent)  # before the runs are scored


def write_tables(
    cmp: Comparison,
    out: Path,
    top: int = 20,
    context: int = 12,
    runs: tuple[str, str] = ("A", "B"),
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], list[Path]]:
    """The top positions to ``out`` (CSV), each grouping next to it as ``out``_NAME.csv and the
    figure of the groupings as ``out`` with .png: (top rows, groupings, paths written)."""
    check_out(out)
    rows, groups = top_positions(cmp, top, context), groupings(cmp)
    written = [write_csv(out, rows, mark=False)]  # a file the user named, in their folder
    for name, group in groups.items():
        written.append(write_csv(out.with_name(f"{out.stem}_{name}.csv"), group, mark=False))
    plot(groups, out.with_suffix(".png"), *runs)
    return rows, groups, [*written, out.with_suffix(".png")]
