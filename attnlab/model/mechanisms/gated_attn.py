"""Gated attention (``gated-attn``; Qiu et al. 2025, arXiv 2505.06708): Y' = Y * sigmoid(x W_theta).

The head-specific, elementwise sigmoid gate of "Gated Attention for Large Language Models:
Non-linearity, Sparsity, and Attention-Sink-Free" (the gate Qwen3-Next uses). After SDPA and
before ``c_proj``, every channel of every head's output Y is multiplied by its own gate score,
computed from x, the attention's normalised input (the same tensor the QKV projection reads)::

    Y' = Y * sigmoid(x W_theta + b_theta)       W_theta: n_embd -> n_head * head_dim

The bias follows the config's ``bias``. What the paper reports about this position (its "G1",
the best of the positions it compares, among them the value position the QKVE value gate uses):

- the gate adds a non-linearity between the value and output projections, whose product is
  otherwise one low-rank linear map per head;
- its scores are query-dependent and sparse (most are near zero), so a head can switch its
  output off per token;
- it removes the "attention sink": the attention mass the first token draws falls sharply;
- training is more stable (fewer loss spikes, larger learning rates tolerated).

Initialisation (this implementation's choice). ``attn_output_gate_init="normal"`` draws W_theta
like every other projection (nanoGPT's N(0, 0.02), zero bias), so a fresh score is near
sigmoid(0) = 1/2 everywhere: bounded, where the sigmoid's slope is largest (the gate learns
fastest there), and with no channel switched on or off before training says so.
``"zero"`` starts every score at exactly 1/2 (a fresh model is plain attention with its output
halved), removing the init's small random per-channel spread.
The score depends only on its own token, so cached decoding is exact; composed with the
boosted rounds the gate multiplies their final sum F.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention import Context
from attnlab.model.layers import Linear
from attnlab.model.mechanisms import Mechanism, Part, Rule


class OutputGate(Linear):
    """attn.W_theta: the gate projection, one score per head and channel of the output."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.n_embd, config.n_head * config.head_dim, bias=config.bias)
        self.zero_init = config.attn_output_gate_init == "zero"

    def init_weights(self) -> None:
        if self.zero_init:
            nn.init.zeros_(self.weight)
            if self.bias is not None:
                nn.init.zeros_(self.bias)

    def adjust_output(self, x: Tensor, y: Tensor, ctx: Context) -> Tensor:
        g = torch.sigmoid(self(x))
        if ctx.stats is not None:
            ctx.record("output_gate_mean", g.mean())
            ctx.record("output_gate_std", g.std())
        ctx.keep("output_gate.gate", g)
        return y * g


def parts(config: ModelConfig) -> list[Part]:
    if not config.attn_output_gate:
        return []
    return [Part("attn", "W_theta", ("output",), lambda: OutputGate(config))]


SPEC = Mechanism(
    name="gated_attn",
    switch={"attn_output_gate": False},
    fields=("attn_output_gate", "attn_output_gate_init"),
    example={"attn_output_gate": True},
    bench={"gated-attn": {"attn_output_gate": True}},
    choices={"attn_output_gate_init": ("normal", "zero")},
    rules=(
        Rule(
            ("attn_output_gate_init", "attn_output_gate"),
            lambda c: c.attn_output_gate_init != "normal" and not c.attn_output_gate,
            "attn_output_gate_init={attn_output_gate_init!r} needs attn_output_gate=True (there "
            "is no gate to initialise)",
            example={"attn_output_gate_init": "zero"},
        ),
    ),
    help={
        "attn_output_gate": "gated attention (Qiu et al. 2025): Y * sigmoid(x W_theta) per head "
        "and channel, before c_proj",
        "attn_output_gate_init": "output-gate W_theta init: normal (nanoGPT's), or zero (every "
        "score exactly 1/2 at start)",
    },
    gates={"output_gate": (0.0, 1.0)},  # sigmoid(x W_theta): 0 shuts a head's channel
)
