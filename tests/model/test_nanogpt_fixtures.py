"""The backbone with every mechanism off against nanoGPT's own numbers (../shared/fixtures).

The state_dict under the same seed must be bit-identical. Logits, loss and gradients are compared
at float32 rounding level (atol 5e-7): the fixtures were computed on a CPU whose float32 kernels
accumulate in a different order from this one (our result and the fixture's are equally close to
a float64 recompute); any real deviation in the computation shows up orders of magnitude above.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURES
from safetensors import safe_open

from attnlab import GPT, ModelConfig

ATOL = 5e-7


def load_fixture(name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    with safe_open(str(FIXTURES / f"{name}.safetensors"), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    return meta, tensors


def run_fixture(name: str) -> tuple[GPT, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Build the model the fixture describes under its seed, run forward and backward."""
    meta, t = load_fixture(name)
    torch.manual_seed(int(meta["seed"]))
    model = GPT(ModelConfig(**json.loads(meta["config"])))
    logits, loss = model(t["idx"], t["targets"])
    loss.backward()
    return model, t, logits, loss


@pytest.mark.parametrize("name", ["nanogpt_bias", "nanogpt_nobias"])
def test_state_dict_bit_identical(name: str) -> None:
    model, t, _, _ = run_fixture(name)
    sd = model.state_dict()
    assert {f"sd.{k}" for k in sd} == {k for k in t if k.startswith("sd.")}
    for key, value in sd.items():
        assert torch.equal(value, t[f"sd.{key}"]), key


@pytest.mark.parametrize("name", ["nanogpt_bias", "nanogpt_nobias"])
def test_logits_loss_and_gradients_match(name: str) -> None:
    model, t, logits, loss = run_fixture(name)
    torch.testing.assert_close(logits, t["logits"], rtol=0, atol=ATOL)
    torch.testing.assert_close(loss.reshape(t["loss"].shape), t["loss"], rtol=0, atol=ATOL)
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert {f"grad.{k}" for k in grads} == {k for k in t if k.startswith("grad.")}
    for key, grad in grads.items():
        torch.testing.assert_close(grad, t[f"grad.{key}"], rtol=0, atol=ATOL, msg=key)


def test_tolerance_catches_a_real_deviation() -> None:
    """A one-ulp-scale tolerance still flags a genuinely different computation (here eps 1e-6)."""
    meta, t = load_fixture("nanogpt_nobias")
    torch.manual_seed(int(meta["seed"]))
    model = GPT(ModelConfig(**json.loads(meta["config"]), norm_eps=1e-6))
    logits, _ = model(t["idx"], t["targets"])
    assert (logits - t["logits"]).abs().max() > ATOL


def test_inference_returns_last_position_only() -> None:
    model, t, logits, _ = run_fixture("nanogpt_bias")
    last, loss = model(t["idx"])
    assert loss is None and last.shape == (t["idx"].size(0), 1, logits.size(-1))
    torch.testing.assert_close(last[:, 0], logits[:, -1], rtol=0, atol=1e-6)
