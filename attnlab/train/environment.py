"""What a run ran on: versions, device, git commit and command line (a run's env.json)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import torch

import attnlab


def _git(args: list[str], cwd: Path) -> bytes | None:
    """Output of ``git ARGS`` in ``cwd``, or None outside a git checkout (or without git)."""
    try:
        proc = subprocess.run(["git", *args], capture_output=True, timeout=30, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_state(package: Path | None = None) -> dict[str, Any]:
    """The commit of the checkout holding attnlab (or ``package``), whether the package's files
    differ from it (tracked changes or untracked files under it) and the sha256 of that
    difference: ``git diff HEAD --binary`` of the package, then each untracked file's path and
    bytes, so two trees with different uncommitted code at one commit never share a hash. Files
    outside the package (README, tests) change nothing a run computes and are left out. All
    None outside a git checkout. Taken once per process (``process_git_state``) where it
    describes the code a process runs."""
    here = package or Path(attnlab.__file__).parent
    top = _git(["rev-parse", "--show-toplevel"], here)
    commit = _git(["rev-parse", "HEAD"], here)
    if top is None or commit is None:
        return {"commit": None, "dirty": None, "diff_sha256": None}
    root = Path(top.decode().strip())
    scope = ["--", str(here.resolve().relative_to(root.resolve()))]
    diff = _git(["diff", "HEAD", "--binary", *scope], root) or b""
    listed = _git(["ls-files", "--others", "--exclude-standard", "-z", *scope], root) or b""
    untracked = sorted(name for name in listed.split(b"\0") if name)
    digest = hashlib.sha256(diff)
    for name in untracked:
        digest.update(b"\0" + name + b"\0")
        with contextlib.suppress(OSError):  # removed since it was listed
            digest.update((root / name.decode()).read_bytes())
    dirty = bool(diff or untracked)
    return {
        "commit": commit.decode().strip() or None,
        "dirty": dirty,
        "diff_sha256": digest.hexdigest() if dirty else None,
    }


@functools.cache
def _first_git_state() -> dict[str, Any]:
    return git_state()


def process_git_state() -> dict[str, Any]:
    """``git_state`` of attnlab's checkout as this process first saw it: a process runs the
    code it imported, so files edited while it trains (a shared checkout) do not make one
    study's runs differ in what they record."""
    return dict(_first_git_state())


def environment(device: torch.device, processes: int = 1) -> dict[str, Any]:
    """Versions, device, processes (torchrun's ranks), git commit (and whether the tree was
    dirty, with the hash of its difference) and command line, for env.json."""
    git = process_git_state()
    return {
        "attnlab": attnlab.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "processes": processes,
        # torchrun's job id: a restarted worker (--max-restarts) knows the run its job began
        "torchrun_run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "git_diff_sha256": git["diff_sha256"],
        "command": sys.argv,
    }
