"""A replace removes only what attnlab wrote there: `prepare`, `export` and `analyze` refuse
to replace a folder that holds files of yours, naming them in one line.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from refusal_fixtures import corpus_fixture, data_fixture  # noqa: F401  (fixtures)
from test_bad_input import TINY, attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot
from test_untrusted import model_dir  # noqa: F401  (a fixture)

from attnlab.fsutil import MANIFEST


def test_prepare_refuses_to_replace_a_data_folder_holding_files_of_yours(
    attnlab,  # noqa: F811
    corpus: Path,
    data: Path,
    tmp_path: Path,
):
    (data / "README.md").write_text("how I made this\n")
    (data / "thesis.txt").write_text("a month of work\n")
    (data / "notes").mkdir()
    (data / "notes" / "day1.txt").write_text("notes\n")
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(data))
    assert error_line(p, "prepare") == (
        f"{data} holds README.md, notes/, thesis.txt, which attnlab did not write there; move "
        "them out, or pass --overwrite to delete them with the prepared data folder"
    )
    assert snapshot(tmp_path) == before
    # once they are moved out it is prepare's own folder again
    for name in ("README.md", "thesis.txt", "notes"):
        shutil.move(data / name, tmp_path / name)
    assert attnlab("prepare", "--corpus", str(corpus), "--out", str(data)).returncode == 0


def test_a_refusal_names_at_most_five_entries(attnlab, corpus: Path, data: Path, tmp_path: Path):  # noqa: F811
    for n in range(7):
        (data / f"mine{n}.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(data))
    assert error_line(p, "prepare") == (
        f"{data} holds mine0.txt, mine1.txt, mine2.txt, mine3.txt, mine4.txt and 2 more, which "
        "attnlab did not write there; move them out, or pass --overwrite to delete them with the "
        "prepared data folder"
    )
    assert snapshot(tmp_path) == before


def test_prepare_refuses_a_data_folder_from_before_manifests_holding_more(
    attnlab,  # noqa: F811
    corpus: Path,
    data: Path,
    tmp_path: Path,
):
    (data / MANIFEST).unlink()  # as an older attnlab left it
    (data / "README.md").write_text("mine\n")
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(data))
    assert error_line(p, "prepare") == (
        f"{data} is not empty and is not a prepared data folder; pass --overwrite to replace it, "
        "or choose another --out"
    )
    assert snapshot(tmp_path) == before
    (data / "README.md").unlink()  # an older folder with prepare's files alone is its own
    assert attnlab("prepare", "--corpus", str(corpus), "--out", str(data)).returncode == 0
    assert (data / MANIFEST).is_file()


def test_a_damaged_manifest_is_refused(attnlab, corpus: Path, data: Path, tmp_path: Path):  # noqa: F811
    (data / MANIFEST).write_text("{not json")
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(data))
    assert error_line(p, "prepare") == (
        f"{data / MANIFEST} is damaged, so what attnlab wrote in {data} is unknown; pass "
        "--overwrite to replace the folder whole, or choose another --out"
    )
    assert snapshot(tmp_path) == before


def test_a_run_inside_a_data_folder_is_refused(attnlab, data: Path, tmp_path: Path):  # noqa: F811
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        p = attnlab("train", "--data", str(data), "--out", str(data / "run"), *extra, *TINY)
        assert error_line(p, "train") == (
            f"--out {data / 'run'} is inside {data}, a prepared data folder that attnlab replaces "
            "whole; choose another --out"
        )
    assert snapshot(tmp_path) == before


def test_prepare_refuses_a_data_folder_holding_a_run(
    attnlab,  # noqa: F811
    corpus: Path,
    data: Path,
    tmp_path: Path,
):
    """The reverse: a run already in a data folder (put there by hand, or by an older attnlab)
    is not deleted by preparing the folder again; nor is a folder of runs prepared into."""
    run = tmp_path / "run"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    shutil.copytree(run, data / "run")
    shutil.copytree(run, tmp_path / "runs" / "run")
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(data))
    assert error_line(p, "prepare") == (
        f"{data} holds run/, which attnlab did not write there; move them out, or pass "
        "--overwrite to delete them with the prepared data folder"
    )
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(tmp_path / "runs"))
    assert error_line(p, "prepare") == (
        f"{tmp_path / 'runs'} is not empty and is not a prepared data folder; pass --overwrite "
        "to replace it, or choose another --out"
    )
    assert snapshot(tmp_path) == before


def test_export_keeps_files_of_yours_and_refuses_an_out_inside_an_export(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
):
    out = tmp_path / "exported"
    args = ("export", str(model_dir), "--formats", "safetensors")
    assert attnlab(*args, "--out", str(out)).returncode == 0
    assert attnlab(*args, "--out", str(out)).returncode == 0  # its own: replaced
    (out / "README.md").write_text("my model card\n")
    before = snapshot(tmp_path)
    p = attnlab(*args, "--out", str(out))
    assert error_line(p, "export") == (
        f"{out} holds README.md, which attnlab did not write there; move them out, or pass "
        "--overwrite to delete them with the model folder exported by attnlab"
    )
    p = attnlab(*args, "--out", str(out / "inner"))
    assert error_line(p, "export") == (
        f"--out {out / 'inner'} is inside {out}, a model folder exported by attnlab that "
        "attnlab replaces whole; choose another --out"
    )
    assert snapshot(tmp_path) == before


@pytest.fixture
def boosted_run(attnlab, data: Path, tmp_path: Path) -> Path:  # noqa: F811
    run = tmp_path / "boosted"
    p = attnlab("train", "--data", str(data), "--out", str(run), "boost_rounds=2", *TINY)
    assert p.returncode == 0, p.stderr
    return run


@pytest.mark.parametrize("name", ["gates.csv", "gates.png"])
def test_analyze_gates_keeps_a_file_of_yours_in_run_analysis(
    attnlab,  # noqa: F811
    boosted_run: Path,
    tmp_path: Path,
    name: str,
):
    analysis = boosted_run / "analysis"
    analysis.mkdir()
    (analysis / name).write_text("layer,mine\n0,1\n")
    before = snapshot(tmp_path)
    p = attnlab("analyze", "gates", str(boosted_run), "--sequences", "1")
    expected = (
        f"{analysis / name} exists and was not written by an attnlab analysis; choose another "
        "--out or move it"
        if name.endswith(".csv")
        else f"{analysis / name} exists and was not written by attnlab; choose another --out or "
        "remove it"
    )
    assert error_line(p, "analyze gates") == expected
    assert snapshot(tmp_path) == before


def test_analyze_gates_replaces_its_own_files(attnlab, boosted_run: Path):  # noqa: F811
    from attnlab.analysis import gates

    for _ in range(2):
        p = attnlab("analyze", "gates", str(boosted_run), "--sequences", "1")
        assert p.returncode == 0, p.stderr
    mark = (boosted_run / "analysis" / ".attnlab-analysis").read_text().splitlines()
    assert mark == [name for name in gates.FILES if name.endswith(".csv")]  # each once
