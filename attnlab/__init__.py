"""attnlab: transformer attention with a fourth signal, trained, compared and shipped.

``GPT``, ``ModelConfig``, ``TrainConfig`` and ``from_pretrained`` are imported on first use, so
that ``attnlab --help`` and other light commands start without loading torch. The library reports
through ``logging`` under the ``attnlab`` logger (attnlab.reporting).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from attnlab.errors import AttnlabError
from attnlab.reporting import LOGGER

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from attnlab.config import ModelConfig, TrainConfig
    from attnlab.data.tokenizer import Tokenizer
    from attnlab.model import GPT

__version__ = "0.1.0"
# a library's default: silent until the program configures logging (the CLI does)
logging.getLogger(LOGGER).addHandler(logging.NullHandler())
_LAZY = {"GPT": "attnlab.model", "ModelConfig": "attnlab.config", "TrainConfig": "attnlab.config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def from_pretrained(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[GPT, Tokenizer | None]:
    """Load a model folder (HF-style export or a run's checkpoint) as ``(model, tokenizer)``."""
    from attnlab.train.checkpoint import load_pretrained

    return load_pretrained(path, device=device)


__all__ = ["GPT", "AttnlabError", "ModelConfig", "TrainConfig", "from_pretrained"]
