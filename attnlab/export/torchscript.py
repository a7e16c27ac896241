"""TorchScript: a traced ``input_ids -> logits`` graph that loads with torch.jit alone."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from attnlab.export.trace import LogitsModel, example_input


def write_torchscript(model: nn.Module, path: Path) -> None:
    """torch.jit.trace: the archive holds the graph and weights, no Python code of ours."""
    with warnings.catch_warnings(), torch.no_grad():
        # the backbone's block_size check reads sizes as Python ints; the trace keeps sizes symbolic
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(LogitsModel(model).eval(), example_input(model.config))
    # through a Python file: given a path, torch's C++ writer aborts the process (exit 134) on a
    # full disk; a file object's write raises OSError(ENOSPC), which replace_folder reports
    with path.open("wb") as f:
        torch.jit.save(traced, f)
