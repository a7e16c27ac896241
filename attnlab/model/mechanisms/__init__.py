"""Attention signals: one module per mechanism, plugged into the backbone at named hooks.

A mechanism module defines ``parts(config) -> list[Part]``; each Part is a small nn.Module that
lives either in the attention (``where="attn"``) or in the block (``where="block"``) under a fixed
attribute name (which fixes its state_dict key), and implements one or more hooks:

=========  ==================================================  ===============================
hook       signature                                           used by
=========  ==================================================  ===============================
qkv        adjust_qkv(x, q, k, v, ctx) -> (q, k, v)            K/V-bias, value gate
core       core(q, k, v, ctx, slot, dropout_p, need_weights)   Twicing (replaces softmax(QK)V)
           -> (y [B,H,T,D], weights | None)
rounds     add_rounds(x, F, w0, attn, ctx) -> F                gradient-boosted rounds
output     adjust_output(y, ctx) -> y   (before c_proj)         K/V-bias ablation "output_mul"
state      update_state(h, ctx) -> None (h = the MLP input)    purpose-state GRU gate
mlp_input  adjust_mlp_input(h, ctx) -> h                       K/V-bias ablation "mlp_input"
=========  ==================================================  ===============================

A part may also define ``init_weights()`` (called after the nanoGPT init) and expose
``needs_weights = True`` (a rounds part that needs round-0 attention weights).
Adding a mechanism = one module here, one line in ``REGISTRY``, its config flag, one test file.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

HOOKS = ("qkv", "core", "rounds", "output", "state", "mlp_input")

# module names under attnlab.model.mechanisms, in the order their hooks run
REGISTRY = ("purpose_state", "value_gate", "twicing", "boosted")


@dataclass(frozen=True)
class Part:
    where: str  # "attn" or "block"
    name: str  # attribute name on the owner, hence the state_dict key
    hooks: tuple[str, ...]
    build: Callable[[], nn.Module]


def parts_for(config, where: str) -> list[Part]:
    """Every enabled part of every registered mechanism that lives in ``where``."""
    found = []
    for name in REGISTRY:
        module = importlib.import_module(f"{__name__}.{name}")
        found += [p for p in module.parts(config) if p.where == where]
    return found


def attach(owner: nn.Module, config, where: str) -> dict[str, list[nn.Module]]:
    """Create the parts that live in ``owner`` and return them grouped by hook."""
    hooks: dict[str, list[nn.Module]] = defaultdict(list)
    for part in parts_for(config, where):
        module = part.build()
        setattr(owner, part.name, module)
        for hook in part.hooks:
            if hook not in HOOKS:
                raise ValueError(
                    f"part {part.name!r} names unknown hook {hook!r}; hooks are {HOOKS}"
                )
            hooks[hook].append(module)
    if len(hooks["core"]) > 1:
        raise ValueError("only one mechanism may replace the attention core")
    # a plain dict with every hook: a defaultdict would grow on first read, and torch.compile
    # guards on its length, so the first forward after compiling would recompile
    return {hook: hooks[hook] for hook in HOOKS}
