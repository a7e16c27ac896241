"""Trainer: loss falls, run folder layout, paired batches across models, bit-exact resume."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model, tiny_train
from safetensors.torch import load_file

from attnlab.data.bins import BatchSampler
from attnlab.rundir import LOCK_FILE
from attnlab.train.trainer import Trainer


def metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_the_last_row_carries_the_mechanism_statistics(tmp_path: Path, train_tiny) -> None:
    """With max_iters below log_interval the one training row is the last: it had no gate
    statistics, and as the first training row it fixed metrics.csv's columns without them for
    the rest of the run, resumes included."""
    run = tmp_path / "run"
    train_tiny(run, model={"use_m_gate": True}, max_iters=4, log_interval=10, eval_interval=4)
    rows = [r for r in metrics(run) if r["train_loss"]]
    assert [r["iter"] for r in rows] == ["4"]
    gates = [k for k in rows[0] if k.startswith("m_gate_mean/layer")]
    assert gates and all(0.0 < float(rows[0][k]) < 1.0 for k in gates)


def test_thirty_iterations_reduce_the_loss_and_fill_the_run_folder(
    tmp_path: Path, train_tiny
) -> None:
    run = tmp_path / "run"
    trainer, summary = train_tiny(run, model={"use_m_gate": True}, tensorboard=True)
    rows = metrics(run)
    header = list(rows[0])
    assert header[:4] == ["iter", "train_loss", "val_loss", "lr"]
    vals = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    assert vals[-1] < vals[0] - 0.3, vals  # 30 steps at lr 3e-3 from ln(vocab) ~ 4.4
    assert summary["iters"] == 30 and summary["final_val_loss"] == vals[-1]
    # token windows are full: 30 steps x batch 8 x block 32 positions
    assert trainer.state.tokens == 30 * 8 * 32
    assert summary["tokens_per_s"] == 30 * 8 * 32 / summary["train_seconds"]
    assert any(k.startswith("m_gate_mean/layer") for k in header)  # mechanism statistics logged
    for name in (
        "config.json",
        "env.json",
        "summary.json",
        "latest/model.safetensors",
        "latest/config.json",
        "latest/tokenizer.json",
        "latest/trainer_state.pt",
        "best/model.safetensors",
    ):
        assert (run / name).is_file(), name
    # TensorBoard holds every val loss of metrics.csv, iter 0's (held back before the columns) too
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run / "tb").glob("events.out.tfevents.*")
    tb = EventAccumulator(str(events))
    tb.Reload()
    logged = [(int(r["iter"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    assert logged[0][0] == 0
    scalars = tb.Scalars("val_loss")
    assert [e.step for e in scalars] == [it for it, _ in logged]
    assert [e.value for e in scalars] == pytest.approx([v for _, v in logged], rel=1e-6)
    # no temporary folders left; the run's lock file stays (see attnlab.rundir)
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == [LOCK_FILE]
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["use_m_gate"] and saved["train"]["max_iters"] == 30
    assert saved["model"]["vocab_size"] == trainer.data.meta["vocab_size"]


def test_variants_see_identical_batches(tmp_path: Path, tiny_data: Path) -> None:
    """The sampler has its own generator: model construction never shifts the data stream."""
    streams = []
    for overrides in ({}, {"use_m_gate": True, "n_embd": 48}):
        trainer = Trainer(
            tmp_path / f"run{len(streams)}",
            tiny_model(**overrides),
            tiny_train(),
            tiny_data,
            quiet=True,
        )
        streams.append([trainer.sampler.next_batch() for _ in range(3)] + trainer.val_batches)
    for (xa, ya), (xb, yb) in zip(*streams, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_resumed_run_is_bit_identical(tmp_path: Path, train_tiny, tiny_data: Path) -> None:
    straight = tmp_path / "straight"
    train_tiny(straight, model={"dropout": 0.1}, max_iters=20, ckpt_interval=5)
    interrupted = tmp_path / "interrupted"
    train_tiny(interrupted, model={"dropout": 0.1}, max_iters=20, ckpt_interval=5, until=12)
    assert json.loads((interrupted / "summary.json").read_text())["iters"] == 12
    resumed = Trainer.resume(interrupted, quiet=True)
    assert resumed.state.iter == 12
    resumed.run()
    a = load_file(straight / "latest" / "model.safetensors")
    b = load_file(interrupted / "latest" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    sa = torch.load(straight / "latest" / "trainer_state.pt", weights_only=True)
    sb = torch.load(interrupted / "latest" / "trainer_state.pt", weights_only=True)
    for pid, state in sa["optimizer"]["state"].items():
        assert torch.equal(state["exp_avg_sq"], sb["optimizer"]["state"][pid]["exp_avg_sq"])
    # every logged row matches, except the window cut by the interruption (iters 11-15)
    resumed_rows = {r["iter"]: r for r in metrics(interrupted)}
    for row in metrics(straight):
        if row["iter"] != "15":
            assert row["train_loss"] == resumed_rows[row["iter"]]["train_loss"], row["iter"]
            assert row["val_loss"] == resumed_rows[row["iter"]]["val_loss"], row["iter"]


def test_sampler_rank_slices_cover_the_global_batch(tiny_data: Path) -> None:
    from attnlab.data.prepare import load_dataset

    tokens = load_dataset(tiny_data).train
    whole = BatchSampler(tokens, 16, 8, seed=3).next_batch()[0]
    halves = [
        BatchSampler(tokens, 16, 8, seed=3, rank=r, world_size=2).next_batch()[0] for r in (0, 1)
    ]
    assert torch.equal(torch.cat(halves), whole)


def test_sampler_state_resumes_the_stream_and_refuses_another_shape(tiny_data: Path) -> None:
    import pytest

    from attnlab.data.prepare import load_dataset
    from attnlab.errors import AttnlabError
    from attnlab.train.sft import ExampleSampler

    tokens = load_dataset(tiny_data).train
    examples = [([1, 2, 3], [-1, 3, 4]), ([5] * 9, [6] * 9), ([7], [8])]
    for make in (
        lambda block: BatchSampler(tokens, block, 4, seed=5),
        lambda block: ExampleSampler(examples, block, 4, seed=5),
    ):
        a = make(16)
        a.next_batch()
        b = make(16)
        b.load_state_dict(a.state_dict())
        assert b.batches_drawn == 1 and torch.equal(b.next_batch()[0], a.next_batch()[0])
        with pytest.raises(AttnlabError, match="sampler state has block_size 16, this run uses 32"):
            make(32).load_state_dict(a.state_dict())
