"""`attnlab prepare` refuses text that is no text (NUL bytes), a split that leaves almost
nothing to train on, and a file named twice.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

from pathlib import Path

from refusal_fixtures import TEXT
from test_bad_input import attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot


def test_prepare_refuses_a_file_of_nul_bytes(attnlab, tmp_path: Path):  # noqa: F811
    corpus = tmp_path / "zeros.txt"
    corpus.write_bytes(b"\0" * 4096)
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(tmp_path / "data"))
    assert error_line(p, "prepare") == (
        f"{corpus}: holds a NUL byte (at offset 0), which no text has; remove the file from --corpus"
    )
    assert snapshot(tmp_path) == before


def test_prepare_refuses_a_split_that_leaves_almost_nothing_to_train_on(attnlab, tmp_path: Path):  # noqa: F811
    """One short line and one long one: the only line break to cut at is near the start."""
    corpus = tmp_path / "lines.txt"
    corpus.write_text("a b\n" + "x" * 5000)
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(corpus), "--out", str(tmp_path / "data"))
    assert error_line(p, "prepare") == (
        f"{corpus}: the split leaves 4 bytes of text for training and 5,001 for validation (0% "
        "train, not about 90%): the text has too few line breaks to cut near --val-fraction 0.1; "
        "break it into lines, or into several files"
    )
    assert snapshot(tmp_path) == before


def test_prepare_refuses_a_file_named_twice(attnlab, tmp_path: Path):  # noqa: F811
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(folder), str(folder / "a.txt"), "--out",
                str(tmp_path / "data"))  # fmt: skip
    assert error_line(p, "prepare") == (
        f"{folder / 'a.txt'} is read twice (from --corpus {folder} and {folder / 'a.txt'}); give "
        "it once"
    )
    assert snapshot(tmp_path) == before
