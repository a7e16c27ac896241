"""`attnlab analyze attention RUN`: attention of chosen tokens per round, head-averaged (Figure 6).

Tokens are ``--tokens`` positions of validation window ``--sequence``, or (with ``--baseline``)
the ``--top`` tokens where the boosted run's loss beats the baseline's by the most.
"""

from __future__ import annotations

import argparse

import numpy as np

from attnlab.analyze import add_common_args, out_dir


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser(
        "attention", help="attention weights of chosen tokens per round (Figure 6)"
    )
    add_common_args(p)
    p.add_argument("--baseline", metavar="RUN", help="a standard model to compare with (same data)")
    p.add_argument("--tokens", help="comma-separated query positions in window --sequence")
    p.add_argument(
        "--sequence", type=int, default=0, help="validation window of --tokens (default 0)"
    )
    p.add_argument("--top", type=int, default=2, help="tokens to pick when --tokens is not given")
    p.add_argument(
        "--layer", type=int, default=1, help="layer to show (default 1, as in the paper)"
    )
    p.add_argument("--window", type=int, default=16, help="context positions shown per token")
    p.set_defaults(func=run)


def chosen_tokens(args: argparse.Namespace, inputs, baseline, losses) -> list[tuple[int, int]]:
    """(sequence, position) pairs from --tokens, or where the boosted model gains most."""
    from attnlab.errors import AttnlabError

    n, t = inputs.x.shape
    if args.tokens:
        if not 0 <= args.sequence < n:
            raise AttnlabError(f"--sequence {args.sequence} is out of range: {n} windows loaded")
        positions = [int(p) for p in args.tokens.split(",") if p.strip()]
        bad = [p for p in positions if not 0 <= p < t]
        if bad:
            raise AttnlabError(f"--tokens {bad} out of range 0..{t - 1}")
        return [(args.sequence, p) for p in positions]
    if baseline is None:
        raise AttnlabError(
            "give --tokens POSITIONS, or --baseline RUN to pick the tokens boosting fixes"
        )
    gain = (losses["standard"] - losses["boosted"]).flatten()
    return [divmod(int(i), t) for i in gain.topk(min(args.top, gain.numel())).indices]


def plot(panels: list[dict], path):
    """One panel per token: grouped bars over its last context positions, one colour per source."""
    from attnlab.plotting import pyplot, save_figure

    plt = pyplot()
    colours = {"standard": "tab:blue", "round0": "tab:gray", "round1": "tab:red"}
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        sources = panel["weights"]
        width = 0.8 / len(sources)
        xs = np.arange(len(panel["labels"]))
        for i, (name, w) in enumerate(sources.items()):
            ax.bar(
                xs + (i - (len(sources) - 1) / 2) * width,
                w,
                width,
                label=name,
                color=colours.get(name),
            )
        ax.set_xticks(xs, panel["labels"], rotation=60, fontsize=7)
        ax.set_ylabel("weight")
        ax.set_title(panel["title"], fontsize=9)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    from attnlab.eval.attention_stats import (
        load_baseline,
        load_inputs,
        token_losses,
        token_weights,
        write_csv,
    )

    inputs = load_inputs(args.run, args.data, args.sequences, args.device)
    model, tok = inputs.model, inputs.tokenizer
    baseline = load_baseline(args.baseline, model, args.device) if args.baseline else None
    models = {"boosted": model, **({"standard": baseline} if baseline is not None else {})}
    scored = {name: token_losses(m, inputs.x, inputs.y) for name, m in models.items()}
    losses = {name: s[0] for name, s in scored.items()}
    layer = min(max(args.layer, 0), model.config.n_layer - 1)
    rows, panels = [], []
    for seq, pos in chosen_tokens(args, inputs, baseline, losses):
        weights = {
            f"round{m}": w for m, w in enumerate(token_weights(model, inputs.x, seq, pos, layer))
        }
        if baseline is not None:
            weights = {"standard": token_weights(baseline, inputs.x, seq, pos, layer)[0], **weights}
        first = max(0, pos + 1 - args.window)
        context = [tok.decode([int(i)]) for i in inputs.x[seq, first : pos + 1]]
        target = tok.decode([int(inputs.y[seq, pos])])
        preds = ", ".join(
            f"{name} {tok.decode([int(scored[name][1][seq, pos])])!r} "
            f"(CE {float(losses[name][seq, pos]):.2f})"
            for name in scored
        )
        panels.append(
            {
                "labels": [repr(c)[1:-1] for c in context],
                "weights": {k: w[first:] for k, w in weights.items()},
                "title": f"seq {seq} pos {pos}, layer {layer}: target {target!r}; {preds}",
            }
        )
        rows += [
            {
                "sequence": seq,
                "position": pos,
                "target": target,
                "source": name,
                "context_position": first + j,
                "context_token": c,
                "weight": float(w[first + j]),
            }
            for name, w in weights.items()
            for j, c in enumerate(context)
        ]
        print(panels[-1]["title"])
    out = out_dir(args)
    csv_path = write_csv(out / "attention.csv", rows)
    png = plot(panels, out / "attention.png")
    print(f"wrote {csv_path} and {png}")
    return 0
