"""A manifest vouches only for files inside its folder, and one that is not a file is damage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from attnlab.fsutil import MANIFEST, file_sha256


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("listed", ["../secret.txt", "{secret}", "./../secret.txt", "a/../../x"])
def test_a_manifest_listing_a_file_outside_its_folder_is_refused(
    tiny_data: Path, tmp_path: Path, listed: str
) -> None:
    """``verify`` hashed ../secret.txt (or an absolute path) and said ok: a manifest may name
    only files below its folder."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    secret = tmp_path / "secret.txt"
    secret.write_text("not the data folder's")
    listed = listed.format(secret=secret)
    manifest = json.loads((data / MANIFEST).read_text())
    manifest["files"][listed] = {"bytes": secret.stat().st_size, "sha256": file_sha256(secret)}
    (data / MANIFEST).write_text(json.dumps(manifest))
    before = snapshot(tmp_path)
    p = run_cli("verify", str(data))
    assert p.returncode == 2, p.stdout
    assert p.stderr == (
        f"attnlab verify: error: {data / MANIFEST} is damaged, so what {data} should hold is "
        "unknown; write the folder again\n"
    )
    assert snapshot(tmp_path) == before


def test_a_manifest_that_is_a_folder_is_refused(train_tiny, tmp_path: Path) -> None:
    """A folder in the manifest's place made sample check nothing (read as no manifest)."""
    run = tmp_path / "run"
    train_tiny(run, max_iters=2, eval_interval=2)
    best = run / "best"
    (best / MANIFEST).unlink()
    (best / MANIFEST).mkdir()
    before = snapshot(tmp_path)
    p = run_cli("sample", str(run), "--max-new-tokens", "2", "--device", "cpu")
    assert p.returncode == 2, p.stdout
    assert p.stderr == (
        f"attnlab sample: error: {best / MANIFEST} is damaged, so what {best} should hold is "
        "unknown; write the folder again\n"
    )
    assert snapshot(tmp_path) == before
