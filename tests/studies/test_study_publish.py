"""`attnlab study NAME --out STUDY --publish DIR`: the study without its runs, to commit."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.rundir import LOCK_FILE, RECORDS, has_weights
from attnlab.studies import output
from attnlab.studies.runner import run_study
from attnlab.studies.spec import load_spec

SPEC = """
name = "pair"
description = "vanilla against a wider vanilla, tiny"
[variants.base]
preset = "shakespeare-char"
[variants.wide]
preset = "shakespeare-char"
model = { n_embd = 40 }
[[comparisons]]
baseline = "base"
variant = "wide"
[scale.ci]
seeds = 1
model = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, Path]:
    """A finished two-run study: (its spec file, its folder)."""
    root = tmp_path_factory.mktemp("publish")
    spec = root / "pair.toml"
    spec.write_text(SPEC)
    run_study(load_spec(str(spec)), "ci", root / "study", data=tiny_data)
    return spec, root / "study"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_publish_copies_everything_but_the_runs_and_keeps_notes(
    study: tuple[Path, Path], tmp_path: Path
) -> None:
    spec, folder = study
    dest = tmp_path / "results" / "pair"
    p = run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (
        f"study pair: published in {dest} (everything but the runs' model folders)"
    )
    source = {k: v for k, v in _files(folder).items() if k.split("/")[0] in output.PUBLISHED}
    # each run's records, its model folders left out
    records = {
        k: v
        for k, v in _files(folder).items()
        if k.startswith("runs/") and k.split("/")[-1] in RECORDS and k.count("/") == 3
    }
    assert {tuple(k.split("/")[1:3]) for k in records} == {("base", "seed0"), ("wide", "seed0")}
    assert {k.split("/")[-1] for k in records} == {
        "config.json",
        "env.json",
        "metrics.csv",
        "summary.json",
    }
    source.update(records)
    assert _files(dest) == source
    assert {k.split("/")[0] for k in source} == {*output.PUBLISHED, output.RUNS}  # figures too
    # a second publication replaces the first whole, keeping what is not the study's
    (dest / "NOTES.md").write_text("what I noticed")
    (dest / output.FIGURES / "old.png").write_bytes(b"a figure the study no longer draws")
    p = run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest))
    assert p.returncode == 0, p.stderr
    assert _files(dest) == {**source, "NOTES.md": b"what I noticed"}
    # the copy is a study folder: reported again from its results.json and study.json alone
    p = run_cli("study", str(spec), "--out", str(dest), "--report-only")
    assert p.returncode == 0, p.stderr
    assert "Reported again by" in (dest / output.REPORT).read_text()
    # publishing again keeps a link as a link, and never the lock and marker the report left
    assert (dest / output.MARKER).is_file() and (dest / LOCK_FILE).is_file()
    (dest / "data").symlink_to(folder / "runs")
    p = run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest))
    assert p.returncode == 0, p.stderr
    assert (dest / "data").is_symlink() and os.readlink(dest / "data") == str(folder / "runs")
    assert not (dest / output.MARKER).exists() and not (dest / LOCK_FILE).exists()


def test_a_first_copy_goes_beside_notes_written_before_it(
    study: tuple[Path, Path], tmp_path: Path
) -> None:
    """A results folder holding only its NOTES.md (the smoke copy removed, the notes kept for
    the real study) was refused as "not a study folder": the notes stay, the copy joins them;
    a folder with any other file is still refused (test_bad_publish_is_refused_in_one_line)."""
    spec, folder = study
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / output.NOTES).write_text("in progress")
    p = run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest))
    assert p.returncode == 0, p.stderr
    assert (dest / output.NOTES).read_text() == "in progress"
    assert {p.name for p in dest.iterdir()} == {*output.PUBLISHED, output.RUNS, output.NOTES}


def test_a_published_copy_resumes_the_study_without_training_again(
    study: tuple[Path, Path], tmp_path: Path, tiny_data: Path
) -> None:
    """The copy put back as a study folder (another machine): every run counts as finished
    from its records, the results stay as they were, and nothing trains."""
    spec, folder = study
    dest = tmp_path / "pair"
    assert run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest)).returncode == 0
    again = tmp_path / "again"
    shutil.copytree(dest, again)
    run_study(load_spec(str(spec)), "ci", again, data=tiny_data)
    runs = json.loads((again / output.RESULTS_JSON).read_text())["runs"]
    before = json.loads((folder / output.RESULTS_JSON).read_text())["runs"]
    assert [(r["variant"], r["seed"], r["val_loss"]) for r in runs] == [
        (r["variant"], r["seed"], r["val_loss"]) for r in before
    ]
    assert not any(has_weights(run) for run in (again / output.RUNS).glob("*/seed*"))


@pytest.mark.parametrize(
    "case",
    [
        "foreign-dest",
        "no-study",
        "other-study",
        "training-flag",
        "into-itself",
        "inside",
        "over-a-study",
        "over-another-copy",
        "over-another-preset",
        "report-then-file",
        "empty",
        "dot",
        "source-inside-copy",
        "symlinked-dest",
        "note-in-runs",
    ],
)
def test_bad_publish_is_refused_in_one_line(
    study: tuple[Path, Path], tmp_path: Path, case: str
) -> None:
    spec, folder = study
    dest = tmp_path / "dest"
    out = str(folder)
    name = str(spec)
    if case == "foreign-dest":
        dest.mkdir()
        (dest / "mine.txt").write_text("keep me")
    elif case == "no-study":
        out = str(tmp_path / "empty")
        Path(out).mkdir()
    elif case == "other-study":
        name = "kv-bias"
    elif case == "into-itself":
        dest = folder
    elif case == "inside":  # copied itself into itself until the name was too long
        dest = folder / "figures" / "x"
    elif case == "over-a-study":  # its runs were deleted
        dest = tmp_path / "other"
        shutil.copytree(folder, dest)
    elif case == "over-another-copy":
        dest.mkdir()
        (dest / "study.json").write_text(json.dumps({"name": "gates"}))
    elif case == "over-another-preset":  # a smoke test replaced the converged copy
        dest.mkdir()
        (dest / "study.json").write_text(json.dumps({"name": "pair", "preset": "cpu"}))
    elif case == "report-then-file":  # the study was reported again before the refusal
        dest.write_text("a file")
    elif case == "dot":
        dest = Path(".")
    elif case == "source-inside-copy":  # an earlier copy with the study moved inside it
        assert run_cli("study", name, "--out", out, "--publish", str(dest)).returncode == 0
        shutil.copytree(folder, dest / "raw")
        out = str(dest / "raw")
    elif case == "note-in-runs":  # replacing runs/ whole deleted it
        assert run_cli("study", name, "--out", out, "--publish", str(dest)).returncode == 0
        (dest / "runs" / "base" / "seed0" / "notes.txt").write_text("mine")
    elif case == "symlinked-dest":  # the refused copy left its lock in the link's target
        (tmp_path / "real").mkdir()
        dest.symlink_to(tmp_path / "real")
    extra = {"training-flag": ["--seeds", "2"], "report-then-file": ["--report-only"]}.get(case, [])
    before, before_study = snapshot(tmp_path), snapshot(folder)
    given = "" if case == "empty" else str(dest)  # "": taken as no --publish, the study ran
    p = run_cli("study", name, "--out", out, "--publish", given, *extra)
    assert (
        error_line(p, "study")
        == {
            "foreign-dest": f"--publish {dest} is not empty and is not a study folder; "
            "choose another folder",
            "no-study": f"{out} holds no study.json; run the study first",
            "other-study": f"{folder} holds study 'pair', not 'kv-bias'; name the study it holds",
            "training-flag": "--publish takes the study as it ran; leave out --seeds",
            "into-itself": f"--publish {folder} is inside the study folder {folder}; "
            "name a folder outside it",
            "inside": f"--publish {folder / 'figures/x'} is inside the study folder {folder}; "
            "name a folder outside it",
            "over-a-study": f"--publish {tmp_path / 'other'} is a study folder with its runs, not a "
            "published copy; choose another folder",
            "over-another-copy": f"--publish {dest} holds a copy of study 'gates', not 'pair'; "
            "choose another folder",
            "over-another-preset": f"--publish {dest} holds a copy of study 'pair' at preset "
            "'cpu', not 'ci'; choose another folder",
            "report-then-file": f"{dest} exists and is not a folder; choose another --publish",
            "empty": "--publish is empty; name a file or folder",
            "dot": "--publish '.' must name a folder, not the current or parent one",
            "source-inside-copy": f"--publish {dest} would replace the source {dest / 'raw'}; "
            "choose another --publish",
            "symlinked-dest": f"{dest} is a symlink to {tmp_path / 'real'}; give that folder as "
            "--publish instead",
            "note-in-runs": f"--publish {dest}: {dest / 'runs/base/seed0/notes.txt'} is not a "
            f"run's record, and the copy replaces {dest / 'runs'} whole; move it out of there first",
        }[case]
    )
    assert snapshot(tmp_path) == before and snapshot(folder) == before_study


def test_a_nan_loss_is_null_in_results_json_and_empty_in_results_csv(tmp_path: Path) -> None:
    """results.csv said nan where results.json said null: both now say 'no value'."""
    import csv

    row = dict.fromkeys(output.RUN_FIELDS)
    row.update(variant="base", seed=0, status="ok", val_loss=float("nan"), iters=4)
    output.StudyDir(tmp_path).write_results({"runs": [row], "comparisons": []}, {})
    (written,) = json.loads((tmp_path / output.RESULTS_JSON).read_text())["runs"]
    with (tmp_path / output.RESULTS_CSV).open() as f:
        (cells,) = list(csv.DictReader(f))
    assert written["val_loss"] is None and cells["val_loss"] == "" and cells["iters"] == "4"


def _restored(study: tuple[Path, Path], tmp_path: Path) -> Path:
    """The study's published copy, put back as a study folder (another machine's)."""
    spec, folder = study
    dest = tmp_path / "copy"
    assert run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest)).returncode == 0
    return dest


def _edit_json(path: Path, **values: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


@pytest.mark.parametrize("case", ["no-env", "iters", "loss-text", "loss-made-up", "cut-curve"])
def test_records_that_disagree_are_refused(
    study: tuple[Path, Path], tmp_path: Path, tiny_data: Path, case: str
) -> None:
    """A restored run counts from its summary.json alone: an edited one (a made-up loss, more
    iterations than planned, a curve cut short, no env.json to tell its code state) entered the
    statistics, or was a traceback."""
    spec = study[0]
    run = _restored(study, tmp_path) / "runs" / "base" / "seed0"
    summary = json.loads((run / "summary.json").read_text())
    final = summary["final_val_loss"]
    if case == "no-env":
        (run / "env.json").unlink()
    elif case == "iters":
        _edit_json(run / "summary.json", iters=8)
    elif case == "loss-text":
        _edit_json(run / "summary.json", final_val_loss="abc")
    elif case == "loss-made-up":
        _edit_json(run / "summary.json", final_val_loss=1.0)
    else:  # the evaluations up to iteration 2 of 4
        lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
        (run / "metrics.csv").write_text("".join(lines[:3]))
    before = snapshot(tmp_path)
    p = run_cli("study", str(spec), "--out", str(run.parents[2]), "--data", str(tiny_data))
    problem = {
        "no-env": "env.json is missing",
        "iters": "summary.json says 8 iterations, its config.json max_iters 4",
        "loss-text": "summary.json's final_val_loss is 'abc', not a number",
        "loss-made-up": f"summary.json's final val loss 1.0 is not metrics.csv's at iteration 4 "
        f"({final!r})",
        "cut-curve": f"summary.json's final val loss {final!r} is not metrics.csv's at "
        "iteration 4 (none)",
    }[case]
    assert error_line(p, "study") == (
        f"{run}: {problem}, so its results cannot be trusted: restore the run's files as it "
        "wrote them, or move that folder away to train it again"
    )
    assert snapshot(tmp_path) == before


def test_a_plan_says_a_run_without_a_checkpoint_trains_again(
    study: tuple[Path, Path], tmp_path: Path, tiny_data: Path
) -> None:
    """A copy's unfinished run has records but no checkpoint: it trains from the start (the plan
    said "resumes near iteration 4" and left it out of the time left)."""
    spec = study[0]
    copy = _restored(study, tmp_path)
    (copy / "runs" / "base" / "seed0" / "summary.json").unlink()
    p = run_cli("study", str(spec), "--out", str(copy), "--data", str(tiny_data), "--plan")
    assert p.returncode == 0, p.stderr
    states = {line.split()[0]: line.split(None, 3)[3] for line in p.stdout.splitlines()[2:4]}
    assert states == {"base": "trains again (records, no checkpoint)", "wide": "finished"}
    assert "left: 1 runs" in p.stdout


@pytest.mark.parametrize("flag", ["--report-only", "--publish"])
@pytest.mark.parametrize("case", ["no-study-json", "running"])
def test_a_study_json_not_there_is_named(
    study: tuple[Path, Path], tmp_path: Path, flag: str, case: str
) -> None:
    """A copy without study.json was "holds study None" and "not a study folder"; a study still
    in its first run was "run the study first"."""
    spec = study[0]
    copy = _restored(study, tmp_path)
    (copy / "study.json").unlink()
    args = [str(tmp_path / "pub")] if flag == "--publish" else []
    if case == "no-study-json":
        before = snapshot(tmp_path)
        p = run_cli("study", str(spec), "--out", str(copy), flag, *args)
        assert error_line(p, "study") == (
            f"{copy} holds results.json but no study.json; restore it (a published copy carries it)"
        )
    else:
        copy = tmp_path / "fresh"
        with output.StudyDir(copy).create():  # what a study in its first run holds
            before = snapshot(tmp_path)
            p = run_cli("study", str(spec), "--out", str(copy), flag, *args)
            assert error_line(p, "study") == (
                f"{copy}: the study running there (PID {os.getpid()}) has not written its "
                "study.json yet (it does after its first run); wait for that"
            )
    assert snapshot(tmp_path) == before


DAMAGE = {
    "cut-short": None,
    "no-elapsed": {"elapsed_s": None},
    "no-seeds": {"seeds": []},  # a rerun writes the seeds it runs: nothing is lost there
    "bad-invocations": {"invocations": "garbage"},
}


@pytest.mark.parametrize(
    ("mode", "case", "edit"),
    [
        (mode, case, edit)
        for mode in ("rerun", "--report-only")
        for case, edit in DAMAGE.items()
        if (mode, case) != ("rerun", "no-seeds")
    ],
)
def test_a_damaged_study_json_is_refused_before_anything_is_written(
    study: tuple[Path, Path], tmp_path: Path, tiny_data: Path, case: str, edit, mode: str
) -> None:
    """A rerun took an unreadable study.json for no study: it timed the wall-clock budget again
    and dropped the earlier invocations and runs from the report; --report-only rewrote
    study.json and results, then failed on the report with a traceback."""
    spec = study[0]
    copy = _restored(study, tmp_path)
    path = copy / "study.json"
    if edit is None:
        path.write_text(path.read_text()[:40])
    else:
        _edit_json(path, **edit)
    before = snapshot(tmp_path)
    args = ["--data", str(tiny_data)] if mode == "rerun" else [mode]
    p = run_cli("study", str(spec), "--out", str(copy), *args)
    message = error_line(p, "study")
    if case == "cut-short":
        assert message.startswith(f"cannot read {path}: ")
        assert message.endswith("; restore it as the study wrote it")
    else:
        assert (
            message
            == {
                "no-elapsed": f"{path} has elapsed_s None, not a number of seconds; restore it",
                "no-seeds": f"{path} lists no seeds; restore it as the study wrote it",
                "bad-invocations": f"{path} has invocations that are not a list of tables with "
                "elapsed_s; restore it",
            }[case]
        )
    assert snapshot(tmp_path) == before
