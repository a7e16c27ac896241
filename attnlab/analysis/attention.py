"""Attention of chosen tokens per round, head-averaged (Figure 6).

Tokens are given positions of one validation window, or (with a baseline) the ``top`` tokens
where the boosted run's loss beats the baseline's by the most, or else ``top`` evenly spaced
positions; picked queries have a full window of context (position 0 attends only to itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, rounds_of, write_csv
from attnlab.errors import AttnlabError
from attnlab.plotting import pyplot, save_figure

# what it writes into its folder, checked before the work (inputs.check_analysis_out)
FILES = ("attention.csv", "attention.png")


def token_losses(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy [N, T] and greedy predictions [N, T]."""
    losses, preds = [], []
    for rows, logits, _ in captured(model, x):
        losses.append(
            torch.nn.functional.cross_entropy(
                logits.transpose(1, 2).float(), y[rows], reduction="none"
            )
        )
        preds.append(logits.argmax(-1))
    return torch.cat(losses), torch.cat(preds)


@torch.no_grad()
def token_weights(
    model: torch.nn.Module, x: torch.Tensor, sequence: int, position: int, layer: int
) -> np.ndarray:
    """Head-averaged attention of one query token over positions 0..t, per round: [rounds, t+1]."""
    capture: dict[str, torch.Tensor] = {}
    model.eval()
    model(x[sequence : sequence + 1, : position + 1], capture=capture)
    return np.stack(
        [
            capture[f"layer{layer}.r{m}.weights"][0, :, position].mean(0).cpu().numpy()
            for m in range(rounds_of(model))
        ]
    )


def chosen_tokens(
    inputs: Inputs,
    losses: dict[str, torch.Tensor],
    tokens: list[int] | None = None,
    sequence: int = 0,
    top: int = 2,
    window: int = 16,
) -> list[tuple[int, int]]:
    """(sequence, position) pairs: ``tokens`` of window ``sequence``; else, with a baseline, the
    ``top`` where boosting gains most; else ``top`` evenly spaced positions of ``sequence``.

    Chosen queries have at least ``window`` - 1 tokens of context (as many as the window
    allows): position 0 attends only to itself and shows nothing.
    """
    n, t = inputs.x.shape
    if not 0 <= sequence < n:
        raise AttnlabError(f"--sequence {sequence} is out of range: {n} windows loaded")
    if tokens:
        bad = [p for p in tokens if not 1 <= p < t]
        if bad:
            raise AttnlabError(
                f"--tokens {bad} out of range 1..{t - 1} (position 0 attends only to itself)"
            )
        return [(sequence, p) for p in tokens]
    first = min(max(1, window - 1), t - 1)
    if "standard" not in losses:
        picks = np.linspace(first, t - 1, min(top, t - first)).round().astype(int)
        return [(sequence, int(p)) for p in dict.fromkeys(picks)]
    gain = (losses["standard"] - losses["boosted"])[:, first:]
    best = gain.flatten().topk(min(top, gain.numel())).indices
    return [(int(i) // gain.size(1), first + int(i) % gain.size(1)) for i in best]


def plot(panels: list[dict], path: str | Path, run: str = "the model") -> Any:
    """One panel per query token: grouped bars over its context (oldest first, the query itself
    last and shaded), one colour per source; legends beside the panels. Returns the Figure."""
    plt = pyplot()
    colours = {"standard": "tab:blue", "round0": "tab:gray", "round1": "tab:red"}
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(10, 2.8 * len(panels) + 0.6), squeeze=False, layout="constrained"
    )
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        sources = panel["weights"]
        width = 0.8 / len(sources)
        xs = np.arange(len(panel["labels"]))
        ax.axvspan(xs[-1] - 0.5, xs[-1] + 0.5, color="gold", alpha=0.3, label="query token")
        for i, (name, w) in enumerate(sources.items()):
            ax.bar(
                xs + (i - (len(sources) - 1) / 2) * width,
                w,
                width,
                label=name,
                color=colours.get(name, f"C{i + 3}"),
            )
        ax.set_xticks(xs, panel["labels"], rotation=60, fontsize=7)
        ax.get_xticklabels()[-1].set_fontweight("bold")
        ax.set_xlim(xs[0] - 0.6, xs[-1] + 0.6)
        ax.set(xlabel="context token (oldest to the query)", ylabel="attention weight (head mean)")
        ax.set_title(panel["title"], fontsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"attention of {run}", fontsize=10)
    save_figure(fig, path)
    return fig


def analyze(
    inputs: Inputs,
    out: Path,
    baseline: torch.nn.Module | None = None,
    tokens: list[int] | None = None,
    sequence: int = 0,
    top: int = 2,
    layer: int | None = None,
    window: int = 16,
    baseline_name: str = "baseline",
) -> tuple[list[dict[str, Any]], Path, Path]:
    """Weights of the chosen tokens in ``layer`` (None: 1 as in the paper, 0 in a 1-layer
    model), ``window`` context positions each, written to ``out``/attention.csv and
    attention.png: (panels, csv, png)."""
    model, tok = inputs.model, inputs.tokenizer
    n_layer = model.config.n_layer
    if layer is None:
        layer = min(1, n_layer - 1)
    elif not 0 <= layer < n_layer:
        raise AttnlabError(
            f"--layer {layer} is out of range: the model has layers 0..{n_layer - 1}"
        )
    if top < 1 or window < 1:
        raise AttnlabError(f"--top and --window must be >= 1, got {top} and {window}")
    models = {"boosted": model, **({"standard": baseline} if baseline is not None else {})}
    scored = {name: token_losses(m, inputs.x, inputs.y) for name, m in models.items()}
    losses = {name: s[0] for name, s in scored.items()}
    rows, panels = [], []
    for seq, pos in chosen_tokens(inputs, losses, tokens, sequence, top, window):
        weights = {
            f"round{m}": w for m, w in enumerate(token_weights(model, inputs.x, seq, pos, layer))
        }
        if baseline is not None:
            weights = {"standard": token_weights(baseline, inputs.x, seq, pos, layer)[0], **weights}
        first = max(0, pos + 1 - window)
        context = [tok.decode([int(i)]) for i in inputs.x[seq, first : pos + 1]]
        target = tok.decode([int(inputs.y[seq, pos])])
        preds = ", ".join(
            f"{name} {tok.decode([int(scored[name][1][seq, pos])])!r} "
            f"(CE {float(losses[name][seq, pos]):.2f})"
            for name in scored
        )
        panels.append(
            {
                "labels": [repr(c)[1:-1].replace(" ", "\u2423") for c in context],  # ␣: space
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
    csv_path = write_csv(out / FILES[0], rows)
    run = inputs.name + (f" vs {baseline_name} (standard)" if baseline is not None else "")
    plot(panels, out / FILES[1], f"{run}, layer {layer}")
    return panels, csv_path, out / FILES[1]
