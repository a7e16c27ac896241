"""A toy attention core in one file, written as docs/adding-a-mechanism.md says: attention
sharpened per head on a depth schedule, ``softmax(s_h QK^T / sqrt(d)) V`` with

    s_h = 1 + lam(l) * tanh(b_h),    lam(l) = 0.8 - 0.6 * exp(-0.3 * l)

``b`` a learned vector (one per head, zero at start: plain attention) and ``l`` the layer index
(``ctx.layer``), the schedule Differential Transformer gives its lambda. It replaces the core
and carries parameters, the class of mechanism whose weights a second registration of the core
stored twice; it declares that it does not compose with twicing (``excludes``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.model.attention import attention
from attnlab.model.mechanisms import Mechanism, Part


def depth_schedule(layer: int) -> float:
    """lam(l): small in the first layer, approaching 0.8 in deep ones."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class SharpenedCore(nn.Module):
    """attn.sharpen: scales each head's scores by s_h (scaling q by s_h does exactly that)."""

    def __init__(self, n_head: int) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.zeros(n_head))

    def core(self, q, k, v, ctx, slot, dropout_p, need_weights):
        s = 1 + depth_schedule(ctx.layer) * torch.tanh(self.b)  # [H]
        q = q * s.to(q.dtype)[:, None, None]  # [B, H, T, D]; q's dtype: SDPA wants one
        return attention(q, k, v, dropout_p, need_weights, ctx.mask)


def parts(config) -> list[Part]:
    if not config.toy_core:
        return []
    return [Part("attn", "sharpen", ("core",), lambda: SharpenedCore(config.n_head))]


SPEC = Mechanism(
    name="toy_core",
    switch={"toy_core": False},
    fields=("toy_core",),
    example={"toy_core": True},
    bench={"toy-core": {"toy_core": True}},
    zero_gate={},
    excludes=("twicing",),
    help={"toy_core": "toy: attention sharpened per head, on a depth schedule"},
)
