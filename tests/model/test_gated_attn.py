"""Gated attention (Qiu et al. 2025): the formula by hand, its init options, statistics, presets.

The mechanism contract (tests/model/test_mechanism_contract.py) covers caching, padding, exports and
composition; these tests check what is particular to the output gate.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from attnlab import GPT
from attnlab.config import ModelConfig
from attnlab.model.attention import Context


def gated_model(**overrides) -> GPT:
    torch.manual_seed(0)
    model = GPT(tiny_model(attn_output_gate=True, **overrides)).eval()
    with torch.no_grad():  # far from the init, so a wrong gate cannot hide near 1/2
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.mark.parametrize("bias", [False, True])
def test_output_is_y_times_sigmoid_of_x_w_theta_before_c_proj(bias: bool) -> None:
    """c_proj(Y * sigmoid(x W_theta + b)) with Y causal softmax attention, recomputed by hand."""
    model = gated_model(bias=bias)
    attn = model.transformer.h[0].attn
    b, t, e, h = 2, 7, model.config.n_embd, model.config.n_head
    x = torch.randn(b, t, e, generator=torch.Generator().manual_seed(1))
    q, k, v = (z.view(b, t, h, e // h).transpose(1, 2) for z in attn.c_attn(x).split(e, dim=2))
    scores = (q @ k.transpose(-2, -1)) / (e // h) ** 0.5
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    y = (scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v).transpose(1, 2)
    w, bias_theta = attn.W_theta.weight, attn.W_theta.bias
    assert w.shape == (h * (e // h), e) and (bias_theta is not None) == bias
    gate = torch.sigmoid(F.linear(x, w, bias_theta)).view(b, t, h, e // h)  # per head, channel
    expected = attn.c_proj((y * gate).reshape(b, t, e))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, Context()), expected, atol=1e-6, rtol=1e-5)


def test_zero_init_is_plain_attention_at_half_output() -> None:
    """attn_output_gate_init="zero": every score is exactly 1/2, so a fresh model equals the
    plain model whose attention c_proj weights are halved."""
    torch.manual_seed(0)
    gated = GPT(tiny_model(attn_output_gate=True, attn_output_gate_init="zero")).eval()
    assert not gated.transformer.h[0].attn.W_theta.weight.any()
    plain = GPT(tiny_model()).eval()
    state = {k: v for k, v in gated.state_dict().items() if "W_theta" not in k}
    for key in state:
        if key.endswith("attn.c_proj.weight"):
            state[key] = state[key] / 2
    plain.load_state_dict(state)
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(gated(idx, all_logits=True)[0], plain(idx, all_logits=True)[0])
    # the normal init draws W_theta like every projection: scores near 1/2, not all equal
    torch.manual_seed(0)
    normal = GPT(tiny_model(attn_output_gate=True)).transformer.h[0].attn.W_theta.weight
    assert 0.015 < normal.std() < 0.025


def test_gate_statistics_are_logged_and_captured() -> None:
    """Mean and std of the scores per layer (metrics.csv's columns), and the scores for
    `analyze gates`, equal to the formula's."""
    model = gated_model()
    idx = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(3))
    stats: dict = {}
    capture: dict = {}
    with torch.no_grad():
        model(idx, stats=stats, capture=capture)
    for layer in range(model.config.n_layer):
        g = capture[f"layer{layer}.output_gate.gate"]
        assert g.shape == (2, 9, model.config.n_embd) and g.min() > 0 and g.max() < 1
        torch.testing.assert_close(stats[f"output_gate_mean/layer{layer}"], g.mean())
        torch.testing.assert_close(stats[f"output_gate_std/layer{layer}"], g.std())


def test_presets_put_the_gate_on_both_backbones() -> None:
    """The nanoGPT and the QKVE-style presets differ from their plain backbone only by the gate,
    and add exactly n_layer * n_embd * (n_embd [+ 1]) parameters."""
    for preset, plain, off in (
        ("gated-attn-shakespeare-char", "shakespeare-char", {}),
        ("gated-attn-qkve-small", "qkve-small", {"value_gate": False}),
    ):
        gated = ModelConfig.preset(preset, vocab_size=65)
        base = ModelConfig.preset(plain, vocab_size=65).replace(**off)
        assert gated == base.replace(attn_output_gate=True)
        extra = gated.n_layer * gated.n_embd * (gated.n_embd + gated.bias)
        with torch.device("meta"):
            grown = GPT(gated).get_num_params() - GPT(base).get_num_params()
        assert grown == extra
