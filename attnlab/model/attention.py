"""Causal self-attention: fused QKV, GQA, RoPE, KV cache, SDPA, and the mechanism hook points.

With no mechanism attached this is nanoGPT's CausalSelfAttention op for op (same matmuls, same
``scaled_dot_product_attention(..., is_causal=True)`` call), which is what keeps the backbone
bit-identical to nanoGPT. Mechanisms reach in only through the hooks named in
attnlab.model.mechanisms; nothing here knows about any particular mechanism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import ModelConfig
from attnlab.model.layers import Linear, rotate
from attnlab.model.mechanisms import attach


class LayerCache:
    """Growing per-layer buffers (keys, values, and whatever a mechanism needs per token).

    Buffers are allocated once at ``max_len`` and written in place, so a decoding step costs
    O(1) allocation instead of a ``torch.cat`` of the whole history.
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self._slots: dict[str, list] = {}  # name -> [buffer, filled length, (B, dtype)]

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """Each slot's buffer (the ONNX export reads which slots a model fills)."""
        return {name: slot[0] for name, slot in self._slots.items()}

    def extend(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Append x [B, H, T, D] along T to slot ``name``; return everything cached so far."""
        b, h, t, d = x.shape
        slot = self._slots.get(name)
        if slot is None or slot[2] != (b, x.dtype):
            # one spare slot: the filled part never spans the whole buffer, so torch.compile
            # has no "cache exactly full" case to specialise (and recompile) for
            slot = self._slots[name] = [x.new_empty(b, h, self.max_len + 1, d), 0, (b, x.dtype)]
        buf, start, _ = slot
        end = start + t
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {end} positions > block_size {self.max_len}")
        buf.narrow(2, start, t).copy_(x)  # narrow: cheaper per step than __setitem__
        slot[1] = end
        return buf.narrow(2, 0, end)


class KVCache:
    """One LayerCache per block plus the number of positions already processed."""

    def __init__(self, n_layer: int, max_len: int) -> None:
        self.layers = [LayerCache(max_len) for _ in range(n_layer)]
        self.length = 0


@dataclass
class Context:
    """What travels beside the hidden states through one forward pass."""

    start: int = 0  # absolute position of the first token (non-zero when decoding with a cache)
    cache: KVCache | None = None
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # RoPE's cos and sin (see Rotary)
    layer: int = 0
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # cross-layer signals, e.g. "M"
    stats: dict[str, torch.Tensor] | None = None  # mechanisms put gate statistics here when asked
    capture: dict[str, Any] | None = None  # analyses ask for attention weights here
    mask: torch.Tensor | None = None  # [B, 1, Tq, Tk] bool, True = attend; None: plain causal

    @property
    def layer_cache(self) -> LayerCache | None:
        return self.cache.layers[self.layer] if self.cache is not None else None

    def record(self, name: str, value: torch.Tensor) -> None:
        """Store a per-layer statistic when the trainer asked for them (detached, no sync)."""
        if self.stats is not None:
            self.stats[f"{name}/layer{self.layer}"] = value.detach()

    def keep(self, name: str, value: torch.Tensor) -> None:
        """Store a tensor for an analysis when one asked (``capture`` is a dict)."""
        if self.capture is not None:
            self.capture[f"layer{self.layer}.{name}"] = value.detach()


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, Hkv * n_rep, T, D]; query head h reads kv head h // n_rep."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def padding_mask(attention_mask: torch.Tensor, tq: int) -> torch.Tensor:
    """[B, 1, Tq, Tk] bool: causal and not padding (attention_mask [B, Tk], 1 = a real token).

    A padding query would see no key at all (a NaN row), so it sees itself; no real token ever
    sees a padding key.
    """
    keys = attention_mask.bool()[:, None, None, :]
    tk = keys.size(-1)
    rows = torch.arange(tq, device=keys.device)[:, None] + (tk - tq)
    cols = torch.arange(tk, device=keys.device)[None, :]
    return ((cols <= rows) & keys) | (cols == rows)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d)) v, causal, for queries that are the LAST Tq of the Tk positions.

    q [B, H, Tq, D]; k, v [B, Hkv, Tk, D] (v may already have H heads). Uses SDPA unless the caller needs the weights
    (analyses, the MLP boosting gate), in which case the T x T matrix is formed explicitly.
    ``mask`` (see ``padding_mask``) replaces the causal mask when sequences are padded.
    """
    if need_weights or k.size(1) != v.size(1):  # explicit heads (v may have been widened)
        k, v = repeat_kv(k, q.size(1) // k.size(1)), repeat_kv(v, q.size(1) // v.size(1))
    # SDPA shares each kv head among its query heads itself: no copy of the (cached) keys and
    # values per call, and one ONNX Attention node with kv_num_heads (bool(): a jit trace's
    # sizes are tensors)
    gqa = bool(k.size(1) != q.size(1))
    sdpa = F.scaled_dot_product_attention
    tq, tk = q.size(2), k.size(2)
    if need_weights:
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        if mask is None:
            mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return F.dropout(weights, dropout_p) @ v, weights
    if mask is not None:
        return sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa), None
    if tq == tk:  # full sequence: nanoGPT's exact call
        return sdpa(
            q, k, v, attn_mask=None, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa
        ), None
    if tq == 1:  # one new token sees every cached position
        return sdpa(q, k, v, dropout_p=dropout_p, enable_gqa=gqa), None
    mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
    return sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa), None


def as_given(given: tuple[torch.Tensor, ...], returned: Any) -> tuple[torch.Tensor, ...]:
    """A hook's tensors back in the dtypes it was given.

    Under autocast a hook mixing in a float32 parameter (``v * (1 + a)``) returns float32, and
    the next op that insists on one dtype (another mechanism's torch.lerp, SDPA) fails far from
    the cause. Every hook's output is cast back where it is called; the cast is free when the
    dtype already matches.
    """
    return tuple(r.to(g.dtype) for g, r in zip(given, returned, strict=True))


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention with a fused QKV projection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, int(config.n_kv_head or config.n_head)
        self.n_embd, self.kv_dim, self.head_dim = config.n_embd, config.kv_dim, config.head_dim
        self.dropout = config.dropout
        self.c_attn = Linear(config.n_embd, config.n_embd + 2 * config.kv_dim, bias=config.bias)
        self.qkv_sizes = [config.n_embd, config.kv_dim, config.kv_dim]
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # the parts live once, under their own names (attach sets them): a second attribute
        # holding one would register its parameters twice (two state_dict keys, one tensor)
        self.hooks = attach(self, config, "attn")
        self.need_round0_weights = any(
            getattr(p, "needs_weights", False) for p in self.hooks["rounds"]
        )

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: Context,
        slot: str,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One attention round: heads, RoPE, cache, softmax(QK^T)V; returns [B, T, E] and weights."""
        b, t, _ = q.shape
        h, hkv, d = self.n_head, self.n_kv_head, self.head_dim
        if t == 1:  # a decoding step: [B, 1, n*D] and [B, n, 1, D] are one memory order
            q, k, v = q.view(b, h, 1, d), k.view(b, hkv, 1, d), v.view(b, hkv, 1, d)
        else:  # [B, T, n*D] -> [B, n, T, D]
            q = q.view(b, t, h, d).transpose(1, 2)
            k, v = k.view(b, t, hkv, d).transpose(1, 2), v.view(b, t, hkv, d).transpose(1, 2)
        if ctx.rope is not None:
            q, k = rotate(q, *ctx.rope), rotate(k, *ctx.rope)
        cache = ctx.layer_cache
        if cache is not None:
            k, v = cache.extend(f"{slot}.k", k), cache.extend(f"{slot}.v", v)
        need_weights = need_weights or ctx.capture is not None
        dropout_p = self.dropout if self.training else 0.0
        core = self.hooks["core"]
        if core:
            y, w = core[0].core(q, k, v, ctx, slot, dropout_p, need_weights)
            y = y.to(q.dtype)  # see as_given
        else:
            y, w = attention(q, k, v, dropout_p, need_weights, ctx.mask)
        if ctx.capture is not None:
            ctx.keep(f"{slot}.weights", w)
            ctx.keep(f"{slot}.v", repeat_kv(v, self.n_head // self.n_kv_head))
            ctx.keep(f"{slot}.out", y)
        y = y.reshape(b, 1, self.n_embd) if t == 1 else y.transpose(1, 2).reshape(b, t, self.n_embd)
        return y, w

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        # the fused projection split into q [B, T, E], k and v [B, T, kv_dim] (split_with_sizes:
        # Tensor.split is a Python wrapper around it)
        m = self._modules  # m["c_attn"] is self.c_attn without a failed lookup first (layers.py)
        q, k, v = m["c_attn"](x).split_with_sizes(self.qkv_sizes, dim=2)
        for part in self.hooks["qkv"]:
            q, k, v = as_given((q, k, v), part.adjust_qkv(x, q, k, v, ctx))
        y, w0 = self.attend(q, k, v, ctx, "r0", self.need_round0_weights)
        for part in self.hooks["rounds"]:
            y = part.add_rounds(x, y, w0, self, ctx).to(y.dtype)
        for part in self.hooks["output"]:
            y = part.adjust_output(x, y, ctx).to(y.dtype)
        y = m["c_proj"](y)
        # dropout is the identity in eval mode: not calling it saves a dispatch per decoded token
        return self.resid_dropout(y) if self.training else y
