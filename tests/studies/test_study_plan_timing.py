"""`study --plan` answers in seconds: a variant's step time is the one its run logged, where the
study folder holds one that trains what the plan would, else a few eager steps timed here
within a budget, shown with their range."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnlab.studies.jobs import Job
from attnlab.studies.kinds import lm_plan


def job(run_dir: Path, **train) -> Job:
    return Job("kv", 0, "shakespeare-char", {}, train, "", str(run_dir))


def fake_clock(monkeypatch: pytest.MonkeyPatch, seconds: list[float], asked: list[dict]):
    """job_step's step advancing a fake perf_counter by each of ``seconds`` in turn (the first
    is the warm-up's); ``asked`` collects the train overrides each job_step was given."""
    now = [0.0]
    durations = iter(seconds)

    def step() -> None:
        now[0] += next(durations)

    def job_step(j: Job):
        asked.append(j.train)
        return step, "cpu"

    monkeypatch.setattr(lm_plan, "job_step", job_step)
    # what the runs train: the job's compile (the real planned() resolves its preset)
    monkeypatch.setattr(
        lm_plan, "planned", lambda j: SimpleNamespace(train=SimpleNamespace(**j.train))
    )
    monkeypatch.setattr(lm_plan.time, "perf_counter", lambda: now[0])


def test_a_logged_run_is_not_timed_again(tmp_path: Path, monkeypatch) -> None:
    """The run's metrics.csv step_ms rows, the first (warm-up, compilation) left out."""
    run = tmp_path / "runs/kv/seed0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "iter,train_loss,step_ms,val_loss\n0,4.0,9000,\n10,3.0,120,\n20,2.9,,2.95\n"
        "30,2.8,100,\n40,2.7,140,\n"
    )
    monkeypatch.setattr(lm_plan, "setup_differences", lambda j: [])
    monkeypatch.setattr(lm_plan, "job_step", lambda j: pytest.fail("timed a logged run"))
    got = lm_plan.step_seconds(job(run))
    assert (float(got), got.low, got.high) == (0.12, 0.1, 0.14)
    assert got.source == "logged by its run, 3 intervals"
    # a run that trains something else (another batch size, say) is timed instead
    monkeypatch.setattr(lm_plan, "setup_differences", lambda j: ["train.batch_size 8, not 4"])
    asked: list[dict] = []
    fake_clock(monkeypatch, [0.25, 0.125, 0.375, 0.25], asked)
    assert float(lm_plan.step_seconds(job(run, compile=False))) == 0.25 and len(asked) == 1


@pytest.mark.parametrize(
    ("durations", "timed", "source"),
    [
        # binary fractions: the fake clock's sums are exact
        ([0.25, 0.125, 0.25, 0.0625, 8.0], [0.125, 0.25, 0.0625], "3 timed here after a warm-up"),
        ([0.25, 0.25, 0.375, 8.0], [0.25, 0.375], "2 timed here after a warm-up"),  # budget spent
        ([0.25, 4.0, 8.0], [4.0], "1 timed here after a warm-up"),  # one, however long
        ([2.0, 8.0], [2.0], "1 timed here, the warm-up itself"),  # a slow step: no other
    ],
)
def test_fresh_arms_time_a_few_eager_steps(
    tmp_path: Path, monkeypatch, durations: list[float], timed: list[float], source: str
) -> None:
    asked: list[dict] = []
    fake_clock(monkeypatch, durations, asked)
    got = lm_plan.step_seconds(job(tmp_path / "none", compile=True))
    assert asked == [{"compile": False}]  # compiling one model takes longer than a plan may
    assert (got.low, got.high) == (min(timed), max(timed))
    assert float(got) == statistics.median(timed)
    assert got.source == f"{source}, eager: the runs compile"
    assert lm_plan.PLAN_REPS == 3 and lm_plan.PLAN_ARM_SECONDS == 0.5
    assert not list(itertools.islice(tmp_path.iterdir(), 1))  # nothing written
