"""Loss over a whole split: every token predicted exactly once, not a random sample of batches."""

from __future__ import annotations

import math
import sys

import numpy as np
import torch
from tqdm import tqdm

from attnlab.data.bins import sequential_windows

# seconds before the progress bar appears: a quick evaluation stays silent
PROGRESS_DELAY_S = 2.0


@torch.no_grad()
def split_loss(
    model: torch.nn.Module, tokens: np.ndarray, batch_size: int = 16, progress: bool = False
) -> dict[str, float]:
    """Mean cross-entropy and perplexity of ``model`` on ``tokens`` in block_size windows.

    ``progress``: a bar of tokens scored on stderr, as training's, where stderr is a terminal
    and the evaluation outlasts PROGRESS_DELAY_S; it is cleared when done.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    windows = sequential_windows(tokens, model.config.block_size, batch_size, device)
    # off a terminal a bar would be lines of carriage returns in a log: nothing, as in training
    bar = tqdm(
        total=len(tokens) - 1,
        disable=not (progress and sys.stderr.isatty()),
        file=sys.stderr,
        delay=PROGRESS_DELAY_S,
        leave=False,
        unit="tok",
        unit_scale=True,
        dynamic_ncols=True,
        desc="eval",
    )
    with bar:
        for x, y in windows:
            logits, _ = model(x, y)
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
