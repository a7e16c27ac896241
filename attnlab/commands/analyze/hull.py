"""`attnlab analyze hull RUN`: distance of the boosted output to the round-0 value hull (Figure 4).

For each layer, head and sampled position t: the exact Euclidean distance (head_dim space) from
the boosted output F_t to conv(v_0, ..., v_t) of round-0 values. Plain attention's output is a
convex combination of those values, so 0 means the extra rounds did not leave the hull.
Defaults (5 sequences x 30 positions) give the paper's 2,400 measurements for 4 layers x 4 heads.
"""

from __future__ import annotations

import argparse

import numpy as np

from attnlab.analyze import add_common_args, out_dir

# below this a distance is solver round-off: the output lies in the hull
INSIDE_TOL = 1e-6


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser(
        "hull", help="distance of boosted outputs to the round-0 value hull (Figure 4)"
    )
    add_common_args(p, sequences=5)
    p.add_argument(
        "--positions",
        type=int,
        default=30,
        help="positions per sequence, evenly spaced (default 30)",
    )
    p.set_defaults(func=run)


def layer_means(rows: list[dict]) -> dict[int, float]:
    layers = sorted({r["layer"] for r in rows})
    return {
        layer: float(np.mean([r["distance"] for r in rows if r["layer"] == layer]))
        for layer in layers
    }


def plot(rows: list[dict], path):
    """Per layer: every distance (jittered) with a box and the annotated mean."""
    from attnlab.plotting import pyplot, save_figure

    plt = pyplot()
    means = layer_means(rows)
    fig, ax = plt.subplots(figsize=(1.6 * len(means) + 2, 3.5))
    data = [[r["distance"] for r in rows if r["layer"] == layer] for layer in means]
    ax.boxplot(data, positions=list(means), widths=0.5, showfliers=False)
    jitter = np.random.default_rng(0)
    for layer, values in zip(means, data, strict=True):
        ax.scatter(layer + jitter.uniform(-0.15, 0.15, len(values)), values, s=3, alpha=0.4)
        ax.annotate(
            f"{means[layer]:.3g}", (layer, max(values)), ha="center", va="bottom", fontsize=8
        )
    ax.set(
        xlabel="layer",
        ylabel="distance to conv(round-0 values)",
        title="boosted output outside the hull",
    )
    return save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    from attnlab.eval.attention_stats import (
        evenly_spaced,
        hull_table,
        load_inputs,
        write_csv,
    )

    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    positions = evenly_spaced(inputs.x.size(1), args.positions)
    rows = hull_table(inputs.model, inputs.x, positions, progress=True)
    out = out_dir(args)
    csv_path = write_csv(out / "hull.csv", rows)
    png = plot(rows, out / "hull.png")
    for layer, mean in layer_means(rows).items():
        print(f"layer {layer}: mean distance {mean:.4g}")
    positive = sum(r["distance"] > INSIDE_TOL for r in rows)
    print(
        f"{positive} of {len(rows)} outputs outside the hull (distance > {INSIDE_TOL:g}); wrote {csv_path} and {png}"
    )
    return 0
