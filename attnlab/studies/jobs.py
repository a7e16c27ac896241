"""The units of work of a study, their workers and the pool that runs them.

A ``Job`` is one training run of an lm study; a ``Pace`` the side-by-side timing of two jobs'
models behind a wall-clock match; a ``Cell`` one retrieval table cell under one protocol.
Their workers (``train_one``, ``time_steps``, ``score_cell``) run in-process or in spawned
processes (``run_all``, with the threads a run gets), so all must stay importable at module level.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from attnlab.analysis.retrieval import run_retrieval
from attnlab.bench.timing import interleaved, synchronizer, train_step
from attnlab.config import INCIDENTAL, ModelConfig, TrainConfig, train_fields
from attnlab.data.prepare import (
    data_vocab_size,
    fingerprint_change,
    is_data_folder,
    read_fingerprint,
)
from attnlab.device import autocast_dtype, resolve_device
from attnlab.errors import AttnlabError
from attnlab.rundir import RunDir, finished_summary
from attnlab.train import checkpoint as ckpt
from attnlab.train.metrics import val_losses
from attnlab.train.spec import RunSpec, as_overrides, resolve
from attnlab.train.trainer import Trainer

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass(frozen=True)
class Job:
    """One training run of a study: a variant's preset and overrides, one seed, one folder."""

    variant: str
    seed: int
    preset: str
    model: dict[str, Any]
    train: dict[str, Any]
    data: str
    run_dir: str
    max_iters: int | None = None  # the wall-clock-matched budget; the schedule stretches with it
    tracking: dict[str, Any] | None = None  # the study's trackers (attnlab.train.trackers)


@dataclass(frozen=True)
class Pace:
    """Time one training step of two jobs' models, as their runs train them, interleaved."""

    baseline: Job
    mechanism: Job
    reps: int
    warmup: int = 2


@dataclass(frozen=True)
class Cell:
    """One retrieval table cell under one protocol: its arguments, settings and seeds."""

    table: str
    column: str
    protocol: str
    args: dict[str, Any]
    settings: dict[str, Any]
    seeds: tuple[int, ...]
    known: tuple[dict[str, float], ...] = ()  # results of the first seeds, from an earlier run


def run_all(
    work: Callable[[Item, int | None], Result],
    items: Sequence[Item],
    n_jobs: int,
    on_done: Callable[[int, Result, float], None],
) -> None:
    """``work(item, threads)`` for every item, here or in ``n_jobs`` spawned processes (torch
    threads split between them); ``on_done(index, result, seconds)`` as each one finishes.

    ``seconds`` is the wall time since the previous one finished: with ``n_jobs`` in flight,
    an ETA from these is the whole batch's, not one item's.
    """
    if n_jobs <= 1:
        for i, item in enumerate(items):
            t0 = time.perf_counter()
            result = work(item, None)
            on_done(i, result, time.perf_counter() - t0)
        return
    threads = max(1, (os.cpu_count() or 1) // n_jobs)
    workers = min(n_jobs, max(1, len(items)))  # no more processes than items: --jobs 10**20 too
    context = multiprocessing.get_context("spawn")
    claims = context.Queue()
    gpus = visible_gpus()
    for i in range(workers):  # worker i runs on GPU i mod the visible ones
        claims.put(gpus[i % len(gpus)] if gpus else None)
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_claim_gpu, initargs=(claims,)
    ) as pool:
        started = {pool.submit(work, item, threads): i for i, item in enumerate(items)}
        t0 = time.perf_counter()
        for future in as_completed(started):
            now = time.perf_counter()
            on_done(started[future], future.result(), now - t0)
            t0 = now


def _claim_gpu(claims: Any) -> None:
    """A worker's start: make one GPU its only visible one, so that its jobs' ``cuda`` is that
    GPU (every job ran on cuda:0). CUDA is not initialised yet in a spawned worker."""
    gpu = claims.get()
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them."""
    if not torch.cuda.is_available():
        return []
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = named.split(",") if named else [str(i) for i in range(torch.cuda.device_count())]
    return ids[: torch.cuda.device_count()]


def train_one(job: Job, threads: int | None = None) -> dict[str, Any]:
    """Train (or skip, or resume) one run; never raises: failures come back as status "failed".

    A run with a ``latest/`` checkpoint but no summary resumes from that checkpoint, so a study
    stopped in the middle of a run loses at most the steps since the last checkpoint.
    """
    run_dir = Path(job.run_dir)
    row: dict[str, Any] = {"variant": job.variant, "seed": job.seed, "run_dir": str(run_dir)}
    t0 = time.perf_counter()
    try:
        summary = finished_summary(run_dir)
        if summary is not None:
            return {**row, **_summary_fields(summary), "status": "ok", "skipped": True}
        if threads is not None:
            torch.set_num_threads(threads)
        if ckpt.checkpoint_dir(RunDir(run_dir).latest) is not None:
            trainer = Trainer.resume(run_dir, quiet=True)
        else:
            trainer = _new_trainer(job, run_dir)
        # the study resumes its runs itself: `attnlab train --resume` would leave the study behind
        trainer.after_interrupt = (
            f"saved {trainer.run_folder.latest}; the same `attnlab study` command resumes it"
        )
        trainer.tracking = job.tracking or {}
        try:
            summary = trainer.run()
        finally:
            trainer.close()
        return {
            **row,
            **_summary_fields(summary),
            "status": "ok",
            "skipped": False,
            "seconds": time.perf_counter() - t0,
        }
    except Exception as e:  # a broken variant must not stop the study
        return {
            **row,
            "status": "failed",
            "error": f"{type(e).__name__}: {e}",
            "skipped": False,
            "seconds": time.perf_counter() - t0,
        }


def job_step(job: Job) -> tuple[Callable[[], None], torch.device]:
    """One training step of ``job``'s model as its runs train it (batch size, device, precision,
    torch.compile; random tokens of the data's vocabulary), and the device it runs on. Fresh
    weights: a step takes as long whatever they hold."""
    plan = planned(job)
    model = plan.model
    if plan.vocab_from_data:
        model = model.replace(vocab_size=data_vocab_size(job.data))
    device = resolve_device(plan.train.device)
    step, _ = train_step(
        model,
        plan.train.batch_size,
        device,
        compile=plan.train.compile,  # compiled in the first (warm-up) step
        amp_dtype=autocast_dtype(plan.train.dtype, device),
    )
    return step, device


def time_steps(pace: Pace, threads: int | None = None) -> dict[str, Any]:
    """Median seconds per training step of both jobs' models and the median per-repetition
    ratio mechanism/baseline.

    Both arms are timed alternately in one process, so load from other work on the machine falls
    on both alike; the runs' own logged step times do not share that protection.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    with torch.random.fork_rng(devices=[]):  # the timing must not move a run's stream
        (base, device), (mech, _) = job_step(pace.baseline), job_step(pace.mechanism)
        steps = {"baseline": base, "mechanism": mech}
        timings = interleaved(steps, "baseline", pace.reps, pace.warmup, synchronizer(device))
    base, mech = timings["baseline"], timings["mechanism"]
    return {
        "baseline_sec_per_step": base.median_s,
        "mechanism_sec_per_step": mech.median_s,
        "ratio": mech.ratio,
        "ratio_iqr": list(mech.ratio_iqr),
        "reps": pace.reps,
        "threads": torch.get_num_threads(),
    }


def planned(job: Job) -> RunSpec:
    """What a new run of ``job`` trains: its preset, overrides, seed and iteration budget."""
    spec = resolve(job.preset, None, as_overrides(job.model) + as_overrides(job.train), job.data)
    train = spec.train.replace(
        seed=job.seed, extra={**spec.train.extra, "study_variant": job.variant}
    )
    if job.max_iters:
        decay = train.lr_decay_iters
        train = train.replace(
            max_iters=job.max_iters,
            lr_decay_iters=None if decay in (None, train.max_iters) else decay,
        )
    return replace(spec, train=train)


def _new_trainer(job: Job, run_dir: Path) -> Trainer:
    spec = planned(job)
    return Trainer.start(
        run_dir,
        spec.model,
        spec.train,
        spec.data_dir,
        vocab_from_data=spec.vocab_from_data,
        quiet=True,
    )


_INCIDENTAL = set(train_fields(INCIDENTAL))  # a run may be resumed or reused with other values


def setup_differences(job: Job) -> list[str]:
    """How the run already in ``job.run_dir`` (finished or not) differs from what ``job`` would
    train, each as "FIELD THE_RUN'S, not THE_JOB'S" (empty when no run is there yet, or alike)."""
    folder = RunDir(job.run_dir)
    if not folder.config.is_file():
        return []
    saved, plan = folder.read_config(), planned(job)

    def fields(model: ModelConfig, train: TrainConfig, data: str) -> dict[str, Any]:
        out = {f"model.{k}": v for k, v in model.to_dict().items()}
        if plan.vocab_from_data:  # follows the data, which is compared itself
            del out["model.vocab_size"]
        out.update({f"train.{k}": v for k, v in train.to_dict().items() if k not in _INCIDENTAL})
        out["train.lr_decay_iters"] = train.lr_decay_iters or train.max_iters
        return {**out, "data": str(Path(data).expanduser().resolve())}

    have = fields(saved.model, saved.train, saved.data)
    want = fields(plan.model, plan.train, job.data)
    diffs = [f"{k} {have.get(k)!r}, not {v!r}" for k, v in want.items() if have.get(k) != v]
    prepared = is_data_folder(Path(job.data).expanduser())  # not yet: the study prepares it
    change = (
        saved.data_splits
        and prepared
        and fingerprint_change(saved.data_splits, read_fingerprint(job.data))
    )
    return diffs + ([f"data prepared again ({change})"] if change else [])


def identical_run(job: Job, donors: Sequence[Path]) -> Path | None:
    """The first finished run folder among ``donors`` (other studies' run folders) that trained
    exactly what ``job`` would: its resolved model and training config, data and seed alike
    (``setup_differences`` finds nothing; the variant's name and logging may differ)."""
    for folder in donors:
        if (
            RunDir(folder).config.is_file()
            and finished_summary(folder) is not None
            and not setup_differences(replace(job, run_dir=str(folder)))
        ):
            return folder
    return None


def refuse_other_setups(jobs: Sequence[Job]) -> None:
    """Refuse, before anything trains, a study whose run folders hold runs of another setup
    (another preset, --data, spec or wall-clock budget): reusing them would pair wrong runs."""
    for job in jobs:
        diffs = setup_differences(job)
        if diffs:
            more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
            moved = any(d.startswith("data ") for d in diffs)
            raise AttnlabError(
                f"{job.run_dir} holds a run of another setup than {job.variant} seed {job.seed} "
                f"here ({'; '.join(diffs[:3])}{more}): use another --out, or move that folder "
                "away to train it again"
                + (
                    " (a study copied from another machine: prepare its data at the path its "
                    "runs name, e.g. with the same ATTNLAB_HOME, or pass --data that path)"
                    if moved
                    else ""
                )
            )
        problem = record_problem(job.run_dir)
        if problem:
            raise AttnlabError(
                f"{job.run_dir}: {problem}, so its results cannot be trusted: restore the run's "
                "files as it wrote them, or move that folder away to train it again"
            )


def record_problem(run_dir: str | Path) -> str | None:
    """Why a finished run's records (attnlab.rundir.RECORDS) disagree with one another, None if
    they agree or the run is not finished. A study counts such a run from summary.json alone,
    so one edited or cut short would enter the statistics unseen."""
    folder = RunDir(run_dir)
    summary = finished_summary(run_dir)
    if summary is None:
        return None
    if not folder.env.is_file():  # its code state is unknown: the mixed-commit check skips it
        return "env.json is missing"
    train = folder.read_config().train
    iters, final = summary.get("iters"), summary.get("final_val_loss")
    if train.max_seconds is None and iters != train.max_iters:
        return f"summary.json says {iters} iterations, its config.json max_iters {train.max_iters}"
    if final is not None and (isinstance(final, bool) or not isinstance(final, int | float)):
        return f"summary.json's final_val_loss is {final!r}, not a number"
    if final is not None and final == final:  # a NaN loss (a diverged run) is logged as nan
        logged = val_losses(folder.metrics).get(iters)
        if logged != final:
            said = "none" if logged is None else f"{logged!r}"
            return (
                f"summary.json's final val loss {final!r} is not metrics.csv's at iteration "
                f"{iters} ({said})"
            )
    return None


def _summary_fields(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "val_loss": summary.get("final_val_loss"),
        "best_val_loss": summary.get("best_val_loss"),
        "iters": summary.get("iters"),
        "wall_s": summary.get("train_seconds"),
        "sec_per_step": summary.get("sec_per_step"),
        "params": summary.get("params"),
    }


def score_cell(cell: Cell, threads: int | None = None) -> list[dict[str, float]]:
    """Accuracy of every method of ``cell`` for each seed, reusing ``cell.known`` for the
    first seeds."""
    if threads is not None:
        torch.set_num_threads(threads)
    a = cell.args
    return [*cell.known] + [
        run_retrieval(
            a["d"],
            a["patterns"],
            a["sigma"],
            a["methods"],
            rounds=a.get("rounds", 2),
            gate=a.get("gate", "mlp"),
            seed=s,
            protocol=cell.protocol,
            **cell.settings,
        )
        for s in cell.seeds[len(cell.known) :]
    ]
