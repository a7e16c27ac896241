"""Loss over a whole split: every token predicted exactly once, not a random sample of batches."""

from __future__ import annotations

import math

import numpy as np
import torch

from attnlab.data.bins import sequential_windows


@torch.no_grad()
def split_loss(
    model: torch.nn.Module, tokens: np.ndarray, batch_size: int = 16
) -> dict[str, float]:
    """Mean cross-entropy and perplexity of ``model`` on ``tokens`` in block_size windows."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in sequential_windows(tokens, model.config.block_size, batch_size, device):
        logits, _ = model(x, y)
        losses = torch.nn.functional.cross_entropy(
            logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1, reduction="sum"
        )
        total += float(losses)
        count += int((y != -1).sum())
    model.train(was_training)
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": count}
