"""Where a study's units of work run: here (``LocalExecutor``, a process pool) or as SLURM jobs
submitted through submitit (``SlurmExecutor``). Another engine is one more class with ``run``.

A SLURM study keeps its jobs in ``OUT/slurm`` (attnlab.studies.output): each unit of work's job
id is recorded as soon as it is submitted, so the study command can be stopped and run again at
any time and follows the jobs it submitted instead of submitting them again. A job writes what
its unit returned as JSON beside them; the study command reads only that (never submitit's
pickled results) and never writes a run folder itself: a job that ends without a result
(cancelled, killed, failed, its node lost) is submitted again up to ``retries`` times, and a
training run resumes from its last checkpoint. A job SLURM preempts or times out is requeued
by submitit under the same id, and resumes the same way.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attnlab.errors import AttnlabError
from attnlab.fsutil import write_json
from attnlab.studies.jobs import run_all
from attnlab.studies.output import StudyDir, run_label
from attnlab.studies.progress import Progress
from attnlab.train.spec import tomllib

log = logging.getLogger(__name__)

OnDone = Callable[[int, Any, float], None]
# the study's SLURM defaults: this variable names the file, else the user's config folder's
CONFIG_ENV = "ATTNLAB_SLURM_CONFIG"
# squeue's states of a job that has not started yet; any other listed state counts as running
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


class Executor(Protocol):
    """Runs ``work(item, threads)`` for every item, calling ``on_done(index, result, seconds)``
    as each one finishes (``seconds``: the wall time since the previous one finished)."""

    def run(
        self, work: Callable[[Any, int | None], Any], items: Sequence[Any], on_done: OnDone
    ) -> None: ...


@dataclass(frozen=True)
class LocalExecutor:
    """Today's behaviour: the items here, or in ``jobs`` spawned processes."""

    jobs: int = 1

    def run(
        self, work: Callable[[Any, int | None], Any], items: Sequence[Any], on_done: OnDone
    ) -> None:
        run_all(work, items, self.jobs, on_done)


@dataclass(frozen=True)
class SlurmOptions:
    """How each unit of work is submitted; a config file's keys are these fields' names."""

    partition: str | None = None  # None: the cluster's default partition
    time: int = 60  # minutes per job; a longer run is requeued by submitit and resumes
    cpus: int = 1  # CPUs per job (each run's torch threads follow its allocation)
    gpus: int = 0  # GPUs per job
    jobs: int = 16  # jobs of the study running at once (the job array's throttle)
    retries: int = 2  # submissions again of a job that ended without a result
    poll: float = 10.0  # seconds between looks at the queue
    setup: tuple[str, ...] = ()  # shell lines each job runs first (module load, ...)
    sbatch: dict[str, str | bool] = field(default_factory=dict)  # more sbatch options


def config_path() -> Path:
    """The SLURM config file: $ATTNLAB_SLURM_CONFIG, else attnlab/slurm.toml in the user's
    config folder ($XDG_CONFIG_HOME, else ~/.config)."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "attnlab" / "slurm.toml"


def slurm_options(given: dict[str, Any]) -> SlurmOptions:
    """The config file's values (``config_path``; none if it is absent) under ``given`` (the
    command line's; None: not given), each checked; a bad one is refused in one line. The
    sbatch options of both are merged, the command line's winning."""
    path = config_path()
    table: dict[str, Any] = {}
    if path.is_file():
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise AttnlabError(f"cannot read the SLURM config {path}: {e}") from None
    elif os.environ.get(CONFIG_ENV):
        raise AttnlabError(f"{CONFIG_ENV} names {path}, which is not a file")
    hints = typing.get_type_hints(SlurmOptions)
    unknown = sorted(set(table) - set(hints))
    if unknown:
        raise AttnlabError(f"{path}: unknown key {unknown[0]!r}; the keys are {', '.join(hints)}")
    values = {**table, **{k: v for k, v in given.items() if v is not None}}
    for name, value in values.items():
        problem = _value_problem(name, value, hints[name])
        if problem:
            where = f"--{name}" if given.get(name) is not None else f"{path}: {name}"
            raise AttnlabError(f"{where} is {value!r}; {problem}")
    values["setup"] = tuple(values.get("setup", ()))
    values["sbatch"] = {**table.get("sbatch", {}), **(given.get("sbatch") or {})}  # both
    return SlurmOptions(**values)


def _value_problem(name: str, value: Any, hint: Any) -> str | None:
    """Why ``value`` cannot be the SlurmOptions field ``name`` of type ``hint``, None if it can."""
    if isinstance(hint, types.UnionType):  # str | None: a name, or left out
        return None if isinstance(value, str) and value else "give a name"
    origin = typing.get_origin(hint)
    if origin is tuple:
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        return None if ok else "give a list of shell lines"
    if origin is dict:
        ok = isinstance(value, dict) and all(isinstance(v, str | bool) for v in value.values())
        return None if ok else "give a table of sbatch options (KEY = VALUE)"
    if isinstance(value, bool) or not isinstance(value, hint if hint is int else int | float):
        return f"give a {'whole ' if hint is int else ''}number"
    if hint is float:
        return None if value > 0 else "give a positive number"
    least = 0 if name in ("gpus", "retries") else 1
    return None if value >= least else f"give at least {least}"


class _Unit:
    """One unit of work as a SLURM job runs it: ``work(item)``, its result written as JSON
    where the study reads it. submitit requeues it on preemption or timeout (``checkpoint``)."""

    def __init__(self, work: Callable[[Any, int | None], Any], item: Any, folder: str) -> None:
        self.work, self.item, self.folder = work, item, folder

    def __call__(self) -> None:
        import submitit

        # the allocation decides the threads (the cluster confines each job to its CPUs)
        result = self.work(self.item, None)
        path = StudyDir(self.folder).job_result(submitit.JobEnvironment().job_id)
        path.parent.mkdir(parents=True, exist_ok=True)  # a job may finish before it is recorded
        write_json(path, result)

    def checkpoint(self) -> Any:
        """Requeue as it is: a training run resumes from its own last checkpoint."""
        import submitit

        return submitit.helpers.DelayedSubmission(self)


@dataclass
class _Tracked:
    """A unit of work the study waits for: its index, record and how often it was seen gone."""

    index: int
    record: dict[str, Any]
    gone: int = 0


class SlurmExecutor:
    """Each unit of work as a SLURM job through submitit (the units submitted together as one
    job array), followed until every one has returned its result."""

    def __init__(self, options: SlurmOptions, folder: StudyDir, progress: Progress | None) -> None:
        """Refuse, before anything is written, a machine that cannot submit."""
        try:
            import submitit  # noqa: F401  (optional: the cluster extra)
        except ImportError:
            raise AttnlabError(
                "--executor slurm needs submitit: pip install 'attnlab[cluster]'"
            ) from None
        for tool in ("sbatch", "squeue", "srun"):
            if shutil.which(tool) is None:
                raise AttnlabError(
                    f"--executor slurm: {tool} is not on PATH; run the study on a machine that "
                    "submits to the SLURM cluster (a login node)"
                )
        self.options, self.folder, self.progress = options, folder, progress

    def run(
        self, work: Callable[[Any, int | None], Any], items: Sequence[Any], on_done: OnDone
    ) -> None:
        if not items:
            return
        records = self.folder.read_jobs()
        waiting, fresh = [], []
        for i, item in enumerate(items):
            key = _unit_key(work, item)
            record = records.get(key)
            if record is not None and not record.get("collected"):
                waiting.append(_Tracked(i, record))
            else:
                fresh.append(i)
        if waiting:
            self._say(
                f"SLURM: following {len(waiting)} jobs submitted earlier "
                f"({', '.join(t.record['job'] for t in waiting)})"
            )
        if fresh:
            jobs = self._submit(work, [items[i] for i in fresh])
            for i, job in zip(fresh, jobs, strict=True):
                key = _unit_key(work, items[i])
                record = {"job": job, "label": _label(items[i]), "attempt": 1}
                records[key] = record
                waiting.append(_Tracked(i, record))
            self.folder.write_jobs(records)  # at once: a rerun follows them, never resubmits
            array = jobs[0].split("_")[0]
            self._say(
                f"SLURM: submitted {len(jobs)} jobs (job {array}, at most "
                f"{self.options.jobs} at once); their logs are in {self.folder.slurm}"
            )
        try:
            self._wait(work, items, waiting, records, on_done)
        except KeyboardInterrupt:
            left = [t.record["job"] for t in waiting if not t.record.get("collected")]
            self._say(
                f"SLURM: stopped following {len(left)} jobs, which go on; the same command "
                f"follows them again (scancel {' '.join(left)} stops them)"
            )
            raise

    def _wait(
        self,
        work: Callable[[Any, int | None], Any],
        items: Sequence[Any],
        waiting: list[_Tracked],
        records: dict[str, dict[str, Any]],
        on_done: OnDone,
    ) -> None:
        """Poll the queue until every unit has its result; resubmit the ones that ended without."""
        given_up: list[str] = []
        last_status, t0 = "", time.perf_counter()
        while True:
            open_units = [t for t in waiting if not t.record.get("collected")]
            if not open_units:
                break
            queue = _queue()
            counts = {"queued": 0, "running": 0}
            for t in open_units:
                job = t.record["job"]
                state = None if queue is None else queue.get(job)
                if queue is None or state is not None:  # squeue failed: look again later
                    t.gone = 0
                    counts["queued" if state in QUEUED else "running"] += state is not None
                    continue
                result_path = self.folder.job_result(job)
                if result_path.is_file():
                    result = _read_result(result_path)
                    now = time.perf_counter()
                    on_done(t.index, result, now - t0)
                    t0 = now
                    t.record["collected"] = True
                    self.folder.write_jobs(records)
                    continue
                # gone without a result: looked at twice, so a result a shared file system
                # shows late is not taken for a lost job
                t.gone += 1
                if t.gone < 2:
                    continue
                ended = f"SLURM job {job} ({t.record['label']}) ended {_final_state(job)}"
                if t.record["attempt"] > self.options.retries:
                    t.record["collected"] = True  # given up: a rerun submits it afresh
                    given_up.append(ended)
                    self._say(f"{ended}; no retries left ({self.options.retries})")
                else:
                    (new,) = self._submit(work, [items[t.index]])
                    t.record.update(job=new, attempt=t.record["attempt"] + 1)
                    t.gone = 0
                    self._say(
                        f"{ended} without its result; submitted again as job {new} (retry "
                        f"{t.record['attempt'] - 1} of {self.options.retries})"
                    )
                self.folder.write_jobs(records)
            done = sum(bool(t.record.get("collected")) for t in waiting)
            status = (
                f"SLURM: {counts['queued']} queued, {counts['running']} running, "
                f"{done} of {len(waiting)} done"
            )
            if status != last_status and done < len(waiting):
                self._say(status)
                last_status = status
            time.sleep(self.options.poll)
        if given_up:
            more = f" ({len(given_up) - 1} more alike)" if len(given_up) > 1 else ""
            raise AttnlabError(
                f"{given_up[0]} without its result after {self.options.retries + 1} "
                f"submissions{more}; logs in {self.folder.slurm}; the other results are in the "
                "study folder, and the same command submits it again"
            )

    def _submit(self, work: Callable[[Any, int | None], Any], items: Sequence[Any]) -> list[str]:
        """Submit ``items`` (several: as one job array); their job ids."""
        import submitit

        o = self.options
        folder = self.folder.slurm.resolve()
        # the jobs run this interpreter: its venv must be on storage the nodes share
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=o.retries)
        executor.update_parameters(
            job_name=f"attnlab-{self.folder.path.resolve().name}",
            time=o.time,
            cpus_per_task=o.cpus,
            array_parallelism=o.jobs,
            setup=list(o.setup),
            additional_parameters=dict(o.sbatch),
            **({"partition": o.partition} if o.partition else {}),
            **({"gpus_per_node": o.gpus} if o.gpus else {}),
        )
        units = [_Unit(work, item, str(self.folder.path.resolve())) for item in items]
        try:
            with executor.batch():
                jobs = [executor.submit(unit) for unit in units]
        except (subprocess.CalledProcessError, OSError, RuntimeError) as e:
            said = getattr(e, "stderr", None) or getattr(e, "output", None) or e
            if isinstance(said, bytes):
                said = said.decode(errors="replace")
            first = str(said).strip().splitlines()[-1:] or [type(e).__name__]
            raise AttnlabError(f"sbatch refused the study's jobs: {first[0]}") from None
        return [str(job.job_id) for job in jobs]

    def _say(self, line: str) -> None:
        log.info(line)
        if self.progress is not None:
            self.progress(line)


def _unit_key(work: Callable[..., Any], item: Any) -> str:
    """What names a unit of work across invocations: a training run's folder (one job at a time
    writes it), else a digest of the work and its arguments."""
    run_dir = getattr(item, "run_dir", None)
    if run_dir:
        return str(Path(run_dir).expanduser().resolve())
    digest = hashlib.sha256(f"{work.__module__}.{work.__name__}{item!r}".encode()).hexdigest()
    return f"{work.__name__}-{digest[:16]}"


def _label(item: Any) -> str:
    """A unit of work as the progress lines name it."""
    run_dir = getattr(item, "run_dir", None)
    return run_label(run_dir) if run_dir else type(item).__name__.lower()


def _read_result(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise AttnlabError(f"cannot read {path}, a SLURM job's result: {e}") from None


def _queue() -> dict[str, str] | None:
    """This user's SLURM jobs, job id -> state (an array's tasks each as ID_TASK); None when
    squeue fails (the controller busy or restarting: the jobs are looked at again later)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return dict(line.split("|", 1) for line in out.split() if "|" in line)


def _final_state(job: str) -> str:
    """How a job that left the queue ended (CANCELLED, FAILED, ...), from scontrol while the
    controller remembers it, else accounting; "(its state is no longer known)" else."""
    for command in (
        ["scontrol", "-o", "show", "job", job],
        ["sacct", "-X", "-n", "-P", "-o", "State", "-j", job],
    ):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
        except (subprocess.SubprocessError, OSError):
            continue
        for word in out.split():
            if word.startswith("JobState="):
                return word.removeprefix("JobState=")
        if command[0] == "sacct" and out.strip():
            return out.split()[0]
    return "(its state is no longer known)"
