"""RunDir: the run folder's layout, typed config round trip, and refusals of what is not a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import AttnlabError
from attnlab.rundir import RunConfig, RunDir


def test_layout(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    names = {
        "config": "config.json",
        "env": "env.json",
        "metrics": "metrics.csv",
        "summary": "summary.json",
        "tensorboard": "tb",
        "latest": "latest",
        "best": "best",
        "sft_data": "sft_data",
    }
    assert {k: getattr(run, k) for k in names} == {k: tmp_path / v for k, v in names.items()}


def test_config_round_trip(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    config = RunConfig(
        ModelConfig(n_layer=2, n_head=4, n_embd=32), TrainConfig(max_iters=7), "data/x"
    )
    run.write_config(config)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved == {
        "model": config.model.to_dict(),
        "train": config.train.to_dict(),
        "data": "data/x",
    }
    assert run.read_config() == config
    assert run.is_run() and not run.is_sft()
    (tmp_path / "sft_data").mkdir()
    (tmp_path / "sft_data" / "sft.json").write_text("{}")
    assert run.is_sft()


def test_summary(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.read_summary() is None
    run.write_summary({"iters": 3})
    assert run.read_summary() == {"iters": 3}
    assert not list(tmp_path.glob(".*.tmp"))  # written via a temporary file, renamed


def test_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(AttnlabError) as err:
        RunDir(tmp_path).read_config()
    assert str(err.value) == f"cannot resume {tmp_path}: no config.json (is it a run folder?)"
    (tmp_path / "config.json").write_text(ModelConfig().to_json())  # a model folder's config
    with pytest.raises(AttnlabError) as err:
        RunDir(tmp_path).read_config()
    assert str(err.value) == (
        f"cannot resume {tmp_path}: its config.json is not a run's "
        "(a model folder? resume the run folder above it)"
    )
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(AttnlabError, match=r"config\.json is not valid JSON"):
        RunDir(tmp_path).read_config()
    assert not RunDir(tmp_path).is_run()


def test_env_json_records_each_resume_that_trains(train_tiny, tmp_path: Path) -> None:
    """env.json kept the first start's environment only: a run resumed at another commit, on
    other hardware or under torchrun could not say which trained what (the kv-bias NOTES had to
    piece its commits together by hand)."""
    from attnlab.train.trainer import Trainer

    run = tmp_path / "run"
    train_tiny(run, until=5, max_iters=10, ckpt_interval=5)
    first = json.loads((run / "env.json").read_text())
    assert first["processes"] == 1 and "resumes" not in first
    Trainer.resume(run, quiet=True).run()
    Trainer.resume(run, quiet=True).close()  # finished: nothing trains, nothing recorded
    env = json.loads((run / "env.json").read_text())
    assert {k: v for k, v in env.items() if k != "resumes"} == first
    (resume,) = env["resumes"]
    assert resume["iter"] == 5 and resume.keys() == {"iter", *first}
