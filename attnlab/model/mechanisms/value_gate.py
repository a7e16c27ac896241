"""Value gate (``value-gate``; seed qkve-value-gate, "QKVE"): V_mod = V * (1 + tanh(x W_E)).

W_E is shaped like W_V (n_embd -> n_kv_head * head_dim), so with GQA it gates the shared value
heads. The multiplier lies in (0, 2): it can damp or amplify a value channel but never flip its
sign, and a gate of 0 (``value_gate_init="zero"``) is exact pass-through at initialisation.
When composed with the K/V bias the gate multiplies the biased values.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention import Context
from attnlab.model.layers import Linear
from attnlab.model.mechanisms import Mechanism, Part, Rule


class ValueGate(Linear):
    """attn.W_E: the value-gate projection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.n_embd, config.kv_dim, bias=config.bias)
        self.zero_init = config.value_gate_init == "zero"

    def init_weights(self) -> None:
        if self.zero_init:
            nn.init.zeros_(self.weight)
            if self.bias is not None:
                nn.init.zeros_(self.bias)

    def adjust_qkv(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: Context
    ) -> tuple[Tensor, Tensor, Tensor]:
        tanh = torch.tanh(self(x))
        if ctx.stats is not None:
            ctx.record("value_gate_mean", 1 + tanh.mean())
            ctx.record("value_gate_std", tanh.std())
        if ctx.capture is not None:  # the multiplier itself, not tanh: what analyses plot
            ctx.keep("value_gate.gate", 1 + tanh)
        return q, k, torch.addcmul(v, v, tanh)  # v * (1 + tanh) in one fused kernel


def parts(config: ModelConfig) -> list[Part]:
    return [Part("attn", "W_E", ("qkv",), lambda: ValueGate(config))] if config.value_gate else []


SPEC = Mechanism(
    name="value_gate",
    switch={"value_gate": False},
    fields=("value_gate", "value_gate_init"),
    example={"value_gate": True, "n_kv_head": 1},
    bench={"value-gate": {"value_gate": True}},
    bench_on_modern=True,  # the QKVE seed's gate, on the backbone it was designed for
    zero_gate={"value_gate_init": "zero"},
    choices={"value_gate_init": ("normal", "zero")},
    help={
        "value_gate": "QKVE value gate: V * (1 + tanh(x W_E))",
        "value_gate_init": "value-gate W_E init: normal, or zero (exact pass-through at start)",
    },
    gates={"value_gate": (0.0, 2.0)},  # 1 + tanh(x W_E): 1 passes the value channel unchanged
    rules=(
        Rule(  # without the gate there is no W_E to initialise: recorded, doing nothing
            ("value_gate_init", "value_gate"),
            lambda c: not c.value_gate and c.value_gate_init != "normal",
            "value_gate_init={value_gate_init!r} needs value_gate=True",
            example={"value_gate_init": "zero"},
        ),
    ),
)
