"""Backbone building blocks: norms, feed-forward layers and rotary embeddings.

Module and parameter names follow nanoGPT (``c_fc``, ``c_proj``, ``weight``/``bias``) so that
checkpoints line up and the ``c_proj.weight`` scaled init applies to every residual projection.

The forwards that run once per layer and decoded token read their submodules from
``self._modules`` and their parameters from ``self._parameters``, the registries nn.Module's own
``__getattr__`` reads: ``self.c_fc`` or ``self.weight`` first fails the normal attribute lookup
(building an AttributeError) before ``__getattr__`` finds it, a cost per access that adds up
over a small model's decoding step (`attnlab bench generate` measures it). Reassigning a submodule or parameter still works
(it updates the registry); a parameter that weight_norm or parametrize took out of the registry
is read as the attribute it became (``p["weight"] if "weight" in p else self.weight``). Every
projection is ``Linear`` for the same reason: nn.Linear's forward reads ``self.weight``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import ModelConfig


class Linear(nn.Linear):
    """nn.Linear whose forward reads its weight and bias from the registry (see above)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self._parameters  # inline, not a helper: a function call per read costs a few %
        weight = p["weight"] if "weight" in p else self.weight
        return F.linear(x, weight, p["bias"] if "bias" in p else self.bias)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1; nanoGPT's own class)."""

    def __init__(self, ndim: int, bias: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.eps = eps
        self.shape = (ndim,)  # a plain tuple: cheaper per call than reading weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self._parameters  # (see the module docstring)
        weight = p["weight"] if "weight" in p else self.weight
        return F.layer_norm(
            x, self.shape, weight, p["bias"] if "bias" in p else self.bias, self.eps
        )


class RMSNorm(nn.Module):
    """Root-mean-square norm (no centring, no bias), as in the QKVE backbone."""

    def __init__(self, ndim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = eps
        self.shape = (ndim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self._parameters  # (see the module docstring)
        return F.rms_norm(x, self.shape, p["weight"] if "weight" in p else self.weight, self.eps)


def make_norm(config: ModelConfig) -> nn.Module:
    """The configured norm over n_embd (its eps derived from the norm unless set)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return LayerNorm(config.n_embd, config.bias, config.norm_eps)


class MLP(nn.Module):
    """nanoGPT's feed-forward: Linear -> exact GELU (``gelu_tanh``: GPT-2's approximation) -> Linear."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d_ffn = int(config.d_ffn or 4 * config.n_embd)
        self.c_fc = Linear(config.n_embd, d_ffn, bias=config.bias)
        # the function, not nn.GELU: one module call fewer per layer and decoded token
        self.approximate = "tanh" if config.mlp == "gelu_tanh" else "none"
        self.c_proj = Linear(d_ffn, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self._modules  # (see the module docstring)
        y = m["c_proj"](F.gelu(m["c_fc"](x), approximate=self.approximate))
        return self.dropout(y) if self.training else y  # identity in eval: skip the call


class SwiGLU(nn.Module):
    """SiLU-gated feed-forward. Gate and up projections are fused into one matmul (``c_fc``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d_ffn = int(config.d_ffn or 4 * config.n_embd)
        self.c_fc = Linear(config.n_embd, 2 * d_ffn, bias=config.bias)
        self.c_proj = Linear(d_ffn, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self._modules  # (see the module docstring)
        gate, up = m["c_fc"](x).chunk(2, dim=-1)  # chunk: no Python wrapper, unlike split
        y = m["c_proj"](F.silu(gate) * up)
        return self.dropout(y) if self.training else y


def make_mlp(config: ModelConfig) -> nn.Module:
    """The configured feed-forward layer: SwiGLU, or the GELU MLP."""
    return SwiGLU(config) if config.mlp == "swiglu" else MLP(config)


class Rotary(nn.Module):
    """Rotary position embedding tables (rotate-half convention) up to block_size positions."""

    def __init__(self, head_dim: int, max_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        # non-persistent: derived from the config, so not part of the state_dict
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(
        self, start: int, t: int, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions ``start`` ... ``start + t - 1`` ([T, D]) or of ``positions``
        [B, T] ([B, 1, T, D]): looked up once per forward, used by every layer and round."""
        if positions is None:
            return self.cos[start : start + t], self.sin[start : start + t]
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by the angles whose cos and sin ``Rotary`` looked up."""
    if cos.dtype != x.dtype:  # autocast: q and k are in the autocast dtype, the tables float32
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
