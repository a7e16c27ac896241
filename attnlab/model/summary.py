"""What a model is made of, without training it: its parameters by component, and a model of
the right shapes built without initialising its weights (``attnlab info`` on a 7B preset)."""

from __future__ import annotations

import re

import torch
from torch.overrides import TorchFunctionMode

from attnlab.config import ModelConfig
from attnlab.model.gpt import GPT
from attnlab.model.mechanisms import parts_for

COMPONENTS = ("embeddings", "attention", "ffn", "norms", "mechanisms")
_BLOCK_PARAM = re.compile(r"^transformer\.h\.\d+\.(?:(attn)\.)?([^.]+)\.")


def parameter_counts(model: GPT) -> dict[str, int]:
    """Parameters per component (shared tensors once), mechanism parts by name, and the total.

    attention = c_attn + c_proj + the mechanism parts that live in the attention (e.g. the value
    gate ``attn.W_E``, also listed alone); mechanisms = parts that live in the block.
    """
    attn_parts = {p.name for p in parts_for(model.config, "attn")}
    block_parts = {p.name for p in parts_for(model.config, "block")}
    counts = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        match = _BLOCK_PARAM.match(name)
        inner = match.group(2) if match else ""
        if match and match.group(1):
            counts["attention"] += p.numel()
            if inner in attn_parts:
                counts[f"attn.{inner}"] = counts.get(f"attn.{inner}", 0) + p.numel()
        elif inner in block_parts:
            counts["mechanisms"] += p.numel()
            counts[f"block.{inner}"] = counts.get(f"block.{inner}", 0) + p.numel()
        elif inner.startswith("mlp"):
            counts["ffn"] += p.numel()
        elif inner.startswith("ln_") or name.startswith("transformer.ln_f."):
            counts["norms"] += p.numel()
        elif name.startswith(("transformer.wte.", "transformer.wpe.", "lm_head.")):
            counts["embeddings"] += p.numel()
        else:
            raise ValueError(f"parameter {name} belongs to no known component")
    counts["total"] = sum(counts[c] for c in COMPONENTS)
    return counts


def shapes_only(config: ModelConfig) -> GPT:
    """The GPT of ``config`` with its initialisation skipped: right shapes, values never written.

    Not the meta device: meta kernels of normal_, arange and friends import torch._dynamo, which
    costs seconds. Uninitialised CPU storage is as cheap (the pages are never touched).
    """

    class SkipInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            kwargs = kwargs or {}
            if getattr(func, "__module__", None) == "torch.nn.init" or func in (
                torch.Tensor.normal_,
                torch.Tensor.uniform_,
            ):
                return args[0] if args else kwargs["tensor"]
            return func(*args, **kwargs)

    with SkipInit():
        return GPT(config)
