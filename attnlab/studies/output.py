"""The study folder, owned here: its layout and every read and write of its files.

A study folder (``StudyDir``, the ``--out`` of ``attnlab study``) holds::

    results.json   the training runs (RUN_FIELDS each) and the paired comparisons between them
    results.csv    the same runs, one row each
    study.json     what ran (spec and its text, preset, seeds, command, commit and dirty tree,
                   packages, data provenance, resolved configs, the runs' code states, the
                   runs copied from other studies, every invocation that ran it in this
                   folder: its time runs to its last finished run) and the kind's own results
    report.md      the report; figures/ holds the PNGs it embeds by relative path
    runs/<variant>/seed<s>/   one run folder (attnlab.rundir) per training run
    slurm/         with ``--executor slurm``: jobs.json (each unit of work's SLURM job, so a
                   rerun follows the jobs it submitted), results/<job id>.json (what each job
                   returned) and submitit's scripts and logs; never published

A published copy (``publish``, e.g. under results/) holds all of it but the runs' model
folders: runs/ there holds each finished run's records (attnlab.rundir.RECORDS), so the copy,
put back as a study folder on another machine, resumes the study without training those again.

Retrieval and overhead studies train nothing: their results.json and results.csv have no runs.
The JSON files are strict: a NaN (t and p of a single pair, a diverged run's loss) is written as
null, and as an empty cell in results.csv.

Convergence is read from each run's own val curve (its metrics.csv): ``val_change_last20`` is
the relative change of the validation loss over the run's last LAST_FRACTION of iterations, and
a run whose change lies beyond ±CONVERGED_WITHIN is not ``converged``.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.fsutil import check_out_path, check_writable, replace_folder, write_json
from attnlab.rundir import (
    LOCK_FILE,
    RECORDS,
    RunDir,
    RunLock,
    copy_records,
    finished_summary,
    has_weights,
    is_run_folder,
)
from attnlab.train.metrics import val_losses

RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
STUDY_JSON = "study.json"
REPORT = "report.md"
FIGURES = "figures"
RUNS = "runs"
SLURM = "slurm"  # the SLURM executor's folder (attnlab.studies.executors)
SLURM_JOBS = "jobs.json"
SLURM_RESULTS = "results"
# what a published copy of a study holds (``StudyDir.publish``) besides its runs' records
PUBLISHED = (REPORT, RESULTS_JSON, RESULTS_CSV, STUDY_JSON, FIGURES)
# the hand-written notes a results folder keeps: written before the first copy, they are its own
NOTES = "NOTES.md"
MARKER = ".attnlab-study"  # written first: an interrupted study's folder is still its own
LAST_FRACTION = 0.2  # the tail of a run's iterations its convergence is read over
# at most this relative change of the val loss over that tail counts as a plateau; a loss still
# moving faster ranks where training stopped, not where it would settle
CONVERGED_WITHIN = 0.01
# the columns of results.csv and the keys of each run in results.json
RUN_FIELDS = (
    "variant",
    "seed",
    "val_loss",
    "iters",
    "wall_s",
    "status",
    "sec_per_step",
    "best_val_loss",
    "val_change_last20",
    "converged",
    "params",
    "error",
    "run_dir",
)


class StudyDir:
    """A study folder: the paths in it and the writes of its files (each one atomic)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def create(self) -> RunLock:
        """Make the folder, lock it and mark it as a study's; return the held lock.

        A non-empty folder must be a study's already (a user's report.md or results.csv there
        were overwritten), and one study at a time: two in one folder marked each other's runs
        failed and both exited 1 without a word.
        """
        self.check_usable()
        lock = RunLock(self.path, user="study")
        lock.acquire()  # makes the folder; refuses, changing nothing, while a study holds it
        (self.path / MARKER).touch()
        return lock

    def check_usable(self) -> None:
        """Refuse, writing nothing, a folder a study may not be written in: a non-empty one that
        is not a study's, a file, a read-only or pseudo file system (/proc), a permission."""
        if check_out_path(self.path) and not self.is_study():
            raise AttnlabError(
                f"{self.path} is not empty and is not a study folder; choose another --out"
            )
        # a study inside another's folder is published with it, or inside a run with its weights
        for parent in self.path.expanduser().resolve().parents:
            what = (
                "study" if StudyDir(parent).is_study() else "run" if is_run_folder(parent) else ""
            )
            if what:
                raise AttnlabError(
                    f"{self.path} lies inside the {what} folder {parent}; choose another --out"
                )
        check_writable(self.path)

    def has_runs(self) -> bool:
        """Whether the folder holds run folders (an old published copy holds none; a newer
        one holds the records of its finished runs)."""
        return any((self.path / RUNS).glob("*/seed*"))

    def has_weights(self) -> bool:
        """Whether a run folder here holds its model (a published copy's hold records only)."""
        return any(has_weights(run) for run in (self.path / RUNS).glob("*/seed*"))

    def in_use(self) -> str | None:
        """Who runs a study in the folder now ("PID N", or "" unnamed), None when no one."""
        return RunLock(self.path, user="study").holder()

    @property
    def report(self) -> Path:
        return self.path / REPORT

    def run_dir(self, variant: str, seed: int) -> Path:
        return self.path / RUNS / variant / f"seed{seed}"

    def seed_runs(self, seed: int) -> list[Path]:
        """The run folders of seed ``seed``, every variant's, in name order."""
        return sorted((self.path / RUNS).glob(f"*/seed{seed}"))

    def is_study(self) -> bool:
        """Whether the folder is a study's (its study.json or marker is there)."""
        return any((self.path / name).is_file() for name in (STUDY_JSON, MARKER))

    def figure(self, name: str) -> Path:
        """Where the figure ``name`` is drawn (its folder is made when it is saved)."""
        return self.path / figure_link(name)

    def previous(self) -> dict[str, Any]:
        """study.json of an earlier invocation ({} if none or unreadable)."""
        try:
            held = json.loads((self.path / STUDY_JSON).read_text())
        except (OSError, ValueError):
            return {}
        return held if isinstance(held, dict) else {}

    def written(self) -> dict[str, Any]:
        """study.json of the study this folder holds, for a command that reads a study as it
        ran (``--report-only``, ``--publish``); refused in one line where there is none yet."""
        if not (self.path / STUDY_JSON).is_file():
            holder = self.in_use() if self.path.is_dir() else None
            if holder is not None:
                who = f" ({holder})" if holder else ""
                raise AttnlabError(
                    f"{self.path}: the study running there{who} has not written its "
                    f"{STUDY_JSON} yet (it does after its first run); wait for that"
                )
            if (self.path / RESULTS_JSON).is_file():
                raise AttnlabError(
                    f"{self.path} holds {RESULTS_JSON} but no {STUDY_JSON}; restore it (a "
                    "published copy carries it)"
                )
            raise AttnlabError(f"{self.path} holds no {STUDY_JSON}; run the study first")
        path = self.path / STUDY_JSON
        try:
            held = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise AttnlabError(
                f"cannot read {path}: {e}; restore it as the study wrote it"
            ) from None
        if not isinstance(held, dict):
            raise AttnlabError(f"{path} is not a study's record (a table); restore it")
        return held

    def read_results(self) -> dict[str, Any]:
        """results.json, to report a study again without its runs."""
        path = self.path / RESULTS_JSON
        try:
            results = json.loads(path.read_text())
        except FileNotFoundError:
            raise AttnlabError(f"{path}: not found; run the study first") from None
        except (OSError, ValueError) as e:
            raise AttnlabError(f"cannot read {path}: {e}") from None
        if not isinstance(results, dict) or not isinstance(results.get("runs"), list):
            raise AttnlabError(f"{path} is not a study's results (no list of runs)")
        for i, run in enumerate(results["runs"]):
            problem = _run_problem(run)
            if problem:
                raise AttnlabError(
                    f"{path}: run {i + 1} {problem}; restore it as the study wrote it"
                )
        return results

    def write_results(self, results: dict[str, Any], study: dict[str, Any]) -> None:
        """results.json, results.csv (the runs of ``results``) and study.json."""
        write_json(self.path / RESULTS_JSON, _nan_to_none(results))
        tmp = self.path / f"{RESULTS_CSV}.tmp"
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=RUN_FIELDS)
            writer.writeheader()
            writer.writerows(_nan_to_none(results["runs"]))  # empty, as results.json's null
        tmp.replace(self.path / RESULTS_CSV)
        write_json(self.path / STUDY_JSON, _nan_to_none(study))

    def publish(self, dest: str | Path) -> Path:
        """Copy the study's report, results, study.json and figures, and the records of its
        finished runs (never their model folders), to ``dest`` (e.g. results/NAME, to commit),
        replacing an earlier copy of this study whole; anything else already there (a
        hand-written NOTES.md, as it is, links kept as links) is kept, and a folder holding
        only its NOTES.md takes a first copy. ``dest`` may not be a study folder that holds
        runs, a copy of another study or of this one at another preset, or lie inside this
        study. A running study's copy is what it has written so far (each file whole; a file
        rewritten meanwhile may be a run newer than the others). Returns ``dest``."""
        dest = self.check_publish(dest)
        # the records of the runs results.json lists (one finished since is not in the copy's)
        listed = (
            [
                self.run_dir(r["variant"], r["seed"])
                for r in self.read_results()["runs"]
                if r["status"] == "ok"
            ]
            if (self.path / RESULTS_JSON).is_file()
            else []
        )
        kept = [
            p
            for p in (dest.iterdir() if dest.is_dir() else [])
            if p.name not in (*PUBLISHED, RUNS, MARKER, LOCK_FILE)
        ]
        lock = RunLock(dest, record_pid=False, user="study")
        had_lock = lock.path.exists()
        if dest.is_dir():
            lock.acquire()  # a study starting in it meanwhile is refused, and so is this
        try:
            with replace_folder(
                dest, "study", overwrite=True, flag="--publish", sources=[self.path], manifest=False
            ) as tmp:
                for source in [*(self.path / name for name in PUBLISHED), *kept]:
                    if source.is_dir() and not source.is_symlink():
                        shutil.copytree(source, tmp / source.name, symlinks=True)
                    elif source.is_file() or source.is_symlink():
                        shutil.copy2(source, tmp / source.name, follow_symlinks=False)
                for run in listed:
                    if finished_summary(run) is not None:
                        copy_records(run, tmp / run.relative_to(self.path))
        finally:
            lock.release()
            if not had_lock:  # a refused copy leaves dest as it was (a done one has no lock)
                lock.path.unlink(missing_ok=True)
        return dest

    def check_publish(self, dest: str | Path) -> Path:
        """``publish``'s refusals, made without copying anything (a command that reports the
        study again first makes them before that); ``dest`` as a path."""
        given, dest = str(dest), Path(dest).expanduser()
        if dest.name in ("", ".."):  # "", ".", "..", "/": the copy replaces the folder whole
            raise AttnlabError(
                f"--publish {given!r} must name a folder, not the current or parent one"
            )
        record = self.written()
        here, there = self.path.resolve(), dest.resolve()
        if there == here or here in there.parents:
            raise AttnlabError(
                f"--publish {dest} is inside the study folder {self.path}; name a folder outside it"
            )
        if check_out_path(dest, "--publish"):
            _refuse_publishing_over(dest, record.get("name"), record.get("preset"))
        return dest

    @property
    def slurm(self) -> Path:
        """The folder of the study's SLURM jobs: submitit's files, the records, the results."""
        return self.path / SLURM

    def job_result(self, job_id: str) -> Path:
        """Where the SLURM job ``job_id`` writes what its unit of work returned."""
        return self.slurm / SLURM_RESULTS / f"{job_id}.json"

    def read_jobs(self) -> dict[str, dict[str, Any]]:
        """The SLURM jobs the study submitted, by unit of work ({} before the first)."""
        path = self.slurm / SLURM_JOBS
        try:
            held = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise AttnlabError(
                f"cannot read {path}: {e}; restore it (without it the study cannot follow the "
                "jobs it submitted), or move it away to submit the unfinished runs again"
            ) from None
        if not isinstance(held, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("job"), str) for v in held.values()
        ):
            raise AttnlabError(
                f"{path} is not the study's record of its SLURM jobs (a table of jobs); "
                "restore it, or move it away to submit the unfinished runs again"
            )
        return held

    def write_jobs(self, jobs: dict[str, dict[str, Any]]) -> None:
        """Record the study's SLURM jobs (``read_jobs``)."""
        (self.slurm / SLURM_RESULTS).mkdir(parents=True, exist_ok=True)
        write_json(self.slurm / SLURM_JOBS, jobs)

    def write_report(self, text: str) -> None:
        tmp = self.path / f"{REPORT}.tmp"
        tmp.write_text(text)
        tmp.replace(self.report)


def _run_problem(run: Any) -> str | None:
    """What makes ``run`` (a row of results.json) not one a study writes, None if nothing."""
    if not isinstance(run, dict):
        return f"is {type(run).__name__}, not a table of {', '.join(RUN_FIELDS[:3])}, ..."
    if not isinstance(run.get("variant"), str):
        return f"has variant {run.get('variant')!r}, not a name"
    if not isinstance(run.get("seed"), int) or isinstance(run.get("seed"), bool):
        return f"({run['variant']}) has seed {run.get('seed')!r}, not a whole number"
    if run.get("status") not in ("ok", "failed"):
        return f"({run['variant']} seed {run['seed']}) has status {run.get('status')!r}, not ok or failed"
    for key in ("val_loss", "best_val_loss", "iters", "wall_s", "sec_per_step", "params"):
        value = run.get(key)
        if value is None:
            continue  # not measured, or not a number (written as null)
        whole = key in ("iters", "params")
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            return f"({run['variant']} seed {run['seed']}) has {key} {value!r}, not a " + (
                "whole number" if whole else "number"
            )
        if value < 0:  # a loss, a count or a time: none of them is negative
            return f"({run['variant']} seed {run['seed']}) has {key} {value!r}, below 0"
    return None


def _refuse_publishing_over(dest: Path, name: str | None, preset: str | None) -> None:
    """Refuse a non-empty ``dest`` that is not an earlier published copy of study ``name`` at
    ``preset`` (a copy of the converged scale is not replaced by a smoke test's)."""
    other = StudyDir(dest)
    if [p.name for p in dest.iterdir()] == [NOTES] and (dest / NOTES).is_file():
        return  # notes written before the study's first copy: kept beside it
    if not other.is_study():
        raise AttnlabError(
            f"--publish {dest} is not empty and is not a study folder; choose another folder"
        )
    if any(has_weights(run) for run in (dest / RUNS).glob("*/seed*")):
        raise AttnlabError(
            f"--publish {dest} is a study folder with its runs, not a published copy; "
            "choose another folder"
        )
    # what a published copy holds under runs/: VARIANT/SEED/RECORD files, nothing else
    foreign = next(
        (
            p
            for p in sorted((dest / RUNS).rglob("*"))
            if not p.is_dir()
            and (len(p.relative_to(dest / RUNS).parts) != 3 or p.name not in RECORDS)
        ),
        None,
    )
    if foreign is not None:
        # the copy replaces runs/ whole: a note kept beside a run's records would be lost
        raise AttnlabError(
            f"--publish {dest}: {foreign} is not a run's record, and the copy replaces "
            f"{dest / RUNS} whole; move it out of there first"
        )
    held = other.previous()
    if held.get("name") is not None and held.get("name") != name:
        raise AttnlabError(
            f"--publish {dest} holds a copy of study {held['name']!r}, not {name!r}; choose "
            "another folder"
        )
    if held.get("preset") is not None and held.get("preset") != preset:
        raise AttnlabError(
            f"--publish {dest} holds a copy of study {name!r} at preset {held['preset']!r}, not "
            f"{preset!r}; choose another folder"
        )


def val_curve(run_dir: str | Path) -> dict[int, float]:
    """Iteration -> validation loss at each evaluation of a run folder ({} where there is none)."""
    return val_losses(RunDir(run_dir).metrics)


def val_change(curve: dict[int, float], iters: int) -> float | None:
    """(L(iters) - L(s)) / L(s), s = (1 - LAST_FRACTION) * iters: the relative change of the val
    loss over the last LAST_FRACTION of ``iters``, L(s) interpolated linearly between the
    evaluations around s. None without an evaluation at ``iters`` and one at or before s."""
    start = (1 - LAST_FRACTION) * iters
    before = [i for i in curve if i <= start]
    after = [i for i in curve if start <= i]
    if iters not in curve or not before:
        return None
    lo, hi = max(before), min(after)
    at_start = (
        curve[lo] if hi == lo else curve[lo] + (curve[hi] - curve[lo]) * (start - lo) / (hi - lo)
    )
    return (curve[iters] - at_start) / at_start


def convergence(run_dir: str | Path, iters: int) -> dict[str, Any]:
    """A finished run's ``val_change_last20`` and whether it is ``converged`` (None: unknown)."""
    change = val_change(val_curve(run_dir), iters)
    converged = None if change is None else abs(change) <= CONVERGED_WITHIN
    return {"val_change_last20": change, "converged": converged}


def figure_link(name: str) -> str:
    """The figure ``name`` as report.md and study.json refer to it (relative to the folder)."""
    return f"{FIGURES}/{name}"


def run_label(run_dir: str | Path) -> str:
    """A run folder ``OUT/runs/<variant>/seed<s>`` as "<variant> seed <s>" for figure titles."""
    path = Path(run_dir)
    return f"{path.parent.name} seed {path.name.removeprefix('seed')}"


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x
