"""`attnlab analyze entropy RUN [--baseline RUN]`: attention entropy per round and layer (Figure 5)."""

from __future__ import annotations

import argparse

import numpy as np

from attnlab.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser("entropy", help="attention entropy per round and layer (Figure 5)")
    add_common_args(p)
    p.add_argument("--baseline", metavar="RUN", help="a standard model to compare with (same data)")
    p.set_defaults(func=run)


def summary_rows(sources: dict[str, np.ndarray]) -> list[dict]:
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


def plot(sources: dict[str, np.ndarray], path):
    """Left: histogram over all layers, heads and positions; right: mean per layer."""
    from attnlab.plotting import pyplot, save_figure

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


def run(args: argparse.Namespace) -> int:
    from attnlab.eval.attention_stats import (
        entropies,
        load_baseline,
        load_inputs,
        write_csv,
    )

    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    sources: dict[str, np.ndarray] = {}
    if args.baseline:
        sources["standard"] = entropies(
            load_baseline(args.baseline, inputs.model, args.device), inputs.x
        )[0]
    for m, ent in enumerate(entropies(inputs.model, inputs.x)):
        sources[f"round{m}"] = ent
    out = out_dir(args)
    rows = summary_rows(sources)
    csv_path = write_csv(out / "entropy.csv", rows)
    png = plot(sources, out / "entropy.png")
    for row in rows:
        if row["layer"] == "all":
            print(f"{row['source']:>8}: mean entropy {row['mean']:.4f} nats")
    print(f"over {inputs.x.size(0)} sequences; wrote {csv_path} and {png}")
    return 0
