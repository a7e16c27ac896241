"""`attnlab study ... --plan`: every run the command would consider, its state and the time
left, with nothing written."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import fixed_pace, run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.studies import runner
from attnlab.studies.kinds import lm, lm_plan
from attnlab.studies.output import StudyDir
from attnlab.studies.runner import plan_study, run_study
from attnlab.studies.spec import list_studies, load_spec

SPEC = """
name = "clocked"
description = "vanilla against K/V-bias, also wall-clock matched, tiny"
[variants.base]
preset = "shakespeare-char"
[variants.kv]
preset = "kv-bias-shakespeare-char"
[[comparisons]]
baseline = "base"
variant = "kv"
wallclock = true
[scale.ci]
seeds = 2
model = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 3, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""
STEP = {"base": 0.2, "kv": 0.3}  # seconds per training step, as if timed


@pytest.fixture()
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(lm_plan, "step_seconds", lambda job: STEP[job.variant])
    path = tmp_path / "clocked.toml"
    path.write_text(SPEC)
    return path


def _left(iters: int, done: int, seconds: float) -> float:
    """(iterations left + one evaluation every 2 and at the end, 3 batches of a third) x step."""
    left = iters - done
    evals = left // 2 + (1 if left else 0)
    return (left + evals * 3 / 3) * seconds


def test_a_plan_lists_every_run_and_its_time_and_writes_nothing(
    spec: Path, tmp_path: Path, tiny_data: Path
) -> None:
    out = tmp_path / "study"
    before = snapshot(tmp_path)
    plan = plan_study(load_spec(str(spec)), "ci", out, data=tiny_data)
    assert snapshot(tmp_path) == before and not out.exists()
    rows = [(r["variant"], r["seed"], r["iters"], r["state"]) for r in plan["rows"]]
    # the wall-clock arm: kv's 4 iterations x the step ratio timed here, 0.3 / 0.2
    assert rows == [
        ("base", 0, 4, "trains"),
        ("kv", 0, 4, "trains"),
        ("base", 1, 4, "trains"),
        ("kv", 1, 4, "trains"),
        ("base-wallclock", 0, 6, "trains"),
        ("base-wallclock", 1, 6, "trains"),
    ]
    assert [r.get("estimated", False) for r in plan["rows"]] == [False] * 4 + [True] * 2
    expected = 2 * _left(4, 0, 0.2) + 2 * _left(4, 0, 0.3) + 2 * _left(6, 0, 0.2)
    assert plan["seconds_left"] == pytest.approx(expected, rel=1e-12)
    assert plan["sec_per_step"] == STEP
    # untimed: no step times, no estimate, and the wall-clock arm's iterations unknown
    bare = plan_study(load_spec(str(spec)), "ci", out, data=tiny_data, timed=False)
    assert bare["sec_per_step"] == {} and bare["seconds_left"] is None
    assert [r["iters"] for r in bare["rows"]] == [4, 4, 4, 4, None, None]
    assert not any("seconds_left" in r for r in bare["rows"])


def test_a_plan_of_a_started_study_says_what_is_done(
    spec: Path, tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.studies.kinds import lm_report

    monkeypatch.setattr(lm_report, "plot_curves", lambda *args: False)
    monkeypatch.setattr(lm, "time_steps", fixed_pace(1.25, (1.2, 1.3)))
    out = tmp_path / "study"
    run_study(load_spec(str(spec)), "ci", out, data=tiny_data)
    # kv seed 1 stopped half-way (its summary gone, its curve cut at iteration 2); the kept
    # wall-clock budget (4 x 1.25 = 5) is the plan's, not an estimate
    run = out / "runs/kv/seed1"
    (run / "summary.json").unlink()
    metrics = (run / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    kept = [line for line in metrics[1:] if int(line.split(",")[header.index("iter")]) <= 2]
    (run / "metrics.csv").write_text("\n".join([metrics[0], *kept]) + "\n")
    before = snapshot(tmp_path)
    plan = plan_study(load_spec(str(spec)), "ci", out, data=tiny_data)
    assert snapshot(tmp_path) == before
    states = {(r["variant"], r["seed"]): (r["iters"], r["state"]) for r in plan["rows"]}
    assert states.pop(("kv", 1)) == (4, "resumes near iteration 2")
    assert states.pop(("base-wallclock", 0)) == (5, "finished")
    assert set(states.values()) == {(4, "finished"), (5, "finished")}
    assert not any(r.get("estimated") for r in plan["rows"])
    assert plan["seconds_left"] == pytest.approx(_left(4, 2, 0.3), rel=1e-12)
    # another study's identical runs show as copied; the CLI prints the plan, timing for real
    other = tmp_path / "other"
    copied = plan_study(load_spec(str(spec)), "ci", other, data=tiny_data, reuse_from=[out])
    assert {(r["variant"], r["seed"]): r["state"] for r in copied["rows"][:4]} == {
        ("base", 0): f"copied from {out / 'runs/base/seed0'}",
        ("kv", 0): f"copied from {out / 'runs/kv/seed0'}",
        ("base", 1): f"copied from {out / 'runs/base/seed1'}",
        ("kv", 1): "trains",  # unfinished there
    }
    p = run_cli("study", str(spec), "--out", str(out), "--data", str(tiny_data), "--plan")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "study clocked (ci): 6 runs"
    assert lines[1].split() == ["variant", "seed", "iters", "state"]
    assert lines[2].split() == ["base", "0", "4", "finished"]
    assert any(
        line.split()[:3] == ["kv", "1", "4"] and "resumes near iteration 2" in line
        for line in lines
    )
    assert lines[-1].startswith("left: 1 runs, about ")
    # what the estimate leaves out: at the ci scale a run's start-up is most of its time
    assert lines[-1].endswith(
        "(evaluation included; each run's start-up, checkpoints and analyses not; other work "
        "on it stretches this)"
    )
    assert json.loads((out / "study.json").read_text())["wallclock"]["base-wallclock"]["iters"] == 5


@pytest.mark.parametrize("case", ["with-publish", "no-runs-kind", "foreign-out", "jobs"])
def test_bad_plan_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    """Refused as the study would be (a foreign --out was planned as if empty)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    args = {
        "with-publish": ["kv-bias", "--out", str(tmp_path / "s"), "--plan", "--publish", "x"],
        "no-runs-kind": ["gba-retrieval", "--out", str(tmp_path / "s"), "--plan"],
        "foreign-out": ["kv-bias", "--out", str(mine), "--plan"],
        "jobs": ["kv-bias", "--out", str(tmp_path / "s"), "--plan", "--jobs", "2"],
    }[case]
    expected = {
        "with-publish": "--plan trains nothing already; leave out --report-only and --publish",
        "no-runs-kind": "--plan: kind = 'retrieval' studies train no runs to plan; leave it out",
        "foreign-out": f"{mine} is not empty and is not a study folder; choose another --out",
        "jobs": "--plan: --jobs does not change the plan; leave it out",
    }[case]
    before = snapshot(tmp_path)
    assert error_line(run_cli("study", *args), "study") == expected
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["kv-bias"], "kv-bias"),
        (["--preset", "cpu"], "--preset"),
        (["--jobs", "2"], "--jobs"),
        (["--plan"], "--plan"),
        (["--seeds", "0"], "--seeds"),
    ],
)
def test_list_refuses_what_it_would_ignore(tmp_path: Path, extra: list[str], named: str) -> None:
    """`--list` lists the shipped studies and nothing else: any other option was ignored."""
    before = snapshot(tmp_path)
    p = run_cli("study", "--list", *extra, cwd=tmp_path)
    assert error_line(p, "study") == f"--list lists the shipped studies; leave out {named}"
    assert snapshot(tmp_path) == before


def test_a_plan_of_a_folder_in_use_says_so(spec: Path, tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "study"
    assert plan_study(load_spec(str(spec)), "ci", out, data=tiny_data)["in_use"] is None
    with StudyDir(out).create():  # what a running study holds
        plan = plan_study(load_spec(str(spec)), "ci", out, data=tiny_data)
    assert plan["in_use"] == f"PID {os.getpid()}"
    assert plan_study(load_spec(str(spec)), "ci", out, data=tiny_data)["in_use"] is None


def test_step_timings_compile_where_the_runs_train_compiled(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall-clock budget's side-by-side timing timed eager models while the runs trained
    compiled (the converged qkve and gates scales): it follows the runs' ``compile`` now. A
    plan times eager (compiling every arm took minutes; it answers in seconds) and says so."""
    from attnlab.studies import jobs

    asked: list[bool] = []

    def fake_step(config, batch_size, device="cpu", seed=0, compile=False, amp_dtype=None):
        asked.append(compile)
        return (lambda: None), None

    monkeypatch.setattr(jobs, "train_step", fake_step)
    for compiled in (False, True):
        arms = [
            jobs.Job(arm, 0, "shakespeare-char", {}, {"compile": compiled}, str(tiny_data), "")
            for arm in ("base", "mech")
        ]
        asked.clear()
        jobs.time_steps(jobs.Pace(*arms, reps=2))
        assert asked == [compiled, compiled]
    spec = tmp_path / "compiled.toml"
    spec.write_text(SPEC.replace('device = "cpu" }', 'device = "cpu", compile = true }'))
    asked.clear()
    plan = plan_study(load_spec(str(spec)), "ci", tmp_path / "out", data=tiny_data)
    assert asked == [False, False]  # base and kv; the wall-clock arm is base's model
    assert all(s.source.endswith("eager: the runs compile") for s in plan["sec_per_step"].values())
    # the wall-clock budget times both arms as the spec trains them (compiled), and gives the
    # baseline the mechanism's 4 iterations times the ratio
    paces: list[jobs.Pace] = []

    class Pool:  # the timing, at once
        def run(self, work, items, on_done) -> None:
            paces.extend(items)
            on_done(0, fixed_pace()(items[0]), 0.0)

    study = runner._prepared(
        load_spec(str(spec)),
        "ci",
        tmp_path / "out",
        None,
        1,
        tiny_data,
        None,
        None,
        None,
        False,
        None,
    )
    study = replace(study, executor=Pool())
    assert lm.wallclock_budget(study, "base-wallclock")["iters"] == 6
    assert [(p.baseline.variant, p.mechanism.variant) for p in paces] == [("base-wallclock", "kv")]
    assert [p.mechanism.train["compile"] for p in paces] == [True]


def test_a_plan_prepares_no_shipped_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--plan` prepared the shipped corpus in ATTNLAB_HOME to time a step on its vocabulary:
    it wrote there, and a BPE folder prepared so was one more draw of the library's tie order."""
    from attnlab.data.prepare import data_vocab_size, default_data_dir, shipped_char_vocab_size

    home = tmp_path / "home"
    monkeypatch.setenv("ATTNLAB_HOME", str(home))
    path = tmp_path / "clocked.toml"
    path.write_text(SPEC)
    plan = plan_study(load_spec(str(path)), "ci", tmp_path / "study")
    assert set(plan["sec_per_step"]) == {"base", "kv"}  # timed on the real vocabulary, unprepared
    assert not home.exists()
    assert data_vocab_size(default_data_dir("bpe", 2048)) == 2048
    assert data_vocab_size(default_data_dir()) == shipped_char_vocab_size()
    assert not home.exists()


@pytest.mark.parametrize("name", [n for n, _ in list_studies() if load_spec(n).kind == "lm"])
def test_every_shipped_lm_study_plans_without_preparing(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan on a study whose presets take the embedded corpus (no data table) raised a
    TypeError: the embedded corpus's folder is named by None until it is prepared."""
    home = tmp_path / "home"
    monkeypatch.setenv("ATTNLAB_HOME", str(home))
    monkeypatch.setattr(lm_plan, "step_seconds", lambda job: 0.01)
    plan = plan_study(load_spec(name), "ci", tmp_path / "study")
    assert plan["rows"] and all(r["state"] == "trains" for r in plan["rows"])
    assert not home.exists() and not (tmp_path / "study").exists()
