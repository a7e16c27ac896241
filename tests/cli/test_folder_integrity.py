"""Integrity: a manifest of sizes and digests in every folder attnlab writes, checked on load
and in full by `attnlab verify`; swapped-in weights, tokenizers, trainer states and graphs
are refused.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from refusal_fixtures import corpus_fixture, data_fixture  # noqa: F401  (fixtures)
from test_bad_input import TINY, attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot
from test_untrusted import model_dir  # noqa: F401  (a fixture)

from attnlab.fsutil import MANIFEST


def test_verify_says_in_one_line_what_it_checked(attnlab, data: Path, tmp_path: Path):  # noqa: F811
    run, exported = tmp_path / "run", tmp_path / "exported"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    p = attnlab("export", str(run), "--formats", "safetensors", "--out", str(exported))
    assert p.returncode == 0, p.stderr
    expected = {
        data: "data folder, 1,476 train + 164 val tokens, every id below the 15 of its char "
        "tokenizer; 4 files match their sha256",
        run: f"run at iteration 2: latest/ and best/ whole and the model its config.json names; "
        f"{data.resolve()} holds the data it recorded",
        run / "best": "model folder, weights loaded, char tokenizer; 5 files match their sha256",
        exported: "model folder, weights loaded, char tokenizer; 6 files match their sha256",
    }
    for folder, line in expected.items():
        p = attnlab("verify", str(folder))
        assert (p.returncode, p.stdout, p.stderr) == (0, f"ok: {folder}: {line}\n", "")
    p = attnlab("verify", str(tmp_path / "corpus.txt"))
    assert error_line(p, "verify") == f"{tmp_path / 'corpus.txt'} is not a folder"


def test_verify_says_when_a_run_cannot_be_resumed(attnlab, data: Path, tmp_path: Path):  # noqa: F811
    """Both said "ok" as for a whole run, and resume refused them."""
    import shutil

    run = tmp_path / "run"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    (run / "latest" / "config.json").unlink()
    before = snapshot(tmp_path)
    p = attnlab("verify", str(run))
    assert error_line(p, "verify") == (
        f"{run / 'latest'} is not a complete checkpoint (no config.json and weights); restore "
        "it, or it cannot be resumed"
    )
    assert snapshot(tmp_path) == before
    shutil.rmtree(run / "latest")
    p = attnlab("verify", str(run))
    assert p.returncode == 0 and p.stdout == (
        f"ok: {run}: run: best/ whole and the model its config.json names; {data.resolve()} "
        "holds the data it recorded; no latest/, so it cannot be resumed (train --init-from "
        "its best/ can start anew)\n"
    )


def test_a_large_bin_changed_in_place_is_found_by_verify(
    attnlab,  # noqa: F811
    data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """Loading hashes a large file only when it changed after the manifest; one edited with its
    size and time kept loads, and `attnlab verify` (every digest, every id) finds it."""
    from attnlab import fsutil
    from attnlab.data.prepare import load_dataset

    monkeypatch.setattr(fsutil, "SMALL_FILE", 0)  # every file counts as large
    train = data / "train.bin"
    stat = train.stat()
    ids = np.fromfile(train, dtype=np.uint16)
    ids[[0, 1]] = ids[[1, 0]] if ids[0] != ids[1] else (ids[0], (ids[0] + 1) % 15)
    ids.tofile(train)
    os.utime(train, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    load_dataset(data)  # trusted: its size and time are what prepare left
    before = snapshot(tmp_path)
    p = attnlab("verify", str(data))
    assert error_line(p, "verify") == (
        f"{train} is not the file attnlab wrote there (its sha256 differs from "
        f"{data / MANIFEST}'s); restore it, or write the folder again"
    )
    assert snapshot(tmp_path) == before


def test_a_data_folder_whose_tokenizer_was_swapped_is_refused(attnlab, data: Path, tmp_path: Path):  # noqa: F811
    """Two characters trade ids: the same size, the bins now read as other text."""
    path = data / "tokenizer.json"
    text = path.read_text()
    path.write_text(
        text.replace('"a": ', '"A_": ').replace('"b": ', '"a": ').replace('"A_": ', '"b": ')
    )
    assert path.read_text() != text
    before = snapshot(tmp_path)
    p = attnlab("train", "--data", str(data), "--out", str(tmp_path / "run"), *TINY)
    assert error_line(p, "train") == (
        f"{path} is not the file attnlab wrote there (its sha256 differs from {data / MANIFEST}'s); "
        "restore it, or write the folder again"
    )
    assert snapshot(tmp_path) == before


def test_a_folder_whose_manifest_lists_names_only_is_read_as_before(
    attnlab,  # noqa: F811
    corpus: Path,
    data: Path,
):
    import json

    manifest = json.loads((data / MANIFEST).read_text())
    (data / MANIFEST).write_text(json.dumps({k: manifest[k] for k in ("kind", "entries")}))
    p = attnlab("verify", str(data))
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.endswith(
        f"; no file digests to check (no {MANIFEST} listing them: an older folder)\n"
    )
    assert attnlab("prepare", "--corpus", str(corpus), "--out", str(data)).returncode == 0


@pytest.fixture
def two_runs(attnlab, data: Path, tmp_path: Path) -> tuple[Path, Path]:  # noqa: F811
    """Two runs of the same model and data, from other seeds."""
    runs = tmp_path / "a", tmp_path / "b"
    for seed, run in enumerate(runs):
        p = attnlab("train", "--data", str(data), "--out", str(run), *TINY, f"seed={seed}")
        assert p.returncode == 0, p.stderr
    return runs


def test_another_runs_weights_swapped_into_latest_are_refused(
    attnlab,  # noqa: F811
    two_runs: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """Same shapes, same config and tokenizer (their digests in the file agree), and here with the
    time of the file it replaced: the weights' own sha256, in the manifest, tells them apart."""
    from attnlab import fsutil

    monkeypatch.setattr(fsutil, "SMALL_FILE", 0)  # as for a model too large to hash at each load
    mine, other = (run / "latest" / "model.safetensors" for run in two_runs)
    stat = mine.stat()
    shutil.copyfile(other, mine)
    os.utime(mine, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    before = snapshot(tmp_path)
    expected = (
        f"{mine} holds other weights than the ones {mine.parent} was written with (another "
        "model's, copied in?); restore it, or write the folder again"
    )
    assert error_line(attnlab("train", "--resume", str(two_runs[0]), "max_iters=4"), "train") == (
        expected
    )
    # verify hashes every file: the file itself is then what it names
    assert error_line(attnlab("verify", str(two_runs[0])), "verify") == (
        f"{mine} is not the file attnlab wrote there (its sha256 differs from "
        f"{mine.parent / MANIFEST}'s); restore it, or write the folder again"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("twicing", True, "twicing=True"), ("dropout", 0.1, "dropout=0.1")],
)
def test_a_resume_with_config_json_edited_to_another_model_is_refused(
    attnlab,  # noqa: F811
    data: Path,
    tmp_path: Path,
    field: str,
    value: object,
    said: str,
):
    """A parameter-free mechanism or another dropout loads the same weights: the run went on as
    another model, recorded as this one's iterations."""
    import json

    run = tmp_path / "run"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    config = json.loads((run / "config.json").read_text())
    was = config["model"][field]
    config["model"][field] = value
    (run / "config.json").write_text(json.dumps(config))
    before = snapshot(tmp_path)
    p = attnlab("train", "--resume", str(run), "max_iters=4")
    assert error_line(p, "train") == (
        f"cannot resume {run}: {run / 'config.json'} says {said} where {run / 'latest'} was saved "
        f"with {field}={was!r}; restore it, or start a new run from the checkpoint (train "
        "--init-from) with those fields"
    )
    assert snapshot(tmp_path) == before


def test_a_trainer_state_swapped_in_is_refused_unread(attnlab, data: Path, tmp_path: Path):  # noqa: F811
    """With the manifest a replaced trainer_state.pt is never unpickled, however harmless."""
    import torch
    from test_untrusted import RunsCode

    run, marker = tmp_path / "run", tmp_path / "marker"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    state = run / "latest" / "trainer_state.pt"
    torch.save({"optimizer": RunsCode(marker)}, state)
    before = snapshot(tmp_path)
    p = attnlab("train", "--resume", str(run), "max_iters=4")
    line = error_line(p, "train")
    assert line.startswith(f"{state} has ") and line.endswith(
        f"(cut, or replaced since: {run / 'latest' / MANIFEST}); restore it, or write the folder "
        "again"
    )
    assert not marker.exists() and snapshot(tmp_path) == before


@pytest.mark.parametrize("swap", ["int8 graph", "tokenizer"])
def test_an_export_with_a_file_swapped_is_refused_by_either_backend(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    data: Path,
    tmp_path: Path,
    swap: str,
):
    out = tmp_path / "exported"
    p = attnlab("export", str(model_dir), "--formats", "safetensors,onnx-int8", "--out", str(out))
    assert p.returncode == 0, p.stderr
    target, source = {
        "int8 graph": (out / "model.onnx", out / "model-int8.onnx"),
        "tokenizer": (out / "tokenizer.json", data / "tokenizer.json"),
    }[swap]
    shutil.copyfile(source, target)
    before = snapshot(tmp_path)
    backends = [["--backend", "onnxruntime"]] + ([[]] if swap == "tokenizer" else [])
    for backend in backends:
        p = attnlab("sample", str(out), "--prompt", "RO", "--max-new-tokens", "2", *backend)
        assert error_line(p, "sample") == (
            f"{target} has {source.stat().st_size:,} bytes where attnlab wrote "
            f"{_recorded_size(out, target.name):,} (cut, or replaced since: {out / MANIFEST}); "
            "restore it, or write the folder again"
        )
    assert snapshot(tmp_path) == before


def _recorded_size(folder: Path, name: str) -> int:
    import json

    return json.loads((folder / MANIFEST).read_text())["files"][name]["bytes"]
