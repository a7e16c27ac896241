"""K/V-bias (``kv-bias``; seed kv-bias-purpose-state): a purpose state M biases keys and values.

A per-token state M flows down the blocks. Each block's attention adds ``W_kvm(M_prev)`` to its
keys and values (Q, the softmax and the causal mask are untouched), and after the attention
residual a GRU-style gate on h = ln_2(x) (the same tensor the MLP reads) blends in a candidate:

    g, c = sigmoid/tanh of W_gm(h) split in two;   M_new = g * M_prev + (1 - g) * c

M starts as zeros at block 0 and the last block's M is discarded, as in the reference fork: block
0's W_kvm sees only zeros (its gradient is a zero tensor, so AdamW still decays it) and the last
block's W_gm never reaches the loss (its gradient stays None, so AdamW leaves it alone).
M depends only on its own token, which makes caching K' and V' exact.

``m_inject`` reruns the seed's failed attempts: "output_mul" multiplies the attention output by
M (a signal destroyer at init, M ~ 0); "mlp_input" adds M to the MLP input.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.attention import Context
from attnlab.model.layers import Linear
from attnlab.model.mechanisms import Mechanism, Part, Rule


def previous_m(like: torch.Tensor, ctx: Context) -> torch.Tensor:
    """The purpose state entering this block: zeros at block 0."""
    m = ctx.state.get("M")
    return torch.zeros_like(like) if m is None else m


class KVBias(Linear):
    """attn.W_kvm: M_prev -> (k bias, v bias)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.n_embd, 2 * config.kv_dim, bias=config.bias)
        self.detached = config.m_gate_detached

    def adjust_qkv(
        self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, ctx: Context
    ) -> tuple[Tensor, Tensor, Tensor]:
        if "M" not in ctx.state and not torch.is_grad_enabled():
            # block 0 without autograd: W_kvm(0) is exactly its bias, so no matmul (training
            # still runs it for the zero gradient AdamW decays)
            bias = self.bias
            if bias is None:
                return q, k, v
            km, vm = bias.chunk(2)  # float32 parameters: keep k and v in autocast's dtype
            return q, k + km.to(k.dtype), v + vm.to(v.dtype)
        m = previous_m(x, ctx)
        if self.detached:  # the seed's ablation: no gradient flows back into M from here
            m = m.detach()
        km, vm = self(m).chunk(2, dim=2)
        return q, k + km, v + vm


class PurposeGate(Linear):
    """W_gm at block level: GRU-style update of M from the MLP input h."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.n_embd, 2 * config.n_embd, bias=config.bias)
        self.last_layer = config.n_layer - 1

    def update_state(self, h: Tensor, ctx: Context) -> None:
        if ctx.layer == self.last_layer:  # no block reads the last M: skip the dead matmul
            return
        m_prev = previous_m(h, ctx)
        g_pre, c_pre = self(h).chunk(2, dim=2)
        # lerp wants one dtype; under autocast the gate is bf16/fp16 while h (a norm's output)
        # and so block 0's M are float32. Promote as the fork's g*M + (1-g)*c does (float32).
        dtype = torch.promote_types(m_prev.dtype, g_pre.dtype)
        g = torch.sigmoid(g_pre).to(dtype)
        # g * M_prev + (1 - g) * c as one fused kernel (and one in backward) instead of four
        ctx.state["M"] = torch.lerp(torch.tanh(c_pre).to(dtype), m_prev.to(dtype), g)
        if ctx.stats is not None:
            ctx.record("m_gate_mean", g.mean())
            ctx.record("m_gate_std", g.std())
        ctx.keep("m_gate.gate", g)  # for `analyze gates` (a no-op unless an analysis asks)


class OutputMul(nn.Module):
    """Failed attempt: y := y * M on the attention output (before c_proj)."""

    def adjust_output(self, x: Tensor, y: Tensor, ctx: Context) -> Tensor:
        return y * previous_m(y, ctx)


class MLPInput(nn.Module):
    """Failed attempt: M added to the MLP input."""

    def adjust_mlp_input(self, h: Tensor, ctx: Context) -> Tensor:
        return h + previous_m(h, ctx)


def parts(config: ModelConfig) -> list[Part]:
    if not config.use_m_gate:
        return []
    # every injection reads M_prev; the block runs them before the gate overwrites it
    injected = {
        "kv": Part("attn", "W_kvm", ("qkv",), lambda: KVBias(config)),
        "output_mul": Part("attn", "m_output_mul", ("output",), OutputMul),
        "mlp_input": Part("block", "m_mlp_input", ("mlp_input",), MLPInput),
    }[config.m_inject]
    return [injected, Part("block", "W_gm", ("state",), lambda: PurposeGate(config))]


SPEC = Mechanism(
    name="kv_bias",
    switch={"use_m_gate": False},
    fields=("use_m_gate", "m_gate_detached", "m_inject"),
    example={"use_m_gate": True},
    bench={
        "kv-bias": {"use_m_gate": True},
        "kv-bias-detached": {"use_m_gate": True, "m_gate_detached": True},
    },
    choices={"m_inject": ("kv", "output_mul", "mlp_input")},
    help={
        "use_m_gate": "K/V-bias purpose state: a per-token state M that biases keys and values",
        "m_gate_detached": "stop gradients flowing into M through the K/V bias",
        "m_inject": "where M enters: kv (the seed's), output_mul or mlp_input (its failed "
        "attempts)",
    },
    gates={"m_gate": (0.0, 1.0)},  # g in M = g * M_prev + (1 - g) * c: 1 keeps M
    rules=(
        Rule(
            ("m_gate_detached", "use_m_gate"),
            lambda c: c.m_gate_detached and not c.use_m_gate,
            "m_gate_detached=True needs use_m_gate=True",
            example={"m_gate_detached": True},
        ),
        Rule(
            ("m_inject", "use_m_gate"),
            lambda c: c.m_inject != "kv" and not c.use_m_gate,
            "m_inject={m_inject!r} needs use_m_gate=True",
            example={"m_inject": "mlp_input"},
        ),
    ),
)
