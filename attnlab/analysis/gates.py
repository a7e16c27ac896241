"""`attnlab analyze gates RUN`: gate values per layer and dimension (the paper's Figure 3)."""

from __future__ import annotations

import argparse

from attnlab.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser("gates", help="boosting gate per layer and dimension (Figure 3)")
    add_common_args(p)
    p.set_defaults(func=run)


def plot(means, path):
    """One panel per layer: gate per dimension for each extra round, dashed at g = 0.5."""
    from attnlab.plotting import pyplot, save_figure

    plt = pyplot()
    n_layer, n_rounds, dim = means.shape
    fig, axes = plt.subplots(n_layer, 1, figsize=(8, 1.8 * n_layer), sharex=True, squeeze=False)
    for layer, ax in enumerate(axes[:, 0]):
        for m in range(n_rounds):
            ax.plot(range(dim), means[layer, m], lw=0.8, label=f"round {m + 1}")
        ax.axhline(0.5, ls="--", color="gray", lw=0.8)
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"layer {layer}")
        ax.set_title(
            f"mean {means[layer].mean():.3f}, std over dims {means[layer].std():.3f}", fontsize=8
        )
    axes[-1, 0].set_xlabel("dimension")
    if n_rounds > 1:
        axes[0, 0].legend(fontsize=7)
    return save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    from attnlab.eval.attention_stats import gate_means, load_inputs, write_csv

    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    means = gate_means(inputs.model, inputs.x)
    out = out_dir(args)
    rows = [
        {"layer": layer, "round": m + 1, "dim": d, "gate": float(means[layer, m, d])}
        for layer in range(means.shape[0])
        for m in range(means.shape[1])
        for d in range(means.shape[2])
    ]
    csv_path = write_csv(out / "gates.csv", rows)
    png = plot(means, out / "gates.png")
    for layer in range(means.shape[0]):
        print(
            f"layer {layer}: gate mean {means[layer].mean():.4f}  std over dims {means[layer].std():.4f}"
        )
    print(f"over {inputs.x.size(0)} sequences; wrote {csv_path} and {png}")
    return 0
