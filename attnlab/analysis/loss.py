"""Loss over a whole split: every token predicted exactly once, not a random sample of batches."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from attnlab.analysis.inputs import terminal_bar
from attnlab.data.bins import sequential_windows


@torch.no_grad()
def split_loss(
    model: torch.nn.Module,
    tokens: np.ndarray,
    batch_size: int = 16,
    progress: bool = False,
    excluded: Sequence[int] = (),
) -> dict[str, float]:
    """Mean cross-entropy and perplexity of ``model`` on ``tokens`` in block_size windows.

    ``excluded``: ids left out of the softmax, the rows an export added for tokens the model
    never trained (their zero logits would take probability from the trained ones, so an
    export would score worse than its run). ``progress``: a bar of tokens scored on stderr, as
    training's, where stderr is a terminal and the evaluation outlasts PROGRESS_DELAY_S; it is
    cleared when done.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    windows = sequential_windows(tokens, model.config.block_size, batch_size, device)
    bar = terminal_bar(len(tokens) - 1, "eval", "tok", progress)
    with bar:
        for x, y in windows:
            logits, _ = model(x, y)
            if excluded:
                logits[..., list(excluded)] = float("-inf")
            losses = torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), y.view(-1), ignore_index=-1, reduction="sum"
            )
            total += float(losses)
            scored = int((y != -1).sum())
            count += scored
            bar.update(scored)
    model.train(was_training)
    loss = total / max(count, 1)
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": count}
