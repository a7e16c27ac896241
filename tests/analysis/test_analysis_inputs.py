"""The analyses' shared pieces: which data folder runs share, and the one CSV writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.analysis.inputs import write_csv
from attnlab.errors import AttnlabError
from attnlab.rundir import run_data_dir, shared_data_dir


def _run(folder: Path, data: str) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": {}, "train": {}, "data": data}))
    return folder


def test_shared_data_dir(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a", "data/x"), _run(tmp_path / "b", "data/x")
    other = _run(tmp_path / "c", "data/y")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"n_layer": 2}))  # a model folder's config
    assert run_data_dir(a) == "data/x" and run_data_dir(model) is None
    assert run_data_dir(tmp_path / "nowhere") is None
    assert shared_data_dir([a, b]) == "data/x"
    assert shared_data_dir([model, a]) == "data/x"  # a model folder does not know its data
    assert shared_data_dir([model]) is None
    assert shared_data_dir([a, other], data="data/z") == "data/z"
    with pytest.raises(AttnlabError) as err:
        shared_data_dir([a, other])
    assert str(err.value) == (
        f"the runs were trained on different data ({a}: data/x, {other}: data/y); pass --data"
    )


def test_write_csv(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "sub" / "t.csv", [{"a": 1, "b": "x"}, {"a": 2, "b": "y,z"}])
    assert path.read_bytes() == b'a,b\r\n1,x\r\n2,"y,z"\r\n'
    assert write_csv(tmp_path / "empty.csv", []).read_text() == ""
