"""The run folder, owned here: its layout, typed reads and writes, and the lock (one trainer per run).

A run folder (``RunDir``) holds::

    config.json    the run's ModelConfig, TrainConfig and data folder (RunConfig)
    env.json       versions, device, processes, git commit and command line of the first
                   start, and of each resume that trains (``resumes``, with its iteration)
    metrics.csv    one row per log interval and evaluation; tb/ the same for TensorBoard
                   (their columns, rows and truncation on resume: attnlab.train.metrics)
    summary.json   the latest summary (iterations, losses, throughput)
    latest/ best/  model folders (attnlab.train.checkpoint): the last and the best checkpoint
    sft_data/      a fine-tuning run's own data folder (sft_data/sft.json marks an SFT run;
                   its content: attnlab.train.sft), read from beside the run whatever path
                   config.json holds (own_data)
    copied_from.json   where a study copied the run from (copy_run, ``--reuse-from``)

A run's records (RECORDS: config, env, metrics, summary, copied_from; ``copy_records``) are all
of it but its model folders: enough to count it finished, report it and draw its curves, small
enough to commit beside a published study, which a study on another machine resumes from.

A model folder (``latest/``, ``best/``, an export) is a different thing: its config.json is a
bare ModelConfig; attnlab.train.checkpoint reads and writes those.

Two trainers writing one run folder would interleave their checkpoints and metrics.csv rows, so
a trainer holds an exclusive ``fcntl.flock`` on ``RUN/.attnlab.lock`` from start to end; a
second one is refused in one line naming the holder's PID. The operating system drops the lock
when its holder exits, however it exits, so a killed run never leaves a stale lock behind.
Where ``fcntl`` does not exist (Windows) runs are not locked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import AttnlabError
from attnlab.fsutil import (
    fsync,
    fsync_tree,
    no_space_message,
    process_alive,
    remove_stale_temps,
    write_json,
)

try:
    import fcntl
except ImportError:  # pragma: no cover  (Windows)
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".attnlab.lock"
CONFIG = "config.json"
ENV = "env.json"
METRICS = "metrics.csv"
SUMMARY = "summary.json"
TENSORBOARD = "tb"
LATEST = "latest"
BEST = "best"
SFT_DATA = "sft_data"
SFT_FILE = "sft.json"
COPIED_FROM = "copied_from.json"
RECORDS = (CONFIG, ENV, METRICS, SUMMARY, COPIED_FROM)


class RunLock:
    """An exclusive lock on a run (or study) folder, held until ``release`` or the process ends."""

    def __init__(self, run_dir: str | Path, record_pid: bool = True, user: str = "trainer") -> None:
        """``record_pid=False`` holds the lock without writing to the file (a run about to be
        replaced, which must stay as it was should its replacement fail); ``user`` names what
        holds such locks in the refusal."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.record_pid = record_pid
        self.user = user
        self.file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self.file is not None

    def acquire(self, record: bool = True) -> None:
        """Take the lock (creating the folder), or raise naming the process that holds it;
        ``record=False``: the PID is written later (``record``), once the holder is sure to go
        on, so that a refusal leaves the file as it was."""
        if self.held or fcntl is None:
            return
        try:
            if not self.run_dir.is_dir():
                self.run_dir.mkdir(parents=True)
            f = self.path.open("a+")
        except OSError as e:  # a read-only mount, a file where the folder should be
            raise AttnlabError(
                f"cannot write {self.run_dir} ({e.strerror}), where a {self.user} writes; make "
                "it writable, or copy it somewhere that is and use the copy"
            ) from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip()
            f.close()
            # a lock held without recording its PID (--overwrite's, of the run it replaces)
            # leaves the PID of the run's last trainer in the file, long gone: never name it
            who = f" (PID {holder})" if holder.isdigit() and process_alive(int(holder)) else ""
            raise AttnlabError(
                f"{self.run_dir} is in use by another {self.user}{who}; "
                "wait for it to finish or stop it, or choose another folder"
            ) from None
        self.file = f
        if record:
            self.record()

    def record(self) -> None:
        """Write this process's PID into the held lock's file (unless made ``record_pid=False``)."""
        if self.file is not None and self.record_pid:
            self.file.seek(0)
            self.file.truncate()
            self.file.write(f"{os.getpid()}\n")
            self.file.flush()

    def holder(self) -> str | None:
        """Who holds the lock now, without taking it or writing anything: "" or "PID N" while
        one holds it, None when it is free (or there is no lock file)."""
        if fcntl is None or not self.path.is_file():
            return None
        try:
            with self.path.open() as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pid = f.read().strip()
                    return f"PID {pid}" if pid.isdigit() and process_alive(int(pid)) else ""
                fcntl.flock(f, fcntl.LOCK_UN)
        except OSError:
            return None
        return None

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


@dataclass(frozen=True)
class RunConfig:
    """What a run's config.json holds: the model, the training recipe, the data folder and the
    fingerprint of the data in it (attnlab.data.prepare.fingerprint; absent in older runs)."""

    model: ModelConfig
    train: TrainConfig
    data: str
    data_splits: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"model": self.model.to_dict(), "train": self.train.to_dict(), "data": self.data}
        return out if self.data_splits is None else {**out, "data_splits": self.data_splits}


class RunDir:
    """A run folder: the paths of everything in it, typed reads and writes, and its lock."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    config = property(lambda self: self.path / CONFIG)
    env = property(lambda self: self.path / ENV)
    metrics = property(lambda self: self.path / METRICS)
    summary = property(lambda self: self.path / SUMMARY)
    tensorboard = property(lambda self: self.path / TENSORBOARD)
    latest = property(lambda self: self.path / LATEST)
    best = property(lambda self: self.path / BEST)
    sft_data = property(lambda self: self.path / SFT_DATA)

    def lock(self) -> RunLock:
        return RunLock(self.path)

    def is_run(self) -> bool:
        return is_run_folder(self.path)

    def is_foreign(self) -> bool:
        """True if the folder holds something that is not a run's: no trainer writes there. Before
        its config.json a run holds at most its lock and SFT's data."""
        if not self.path.is_dir() or self.is_run():
            return False
        return any(p.name not in (LOCK_FILE, SFT_DATA) for p in self.path.iterdir())

    def refuse_misshapen(self, tensorboard: bool) -> None:
        """Refuse, before a resume changes anything, a run whose logs are not what a trainer
        writes into: a file where ``tb/`` (with ``tensorboard``) or ``best/`` goes, a folder
        where metrics.csv, summary.json or env.json goes."""
        folders = [self.best, *([self.tensorboard] if tensorboard else [])]
        for path in [self.metrics, self.summary, self.env, *folders]:
            want = "folder" if path in folders else "file"
            if path.exists() and path.is_dir() != (want == "folder"):
                hint = ", or resume with tensorboard=false" if path == self.tensorboard else ""
                raise AttnlabError(
                    f"cannot resume {self.path}: {path} is not a {want}; move it away{hint}"
                )

    def is_sft(self) -> bool:
        """True for a fine-tuning run (its own sft_data/ with sft.json)."""
        return (self.sft_data / SFT_FILE).is_file()

    def read_config(self) -> RunConfig:
        """The run's config.json, to resume from; a missing or foreign file is refused in one line."""
        if not self.path.exists():
            raise AttnlabError(f"cannot resume {self.path}: there is no such folder")
        if not self.config.is_file():
            raise AttnlabError(f"cannot resume {self.path}: no {CONFIG} (is it a run folder?)")
        try:
            saved = json.loads(self.config.read_text())
        except (OSError, ValueError) as e:
            raise AttnlabError(f"{self.config} is not valid JSON ({e})") from None
        if not isinstance(saved, dict) or not {"model", "train", "data"} <= saved.keys():
            raise AttnlabError(
                f"cannot resume {self.path}: its {CONFIG} is not a run's "
                "(a model folder? resume the run folder above it)"
            )
        if not all(isinstance(saved[part], dict) for part in ("model", "train")):
            raise AttnlabError(
                f"cannot resume {self.path}: {self.config} is damaged (its model and train "
                "must be JSON objects)"
            )
        try:
            return RunConfig(
                ModelConfig.from_dict(saved["model"]),
                TrainConfig.from_dict(saved["train"]),
                own_data(self.path, str(saved["data"])),
                saved["data_splits"] if isinstance(saved.get("data_splits"), dict) else None,
            )
        except AttnlabError as e:  # e.g. a field of the wrong type
            raise AttnlabError(f"cannot resume {self.path}: {self.config}: {e}") from None

    def train_keys(self) -> set[str]:
        """The training fields config.json names (read_config fills in the defaults of the
        rest: fields an older attnlab did not have); call after read_config."""
        return set(json.loads(self.config.read_text())["train"])

    def write_config(self, config: RunConfig) -> None:
        write_json(self.config, config.to_dict())

    def write_env(self, env: dict[str, Any]) -> None:
        write_json(self.env, env)

    def add_resume_env(self, env: dict[str, Any], at_iter: int) -> None:
        """Append a resume's environment to env.json: a run trained across commits, machines or
        process counts says which trained what. An unreadable env.json starts afresh."""
        try:
            recorded = json.loads(self.env.read_text())
        except (OSError, ValueError):
            recorded = None
        if not isinstance(recorded, dict):
            recorded = {}
        resumes = recorded.get("resumes")
        resumes = resumes if isinstance(resumes, list) else []
        write_json(self.env, {**recorded, "resumes": [*resumes, {"iter": at_iter, **env}]})

    def read_env(self) -> dict[str, Any] | None:
        """env.json, or None if there is none (yet) or it cannot be read."""
        try:
            env = json.loads(self.env.read_text())
        except (OSError, ValueError):
            return None
        return env if isinstance(env, dict) else None

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json, or None if there is none (yet) or it cannot be read."""
        try:
            summary = json.loads(self.summary.read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.summary, summary)


def _run_config(folder: Path) -> dict | None:
    """A run's saved config.json (model, train and data), or None if ``folder`` holds none."""
    try:
        saved = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and {"model", "train", "data"} <= saved.keys() else None


def is_run_folder(folder: Path) -> bool:
    """True if ``folder/config.json`` is a run's (model, train and data), not a model folder's."""
    return _run_config(folder) is not None


def checkpoint_problem(out: Path) -> str | None:
    """Why ``out`` may not be a command's --out: it is, or lies inside, a run's latest/ or best/.

    Resume and eval read them, and every checkpoint save replaces them whole: an export or an
    import written there replaced the run's checkpoint, and anything written inside them was
    lost, without a word, at the next save. A symlinked path counts where it leads too.
    """
    out = out.expanduser()
    for path in dict.fromkeys((Path(os.path.abspath(out)), out.resolve())):
        for folder in (path, *path.parents):
            if folder.name not in (LATEST, BEST) or not is_run_folder(folder.parent):
                continue
            if folder == path:
                return (
                    f"--out {out} is a checkpoint of the run {folder.parent} (resume and eval "
                    "read it); choose another --out"
                )
            return (
                f"--out {out} is inside {folder}, a checkpoint of the run {folder.parent} "
                "(each save replaces it whole); choose another --out"
            )
    return None


def own_data(folder: Path, recorded: str) -> str:
    """The data folder of the run in ``folder`` whose config.json names ``recorded``.

    An SFT run's data is always its own sft_data/, so it is found beside the run: a copied or
    moved run would otherwise read (or miss) the original's, whose absolute path config.json
    holds. A recorded folder of another name is some other data: kept as it is.
    """
    own = RunDir(folder)
    if Path(recorded).name == SFT_DATA and own.is_sft():
        return str(own.sft_data.resolve())
    return recorded


def run_data_dir(folder: str | Path) -> str | None:
    """The data folder a run was trained on, or None for a model folder (or no folder)."""
    saved = _run_config(Path(folder))
    return own_data(Path(folder), str(saved["data"])) if saved is not None else None


def run_data_splits(folder: str | Path) -> dict[str, Any] | None:
    """The fingerprint of the data a run was trained on (None: not a run, or an older one)."""
    saved = _run_config(Path(folder))
    splits = saved.get("data_splits") if saved is not None else None
    return splits if isinstance(splits, dict) else None


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


def copy_run(source: str | Path, dest: str | Path) -> None:
    """Copy the run in ``source`` to the new folder ``dest``, whole or not at all, recording
    where it came from (``COPIED_FROM``, the source's resolved path).

    The source's lock is held meanwhile (a trainer resuming it is refused, and this is while
    one trains it); the copy is written under ``.DEST.tmp-PID`` (removed by
    ``remove_stale_temps`` should this process die) and renamed in once complete. A run records
    no path of its own folder, so the copy reads, resumes and exports as the original.
    """
    source, dest = Path(source), Path(dest)
    if os.path.lexists(dest):
        raise AttnlabError(f"{dest} exists; a run is only copied into a new folder")
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    try:
        with RunLock(source, record_pid=False):
            dest.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(dest)
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(source, tmp, symlinks=True, ignore=shutil.ignore_patterns(LOCK_FILE))
            write_json(tmp / COPIED_FROM, {"source": str(source.resolve())})
            fsync_tree(tmp)
            os.replace(tmp, dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno == errno.ENOSPC:
            raise AttnlabError(no_space_message(dest)) from None
        raise AttnlabError(f"cannot copy the run {source} to {dest} ({e.strerror})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync(dest.parent)


def copy_records(source: str | Path, dest: str | Path) -> None:
    """Copy the RECORDS of the run in ``source`` (those it has) into the new folder ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    for name in RECORDS:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, dest / name)


def has_weights(folder: str | Path) -> bool:
    """Whether a run folder holds a model folder (``latest/`` or ``best/``), not only records."""
    return any((Path(folder) / name).is_dir() for name in (LATEST, BEST))


def copied_from(folder: str | Path) -> str | None:
    """The run folder a run was copied from (``copy_run``), or None for one trained there."""
    try:
        source = json.loads((Path(folder) / COPIED_FROM).read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if isinstance(source, str) else None


def finished_summary(folder: str | Path) -> dict | None:
    """The run's summary.json if the run reached its planned end, else None.

    A summary is also written when a run stops early (``Trainer.run(until=...)``, an interrupt),
    so a summary alone does not mean finished: its iterations must reach ``max_iters``, or the
    run must have used up its ``max_seconds``.
    """
    folder = Path(folder)
    saved, summary = _run_config(folder), RunDir(folder).read_summary()
    if saved is None or summary is None:
        return None
    train = saved["train"]
    budget = train.get("max_seconds")
    if (summary.get("iters") or 0) >= train["max_iters"]:
        return summary
    if budget is not None and (summary.get("train_seconds") or 0) >= budget:
        return summary
    return None
