"""Statistics of captured attention: gates, entropies, hull distances, per-token weights.

Each function takes a model and validation windows ``x`` [N, T] and runs the model with
``capture={}`` (see Context.keep: keys ``layer{L}.r{m}.weights|v|out|gate`` and ``layer{L}.F``)
in small batches, reducing as it goes so no [N, H, T, T] tensor is held for all N at once.
Used by ``attnlab analyze gates|entropy|hull|attention`` and reusable by study reports.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.errors import AttnlabError
from attnlab.model.mechanisms.boosted import attention_entropy

BATCH = 8


@dataclass
class Inputs:
    """What an analysis reads: the model, its tokenizer and validation windows (x, y) [N, T]."""

    model: torch.nn.Module
    tokenizer: Any
    x: torch.Tensor
    y: torch.Tensor


def validation_windows(
    tokens: np.ndarray, block_size: int, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` complete consecutive block_size windows of a split (no padding)."""
    n = min(n, (len(tokens) - 1) // block_size)
    if n < 1:
        raise AttnlabError(
            f"the split has {len(tokens)} tokens: fewer than one window of {block_size + 1}"
        )
    chunk = torch.from_numpy(np.asarray(tokens[: n * block_size + 1], dtype=np.int64))
    return chunk[:-1].view(n, block_size), chunk[1:].view(n, block_size)


def load_inputs(run: str, data: str | None, sequences: int, device: str = "cpu") -> Inputs:
    """A run (or model folder) and ``sequences`` windows of its validation split (or ``data``'s)."""
    from attnlab.commands.eval import run_data_dir
    from attnlab.data.prepare import load_dataset
    from attnlab.train.checkpoint import load_pretrained

    model, tokenizer = load_pretrained(run, device=device)
    dataset = load_dataset(data or run_data_dir(run))
    if int(dataset.meta["vocab_size"]) > model.config.vocab_size:
        raise AttnlabError(
            f"data vocabulary ({dataset.meta['vocab_size']}) exceeds the model's "
            f"({model.config.vocab_size}); pass the run's own --data"
        )
    x, y = validation_windows(dataset.val, model.config.block_size, sequences)
    return Inputs(model, tokenizer or dataset.tokenizer, x.to(device), y.to(device))


def load_baseline(path: str, like: torch.nn.Module, device: str = "cpu") -> torch.nn.Module:
    """A comparison model that can read the same windows (same block_size and vocabulary)."""
    from attnlab.train.checkpoint import load_pretrained

    model, _ = load_pretrained(path, device=device)
    for field in ("block_size", "vocab_size"):
        if getattr(model.config, field) != getattr(like.config, field):
            raise AttnlabError(
                f"baseline {path} has {field}={getattr(model.config, field)}, the run has "
                f"{getattr(like.config, field)}: they must read the same windows"
            )
    return model


def rounds_of(model: torch.nn.Module) -> int:
    return int(model.config.boost_rounds)


def require_boosted(model: torch.nn.Module, what: str) -> None:
    if rounds_of(model) < 2:
        raise AttnlabError(
            f"{what} needs a boosted model (boost_rounds >= 2); this one has 1 round"
        )


@torch.no_grad()
def captured(model: torch.nn.Module, x: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor, dict]]:
    """(rows, logits [b, T, V], capture) for consecutive batches of the windows x."""
    model.eval()
    for start in range(0, x.size(0), BATCH):
        rows = slice(start, min(start + BATCH, x.size(0)))
        capture: dict[str, torch.Tensor] = {}
        logits, _ = model(x[rows], capture=capture, all_logits=True)
        yield rows, logits, capture


def gate_means(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    """Mean gate per layer, round (1..M-1) and dimension over all windows and positions: [L, M-1, E]."""
    require_boosted(model, "the gate analysis")
    cfg = model.config
    total = torch.zeros(cfg.n_layer, rounds_of(model) - 1, cfg.n_embd, dtype=torch.float64)
    for _, _, cap in captured(model, x):
        for layer in range(cfg.n_layer):
            for m in range(1, rounds_of(model)):
                total[layer, m - 1] += cap[f"layer{layer}.r{m}.gate"].double().sum(dim=(0, 1)).cpu()
    return (total / (x.size(0) * x.size(1))).numpy()


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


def evenly_spaced(length: int, count: int) -> list[int]:
    """``count`` distinct positions spread over 0..length-1, always including the last."""
    return sorted({round(float(p)) for p in np.linspace(0, length - 1, min(count, length))})


def hull_table(
    model: torch.nn.Module, x: torch.Tensor, positions: Sequence[int], progress: bool = False
) -> list[dict[str, float]]:
    """Distance of the boosted output F (per head) to conv(round-0 values at positions <= t).

    One row per window, layer, head and position t in ``positions``; the QP is solved exactly
    (attnlab.eval.hull). F is the concatenated multi-head output, so head h is F[..., h*D:(h+1)*D].
    """
    from tqdm import tqdm

    from attnlab.eval.hull import hull_distance

    require_boosted(model, "the hull analysis")
    cfg = model.config
    rows: list[dict[str, float]] = []
    bar = tqdm(
        total=x.size(0) * cfg.n_layer * cfg.n_head * len(positions),
        disable=not progress,
        unit="qp",
        desc="hull",
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


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows of one shape to CSV (columns in the first row's order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path
