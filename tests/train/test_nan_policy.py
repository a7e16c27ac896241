"""nan_policy: "stop" keeps the last good checkpoint; "skip" drops bad steps and gives up after N."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_model, tiny_train
from safetensors.torch import load_file

from attnlab.errors import AttnlabError
from attnlab.train import checkpoint as ckpt
from attnlab.train.trainer import Trainer


class Poison:
    """Wraps a trainer's forward: the listed calls (1-based) return a NaN loss, whose backward
    fills every gradient with NaN. Records the parameters each call saw."""

    def __init__(self, trainer: Trainer, bad_calls) -> None:
        self.model, self.bad_calls = trainer.forward_model, bad_calls
        self.seen: list[torch.Tensor] = []
        trainer.forward_model = self

    def __call__(self, x, y, **kwargs):
        self.seen.append(torch.cat([p.detach().flatten() for p in self.model.parameters()]).clone())
        logits, loss = self.model(x, y, **kwargs)
        if len(self.seen) in self.bad_calls:
            loss = loss * float("nan")
        return logits, loss


def adam_steps(trainer: Trainer) -> set[int]:
    return {int(s["step"]) for s in trainer.optimizer.state.values()}


def test_stop_keeps_the_last_good_checkpoint(train_tiny, tmp_path: Path):
    run = tmp_path / "run"
    trainer, _ = train_tiny(run, until=10, max_iters=20, ckpt_interval=5)
    files = {p.name: p.read_bytes() for p in (run / "latest").iterdir()}
    Poison(trainer, {3})  # the 13th step
    with pytest.raises(AttnlabError) as err:
        trainer.run()
    assert str(err.value) == (
        "non-finite loss or gradient at iter 12 (loss nan, grad norm nan); "
        f"stopped, the last good checkpoint is {run / 'latest'}"
    )
    assert {p.name: p.read_bytes() for p in (run / "latest").iterdir()} == files
    assert ckpt.read_trainer_state(run / "latest")["state"]["iter"] == 10
    model, _ = ckpt.load_pretrained(run)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert all(
        bool(torch.isfinite(v).all()) for v in load_file(run / "best" / ckpt.WEIGHTS).values()
    )


def test_skip_drops_bad_steps_and_counts_them(tiny_data: Path, tmp_path: Path):
    cfg = tiny_train(max_iters=12, eval_interval=6, nan_policy="skip", max_bad_steps=3)
    trainer = Trainer(tmp_path / "run", tiny_model(), cfg, tiny_data, quiet=True)
    poison = Poison(trainer, {3, 5, 6})  # one bad step, then two in a row: under the limit
    summary = trainer.run()
    assert summary["iters"] == 12
    assert summary["skipped_steps"] == 3
    assert len(poison.seen) == 15
    assert adam_steps(trainer) == {12}  # the optimizer stepped only on the good batches
    # a dropped step leaves the weights as they were; a taken one changes them
    for call in (3, 5, 6):
        assert torch.equal(poison.seen[call - 1], poison.seen[call])
    assert not torch.equal(poison.seen[0], poison.seen[1])
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    saved = ckpt.read_trainer_state(tmp_path / "run" / "latest")["state"]
    assert (saved["skipped_steps"], saved["bad_steps"]) == (3, 0)


def test_skip_stops_after_max_bad_steps_in_a_row(tiny_data: Path, tmp_path: Path):
    cfg = tiny_train(max_iters=12, nan_policy="skip", max_bad_steps=3)
    trainer = Trainer(tmp_path / "run", tiny_model(), cfg, tiny_data, quiet=True)
    poison = Poison(trainer, set(range(4, 100)))  # broken for good after 3 steps
    with pytest.raises(AttnlabError) as err:
        trainer.run()
    assert str(err.value) == (
        "non-finite loss or gradient at iter 3 (loss nan, grad norm nan); "
        "3 bad steps in a row (max_bad_steps), stopped"
    )
    assert len(poison.seen) == 6
    assert (trainer.state.iter, trainer.state.skipped_steps) == (3, 3)
    assert adam_steps(trainer) == {3}


def test_stop_before_any_checkpoint_says_there_is_none(tiny_data: Path, tmp_path: Path):
    run = tmp_path / "run"
    trainer = Trainer(run, tiny_model(), tiny_train(max_iters=20), tiny_data, quiet=True)
    Poison(trainer, {2})
    with pytest.raises(AttnlabError) as err:
        trainer.run()
    assert str(err.value) == (
        "non-finite loss or gradient at iter 1 (loss nan, grad norm nan); stopped before any "
        "checkpoint was written: start the run again (a lower learning_rate, or nan_policy=skip, "
        "may help)"
    )
    assert ckpt.checkpoint_dir(run / "latest") is None


def test_float16_overflow_is_the_scalers_to_handle_and_its_scale_resumes(
    tiny_data: Path, tmp_path: Path
):
    """Under float16 the default nan_policy=stop ended the run at the GradScaler's first
    overflow (a finite loss, an infinite gradient: its normal start), saying a lower
    learning_rate may help; and the scale was not saved, so a resumed run skipped other steps."""
    cfg = tiny_train(max_iters=12, eval_interval=6, dtype="float16")

    def trainer(run: str, resume: bool = False) -> Trainer:
        if resume:
            return Trainer.resume(tmp_path / run, quiet=True)
        t = Trainer(tmp_path / run, tiny_model(), cfg, tiny_data, quiet=True)
        # a scale this large overflows float16 gradients for the first dozens of halvings
        t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40, growth_interval=3)
        return t

    whole = trainer("whole")
    summary = whole.run()
    assert summary["iters"] == 12 and summary["skipped_steps"] >= 1
    assert whole.scaler.get_scale() < 2.0**40
    assert all(bool(torch.isfinite(p).all()) for p in whole.model.parameters())
    saved = ckpt.read_trainer_state(tmp_path / "whole" / "latest")["scaler"]
    assert saved["scale"] == whole.scaler.get_scale()
    # interrupted at 6 and resumed: the same scale, the same skipped steps, the same weights
    trainer("split").run(until=6)
    resumed = trainer("split", resume=True)
    assert resumed.run()["skipped_steps"] == summary["skipped_steps"]
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)
