"""What the traced graphs share: the ``input_ids -> logits`` wrapper, its example input, quiet logs."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

INPUT, OUTPUT = "input_ids", "logits"


class LogitsModel(nn.Module):
    """``input_ids -> logits`` at every position: the one signature the graphs are traced with."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, all_logits=True)[0]


def example_input(config: Any) -> torch.Tensor:
    """A [2, up to 8] trace input: sizes above 1, which torch.export would specialise on."""
    return torch.arange(2 * min(8, config.block_size)).view(2, -1) % config.vocab_size


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Hide a library's advisory warnings (missing torchvision ops, a quantization hint)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
