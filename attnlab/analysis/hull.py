"""How far boosted outputs leave the hull of round-0 values (Figure 4), by exact hull distances.

For each layer, head and sampled position t: the exact Euclidean distance (head_dim space) from
the boosted output F_t to conv(v_0, ..., v_t) of round-0 values. Plain attention's output is a
convex combination of those values, so 0 means the extra rounds did not leave the hull.
Defaults (5 sequences x 30 positions) give the paper's 2,400 measurements for 4 layers x 4 heads.

``dist(y, conv P)`` is the norm of the minimum-norm point of ``conv(Q)``, ``Q = P - y``. That
point is found exactly (finite active-set algorithm, no sampling or penalty weight) through
the Lawson–Hanson reduction of least-distance programming to NNLS: solve
``min_{u >= 0} ||[Q^T; 1^T] u - e_{d+1}||`` with scipy.optimize.nnls. Its optimality
conditions give ``||Q^T u||^2 = s (1 - s)`` with ``s = sum(u)``, which makes ``w = u / s`` the
convex weights of the minimum-norm point ``z = Q^T w`` (and 0 when y lies in the hull).

Every answer is certified: ``||z||`` is an upper bound (z is in the hull), and
``min_i q_i . z / ||z||`` is a lower bound (the hyperplane through z normal to z separates
the hull from the origin); the two must agree to a tight tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import nnls

from attnlab.analysis.inputs import (
    Inputs,
    captured,
    evenly_spaced,
    require_boosted,
    terminal_bar,
    write_csv,
)
from attnlab.errors import AttnlabError
from attnlab.plotting import pyplot, save_figure

# Allowed gap between the certified bounds, relative to the scale of the point set.
CERT_TOL = 1e-7
# below this a distance is solver round-off: the output lies in the hull
INSIDE_TOL = 1e-6

# what it writes into its folder, checked before the work (inputs.check_analysis_out)
FILES = ("hull.csv", "hull.png")


def hull_distance(points: np.ndarray, y: np.ndarray) -> float:
    """Euclidean distance from ``y`` [d] to the convex hull of ``points`` [n, d]."""
    points = np.asarray(points, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if points.ndim != 2 or points.shape[0] == 0 or y.shape != (points.shape[1],):
        raise ValueError(f"need points [n>0, d] and y [d]; got {points.shape} and {y.shape}")
    q = points - y
    # Rescale so the sum-to-one row and the coordinates have comparable magnitude.
    scale = float(np.abs(q).max())
    if scale == 0.0:
        return 0.0
    q /= scale
    system = np.vstack([q.T, np.ones(q.shape[0])])
    target = np.zeros(q.shape[1] + 1)
    target[-1] = 1.0
    u, _ = nnls(system, target, maxiter=50 * system.shape[1])
    z = q.T @ (u / u.sum())
    upper = float(np.linalg.norm(z))
    lower = max(0.0, float((q @ z).min()) / upper) if upper > 0 else 0.0
    if upper - lower > CERT_TOL:
        raise RuntimeError(f"hull distance not certified: bounds {lower:.3g}..{upper:.3g}")
    return upper * scale


def hull_table(
    model: torch.nn.Module, x: torch.Tensor, positions: Sequence[int], progress: bool = False
) -> list[dict[str, float]]:
    """Distance of the boosted output F (per head) to conv(round-0 values at positions <= t).

    One row per window, layer, head and position t in ``positions``; the QP is solved exactly
    (hull_distance). F is the concatenated multi-head output, so head h is F[..., h*D:(h+1)*D].
    """
    require_boosted(model, "the hull analysis")
    cfg = model.config
    rows: list[dict[str, float]] = []
    bar = terminal_bar(
        x.size(0) * cfg.n_layer * cfg.n_head * len(positions), "hull", "qp", progress
    )
    for batch, _, cap in captured(model, x):
        for layer in range(cfg.n_layer):
            values = cap[f"layer{layer}.r0.v"].double().cpu().numpy()  # [b, H, T, D]
            f = cap[f"layer{layer}.F"].double().cpu()
            f = (
                f.view(*f.shape[:2], cfg.n_head, cfg.head_dim).transpose(1, 2).numpy()
            )  # [b, H, T, D]
            for i in range(values.shape[0]):
                for head in range(cfg.n_head):
                    for t in positions:
                        d = hull_distance(values[i, head, : t + 1], f[i, head, t])
                        rows.append(
                            {
                                "sequence": batch.start + i,
                                "layer": layer,
                                "head": head,
                                "position": t,
                                "distance": d,
                            }
                        )
                    bar.update(len(positions))
    bar.close()
    return rows


def layer_means(rows: list[dict]) -> dict[int, float]:
    """Mean distance per layer."""
    layers = sorted({r["layer"] for r in rows})
    return {
        layer: float(np.mean([r["distance"] for r in rows if r["layer"] == layer]))
        for layer in layers
    }


def plot(rows: list[dict], path: str | Path, run: str = "the boosted model") -> Any:
    """Per layer: every distance (jittered dots), its box (quartiles, whiskers at 1.5 IQR) and
    its mean (a diamond, annotated); the legend beside the axes. Returns the Figure."""
    plt = pyplot()
    means = layer_means(rows)
    fig, ax = plt.subplots(figsize=(1.6 * len(means) + 4.5, 3.8), layout="constrained")
    data = [[r["distance"] for r in rows if r["layer"] == layer] for layer in means]
    box = ax.boxplot(data, positions=list(means), widths=0.5, showfliers=False)
    box["boxes"][0].set_label("quartiles (whiskers 1.5 IQR)")
    box["medians"][0].set_label("median")
    jitter = np.random.default_rng(0)
    for i, (layer, values) in enumerate(zip(means, data, strict=True)):
        ax.scatter(
            layer + jitter.uniform(-0.15, 0.15, len(values)),
            values,
            s=3,
            alpha=0.4,
            color="tab:blue",
            label="one (window, head, position)" if i == 0 else None,
        )
        ax.annotate(
            f"{means[layer]:.3g}", (layer, max(values)), ha="center", va="bottom", fontsize=8
        )
    ax.plot(list(means), list(means.values()), "D", color="tab:red", label="layer mean")
    ax.set_xticks(list(means))
    ax.set(
        xlabel="layer",
        ylabel="distance to conv(round-0 values)\n(value-space units)",
        title=f"how far the boosted output of {run} leaves the hull of round-0 values",
    )
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path)
    return fig


def measure(inputs: Inputs, positions: int = 30, progress: bool = False) -> list[dict[str, float]]:
    """hull_table at ``positions`` evenly spaced positions of every window."""
    if positions < 1:
        raise AttnlabError(f"--positions must be >= 1, got {positions}")
    at = evenly_spaced(inputs.x.size(1), positions)
    return hull_table(inputs.model, inputs.x, at, progress=progress)


def analyze(
    inputs: Inputs, out: Path, positions: int = 30, progress: bool = False
) -> tuple[list[dict[str, float]], Path, Path]:
    """Distances at ``positions`` evenly spaced positions per window, written to ``out``/hull.csv
    and hull.png: (rows, csv, png)."""
    rows = measure(inputs, positions, progress)
    csv_path = write_csv(out / FILES[0], rows)
    plot(rows, out / FILES[1], inputs.name)
    return rows, csv_path, out / FILES[1]
