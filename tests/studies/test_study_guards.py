"""A study's folders and records are checked before they are trusted: a publish keeps what the
user added, a reused run is checked against its manifest, a report counts only the seeds that
ran, and --jobs is bounded."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot
from test_study_publish import study  # noqa: F401  (a finished two-run study)

from attnlab.studies import output, runner
from attnlab.train import checkpoint as ckpt


def test_publishing_again_refuses_over_a_figure_the_user_added(
    study: tuple[Path, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The second --publish replaced figures/ whole, deleting figures/mine.png unsaid."""
    spec, folder = study
    dest = tmp_path / "results" / "pair"
    assert run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest)).returncode == 0
    mine = dest / output.FIGURES / "mine.png"
    mine.write_bytes(b"my own figure")
    before = snapshot(tmp_path)
    p = run_cli("study", str(spec), "--out", str(folder), "--publish", str(dest))
    assert error_line(p, "study") == (
        f"--publish {dest}: {mine} is not a figure of this study, and the copy replaces "
        f"{dest / output.FIGURES} whole; move it out of there first"
    )
    assert snapshot(tmp_path) == before


def test_reuse_from_refuses_a_run_whose_weights_were_damaged(
    study: tuple[Path, Path],  # noqa: F811
    tmp_path: Path,
    tiny_data: Path,
) -> None:
    """--reuse-from copied a damaged model.safetensors without checking its digest."""
    spec, folder = study
    donor = tmp_path / "donor"
    shutil.copytree(folder, donor)
    weights = donor / "runs" / "base" / "seed0" / "best" / ckpt.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # same size, same time: only the digest tells
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    out = tmp_path / "again"
    before = snapshot(tmp_path)
    p = run_cli(
        "study", str(spec), "--out", str(out), "--data", str(tiny_data), "--reuse-from", str(donor)
    )
    assert error_line(p, "study") == (
        f"--reuse-from: {donor / 'runs/base/seed0'}: {weights} is not the file attnlab wrote "
        f"there (its sha256 differs from {weights.parent / '.attnlab-manifest.json'}'s), so it "
        "cannot be copied: restore the run's files as it wrote them, or leave out --reuse-from"
    )
    assert snapshot(tmp_path) == before


def test_report_only_refuses_seeds_no_run_has(
    study: tuple[Path, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    """study.json edited to 5 seeds (1 ran): the report said "Seeds 0-4 (5)"."""
    spec, folder = study
    copy = tmp_path / "study"
    shutil.copytree(folder, copy)
    record = json.loads((copy / output.STUDY_JSON).read_text())
    record["seeds"] = [0, 1, 2, 3, 4]
    (copy / output.STUDY_JSON).write_text(json.dumps(record))
    before = snapshot(tmp_path)
    p = run_cli("study", str(spec), "--out", str(copy), "--report-only")
    assert error_line(p, "study") == (
        f"{copy / output.STUDY_JSON} has seeds [0, 1, 2, 3, 4], but {copy / output.RESULTS_JSON} "
        "holds no run of seed 1 (nor of 3 more); restore it as the study wrote it, or run the "
        "study command again"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("jobs", ["1000000", str(runner.JOBS_PER_CPU * (os.cpu_count() or 1) + 1)])
def test_absurd_jobs_are_refused_with_the_range(
    study: tuple[Path, Path],  # noqa: F811
    tmp_path: Path,
    jobs: str,
) -> None:
    spec, _ = study
    before = snapshot(tmp_path)
    p = run_cli("study", str(spec), "--out", str(tmp_path / "s"), "--jobs", jobs)
    most = runner.JOBS_PER_CPU * (os.cpu_count() or 1)
    assert error_line(p, "study") == (
        f"--jobs must be between 1 and {most} ({runner.JOBS_PER_CPU} per CPU here; "
        f"got {int(jobs):,})"
    )
    assert snapshot(tmp_path) == before
