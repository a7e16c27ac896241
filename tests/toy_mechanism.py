"""A toy mechanism in one file: each layer scales its values by (1 + s), s a zero-initialised vector.

tests/model/test_mechanism_contract.py registers it with one line (``REGISTRY + ("toy",)``) and runs
the whole contract suite on it, alone and composed with every real mechanism. It owns no config
field, so it is on whenever registered; a real mechanism adds its fields to ModelConfig and names
them in its SPEC.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.model.mechanisms import Mechanism, Part


class ValueScale(nn.Module):
    """attn.value_scale: V * (1 + s), per value channel; s = 0 is plain attention."""

    def __init__(self, kv_dim: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.zeros(kv_dim))

    def adjust_qkv(self, x, q, k, v, ctx):
        return q, k, v * (1 + self.s)


def parts(config) -> list[Part]:
    return [Part("attn", "value_scale", ("qkv",), lambda: ValueScale(config.kv_dim))]


SPEC = Mechanism(
    name="toy",
    switch={},
    fields=(),
    example={},
    bench={},
    zero_gate={},
    always_on=True,
)
