"""eval_batches: the fixed validation set (default) or fresh batches at each evaluation (nanoGPT's
way), drawn from a stream keyed by (eval_seed, iteration) that leaves training untouched."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model, tiny_train

from attnlab.config import ConfigError, TrainConfig
from attnlab.data.bins import fixed_batches
from attnlab.train.trainer import Trainer


def _rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def _trainer(run: Path, data: Path, **train) -> Trainer:
    return Trainer(run, tiny_model(), tiny_train(**train), data, quiet=True)


def test_fresh_batches_are_keyed_by_eval_seed_and_iteration(tmp_path: Path, tiny_data) -> None:
    """At iteration k the batches are exactly fixed_batches at the seed SeedSequence([eval_seed,
    k]) gives: new at every step, the same for every run at the same step."""
    a = _trainer(tmp_path / "a", tiny_data, eval_batches="fresh")
    b = _trainer(tmp_path / "b", tiny_data, eval_batches="fresh")
    drawn = {}
    for it in (0, 10):
        a.state.iter = b.state.iter = it
        got, again = a._fresh_val(), b._fresh_val()
        seed = int(np.random.SeedSequence([a.cfg.eval_seed, it]).generate_state(1)[0])
        want = fixed_batches(a.data.val, 32, a.cfg.batch_size, a.cfg.eval_iters, seed)
        assert len(got) == a.cfg.eval_iters
        for (x, y), (x2, y2), (wx, wy) in zip(got, again, want, strict=True):
            assert torch.equal(x, wx) and torch.equal(y, wy)
            assert torch.equal(x, x2) and torch.equal(y, y2)
        drawn[it] = got
    assert not torch.equal(drawn[0][0][0], drawn[10][0][0])  # another draw at another step
    assert not torch.equal(drawn[0][0][0], a.val_batches[0][0])  # not the fixed set


def test_fresh_evaluation_leaves_training_alone_and_resumes_identically(
    tmp_path: Path, tiny_data
) -> None:
    """Train losses equal the fixed protocol's at every logged step (the training stream is not
    drawn on), val losses differ, and a resumed fresh run logs the straight one's val losses."""
    fixed = _trainer(tmp_path / "fixed", tiny_data, max_iters=20, ckpt_interval=5)
    fixed.run()
    fresh = _trainer(
        tmp_path / "fresh", tiny_data, max_iters=20, ckpt_interval=5, eval_batches="fresh"
    )
    fresh.run()
    cut = _trainer(tmp_path / "cut", tiny_data, max_iters=20, ckpt_interval=5, eval_batches="fresh")
    cut.run(12)
    Trainer.resume(tmp_path / "cut", quiet=True).run()
    rows_fixed, rows_fresh = _rows(tmp_path / "fixed"), _rows(tmp_path / "fresh")
    assert [r["train_loss"] for r in rows_fixed] == [r["train_loss"] for r in rows_fresh]
    vals_fixed = [r["val_loss"] for r in rows_fixed if r["val_loss"]]
    vals_fresh = [r["val_loss"] for r in rows_fresh if r["val_loss"]]
    assert len(vals_fresh) == len(vals_fixed) >= 2 and vals_fresh != vals_fixed
    resumed = {r["iter"]: r["val_loss"] for r in _rows(tmp_path / "cut") if r["val_loss"]}
    for r in rows_fresh:
        if r["val_loss"]:
            assert resumed[r["iter"]] == r["val_loss"], r["iter"]


def test_an_unknown_protocol_is_refused_with_its_choices() -> None:
    with pytest.raises(ConfigError, match=r"eval_batches.*'fixed'.*'fresh'"):
        TrainConfig(eval_batches="random")
