"""Attention mass on the first token per layer and head: the attention sink (Qiu et al. 2025).

For every query position t >= 1 of a validation window, the weight its softmax row gives to the
window's first position, averaged over windows and queries (query 0 sees only itself, so it is
left out). Qiu et al. report that the output gate lowers this mass. A window starts mid-text
(no BOS token), so this is the attention collected by whatever token opens the context. Uniform
causal attention gives the first token 1 / (t + 1) at query t: UNIFORM's mean, the reference
line of the figures. A boosted model's rounds are measured on round 0's attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, write_csv
from attnlab.errors import AttnlabError
from attnlab.plotting import legend_outside, pyplot, save_figure, series_styles

# what it writes into its folder, checked before the work (inputs.check_analysis_out)
FILES = ("sink.csv", "sink.png")


def uniform_mass(block: int) -> float:
    """The first token's mean weight over queries 1..block-1 under uniform causal attention."""
    return float(np.mean(1.0 / np.arange(2, block + 1)))


def first_token_mass(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Mean attention weight on position 0 over the windows x [N, T] and queries 1..T-1: [L, H]."""
    cfg = model.config
    if x.size(1) < 2:
        raise AttnlabError("the attention-sink analysis needs windows of at least 2 tokens")
    total = torch.zeros(cfg.n_layer, cfg.n_head, dtype=torch.float64)
    for _, _, cap in captured(model, x):
        for layer in range(cfg.n_layer):
            weights = cap[f"layer{layer}.r0.weights"]  # [b, H, T, T], row t over keys 0..t
            total[layer] += weights[:, :, 1:, 0].double().sum(dim=(0, 2)).cpu()
    return (total / (x.size(0) * (x.size(1) - 1))).numpy()


def rows(mass: np.ndarray) -> list[dict[str, Any]]:
    """One row per layer and head: the first token's mean attention weight."""
    return [
        {"layer": layer, "head": head, "first_token_mass": float(mass[layer, head])}
        for layer in range(mass.shape[0])
        for head in range(mass.shape[1])
    ]


def plot(mass: np.ndarray, path: str | Path, block: int, run: str = "the model") -> Any:
    """Left: the mass per layer and head as a heat map (values written in); right: the mean per
    layer, its range over heads, and uniform attention's mass. Returns the Figure."""
    plt = pyplot()
    n_layer, n_head = mass.shape
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.45 * n_layer + 3), layout="constrained")
    image = left.imshow(mass, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for layer in range(n_layer):
        for head in range(n_head):
            value = mass[layer, head]
            left.text(
                head,
                layer,
                f"{value:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="black" if value > 0.5 else "white",
            )
    left.set(xlabel="head", ylabel="layer", title="per layer and head")
    left.set_xticks(range(n_head))
    left.set_yticks(range(n_layer))
    fig.colorbar(image, ax=left, label="mean weight")
    layers = np.arange(n_layer)
    right.plot(layers, mass.mean(1), marker="o", color="C0", label="mean over heads")
    right.fill_between(
        layers,
        mass.min(1),
        mass.max(1),
        color="C0",
        alpha=0.2,
        lw=0,
        label="lowest to highest head",
    )
    _uniform_line(right, block)
    right.set(xlabel="layer", ylabel="attention weight on the first token", title="per layer")
    right.set_xticks(layers)
    right.set_ylim(0, _top(mass.max(), block))
    right.grid(alpha=0.3)
    legend_outside(fig, [right], ncol=3)
    fig.suptitle(
        f"attention sink of {run}: mean weight on a window's first token over queries 1..{block - 1}",
        fontsize=10,
    )
    save_figure(fig, path)
    return fig


def _top(highest: float, block: int) -> float:
    """The y range's top: room above the highest mass and the uniform line, at most 1."""
    return min(1.0, 1.15 * max(highest, uniform_mass(block)))


def _uniform_line(ax: Any, block: int) -> None:
    ax.axhline(
        uniform_mass(block),
        ls="--",
        color="gray",
        lw=0.8,
        label=f"uniform causal attention ({uniform_mass(block):.3f})",
    )


def plot_runs(
    masses: dict[str, np.ndarray], path: str | Path, block: int, order: list[str] | None = None
) -> Any:
    """The mean mass per layer of several runs (one line each, the range over heads as a band),
    with uniform attention's: the paper's comparison of gate positions. ``order`` styles the
    runs (series_styles). Returns the Figure."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    styles = series_styles(list(masses), order)
    for name, mass in masses.items():
        layers = np.arange(mass.shape[0])
        ax.plot(layers, mass.mean(1), **styles[name], label=name)
        ax.fill_between(
            layers, mass.min(1), mass.max(1), color=styles[name]["color"], alpha=0.12, lw=0
        )
    _uniform_line(ax, block)
    ax.set(
        xlabel="layer",
        ylabel="attention weight on the first token",
        title="attention sink: mean over heads (band: lowest to highest head)",
    )
    ax.set_xticks(range(max(m.shape[0] for m in masses.values())))
    ax.set_ylim(0, _top(max(float(m.max()) for m in masses.values()), block))
    ax.grid(alpha=0.3)
    legend_outside(fig, [ax], ncol=3)
    save_figure(fig, path)
    return fig


def analyze(inputs: Inputs, out: Path) -> tuple[np.ndarray, list[Path]]:
    """The first-token mass of ``inputs``' model written to ``out`` (FILES): (mass [L, H], paths)."""
    mass = first_token_mass(inputs.model, inputs.x)
    csv_path = write_csv(out / FILES[0], rows(mass))
    plot(mass, out / FILES[1], inputs.x.size(1), inputs.name)
    return mass, [csv_path, out / FILES[1]]
