"""Attention entropy per round and layer, optionally against a standard model (Figure 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, rounds_of, write_csv
from attnlab.model.mechanisms.boosted import attention_entropy
from attnlab.plotting import pyplot, save_figure

# what it writes into its folder, checked before the work (inputs.check_analysis_out)
FILES = ("entropy.csv", "entropy.png")


def entropies(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Entropy of every attention row: [rounds, L, N, H, T] (nats; row t is at most log(t + 1))."""
    cfg = model.config
    out = np.zeros((rounds_of(model), cfg.n_layer, x.size(0), cfg.n_head, x.size(1)))
    for rows, _, cap in captured(model, x):
        for m in range(rounds_of(model)):
            for layer in range(cfg.n_layer):
                out[m, layer, rows] = (
                    attention_entropy(cap[f"layer{layer}.r{m}.weights"]).cpu().numpy()
                )
    return out


def sources(inputs: Inputs, baseline: torch.nn.Module | None = None) -> dict[str, np.ndarray]:
    """Entropies [L, N, H, T] by source: ``standard`` (the baseline, if any), ``round0``, ..."""
    found: dict[str, np.ndarray] = {}
    if baseline is not None:
        found["standard"] = entropies(baseline, inputs.x)[0]
    for m, ent in enumerate(entropies(inputs.model, inputs.x)):
        found[f"round{m}"] = ent
    return found


def summary_rows(sources: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per source (name -> entropies [L, ...]): one row per layer and one over all layers."""
    rows = []
    for name, ent in sources.items():
        for layer in [*range(ent.shape[0]), "all"]:
            vals = ent.reshape(-1) if layer == "all" else ent[layer].reshape(-1)
            rows.append(
                {
                    "source": name,
                    "layer": layer,
                    "mean": float(vals.mean()),
                    "std": float(vals.std()),
                    "n": int(vals.size),
                }
            )
    return rows


# each source keeps its look in both panels: (colour, line style)
STYLES = {"standard": ("black", "-"), "round0": ("tab:blue", "--"), "round1": ("tab:red", "-.")}


def plot(sources: dict[str, np.ndarray], path: str | Path, run: str = "the model") -> Any:
    """Left: the distribution over all layers, heads and positions as outlined densities (one
    line per source, so overlaps stay readable); right: mean per layer with its spread.
    Returns the Figure."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    top = max(float(e.max()) for e in sources.values())
    bins = np.linspace(0.0, max(top, 1e-9), 50)
    for i, (name, ent) in enumerate(sources.items()):
        color, style = STYLES.get(name, (f"C{i + 3}", ":"))
        label = f"{name} (mean {ent.mean():.2f})"
        left.hist(
            ent.reshape(-1),
            bins=bins,
            density=True,
            histtype="step",
            lw=1.6,
            color=color,
            linestyle=style,
            label=label,
        )
        per_layer = ent.reshape(ent.shape[0], -1)
        right.errorbar(
            np.arange(ent.shape[0]) + 0.08 * (i - (len(sources) - 1) / 2),
            per_layer.mean(1),
            yerr=per_layer.std(1),
            marker="o",
            capsize=3,
            color=color,
            linestyle=style,
            label=f"{name} (± std over heads, positions)",
        )
    left.set(
        xlabel="entropy of an attention row (nats)",
        ylabel="density (per nat)",
        title="all layers, heads and positions",
    )
    right.set(xlabel="layer", ylabel="mean entropy (nats)", title="mean per layer")
    right.set_xticks(range(next(iter(sources.values())).shape[0]))
    for ax in (left, right):  # below each panel: a legend on every panel, over no data
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.suptitle(f"attention entropy: {run}", fontsize=10)
    save_figure(fig, path)
    return fig


def analyze(
    inputs: Inputs,
    out: Path,
    baseline: torch.nn.Module | None = None,
    baseline_name: str = "baseline",
) -> tuple[list[dict[str, Any]], Path, Path]:
    """Entropies written to ``out``/entropy.csv and entropy.png: (summary rows, csv, png)."""
    found = sources(inputs, baseline)
    rows = summary_rows(found)
    csv_path = write_csv(out / FILES[0], rows)
    run = inputs.name + (f" (rounds) vs {baseline_name} (standard)" if baseline is not None else "")
    plot(found, out / FILES[1], run)
    return rows, csv_path, out / FILES[1]
