"""Every gate a model's mechanisms keep, per layer and channel; and the boosting gates per round
and dimension (the GBA paper's Figure 3).

A mechanism hands its gate scores to analyses with ``ctx.keep(f"{name}.gate", g)`` and declares
the names and the range of the scores in its SPEC's ``gates`` (the boosted rounds' ``r1`` ...,
the value gate's 1 + tanh, the output gate's sigmoid, K/V-bias's GRU gate). For each gate and
layer: the mean per channel, the mean, std and sparsity of all scores (the fraction below
SPARSE_BELOW, the reading of Qiu et al. 2025, whose output gate scores are mostly near zero),
and their distribution.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, require_boosted, rounds_of, write_csv
from attnlab.errors import AttnlabError
from attnlab.model import mechanisms
from attnlab.plotting import legend_outside, pyplot, save_figure, series_styles

# what it writes into its folder, checked before the work (inputs.check_analysis_out)
FILES = ("gates.csv", "gate_summary.csv", "gates.png")
SPARSE_BELOW = 0.1
BINS = 40  # of the distribution, over the gate's declared range
_GATE_KEY = re.compile(r"layer(\d+)\.(.+)\.gate")


@dataclass
class GateStats:
    """One gate's scores over the windows and positions, per layer that has it."""

    name: str  # as kept: "r1", "value_gate", "output_gate", "m_gate"
    low: float  # the range its scores lie in (the SPEC's)
    high: float
    layers: list[int]
    dim_means: np.ndarray  # [layers, channels]
    mean: np.ndarray  # [layers]
    std: np.ndarray  # [layers]
    sparsity: np.ndarray  # [layers]: fraction of the scores below SPARSE_BELOW
    hist: np.ndarray  # [layers, BINS]: fraction of the scores per bin of (low, high)


def gate_ranges(model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """The gate name patterns of the mechanisms ``model`` enables, with their ranges."""
    found = {
        name: span
        for spec in mechanisms.specs()
        if spec.enabled(model.config)
        for name, span in spec.gates.items()
    }
    if not found:
        switches = [f for spec in mechanisms.specs() if spec.gates for f in spec.switch]
        raise AttnlabError(
            f"the gate analysis needs a model with a gate (one of {', '.join(switches)} turned "
            "on); this one has none"
        )
    return found


def _range_of(name: str, ranges: dict[str, tuple[float, float]]) -> tuple[float, float]:
    for pattern, span in ranges.items():  # "r{m}" is one gate per boosting round
        if re.fullmatch(re.escape(pattern).replace(r"\{m\}", r"\d+"), name):
            return span
    raise ValueError(f"gate {name!r} is kept but no enabled mechanism declares it in its SPEC")


@dataclass
class _Sums:
    """Running sums of one gate in one layer (float64: millions of scores)."""

    channels: torch.Tensor  # [D] sum of the scores per channel
    hist: torch.Tensor  # [BINS] count per bin
    squares: float = 0.0
    n: int = 0
    below: int = 0

    def add(self, g: torch.Tensor, low: float, high: float) -> None:
        self.channels += g.reshape(-1, g.size(-1)).sum(dim=0)
        self.hist += torch.histc(g, BINS, low, high)
        self.squares += float((g * g).sum())
        self.n += g.numel()
        self.below += int((g < SPARSE_BELOW).sum())


def gate_stats(model: torch.nn.Module, x: torch.Tensor) -> dict[str, GateStats]:
    """Every kept gate's statistics over the windows x [N, T], by name, in the order the forward
    keeps them."""
    ranges = gate_ranges(model)
    sums: dict[tuple[str, int], _Sums] = {}
    for _, _, cap in captured(model, x):
        for key, g in cap.items():
            match = _GATE_KEY.fullmatch(key)
            if match is None:
                continue
            name, g = match[2], g.double().cpu()
            acc = sums.setdefault(
                (name, int(match[1])),
                _Sums(
                    torch.zeros(g.size(-1), dtype=torch.float64),
                    torch.zeros(BINS, dtype=torch.float64),
                ),
            )
            acc.add(g, *_range_of(name, ranges))
    found = {}
    for name in dict.fromkeys(n for n, _ in sums):
        layers = sorted(layer for n, layer in sums if n == name)
        per_layer = [sums[(name, layer)] for layer in layers]
        n = np.array([a.n for a in per_layer], dtype=np.float64)
        mean = np.array([float(a.channels.sum()) for a in per_layer]) / n
        squares = np.array([a.squares for a in per_layer]) / n
        found[name] = GateStats(
            name,
            *_range_of(name, ranges),
            layers,
            # per channel: the sum over n / D rows
            np.stack([(a.channels * a.channels.numel() / a.n).numpy() for a in per_layer]),
            mean,
            np.sqrt(np.maximum(squares - mean**2, 0.0)),  # rounding may leave it a hair below 0
            np.array([a.below for a in per_layer]) / n,
            np.stack([(a.hist / a.n).numpy() for a in per_layer]),
        )
    return found


def gate_means(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Mean boosting gate per layer, round (1..M-1) and dimension over all windows and
    positions: [L, M-1, E]."""
    require_boosted(model, "the boosting-gate figure")
    stats = gate_stats(model, x)
    return np.stack([stats[f"r{m}"].dim_means for m in range(1, rounds_of(model))], axis=1)


def gate_rows(stats: dict[str, GateStats]) -> list[dict[str, Any]]:
    """One row per gate, layer and channel: the channel's mean score."""
    return [
        {"gate": g.name, "layer": layer, "dim": d, "mean": float(g.dim_means[i, d])}
        for g in stats.values()
        for i, layer in enumerate(g.layers)
        for d in range(g.dim_means.shape[1])
    ]


def summary_rows(stats: dict[str, GateStats]) -> list[dict[str, Any]]:
    """One row per gate and layer: mean, std and sparsity of all its scores."""
    return [
        {
            "gate": g.name,
            "layer": layer,
            "mean": float(g.mean[i]),
            "std": float(g.std[i]),
            f"below_{SPARSE_BELOW}": float(g.sparsity[i]),
        }
        for g in stats.values()
        for i, layer in enumerate(g.layers)
    ]


def plot_gates(stats: dict[str, GateStats], path: str | Path, run: str = "the model") -> Any:
    """One row per gate: the distribution of its scores per layer (left, with the sparsity
    threshold) and the mean per channel per layer (right); one legend below. Returns the Figure."""
    plt = pyplot()
    fig, axes = plt.subplots(
        len(stats), 2, figsize=(11, 2.4 * len(stats) + 1.2), squeeze=False, layout="constrained"
    )
    for (left, right), g in zip(axes, stats.values(), strict=True):
        centres = np.linspace(g.low, g.high, BINS + 1)
        centres = (centres[:-1] + centres[1:]) / 2
        for i, layer in enumerate(g.layers):
            left.plot(centres, g.hist[i], lw=0.9, color=f"C{i}", label=f"layer {layer}")
            right.plot(g.dim_means[i], lw=0.8, color=f"C{i}", label=f"layer {layer}")
        left.axvline(SPARSE_BELOW, ls="--", color="gray", lw=0.8, label=f"{SPARSE_BELOW} (sparse)")
        left.set_xlim(g.low, g.high)
        left.set_xlabel(f"{g.name} score")
        left.set_ylabel("fraction of scores")
        sparsity = ", ".join(f"{s:.2f}" for s in g.sparsity)
        left.set_title(f"{g.name}: fraction below {SPARSE_BELOW} per layer {sparsity}", fontsize=8)
        right.set_ylim(g.low, g.high)
        right.set_xlabel("channel")
        right.set_ylabel("mean score")
        right.set_title(f"{g.name}: mean per channel", fontsize=8)
    legend_outside(fig, list(axes.ravel()), ncol=6)
    fig.suptitle(f"gate scores of {run}, over validation windows and positions", fontsize=10)
    save_figure(fig, path)
    return fig


def plot_sparsity(
    runs: dict[str, dict[str, GateStats]], path: str | Path, order: list[str] | None = None
) -> Any:
    """One panel per gate name: its fraction of scores below SPARSE_BELOW per layer, one line per
    run that has the gate (the gate-position study's comparison); ``order`` styles the runs
    (series_styles), so a run looks alike in every panel. Returns the Figure."""
    names = list(dict.fromkeys(name for stats in runs.values() for name in stats))
    styles = series_styles(list(runs), order)
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(names), figsize=(4.2 * len(names) + 1, 3.8), squeeze=False, layout="constrained"
    )
    for ax, name in zip(axes[0], names, strict=True):
        for run, stats in runs.items():
            if name in stats:
                ax.plot(stats[name].layers, stats[name].sparsity, **styles[run], label=run)
        ax.set(xlabel="layer", ylabel=f"fraction of scores below {SPARSE_BELOW}", title=name)
        ax.set_xticks(
            sorted({i for stats in runs.values() if name in stats for i in stats[name].layers})
        )
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    legend_outside(fig, list(axes[0]), ncol=4)
    fig.suptitle("gate sparsity over validation windows and positions", fontsize=10)
    save_figure(fig, path)
    return fig


def plot(means: np.ndarray, path: str | Path, run: str = "the boosted model") -> Any:
    """One panel per layer: mean gate per dimension for each extra round, and the g = 0.5 line
    (half of each correction added); one legend below all panels. Returns the Figure."""
    plt = pyplot()
    n_layer, n_rounds, dim = means.shape
    fig, axes = plt.subplots(
        n_layer,
        1,
        figsize=(8, 1.9 * n_layer + 1.2),
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    for layer, ax in enumerate(axes[:, 0]):
        for m in range(n_rounds):
            ax.plot(range(dim), means[layer, m], lw=0.8, color=f"C{m}", label=f"round {m + 1} gate")
        ax.axhline(0.5, ls="--", color="gray", lw=0.8, label="g = 0.5 (half of each correction)")
        ax.annotate(
            "g = 0.5",
            (1.0, 0.5),
            xycoords=("axes fraction", "data"),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
            color="gray",
        )
        ax.set_ylim(0, 1)
        ax.set_ylabel("gate value")
        ax.set_title(
            f"layer {layer}: mean {means[layer].mean():.3f}, "
            f"std over dimensions {means[layer].std():.3f}",
            fontsize=8,
        )
    axes[-1, 0].set_xlabel("dimension (channel of the residual stream)")  # x shared by all
    legend_outside(fig, list(axes[:, 0]), ncol=n_rounds + 1)
    fig.suptitle(f"boosting gates of {run}, mean over validation windows", fontsize=10)
    save_figure(fig, path)
    return fig


def analyze(inputs: Inputs, out: Path) -> tuple[dict[str, GateStats], list[Path]]:
    """Every gate of ``inputs``' model, written to ``out`` (FILES): (stats, paths written)."""
    stats = gate_stats(inputs.model, inputs.x)
    paths = [
        write_csv(out / FILES[0], gate_rows(stats)),
        write_csv(out / FILES[1], summary_rows(stats)),
    ]
    plot_gates(stats, out / FILES[2], inputs.name)
    return stats, [*paths, out / FILES[2]]
