"""What a study records of its making (commit, dirty tree, packages, data, configs, spec), the
refusal to mix runs of different code states, and reporting a study again without its runs."""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from scipy import stats
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.studies import output, provenance
from attnlab.studies.kinds import lm_report
from attnlab.studies.runner import run_study
from attnlab.studies.spec import load_spec
from attnlab.train.environment import git_state, process_git_state

SPEC = """
name = "prov"
description = "vanilla against K/V-bias, tiny, with the seed's values"
[variants.base]
preset = "shakespeare-char"
reference = 1.80
[variants.kv]
preset = "kv-bias-shakespeare-char"
model = { n_embd = 24 }
reference = 1.75
[[comparisons]]
baseline = "base"
variant = "kv"
reference_t = -9.04
[scale.ci]
seeds = 2
model = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> Path:
    """A finished two-seed study of SPEC (copied by each test that changes it)."""
    root = tmp_path_factory.mktemp("prov")
    (root / "prov.toml").write_text(SPEC)
    run_study(load_spec(root / "prov.toml"), "ci", root / "study", data=tiny_data)
    return root


def _copy(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The study and its spec in ``tmp_path``: its run folders hold paths of the original's."""
    spec = tmp_path / "prov.toml"
    shutil.copy(finished / "prov.toml", spec)
    shutil.copytree(finished / "study", tmp_path / "study")
    return spec, tmp_path / "study"


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout


def test_git_state_tells_uncommitted_code_apart(tmp_path: Path) -> None:
    repo, pkg = tmp_path / "repo", tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (repo / "README.md").write_text("notes\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    assert git_state(pkg) == {"commit": commit, "dirty": False, "diff_sha256": None}
    (repo / "README.md").write_text("other notes\n")  # outside the package: not its code
    assert git_state(pkg)["dirty"] is False
    (pkg / "a.py").write_text("x = 2\n")
    one = git_state(pkg)
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--binary", "--", "pkg"], cwd=repo, capture_output=True, check=True
    ).stdout
    assert one["dirty"] and one["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    (pkg / "a.py").write_text("x = 3\n")
    two = git_state(pkg)
    assert two["commit"] == commit and two["diff_sha256"] != one["diff_sha256"]
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "new.py").write_text("y = 1\n")  # an uncommitted module is code too
    three = git_state(pkg)
    assert three["dirty"] and three["diff_sha256"] not in (one["diff_sha256"], None)
    (pkg / "new.py").write_text("y = 2\n")
    assert git_state(pkg)["diff_sha256"] != three["diff_sha256"]
    assert git_state(tmp_path)["commit"] is None  # not a checkout


def test_a_study_records_what_it_was_made_from(finished: Path, tiny_data: Path) -> None:
    out = finished / "study"
    record = json.loads((out / output.STUDY_JSON).read_text())
    now = process_git_state()
    assert (record["git_commit"], record["git_dirty"], record["git_diff_sha256"]) == (
        now["commit"],
        now["dirty"],
        now["diff_sha256"],
    )
    assert record["spec_text"] == SPEC and record["mixed_commits_allowed"] is False
    versions = record["packages"]
    for name in ("torch", "numpy", "scipy", "tokenizers", "attnlab"):
        assert versions[name] == importlib.metadata.version(name), name
    assert "python" in versions
    folder = str(tiny_data)
    meta = json.loads((tiny_data / "meta.json").read_text())
    assert record["data"][folder]["meta"] == meta
    for name in ("train.bin", "val.bin"):
        expected = hashlib.sha256((tiny_data / name).read_bytes()).hexdigest()
        assert record["data"][folder]["bins"][name]["sha256"] == expected
    configs = record["configs"]
    assert set(configs) == {"base", "kv"}
    assert configs["kv"]["model"]["n_embd"] == 24 and configs["kv"]["model"]["use_m_gate"]
    assert configs["base"]["train"]["max_iters"] == 4 and configs["base"]["data"] == folder
    assert configs["base"]["model"]["vocab_size"] == meta["vocab_size"]
    for seed in (0, 1):  # each run's config.json agrees with the recorded one
        run = json.loads((out / "runs" / "kv" / f"seed{seed}" / "config.json").read_text())
        assert run["model"] == configs["kv"]["model"]
    env = json.loads((out / "runs/base/seed0/env.json").read_text())
    assert env["git_commit"] == now["commit"] and env["git_dirty"] == now["dirty"]
    assert env["git_diff_sha256"] == now["diff_sha256"]
    assert record["run_commits"] == [
        {
            "commit": now["commit"],
            "dirty": now["dirty"],
            "diff_sha256": now["diff_sha256"],
            "runs": ["base seeds 0, 1", "kv seeds 0, 1"],
        }
    ]
    report = (out / output.REPORT).read_text()
    assert "## Provenance" in report and "Every run trained at commit" in report
    assert "```toml\n" + SPEC.strip() in report and "torch " + versions["torch"] in report
    row = next(line for line in report.splitlines() if line.startswith("| kv vs base"))
    assert "| -9.04 |" in row  # the seed's t beside ours


def test_the_bins_are_hashed_once(
    finished: Path, tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, out = _copy(finished, tmp_path)

    def refuse(path: Path) -> str:
        raise AssertionError(f"hashed {path} again")

    monkeypatch.setattr(provenance, "_sha256", refuse)
    again = run_study(load_spec(spec), "ci", out, data=tiny_data)
    assert again["study"]["data"] == json.loads((finished / "study/study.json").read_text())["data"]


def _set_state(run: Path, commit: str, dirty: bool | None, diff: str | None) -> None:
    env = json.loads((run / "env.json").read_text())
    env.update(git_commit=commit, git_dirty=dirty, git_diff_sha256=diff)
    (run / "env.json").write_text(json.dumps(env))


def test_runs_of_different_code_states_are_refused_unless_asked(
    finished: Path, tmp_path: Path, tiny_data: Path
) -> None:
    spec, out = _copy(finished, tmp_path)
    commit = process_git_state()["commit"] or "0" * 40
    for run in (out / "runs").glob("*/seed*"):
        _set_state(run, commit, False, None)
    _set_state(out / "runs/kv/seed1", "f" * 40, False, None)
    args = ["study", str(spec), "--preset", "ci", "--out", str(out), "--data", str(tiny_data)]
    before = snapshot(tmp_path)
    line = error_line(run_cli(*args), "study")
    assert line == (
        f"this study would mix runs made at 2 code states ({commit[:12]}: base seeds 0, 1, "
        f"kv seed 0; ffffffffffff: kv seed 1); pass --allow-mixed-commits to report them "
        "together, or use another --out"
    )
    assert snapshot(tmp_path) == before

    # one commit, two different uncommitted diffs: mixed as well
    _set_state(out / "runs/kv/seed1", commit, True, "1" * 64)
    _set_state(out / "runs/kv/seed0", commit, True, "2" * 64)
    before = snapshot(tmp_path)
    line = error_line(run_cli(*args), "study")
    assert "3 code states" in line and "+ uncommitted diff 111111111111: kv seed 1" in line
    assert "+ uncommitted diff 222222222222: kv seed 0" in line
    assert snapshot(tmp_path) == before

    # a run resumed at another commit is mixed in itself
    _set_state(out / "runs/kv/seed0", commit, False, None)
    _set_state(out / "runs/kv/seed1", commit, False, None)
    env = json.loads((out / "runs/kv/seed1/env.json").read_text())
    env["resumes"] = [{"iter": 2, "git_commit": "e" * 40, "git_dirty": False}]
    (out / "runs/kv/seed1/env.json").write_text(json.dumps(env))
    assert "eeeeeeeeeeee: kv seed 1" in error_line(run_cli(*args), "study")

    p = run_cli(*args, "--allow-mixed-commits")
    assert p.returncode == 0, p.stderr
    record = json.loads((out / output.STUDY_JSON).read_text())
    assert record["mixed_commits_allowed"] is True and len(record["run_commits"]) == 2
    report = (out / output.REPORT).read_text()
    assert "**Runs of 2 code states** (mixed on request (`--allow-mixed-commits`))" in report


def test_a_study_is_reported_again_without_its_run_folders(finished: Path, tmp_path: Path) -> None:
    spec, out = _copy(finished, tmp_path)
    before = json.loads((out / output.RESULTS_JSON).read_text())
    record = json.loads((out / output.STUDY_JSON).read_text())
    shutil.rmtree(out / "runs")
    # as an earlier attnlab wrote it: no spec text, comparisons without the new statistics
    for key in ("spec_text", "configs", "data"):
        del record[key]
    (out / output.STUDY_JSON).write_text(json.dumps(record))
    old = json.loads(json.dumps(before))
    for c in old["comparisons"]:
        del c["mde"], c["ci95"]
    (out / output.RESULTS_JSON).write_text(json.dumps(old))
    p = run_cli("study", str(spec), "--out", str(out), "--report-only")
    assert p.returncode == 0, p.stderr
    after = json.loads((out / output.RESULTS_JSON).read_text())
    assert after == before  # the runs as they were; the statistics computed again
    again = json.loads((out / output.STUDY_JSON).read_text())
    assert again["command"] == record["command"] and again["elapsed_s"] == record["elapsed_s"]
    assert again["invocations"] == record["invocations"] and len(record["invocations"]) == 1
    assert again["run_commits"] == record["run_commits"]  # kept: the env.json files are gone
    assert again["reported"]["command"].endswith("--report-only")
    spec_from = again["reported"]["spec_from"]
    assert spec_from.endswith("as it is now (the study recorded no spec text)")
    assert again["spec_text"] == SPEC
    report = (out / output.REPORT).read_text()
    assert "Reported again by `attnlab study" in report
    assert "figures/curves.png" in report  # drawn when the runs were here
    assert "- **kv vs base:" in report

    p = run_cli("study", str(spec), "--out", str(out), "--report-only", "--seeds", "3")
    assert error_line(p, "study") == "--report-only takes the study as it ran; leave out --seeds"
    p = run_cli("study", "kv-bias", "--out", str(out), "--report-only")
    assert error_line(p, "study") == (
        f"{out} holds study 'prov', not 'kv-bias'; name the study it holds"
    )
    p = run_cli("study", str(spec), "--out", str(tmp_path / "none"), "--report-only")
    assert error_line(p, "study") == f"{tmp_path / 'none'} holds no study.json; run the study first"
    assert not (tmp_path / "none").exists()


def _edit(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "case",
    [
        "twice",
        "foreign-seed",
        "foreign-variant",
        "not-a-table",
        "no-status",
        "no-variant",
        "string-loss",
        "no-preset",
        "bad-seeds",
        "negative-loss",
        "negative-iters",
        "fractional-iters",
        "no-runs",
        "seed-twice",
        "truncated-record",
        "record-not-a-table",
    ],
)
def test_a_hand_edited_study_is_refused_by_report_only(
    finished: Path, tmp_path: Path, case: str
) -> None:
    """--report-only on results.json or study.json edited by hand: one line naming the row or
    field, nothing written (a duplicated row was averaged into the variant table, a row of a
    seed outside the study counted, and a missing key was a traceback)."""
    spec, out = _copy(finished, tmp_path)
    results, record = out / output.RESULTS_JSON, out / output.STUDY_JSON
    runs = lambda change: _edit(results, lambda d: change(d["runs"]))  # noqa: E731
    if case == "twice":
        runs(lambda r: r.append(dict(r[0])))
    elif case == "foreign-seed":
        runs(lambda r: r[0].update(seed=7))
    elif case == "foreign-variant":
        runs(lambda r: r[0].update(variant="other"))
    elif case == "not-a-table":
        runs(lambda r: r.append([1, 2]))
    elif case == "no-status":
        runs(lambda r: r[1].pop("status"))
    elif case == "no-variant":
        runs(lambda r: r[0].pop("variant"))
    elif case == "string-loss":
        runs(lambda r: r[0].update(val_loss="1.5"))
    elif case == "no-preset":
        _edit(record, lambda d: d.pop("preset"))
    elif case == "bad-seeds":
        _edit(record, lambda d: d.update(seeds="0,1"))
    elif case == "negative-loss":  # was reported: a mean of -0.9 and a CI of 10^26 %
        runs(lambda r: r[0].update(val_loss=-5.0))
    elif case == "negative-iters":
        runs(lambda r: r[0].update(iters=-4))
    elif case == "fractional-iters":
        runs(lambda r: r[0].update(iters=2.5))
    elif case == "no-runs":  # was rewritten as an empty study beside its finished runs
        runs(lambda r: r.clear())
    elif case == "seed-twice":
        _edit(record, lambda d: d.update(seeds=[0, 0]))
    elif case == "truncated-record":  # was "holds study None, not 'prov'"
        record.write_text(record.read_text()[:100])
    elif case == "record-not-a-table":
        record.write_text("[]")
    first = json.loads(results.read_text())["runs"]
    second = first[1] if len(first) > 1 else {}  # the row edited by "no-status"
    before = snapshot(tmp_path)
    p = run_cli("study", str(spec), "--out", str(out), "--report-only")
    msg = error_line(p, "study")
    assert snapshot(tmp_path) == before
    row = f"{results}: run"
    assert (
        msg
        == {
            "twice": f"{row} base seed 0 is listed twice",
            "foreign-seed": f"{row} base seed 7: the study ran seeds [0, 1]",
            "foreign-variant": f"{row} other seed 0: the study has no variant 'other'",
            "not-a-table": f"{row} 5 is list, not a table of variant, seed, val_loss, ...; "
            "restore it as the study wrote it",
            "no-status": f"{row} 2 ({second.get('variant')} seed {second.get('seed')}) has status None, "
            "not ok or failed; restore it as the study wrote it",
            "no-variant": f"{row} 1 has variant None, not a name; restore it as the study wrote it",
            "string-loss": f"{row} 1 (base seed 0) has val_loss '1.5', not a number; "
            "restore it as the study wrote it",
            "no-preset": f"{record} names no preset; restore it as the study wrote it",
            "bad-seeds": f"{record} has seeds '0,1', not a list of whole numbers",
            "negative-loss": f"{row} 1 (base seed 0) has val_loss -5.0, below 0; "
            "restore it as the study wrote it",
            "negative-iters": f"{row} 1 (base seed 0) has iters -4, below 0; "
            "restore it as the study wrote it",
            "fractional-iters": f"{row} 1 (base seed 0) has iters 2.5, not a whole number; "
            "restore it as the study wrote it",
            "no-runs": f"{results} does not list the finished run base seed 0; restore it, or "
            "run the study command again (it lists every finished run)",
            "seed-twice": f"{record} has seeds [0, 0], one of them twice; restore it",
            "truncated-record": msg.startswith(f"cannot read {record}: ")
            and msg.endswith("; restore it as the study wrote it")
            and msg,
            "record-not-a-table": f"{record} is not a study's record (a table); restore it",
        }[case]
    )


def test_every_t_and_p_recomputes_from_results_csv(finished: Path) -> None:
    """results.csv's per-seed losses give results.json's statistics, by scipy and by hand."""
    out = finished / "study"
    with (out / output.RESULTS_CSV).open() as f:
        loss = {(r["variant"], int(r["seed"])): float(r["val_loss"]) for r in csv.DictReader(f)}
    (c,) = json.loads((out / output.RESULTS_JSON).read_text())["comparisons"]
    v, b = ([loss[name, s] for s in (0, 1)] for name in ("kv", "base"))
    res = stats.ttest_rel(v, b)
    assert c["t"] == pytest.approx(res.statistic, rel=1e-12)
    assert c["p"] == pytest.approx(res.pvalue, rel=1e-12)
    ci = res.confidence_interval()
    assert c["ci95"] == pytest.approx([ci.low, ci.high], rel=1e-12)
    assert c["claimed_diff"] == pytest.approx(1.75 - 1.80) and c["reference_t"] == -9.04
    d = [x - y for x, y in zip(v, b, strict=True)]
    assert c["sd_diff"] == pytest.approx(abs(d[0] - d[1]) / math.sqrt(2))  # n = 2 by hand


def _comparison(**over: object) -> dict:
    row = {
        "variant": "kv",
        "baseline": "base",
        "n": 8,
        "df": 7,
        "t": -1.2,
        "p": 0.27,
        "p_holm": 0.27,
        "mean_diff": -0.01,
        "sd_diff": 0.0236,
        "ci95": [-0.03, 0.01],
        "mde": 0.0264,
        "claimed_diff": -0.0429,
        "seeds_for_claim": 5,
        "reference_t": -9.04,
        "no_spread": False,
    }
    return {**row, **over}


def test_an_inconclusive_verdict_says_what_its_seeds_could_see() -> None:
    text = lm_report.verdict(_comparison())
    assert text == (
        "**kv vs base: not reproduced (at this size)** (t(7) = -1.20, p = 0.2700; the seed's "
        "t = -9.04). At the "
        "observed spread (sd of the per-seed differences 0.0236) 8 seeds detect a difference of "
        "±0.0264 at 80 % power (paired t, two-sided, α = 0.05); 5 would already detect the "
        "seed's claimed -0.0429, so these 8 seeds do not bear that claim out."
    )
    more = lm_report.verdict(_comparison(seeds_for_claim=14))
    assert more.endswith("; detecting the seed's claimed -0.0429 would take 14 seeds.")
    none = lm_report.verdict(_comparison(claimed_diff=None, seeds_for_claim=None))
    assert none.endswith(
        "the seed gives no values for both arms, so there is no claimed effect to size seeds for."
    )
    lower = lm_report.verdict(_comparison(p=0.001, p_holm=0.08, t=-5.0, ci95=[-0.02, -0.005]))
    # significant alone, not after Holm: the rule weighs the Holm interval, which holds 0
    assert lower.startswith(
        "**kv vs base: inconclusive (at this size)**; kv lower by -0.0100 "
        "(95 % CI -0.0200 – -0.0050;"
    )
    assert lower.endswith("(not after Holm's correction: 0.0800).")
    flat = lm_report.verdict(_comparison(no_spread=True, p=math.nan, t=math.nan))
    assert flat.startswith("**kv vs base: no test.**") and "inconclusive" not in flat
    one = lm_report.verdict(_comparison(n=1, df=0, p=math.nan, t=math.nan))
    assert one == "**kv vs base: no test.** 1 finished pair(s); a paired t-test needs two."


def test_the_wall_clock_arm_states_its_schedule_and_whether_its_timing_tells_it_apart() -> None:
    train = {"decay_lr": True, "warmup_iters": 100, "min_lr": 1e-4}
    configs = {
        "base": {"train": {**train, "max_iters": 3000, "lr_decay_iters": 3000}},
        "base-wallclock": {"train": {**train, "max_iters": 3254, "lr_decay_iters": None}},
    }
    budget = {"baseline": "base", "mechanism": "kv", "ratio_iqr": [0.98, 1.12]}
    lines = lm_report._schedule_lines("base-wallclock", budget, configs)
    assert lines == [
        "Its schedule as its runs train it: 3254 iterations, warmup 100, cosine decay to 0.0001 "
        "at iteration 3254 (base: 3000 iterations, warmup 100, cosine decay to 0.0001 at "
        "iteration 3000).",
        "",
        "The timing ratio's IQR (0.980-1.120) spans 1.0: kv's step cannot be told apart from "
        "base's in time, so `base-wallclock` cannot be told apart from the equal-iteration base "
        "arm.",
        "",
    ]
    apart = lm_report._schedule_lines("base-wallclock", {**budget, "ratio_iqr": [1.07, 1.09]}, {})
    assert apart == ["The timing ratio's IQR (1.070-1.090) excludes 1.0.", ""]


def test_report_only_keeps_the_data_record_the_study_ran_on(finished: Path, tmp_path: Path) -> None:
    """--report-only took the data record afresh from the folder as it is now: data prepared
    again at the same path became the published study's provenance."""
    spec, out = _copy(finished, tmp_path)
    record = json.loads((out / output.STUDY_JSON).read_text())
    (folder,) = record["data"]
    ran = record["data"][folder]
    # the folder has been prepared again since (another file there now, written later)
    ran["bins"]["val.bin"].update(sha256="0" * 64, mtime_ns=1)
    del ran["unigram_loss"]
    (out / output.STUDY_JSON).write_text(json.dumps(record))
    assert run_cli("study", str(spec), "--out", str(out), "--report-only").returncode == 0
    assert json.loads((out / output.STUDY_JSON).read_text())["data"] == record["data"]

    # the same bins: the record gains what it lacked, and keeps what it had
    ran["bins"]["val.bin"]["sha256"] = provenance._sha256(Path(folder) / "val.bin")
    ran["meta"]["note"] = "as recorded"
    (out / output.STUDY_JSON).write_text(json.dumps(record))
    assert run_cli("study", str(spec), "--out", str(out), "--report-only").returncode == 0
    again = json.loads((out / output.STUDY_JSON).read_text())["data"][folder]
    assert again["meta"]["note"] == "as recorded" and again["bins"] == ran["bins"]
    assert isinstance(again["unigram_loss"], float)
