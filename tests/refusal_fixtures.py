"""Fixtures of the refusal tests: a corpus, the data folder `attnlab prepare` makes of it
(with its manifest), a full disk and a read-only mount (both need root on Linux; the tests
that use them skip elsewhere).

Each is defined under a name of its own and registered under the fixture name the tests
ask for, so a test module imports it without shadowing its parameters.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bad_input import attnlab  # noqa: F401  (a fixture)

TEXT = "to be or not to be, that is the question\n" * 40


@pytest.fixture(name="corpus")
def corpus_fixture(tmp_path: Path) -> Path:
    (tmp_path / "corpus.txt").write_text(TEXT)
    return tmp_path / "corpus.txt"


@pytest.fixture(name="data")
def data_fixture(attnlab, corpus: Path, tmp_path: Path) -> Path:  # noqa: F811
    """A data folder written by `attnlab prepare` (so with its manifest)."""
    out = tmp_path / "data"
    assert attnlab("prepare", "--corpus", str(corpus), "--out", str(out)).returncode == 0
    return out


def _mount(args: list[str]) -> bool:
    """Run mount (root only); False where it cannot."""
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture(name="full_disk")
def full_disk_fixture(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: what is written past it fails as on a full disk (root on Linux only)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if not _mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]):
        pytest.skip("mounting a small tmpfs needs root on Linux")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(name="read_only")
def read_only_fixture(tmp_path: Path) -> Iterator[Path]:
    """A folder, bound onto itself read-only (root on Linux only)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    yield folder  # the test fills it, then calls freeze
    subprocess.run(["umount", str(folder)], capture_output=True)


def freeze(folder: Path) -> None:
    if not (_mount(["--bind", str(folder), str(folder)])):
        pytest.skip("a read-only bind mount needs root on Linux")
    if not _mount(["-o", "remount,bind,ro", str(folder)]):
        subprocess.run(["umount", str(folder)], check=True)
        pytest.skip("this kernel does not remount a bind mount read-only")
