"""A plan of an lm study (``attnlab study ... --plan``): each run's state and the time left.

A run's time left is its iterations left plus its evaluations (forward passes, each about
EVAL_STEP_FRACTION of a training step) at its variant's step time: an estimate for the machine
as it is when planned, which must answer in seconds. The step time is the one the variant's run
in this study folder logged, where there is one that trains what the plan would (a study being
resumed); else a few steps of the model timed here after a warm-up (a step slower than
PLAN_ARM_SECONDS: the warm-up alone), eager even where the runs train compiled (compiling one
model takes longer than a plan may), with the range of the timed steps shown beside it.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnlab.bench.timing import synchronizer
from attnlab.rundir import RunDir, finished_summary
from attnlab.studies import output
from attnlab.studies.jobs import Job, job_step, planned, setup_differences
from attnlab.studies.kinds.base import Study
from attnlab.train import checkpoint as ckpt

PLAN_REPS = 3  # at most this many timed training steps per variant (after one warm-up) ...
PLAN_ARM_SECONDS = 0.5  # ... and no more once the timed ones took this long (at least one)
# an evaluation batch is a forward pass: about a third of a training step's forward + backward
EVAL_STEP_FRACTION = 1 / 3


class StepTime(float):
    """Seconds per training step (the median of ``times``), with their range and their source;
    a float, so that the plan's arithmetic and JSON take it as one."""

    low: float
    high: float
    source: str

    def __new__(cls, times: Sequence[float], source: str) -> StepTime:
        self = super().__new__(cls, statistics.median(times))
        self.low, self.high, self.source = min(times), max(times), source
        return self


def logged_step(job: Job) -> StepTime | None:
    """The step times the run in ``job.run_dir`` logged (metrics.csv's step_ms, without its
    first row, which holds the warm-up or compilation), where that run trains what ``job``
    would; None where there is none."""
    metrics = RunDir(job.run_dir).metrics
    if not metrics.is_file() or setup_differences(job):
        return None
    with metrics.open(newline="") as f:
        rows = list(csv.DictReader(f))[1:]
    times = [float(r["step_ms"]) / 1000 for r in rows if r.get("step_ms")]
    return StepTime(times, f"logged by its run, {len(times)} intervals") if times else None


def step_seconds(job: Job) -> StepTime:
    """Seconds of one training step of ``job``'s model: as its run logged it (``logged_step``),
    else timed here as its runs train it (``job_step``) but eager, after one warm-up step (or
    the warm-up step itself, where that alone took PLAN_ARM_SECONDS)."""
    logged = logged_step(job)
    if logged is not None:
        return logged
    eager = ", eager: the runs compile" if planned(job).train.compile else ""
    with torch.random.fork_rng(devices=[]):
        step, device = job_step(replace(job, train={**job.train, "compile": False}))
        sync = synchronizer(device)

        def timed() -> float:
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            return time.perf_counter() - t0

        warmup = timed()
        if warmup >= PLAN_ARM_SECONDS:  # a slow step: its warm-up's share is small, and a plan
            # of a large model or a loaded machine must still answer in seconds
            return StepTime([warmup], f"1 timed here, the warm-up itself{eager}")
        times: list[float] = []
        while len(times) < PLAN_REPS and sum(times) < PLAN_ARM_SECONDS:
            times.append(timed())
    return StepTime(times, f"{len(times)} timed here after a warm-up{eager}")


def plan_row(study: Study, job: Job, sec_per_step: float | None) -> dict[str, Any]:
    """One run of a plan: its state, its iterations and, with a step time, the time it has left."""
    plan = planned(job)
    iters = plan.train.max_iters
    done = 0
    if finished_summary(job.run_dir) is not None:
        state, done = "finished", iters
    elif job.run_dir in study.reuse:
        state, done = f"copied from {study.reuse[job.run_dir]}", iters
    elif ckpt.checkpoint_dir(RunDir(job.run_dir).latest) is not None:
        curve = output.val_curve(job.run_dir)
        done = max(curve, default=0)
        state = f"resumes near iteration {done}"
    elif Path(job.run_dir).exists():  # records without a checkpoint (a published copy's)
        state = "trains again (records, no checkpoint)"
    else:
        state = "trains"
    row: dict[str, Any] = {"variant": job.variant, "seed": job.seed, "iters": iters, "state": state}
    if sec_per_step is not None and iters is not None:
        left = iters - done
        evals = left // plan.train.eval_interval + (1 if left else 0)
        steps = left + evals * plan.train.eval_iters * EVAL_STEP_FRACTION
        row["seconds_left"] = steps * sec_per_step
    return row
