"""The run folder: what makes a folder a run, and the lock that keeps one trainer per run.

Two trainers writing one run folder would interleave their checkpoints and metrics.csv rows, so
a trainer holds an exclusive ``fcntl.flock`` on ``RUN/.attnlab.lock`` from start to end; a
second one is refused in one line naming the holder's PID. The operating system drops the lock
when its holder exits, however it exits, so a killed run never leaves a stale lock behind.
Where ``fcntl`` does not exist (Windows) runs are not locked.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import IO

from attnlab.errors import AttnlabError

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows)
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".attnlab.lock"


class RunLock:
    """An exclusive lock on a run folder, held until ``release`` (or the process ends)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self.file is not None

    def acquire(self) -> None:
        """Take the lock (creating the folder), or raise naming the process that holds it."""
        if self.held or fcntl is None:
            return
        if not self.run_dir.is_dir():
            self.run_dir.mkdir(parents=True)
        f = self.path.open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise AttnlabError(
                f"{self.run_dir} is in use by another trainer (PID {holder}); "
                "wait for it to finish or stop it, or choose another folder"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self.file = f

    def release(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()  # closing the file drops the flock
            self.file = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _run_config(folder: Path) -> dict | None:
    """A run's saved config.json (model, train and data), or None if ``folder`` holds none."""
    try:
        saved = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and {"model", "train", "data"} <= saved.keys() else None


def is_run_folder(folder: Path) -> bool:
    """True if ``folder/config.json`` is a run's (model, train and data), not a model folder's."""
    return _run_config(folder) is not None


def run_data_dir(folder: str | Path) -> str | None:
    """The data folder a run was trained on, or None for a model folder (or no folder)."""
    saved = _run_config(Path(folder))
    return saved["data"] if saved is not None else None


def shared_data_dir(runs: list[str] | list[Path], data: str | Path | None = None) -> str | None:
    """``data`` if given, else the one data folder all ``runs`` were trained on (None: unknown)."""
    if data:
        return str(data)
    known = {str(run): run_data_dir(run) for run in runs}
    folders = {str(Path(d).resolve()) for d in known.values() if d}
    if len(folders) > 1:
        listed = ", ".join(f"{run}: {d}" for run, d in known.items() if d)
        raise AttnlabError(f"the runs were trained on different data ({listed}); pass --data")
    return next((d for d in known.values() if d), None)


def finished_summary(folder: str | Path) -> dict | None:
    """The run's summary.json if the run reached its planned end, else None.

    A summary is also written when a run stops early (``Trainer.run(until=...)``, an interrupt),
    so a summary alone does not mean finished: its iterations must reach ``max_iters``, or the
    run must have used up its ``max_seconds``.
    """
    folder = Path(folder)
    saved = _run_config(folder)
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if saved is None or not isinstance(summary, dict):
        return None
    train = saved["train"]
    budget = train.get("max_seconds")
    if (summary.get("iters") or 0) >= train["max_iters"]:
        return summary
    if budget is not None and (summary.get("train_seconds") or 0) >= budget:
        return summary
    return None
