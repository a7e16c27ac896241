"""Twicing attention (``twicing``; Abdullaev & Nguyen, ICLR 2025): (2A - A^2) V, no new parameters.

(2A - A^2) V = A (2V - AV), so instead of forming A^2 we run a second attention pass (same
scores, through SDPA) over u = 2V - AV. u_j depends only on positions <= j, so it is cached per
token like K and V and cached decoding stays exact. Causal A stays causal.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention import Context, attention, repeat_kv
from attnlab.model.mechanisms import Mechanism, Part


class Twicing(nn.Module):
    """Replaces the attention core; keeps the caller's softmax(QK^T) for both passes."""

    def core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        ctx: Context,
        slot: str,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        y1, w = attention(q, k, v, dropout_p, need_weights, ctx.mask)
        t = q.size(2)
        v_new = repeat_kv(v.narrow(2, v.size(2) - t, t), q.size(1) // v.size(1))
        u = torch.lerp(y1, v_new, 2.0)  # y1 + 2 (v - y1) = 2v - y1, one kernel instead of two
        cache = ctx.layer_cache
        if cache is not None:
            u = cache.extend(f"{slot}.twice", u)
        y, _ = attention(q, k, u, dropout_p, mask=ctx.mask)
        return y, (None if w is None else 2 * w - w @ w)


def parts(config: ModelConfig) -> list[Part]:
    return [Part("attn", "twicing", ("core",), Twicing)] if config.twicing else []


SPEC = Mechanism(
    name="twicing",
    switch={"twicing": False},
    fields=("twicing",),
    example={"twicing": True},
    bench={"twicing": {"twicing": True}},
    adds_params=False,
    help={"twicing": "Twicing attention: (2A - A^2) V instead of A V"},
    attention_passes=lambda config: 2,  # (2A - A^2) V = A (2V - AV): two passes over the scores
)
