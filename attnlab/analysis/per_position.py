"""Per-position loss over a token stream, and groupings of it by where each target sits in the text.

Windows are the same sequential ``block_size`` windows as attnlab.eval.loss.split_loss, so the
mean of the per-position losses is that function's loss. Positions are targets: entry ``i`` is
the loss of predicting ``tokens[i + 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

# groups beyond these are pooled into one last bucket, so a table stays readable
MAX_COLUMN = 80
MAX_HEADER_DISTANCE = 40


@torch.no_grad()
def per_position_losses(
    model: torch.nn.Module, tokens: np.ndarray, block_size: int | None = None, batch_size: int = 16
) -> np.ndarray:
    """Cross-entropy of every target ``tokens[1:]`` (float64, length ``len(tokens) - 1``).

    ``block_size`` (at most the model's) sets the window; pass the same value to compare models
    with different context lengths on identical contexts.
    """
    from attnlab.data.bins import sequential_windows

    block = block_size or model.config.block_size
    if block > model.config.block_size:
        raise ValueError(f"block_size={block} exceeds the model's {model.config.block_size}")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        for x, y in sequential_windows(tokens, block, batch_size, device):
            logits, _ = model(x, all_logits=True)
            losses = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)).float(),
                y.view(-1),
                ignore_index=-1,
                reduction="none",
            )
            out.append(losses[y.view(-1) != -1].double().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out).numpy()


def token_pieces(tokenizer, tokens: np.ndarray) -> list[str]:
    """The text of each token: a lookup table over the vocabulary, not one decode per token."""
    table = np.array([tokenizer.decode([i]) for i in range(tokenizer.vocab_size)], dtype=object)
    return table[np.asarray(tokens, dtype=np.int64)].tolist()


def char_offsets(pieces: Sequence[str]) -> np.ndarray:
    """Start offset of each token in ``"".join(pieces)``."""
    return np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]]).astype(np.int64)


def line_columns(text: str, offsets: np.ndarray) -> np.ndarray:
    """Column (characters since the last newline) of the character at each offset."""
    newline = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == ord("\n")
    # index of the last newline at or before each character, -1 if none
    last = np.maximum.accumulate(np.where(newline, np.arange(len(text)), -1))
    before = np.concatenate([[-1], last[:-1]])  # the last newline strictly before each character
    return offsets - before[offsets] - 1


def header_distances(text: str, offsets: np.ndarray, style: str) -> tuple[np.ndarray, np.ndarray]:
    """(characters since the start of the latest speaker header line, -1 before any; in-header flag)."""
    from attnlab.eval.names import header_spans

    starts = np.full(len(text) + 1, -1, dtype=np.int64)
    ends = np.full(len(text) + 1, -1, dtype=np.int64)
    for h in header_spans(text, style):
        starts[h.start], ends[h.start] = h.start, h.end
    starts, ends = np.maximum.accumulate(starts), np.maximum.accumulate(ends)
    latest, latest_end = starts[offsets], ends[offsets]
    distance = np.where(latest >= 0, offsets - latest, -1)
    return distance, (latest >= 0) & (offsets <= latest_end)


def difference_row(
    label: str, mask: np.ndarray, loss_a: np.ndarray, loss_b: np.ndarray
) -> dict[str, Any]:
    """Count, mean losses and B - A over the targets in ``mask``."""
    a, b = float(loss_a[mask].mean()), float(loss_b[mask].mean())
    return {"group": label, "count": int(mask.sum()), "loss_a": a, "loss_b": b, "b_minus_a": b - a}


def grouped_difference(
    keys: np.ndarray, loss_a: np.ndarray, loss_b: np.ndarray, cap: int
) -> list[dict[str, Any]]:
    """One difference_row per key (keys >= cap pooled as "cap+"; negative keys as "none")."""
    labels = np.where(keys < 0, -1, np.minimum(keys, cap))
    return [
        difference_row(
            "none" if key < 0 else (f"{cap}+" if key == cap else str(int(key))),
            labels == key,
            loss_a,
            loss_b,
        )
        for key in np.unique(labels)
    ]
