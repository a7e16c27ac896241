"""Attention of chosen tokens per round, head-averaged (Figure 6).

Tokens are given positions of one validation window, or (with a baseline) the ``top`` tokens
where the boosted run's loss beats the baseline's by the most.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.analysis.inputs import Inputs, captured, rounds_of, write_csv
from attnlab.errors import AttnlabError
from attnlab.plotting import pyplot, save_figure


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
) -> list[tuple[int, int]]:
    """(sequence, position) pairs: ``tokens`` of window ``sequence``, or where boosting gains most."""
    n, t = inputs.x.shape
    if tokens:
        if not 0 <= sequence < n:
            raise AttnlabError(f"--sequence {sequence} is out of range: {n} windows loaded")
        bad = [p for p in tokens if not 0 <= p < t]
        if bad:
            raise AttnlabError(f"--tokens {bad} out of range 0..{t - 1}")
        return [(sequence, p) for p in tokens]
    if "standard" not in losses:
        raise AttnlabError(
            "give --tokens POSITIONS, or --baseline RUN to pick the tokens boosting fixes"
        )
    gain = (losses["standard"] - losses["boosted"]).flatten()
    return [divmod(int(i), t) for i in gain.topk(min(top, gain.numel())).indices]


def plot(panels: list[dict], path: str | Path) -> Path:
    """One panel per token: grouped bars over its last context positions, one colour per source."""
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


def analyze(
    inputs: Inputs,
    out: Path,
    baseline: torch.nn.Module | None = None,
    tokens: list[int] | None = None,
    sequence: int = 0,
    top: int = 2,
    layer: int = 1,
    window: int = 16,
) -> tuple[list[dict[str, Any]], Path, Path]:
    """Weights of the chosen tokens in ``layer`` (clamped to the model's), ``window`` context
    positions each, written to ``out``/attention.csv and attention.png: (panels, csv, png)."""
    model, tok = inputs.model, inputs.tokenizer
    models = {"boosted": model, **({"standard": baseline} if baseline is not None else {})}
    scored = {name: token_losses(m, inputs.x, inputs.y) for name, m in models.items()}
    losses = {name: s[0] for name, s in scored.items()}
    layer = min(max(layer, 0), model.config.n_layer - 1)
    rows, panels = [], []
    for seq, pos in chosen_tokens(inputs, losses, tokens, sequence, top):
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
    return panels, write_csv(out / "attention.csv", rows), plot(panels, out / "attention.png")
