"""What a run ran on: versions, device, git commit and command line (a run's env.json)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import torch

import attnlab


def environment(device: torch.device, processes: int = 1) -> dict[str, Any]:
    """Versions, device, processes (torchrun's ranks), git commit and command line, for
    env.json."""
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                cwd=Path(attnlab.__file__).parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "attnlab": attnlab.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "processes": processes,
        "git_commit": commit,
        "command": sys.argv,
    }
