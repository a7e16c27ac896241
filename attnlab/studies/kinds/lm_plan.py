"""A plan of an lm study (``attnlab study ... --plan``): each run's state and the time left.

One training step of each variant's model is timed here (after a warm-up), and a run's time left
is its iterations left plus its evaluations (forward passes, each about EVAL_STEP_FRACTION of a
training step) at that step time: an estimate for the machine as it is when planned.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.bench.timing import synchronizer
from attnlab.rundir import RunDir, finished_summary
from attnlab.studies import output
from attnlab.studies.jobs import Job, job_step, planned
from attnlab.studies.kinds.base import Study
from attnlab.train import checkpoint as ckpt

PLAN_REPS = 3  # timed training steps per variant behind a plan's estimate (after one warm-up)
# an evaluation batch is a forward pass: about a third of a training step's forward + backward
EVAL_STEP_FRACTION = 1 / 3


def step_seconds(job: Job) -> float:
    """Median seconds of one training step of ``job``'s model, as its runs train it
    (``job_step``), after one warm-up step."""
    with torch.random.fork_rng(devices=[]):
        step, device = job_step(job)
        sync = synchronizer(device)
        step()  # the warm-up: compiles the model where the runs train compiled
        times = []
        for _ in range(PLAN_REPS):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
