"""Gates of gradient-boosted attention: how much of a correction ``c`` is added to ``F``.

The boosted update is ``F <- F + g * c``. The gate types are those of the paper's ablation
(Table 6); "linear" is the language-model default. Every gate is called as
``gate(F, c, entropy)`` and returns ``g`` broadcastable to ``F``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.model.layers import Linear

GATE_KINDS = ("none", "scalar", "linear", "mlp")

MLP_HIDDEN = 32
# sigmoid(0.5) ~ 0.62: start by adding most of the correction, like the released scalar gate.
SCALAR_INIT = 0.5


class NoGate(nn.Module):
    """g = 1: pure additive boosting, no parameters."""

    def forward(self, F: Tensor, c: Tensor, entropy: Tensor | None = None) -> Tensor:
        return torch.ones((), dtype=F.dtype, device=F.device)


class ScalarGate(nn.Module):
    """g = sigmoid(one learned parameter), the analogue of MART's shrinkage."""

    def __init__(self) -> None:
        super().__init__()
        self.logit = nn.Parameter(torch.tensor(SCALAR_INIT))

    def forward(self, F: Tensor, c: Tensor, entropy: Tensor | None = None) -> Tensor:
        return torch.sigmoid(self.logit).to(F.dtype)


class LinearGate(nn.Module):
    """Per-dimension g = sigmoid(Linear(2*dim -> dim)([F, c]))."""

    def __init__(self, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.proj = Linear(2 * dim, dim, bias=bias)

    def forward(self, F: Tensor, c: Tensor, entropy: Tensor | None = None) -> Tensor:
        return torch.sigmoid(self.proj(torch.cat([F, c], dim=-1)))


class MLPGate(nn.Module):
    """Per-dimension g from [F, c, entropy of the round-0 attention weights] through a small MLP."""

    def __init__(self, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(
            Linear(2 * dim + 1, MLP_HIDDEN, bias=bias),
            nn.GELU(),
            Linear(MLP_HIDDEN, dim, bias=bias),
        )

    def forward(self, F: Tensor, c: Tensor, entropy: Tensor | None = None) -> Tensor:
        if entropy is None:
            raise ValueError("the mlp gate needs the entropy of the round-0 attention weights")
        # Accept one entropy per row ([...]) as well as the explicit [..., 1] form.
        if entropy.dim() == F.dim() - 1:
            entropy = entropy.unsqueeze(-1)
        return torch.sigmoid(self.net(torch.cat([F, c, entropy.to(F.dtype)], dim=-1)))


def make_gate(kind: str, dim: int, bias: bool = True) -> nn.Module:
    """Build the gate ``kind`` (one of GATE_KINDS) for corrections of width ``dim``."""
    if kind == "none":
        return NoGate()
    if kind == "scalar":
        return ScalarGate()
    if kind == "linear":
        return LinearGate(dim, bias)
    if kind == "mlp":
        return MLPGate(dim, bias)
    raise ValueError(f"unknown gate kind {kind!r}; allowed: {', '.join(GATE_KINDS)}")
