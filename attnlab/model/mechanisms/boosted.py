"""Gradient-boosted attention (``boosted``; seed gradient-boosted-attention): rounds fit residuals.

Round 0 is the layer's ordinary attention, ``F = Attn_0(x)``. Each round m >= 1 then fits what
round 0 missed, like one stage of gradient boosting::

    r = x - F;   c = Attn_m(r);   g = gate(F, c [, entropy of the round-0 weights]);   F = F + g * c

``Attn_m`` has its own fused QKV projection (``attn.boost[m - 1].c_attn``); Q, K and V all come
from r (``boost_kv_source="residual"``, the released code) or only Q from r and K, V from x
(``"input"``, the paper's "cross" ablation). F is the concatenated multi-head output; the
attention's single ``c_proj`` is applied once, after the last round.

Every round runs through ``attn.attend``, so SDPA, RoPE, GQA, dropout, analysis capture and the
KV cache (slot ``"r{m}"``) work as in round 0, and an attention core (Twicing) applies to every
round. r at position t depends only on positions <= t, so cached decoding is exact.

Composition: the value gate and the K/V-bias (``qkv`` hooks) modify round 0 only; extra rounds
read r (or x) through their own, unmodified projections. ``output`` hooks act on the final F.
The "mlp" gate reads the entropy of round-0 softmax weights, which Twicing does not produce
(its 2A - A^2 rows can be negative), so that one pairing is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.functional import linear

from attnlab.config import ModelConfig
from attnlab.model.attention import Context
from attnlab.model.layers import Linear
from attnlab.model.mechanisms import Mechanism, Part, Rule
from attnlab.model.mechanisms.boost_gates import GATE_KINDS, make_gate


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each attention row: [..., Tq, Tk] -> [..., Tq]; 0 log 0 = 0.

    ``w * log(max(w, tiny))`` rather than ``xlogy(w, w)``: the same values and, wherever a weight
    is positive, the same gradient, but xlogy's gradient at a zero weight is 0/0. Zeros come from
    the causal mask, and under bf16/fp16 from underflow too; softmax's backward multiplies by the
    weight, so a finite gradient there adds nothing, while a NaN poisoned every parameter."""
    return -(weights * weights.clamp_min(torch.finfo(weights.dtype).tiny).log()).sum(dim=-1)


class BoostRound(nn.Module):
    """One extra round: its own fused QKV projection and its gate."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_embd, self.kv_dim = config.n_embd, config.kv_dim
        self.kv_from_input = config.boost_kv_source == "input"
        self.c_attn = Linear(config.n_embd, config.n_embd + 2 * config.kv_dim, bias=config.bias)
        self.gate = make_gate(config.boost_gate, config.n_embd, config.bias)

    def qkv(self, r: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q [B,T,E] from r; k, v [B,T,kv_dim] from r or x (slicing the fused weight: one matmul each)."""
        if not self.kv_from_input:
            return self.c_attn(r).split_with_sizes([self.n_embd, self.kv_dim, self.kv_dim], dim=2)
        w, b, e = self.c_attn.weight, self.c_attn.bias, self.n_embd
        q = linear(r, w[:e], None if b is None else b[:e])
        kv = linear(x, w[e:], None if b is None else b[e:])
        return (q, *kv.chunk(2, dim=2))


class BoostedRounds(nn.ModuleList):
    """attn.boost: rounds 1..M-1 (round 0 is the attention's own c_attn)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__([BoostRound(config) for _ in range(config.boost_rounds - 1)])
        # read by CausalSelfAttention: the mlp gate needs round-0 weights, so no SDPA-only path
        self.needs_weights = config.boost_gate == "mlp"

    def add_rounds(
        self, x: Tensor, F: Tensor, w0: Tensor | None, attn: nn.Module, ctx: Context
    ) -> Tensor:
        entropy = attention_entropy(w0).mean(dim=1) if self.needs_weights else None  # [B, T]
        for m, rnd in enumerate(self, start=1):
            q, k, v = rnd.qkv(x - F, x)
            c, _ = attn.attend(q, k, v, ctx, slot=f"r{m}")
            g = rnd.gate(F, c, entropy)
            F = torch.addcmul(F, g, c)  # F + g * c in one kernel (and one in backward)
            if ctx.stats is not None or ctx.capture is not None:
                g = g.expand_as(c)  # scalar gates: one value per element, so std is defined
                ctx.record(f"boost_gate_r{m}_mean", g.mean())
                ctx.record(f"boost_gate_r{m}_std", g.std())
                ctx.keep(f"r{m}.gate", g)
        ctx.keep("F", F)
        return F


def parts(config: ModelConfig) -> list[Part]:
    if config.boost_rounds == 1:
        return []
    return [Part("attn", "boost", ("rounds",), lambda: BoostedRounds(config))]


SPEC = Mechanism(
    name="boosted",
    switch={"boost_rounds": 1},
    fields=("boost_rounds", "boost_gate", "boost_kv_source"),
    example={"boost_rounds": 2},
    bench={"boosted": {"boost_rounds": 2}},
    attention_passes=lambda config: config.boost_rounds,
    choices={
        "boost_gate": GATE_KINDS,
        "boost_kv_source": ("residual", "input"),
    },
    help={
        "boost_rounds": "gradient-boosted attention rounds (1 = ordinary attention)",
        "boost_gate": "gate on each boosting correction",
        "boost_kv_source": "K and V of extra rounds from the residual x - F or from the input x",
    },
    gates={"r{m}": (0.0, 1.0)},  # round m's g in F = F + g * c (1 for boost_gate="none")
    rules=(
        Rule(
            ("boost_gate", "twicing", "boost_rounds"),
            lambda c: c.boost_gate == "mlp" and c.twicing and c.boost_rounds > 1,
            "boost_gate='mlp' reads the entropy of softmax weights; it does not compose with "
            "twicing=True (2A - A^2 rows can be negative)",
            example={"boost_rounds": 2, "boost_gate": "mlp", "twicing": True},
        ),
        # one round has no correction to gate or to read K and V for: recorded, doing nothing
        Rule(
            ("boost_gate", "boost_rounds"),
            lambda c: c.boost_rounds == 1 and c.boost_gate != "linear",
            "boost_gate={boost_gate!r} needs boost_rounds >= 2 (boost_rounds={boost_rounds} "
            "has no correction to gate)",
            example={"boost_gate": "scalar"},
        ),
        Rule(
            ("boost_kv_source", "boost_rounds"),
            lambda c: c.boost_rounds == 1 and c.boost_kv_source != "residual",
            "boost_kv_source={boost_kv_source!r} needs boost_rounds >= 2 "
            "(boost_rounds={boost_rounds} has no extra round to read K and V for)",
            example={"boost_kv_source": "input"},
        ),
    ),
)
