"""Attention entropy per round and layer, optionally against a standard model (Figure 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, rounds_of, write_csv
from attnlab.model.mechanisms.boosted import attention_entropy
from attnlab.plotting import pyplot, save_figure


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


def plot(sources: dict[str, np.ndarray], path: str | Path) -> Path:
    """Left: histogram over all layers, heads and positions; right: mean per layer."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    top = max(float(e.max()) for e in sources.values())
    bins = np.linspace(0.0, top, 50)
    for name, ent in sources.items():
        left.hist(ent.reshape(-1), bins=bins, alpha=0.5, density=True, label=name)
        right.plot(
            range(ent.shape[0]), ent.reshape(ent.shape[0], -1).mean(1), marker="o", label=name
        )
    left.set(xlabel="entropy (nats)", ylabel="density", title="all layers and heads")
    right.set(xlabel="layer", ylabel="mean entropy (nats)", title="mean per layer")
    right.set_xticks(range(next(iter(sources.values())).shape[0]))
    left.legend(fontsize=8)
    return save_figure(fig, path)


def analyze(
    inputs: Inputs, out: Path, baseline: torch.nn.Module | None = None
) -> tuple[list[dict[str, Any]], Path, Path]:
    """Entropies written to ``out``/entropy.csv and entropy.png: (summary rows, csv, png)."""
    found = sources(inputs, baseline)
    rows = summary_rows(found)
    return rows, write_csv(out / "entropy.csv", rows), plot(found, out / "entropy.png")
