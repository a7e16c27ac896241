"""A toy mechanism in one file, written as docs/adding-a-mechanism.md says: each layer scales its
values by (1 + tanh(a)), ``a`` a float32 vector that starts at zero.

Under autocast ``a`` stays float32, so ``v * (1 + tanh(a))`` is float32 where v was bf16: the
backbone casts what a hook returns back to the dtype it was given, so this composes with
twicing (whose torch.lerp wants one dtype). A fresh model is plain attention, so its zero gate
is its switch alone, the field its example sets too.

The tests register it with conftest.register_toys (its REGISTRY line and its config field, as
its author adds them) and run the mechanism contract on it, alone and composed.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.model.mechanisms import Mechanism, Part


class ValueScale(nn.Module):
    """attn.value_scale: V * (1 + tanh(a)), per value channel; a = 0 is plain attention."""

    def __init__(self, kv_dim: int) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(kv_dim))

    def adjust_qkv(self, x, q, k, v, ctx):
        return q, k, v * (1 + torch.tanh(self.a))


def parts(config) -> list[Part]:
    if not config.toy_scale:
        return []
    return [Part("attn", "value_scale", ("qkv",), lambda: ValueScale(config.kv_dim))]


SPEC = Mechanism(
    name="toy_scale",
    switch={"toy_scale": False},
    fields=("toy_scale",),
    example={"toy_scale": True},
    bench={"toy-scale": {"toy_scale": True}},
    zero_gate={"toy_scale": True},
    help={"toy_scale": "toy: V * (1 + tanh(a)), a float32 vector starting at 0"},
)
