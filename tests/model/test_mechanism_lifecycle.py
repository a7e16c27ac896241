"""Every mechanism lives through a run: alone and in every pair that composes, it trains under
bf16 autocast, writes a checkpoint, resumes from it and exports, and the export gives the
run's logits. The toy mechanisms written as an author would (tests/toy_*.py) do the same.

This is where a mechanism whose parameters were stored twice failed (the core part under a
second attribute: safetensors refuses shared tensors, so the first checkpoint write failed),
and no logits-only check could see it. The cases are derived from the registry; the default
suite runs every mechanism alone, the slow one every pair too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import toy_core
import toy_mechanism
from conftest import register_toys

from attnlab import from_pretrained
from attnlab.export import export
from attnlab.model import mechanisms
from attnlab.train import checkpoint as ckpt
from attnlab.train.trainer import Trainer

TOYS = (toy_mechanism, toy_core)


def lives_through_a_run(names: tuple[str, ...], tmp_path: Path, train_tiny) -> None:
    """Train one step (bf16 autocast), checkpoint, resume for a second, export (safetensors and
    TorchScript); the export loads back with the run's weights and logits."""
    run = tmp_path / "+".join(names)
    fields = mechanisms.composition(names)
    train_tiny(
        run, model=fields, max_iters=2, eval_interval=1, eval_iters=1, batch_size=2,
        dtype="bfloat16", until=1,
    )  # fmt: skip
    resumed = Trainer.resume(run, quiet=True)
    assert resumed.state.iter == 1, names
    resumed.run()
    out = tmp_path / f"{run.name}-export"
    export(run, out, ["safetensors", "torchscript"])
    trained, _ = ckpt.load_pretrained(run, device="cpu")
    exported, _ = from_pretrained(out)
    assert mechanisms.enabled(exported.config) == list(names), names
    idx = torch.randint(0, trained.config.vocab_size, (2, 12), generator=torch.Generator())
    v = trained.config.vocab_size  # an export may pad the vocabulary with rows no id reaches
    with torch.no_grad():
        want = trained.eval()(idx, all_logits=True)[0]
        assert torch.equal(exported.eval()(idx, all_logits=True)[0][..., :v], want), names
        traced = torch.jit.load(str(out / "model.torchscript.pt"))
        torch.testing.assert_close(traced(idx)[..., :v], want, atol=1e-5, rtol=0)


def cases() -> list:
    """Each registered mechanism alone, then (slow) every pair that composes."""
    pairs = [p for p, why in mechanisms.pairs().items() if why is None]
    return [pytest.param((n,), id=n) for n in mechanisms.REGISTRY] + [
        pytest.param(p, id="+".join(p), marks=pytest.mark.slow) for p in pairs
    ]


@pytest.mark.parametrize("names", cases())
def test_every_mechanism_and_pair_trains_resumes_and_exports(
    names: tuple[str, ...], tmp_path: Path, train_tiny
) -> None:
    lives_through_a_run(names, tmp_path, train_tiny)


@pytest.mark.parametrize("pairs", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("toy", [t.SPEC.name for t in TOYS])
def test_the_toys_train_resume_and_export(
    toy: str, pairs: bool, tmp_path: Path, train_tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each toy alone (and, slow, in every pair with it that composes)."""
    register_toys(monkeypatch, *TOYS)
    found = [p for p, why in mechanisms.pairs().items() if why is None and toy in p]
    for names in found if pairs else [(toy,)]:
        lives_through_a_run(names, tmp_path, train_tiny)
