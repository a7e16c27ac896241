"""Boosting gates per layer, round and dimension (the paper's Figure 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, require_boosted, rounds_of, write_csv
from attnlab.plotting import legend_outside, pyplot, save_figure


def gate_means(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Mean gate per layer, round (1..M-1) and dimension over all windows and positions: [L, M-1, E]."""
    require_boosted(model, "the gate analysis")
    cfg = model.config
    total = torch.zeros(cfg.n_layer, rounds_of(model) - 1, cfg.n_embd, dtype=torch.float64)
    for _, _, cap in captured(model, x):
        for layer in range(cfg.n_layer):
            for m in range(1, rounds_of(model)):
                total[layer, m - 1] += cap[f"layer{layer}.r{m}.gate"].double().sum(dim=(0, 1)).cpu()
    return (total / (x.size(0) * x.size(1))).numpy()


def gate_rows(means: np.ndarray) -> list[dict[str, Any]]:
    """One row per layer, extra round and dimension."""
    return [
        {"layer": layer, "round": m + 1, "dim": d, "gate": float(means[layer, m, d])}
        for layer in range(means.shape[0])
        for m in range(means.shape[1])
        for d in range(means.shape[2])
    ]


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


def analyze(inputs: Inputs, out: Path) -> tuple[np.ndarray, Path, Path]:
    """Gate means of ``inputs``, written to ``out``/gates.csv and gates.png: (means, csv, png)."""
    means = gate_means(inputs.model, inputs.x)
    csv_path = write_csv(out / "gates.csv", gate_rows(means))
    plot(means, out / "gates.png", inputs.name)
    return means, csv_path, out / "gates.png"
