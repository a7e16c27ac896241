"""`attnlab study --reuse-from`: a run another study trained identically is copied, not trained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.errors import AttnlabError
from attnlab.rundir import LOCK_FILE, RunDir, RunLock, copied_from, copy_run
from attnlab.studies.runner import run_study
from attnlab.studies.spec import load_spec

SCALE = """
[scale.ci]
seeds = 2
model = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""
# the donor: vanilla against K/V-bias
FIRST = (
    """
name = "first"
description = "vanilla against K/V-bias, tiny"
[variants.base]
preset = "shakespeare-char"
[variants.kv]
preset = "kv-bias-shakespeare-char"
[[comparisons]]
baseline = "base"
variant = "kv"
"""
    + SCALE
)
# "plain" trains what first's "base" trained (another name); "wide" is new
SECOND = (
    """
name = "second"
description = "vanilla against a wider vanilla, tiny"
[variants.plain]
preset = "shakespeare-char"
[variants.wide]
preset = "shakespeare-char"
model = { n_embd = 40 }
[[comparisons]]
baseline = "plain"
variant = "wide"
"""
    + SCALE
)


@pytest.fixture()
def specs(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(FIRST)
    second.write_text(SECOND)
    return first, second


def _losses(results: dict, variant: str) -> list[float]:
    return [
        r["val_loss"]
        for r in sorted(results["runs"], key=lambda r: r["seed"])
        if r["variant"] == variant
    ]


def test_identical_runs_are_copied_and_the_rest_trained(
    tmp_path: Path, tiny_data: Path, specs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.studies.kinds import lm_report

    monkeypatch.setattr(lm_report, "plot_curves", lambda *args: False)
    donor = tmp_path / "first-out"
    first = run_study(load_spec(str(specs[0])), "ci", donor, data=tiny_data)
    assert first["study"]["retrained"] == 4
    out = tmp_path / "second-out"
    lines: list[str] = []

    def second_study(**options: object) -> dict:
        return run_study(
            load_spec(str(specs[1])), "ci", out, data=tiny_data, reuse_from=[donor], **options
        )

    second = second_study(progress=lines.append)
    # plain = base, copied for both seeds; wide has no twin and trains; kv is not asked for
    assert second["study"]["retrained"] == 2
    assert _losses(second, "plain") == _losses(first, "base")
    copied = {f"plain seed {s}": str(donor / f"runs/base/seed{s}") for s in (0, 1)}
    assert second["study"]["reused"] == copied
    assert sum("copied from" in line for line in lines) == 2
    for s in (0, 1):
        mine, theirs = out / f"runs/plain/seed{s}", donor / f"runs/base/seed{s}"
        assert (mine / "summary.json").read_bytes() == (theirs / "summary.json").read_bytes()
        assert (mine / "latest/model.safetensors").read_bytes() == (
            theirs / "latest/model.safetensors"
        ).read_bytes()
        assert RunDir(mine).read_env() == RunDir(theirs).read_env()  # its code state travels
    report = (out / "report.md").read_text()
    assert "**Copied runs.** 2 runs came from another study" in report
    assert f"plain seed 0 from `{donor}/runs/base/seed0`" in report
    # a rerun trains nothing, copies nothing and still says where the runs came from
    lines.clear()
    again = second_study(progress=lines.append)
    assert again["study"]["retrained"] == 0 and not any("copied" in line for line in lines)
    assert json.loads((out / "study.json").read_text())["reused"] == copied
    # other setups are never taken: another seed count trains seed 2 here, copies nothing new
    lines.clear()
    more = second_study(seeds=3, progress=lines.append)
    assert lines[0] == (
        "--reuse-from: none of the 2 runs this study starts was trained identically there; "
        "they train here"
    )
    assert more["study"]["retrained"] == 2 and more["study"]["reused"] == copied
    # a copy deleted and trained here instead is no longer listed as copied
    shutil.rmtree(out / "runs/plain/seed0")
    alone = run_study(load_spec(str(specs[1])), "ci", out, data=tiny_data, seeds=3)
    assert alone["study"]["retrained"] == 1
    assert alone["study"]["reused"] == {"plain seed 1": copied["plain seed 1"]}
    assert "**Copied runs.** 1 run came from another study" in (out / "report.md").read_text()


def test_a_run_is_not_copied_while_a_trainer_holds_it(tmp_path: Path, train_tiny) -> None:
    source = tmp_path / "run"
    train_tiny(source, max_iters=4, eval_interval=2)
    busy = pytest.raises(AttnlabError, match=r"is in use by another trainer \(PID \d+\)")
    with RunLock(source), busy:  # a trainer resuming it
        copy_run(source, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    assert not list(tmp_path.glob(".copy.tmp-*"))
    copy_run(source, tmp_path / "copy")
    assert copied_from(tmp_path / "copy") == str(source.resolve())
    assert copied_from(source) is None


def test_a_donor_of_another_code_state_is_refused_before_anything_is_written(
    tmp_path: Path, tiny_data: Path, specs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.studies.kinds import lm_report

    monkeypatch.setattr(lm_report, "plot_curves", lambda *args: False)
    donor = tmp_path / "first-out"
    run_study(load_spec(str(specs[0])), "ci", donor, data=tiny_data, seeds=1)
    env = RunDir(donor / "runs/base/seed0").env
    record = json.loads(env.read_text())
    env.write_text(json.dumps({**record, "git_commit": "0" * 40, "git_dirty": False}))
    before = snapshot(tmp_path)
    mixed = r"^this study would mix runs made at 2 code states .*, or leave out --reuse-from$"

    def second(**options: object) -> dict:
        spec = load_spec(str(specs[1]))
        return run_study(spec, "ci", tmp_path / "out", data=tiny_data, seeds=1, **options)

    with pytest.raises(AttnlabError, match=mixed):
        second(reuse_from=[donor])
    assert snapshot(tmp_path) == before
    # a donor trained at this code state is preferred, wherever it is listed
    current = tmp_path / "current-out"
    run_study(load_spec(str(specs[0])), "ci", current, data=tiny_data, seeds=1)
    preferred = second(reuse_from=[donor, current])
    assert preferred["study"]["reused"] == {
        "plain seed 0": str((current / "runs/base/seed0").resolve())
    }
    shutil.rmtree(tmp_path / "out")
    # asked for, they are mixed, and the copy leaves the donor's lock file behind
    done = second(reuse_from=[donor], allow_mixed_commits=True)
    assert done["study"]["retrained"] == 1
    assert len(done["study"]["run_commits"]) == 2
    assert not (tmp_path / "out/runs/plain/seed0" / LOCK_FILE).exists()


@pytest.mark.parametrize(
    "case",
    [
        "not-a-study",
        "itself",
        "report-only",
        "no-runs-kind",
        "published-copy",
        "empty",
        "no-variants",
    ],
)
def test_bad_reuse_from_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    out = tmp_path / "out"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a study")
    if case == "itself":
        out.mkdir()
        (out / "study.json").write_text("{}")
    args = {
        "not-a-study": ["kv-bias", "--out", str(out), "--reuse-from", str(mine)],
        "itself": ["kv-bias", "--out", str(out), "--reuse-from", str(out)],
        "report-only": ["kv-bias", "--out", str(out), "--report-only", "--reuse-from", str(out)],
        "no-runs-kind": ["gba-retrieval", "--out", str(tmp_path / "r"), "--reuse-from", str(out)],
        "published-copy": ["kv-bias", "--out", str(tmp_path / "s"), "--reuse-from", str(out)],
        "empty": ["kv-bias", "--out", str(out), "--reuse-from", str(mine), "--reuse-from", ""],
        "no-variants": ["kv-bias", "--out", str(out), "--variants", ""],  # ran every variant
    }[case]
    if case in ("no-runs-kind", "published-copy"):
        out.mkdir()
        (out / "study.json").write_text("{}")
    if case == "no-runs-kind":
        (out / "runs/base/seed0/latest").mkdir(parents=True)
    if case == "published-copy":  # its runs' records, no weights: copies were runs without models
        (out / "runs/vanilla-128/seed0").mkdir(parents=True)
        (out / "runs/vanilla-128/seed0/summary.json").write_text("{}")
    before = snapshot(tmp_path)
    line = error_line(run_cli("study", *args), "study")
    assert (
        line
        == {
            "not-a-study": f"--reuse-from {mine}: not a study folder (no study.json)",
            "itself": f"--reuse-from {out} is this study's --out; name another study",
            "report-only": "--report-only takes the study as it ran; leave out --reuse-from",
            "no-runs-kind": "--reuse-from: kind = 'retrieval' studies train no runs to reuse; "
            "leave it out",
            "published-copy": f"--reuse-from {out} holds no run with its weights (a published "
            "copy?); name the study folder that trained them",
            "empty": "--reuse-from is empty; name a file or folder",
            "no-variants": "--variants names none; choose from vanilla-128, kv-bias-112, "
            "kv-bias-detached, vanilla-112, vanilla-7l, vanilla-136, vanilla-128-wallclock",
        }[case]
    )
    assert snapshot(tmp_path) == before


def test_a_donor_run_whose_records_disagree_is_not_copied(
    tmp_path: Path, tiny_data: Path, specs: tuple[Path, Path]
) -> None:
    """A donor whose summary.json was edited was copied, and its made-up loss reported; only a
    later rerun noticed."""
    donor = tmp_path / "first-out"
    run_study(load_spec(str(specs[0])), "ci", donor, data=tiny_data, seeds=1)
    summary = donor / "runs/base/seed0/summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "final_val_loss": 1.0}))
    before = snapshot(tmp_path)
    out = tmp_path / "second-out"
    p = run_cli(
        "study", str(specs[1]), "--out", str(out), "--data", str(tiny_data), "--seeds", "1",
        "--reuse-from", str(donor),
    )  # fmt: skip
    line = error_line(p, "study")
    assert line.startswith(
        f"--reuse-from: {donor / 'runs/base/seed0'}: summary.json's final val loss 1.0 is not "
        "metrics.csv's at iteration 4 ("
    )
    assert line.endswith("), so it cannot be copied: restore the run's files as it wrote them, "
                         "or leave out --reuse-from")  # fmt: skip
    assert snapshot(tmp_path) == before
