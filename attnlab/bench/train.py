"""`attnlab bench train`: training throughput, MFU, and our step against a plain-PyTorch reference.

MFU is measured against this machine's own fp32 matmul rate, timed in the same run, so it says
how much of the reachable compute the training step uses (not a datasheet number). The
reference is nanoGPT's forward written out in a few functional torch calls on the SAME weights
(no module tree, no hooks, no mechanism plumbing): if our step is slower than it, the
overhead is ours.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlab.bench.timing import (
    format_table,
    interleaved,
    matmul_peak_flops,
    synchronizer,
    train_step,
)
from attnlab.config import ModelConfig
from attnlab.model import mechanisms
from attnlab.presets import get_preset
from attnlab.reporting import STDERR

logger = logging.getLogger(__name__)

CHAR_VOCAB = 65  # tiny-shakespeare's character set, for presets that take vocab_size from the data
# the component fields of a plain nanoGPT model (every mechanism off comes from the registry)
NANOGPT_COMPONENTS: dict[str, object] = dict(
    norm="layernorm",
    norm_placement="pre",
    pos="learned",
    mlp="gelu",
    ffn_sublayers=1,
    tie_embeddings=True,
)


def bench_config(preset: str) -> tuple[ModelConfig, int]:
    """(model config, batch size) of a preset, with dropout off (timing, not training)."""
    p = get_preset(preset)
    cfg = ModelConfig.from_dict({"vocab_size": CHAR_VOCAB, **p.model, "dropout": 0.0})
    return cfg, int(p.train.get("batch_size", 32))


def is_nanogpt_shaped(cfg: ModelConfig) -> bool:
    """True when the config is plain nanoGPT, the only model the reference implements."""
    plain = {**NANOGPT_COMPONENTS, **mechanisms.plain_fields()}
    return all(getattr(cfg, k) == v for k, v in plain.items()) and cfg.n_kv_head == cfg.n_head


def reference_loss(
    p: dict[str, torch.Tensor], cfg: ModelConfig, idx: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """nanoGPT's forward and loss as functional calls on a name -> tensor dict of GPT's parameters."""
    b, t = idx.shape
    e, nh, eps = cfg.n_embd, cfg.n_head, float(cfg.norm_eps or 1e-5)
    x = F.embedding(idx, p["transformer.wte.weight"]) + F.embedding(
        torch.arange(t, device=idx.device), p["transformer.wpe.weight"]
    )
    for i in range(cfg.n_layer):
        w = lambda name, i=i: p.get(f"transformer.h.{i}.{name}")  # noqa: E731 (None for absent biases)
        h = F.layer_norm(x, (e,), w("ln_1.weight"), w("ln_1.bias"), eps)
        q, k, v = F.linear(h, w("attn.c_attn.weight"), w("attn.c_attn.bias")).split(e, dim=2)
        q, k, v = (z.view(b, t, nh, e // nh).transpose(1, 2) for z in (q, k, v))
        y = (
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            .transpose(1, 2)
            .contiguous()
            .view(b, t, e)
        )
        x = x + F.linear(y, w("attn.c_proj.weight"), w("attn.c_proj.bias"))
        h = F.layer_norm(x, (e,), w("ln_2.weight"), w("ln_2.bias"), eps)
        x = x + F.linear(
            F.gelu(F.linear(h, w("mlp.c_fc.weight"), w("mlp.c_fc.bias"))),
            w("mlp.c_proj.weight"),
            w("mlp.c_proj.bias"),
        )
    x = F.layer_norm(x, (e,), p["transformer.ln_f.weight"], p.get("transformer.ln_f.bias"), eps)
    logits = F.linear(x, p["transformer.wte.weight"])
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def reference_step(
    model: torch.nn.Module, batch_size: int, device: str = "cpu", seed: int = 0
) -> Callable[[], None]:
    """A training step of the reference on a copy of ``model``'s weights and train_step's batch."""
    cfg = model.config
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    groups = [
        {"params": [v for v in params.values() if v.dim() >= 2], "weight_decay": 0.1},
        {"params": [v for v in params.values() if v.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.99))
    gen = torch.Generator().manual_seed(seed)  # the same draws as timing.train_step
    x = torch.randint(cfg.vocab_size, (batch_size, cfg.block_size), generator=gen).to(device)
    y = torch.randint(cfg.vocab_size, (batch_size, cfg.block_size), generator=gen).to(device)

    def step() -> None:
        reference_loss(params, cfg, x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(
    cfg: ModelConfig,
    batch: int,
    steps: int,
    warmup: int = 2,
    device: str = "cpu",
    peak_n: int = 2048,
) -> dict[str, object]:
    """Peak matmul rate, then our step and (for nanoGPT-shaped configs) the reference, interleaved."""
    peak = matmul_peak_flops(peak_n, device=device)
    ours, model = train_step(cfg, batch, device)
    variants = {"attnlab GPT": ours}
    if is_nanogpt_shaped(cfg):
        variants["plain reference"] = reference_step(model, batch, device)
    logger.info(f"bench train: {len(variants)} variants x {steps} steps", extra=STDERR)
    timings = interleaved(variants, "attnlab GPT", steps, warmup, synchronizer(device))
    tokens = batch * cfg.block_size
    flops_per_token = model.flops_per_token()
    return {
        "peak_flops": peak,
        "flops_per_token": flops_per_token,
        "tokens_per_step": tokens,
        "params": model.get_num_params(non_embedding=False),
        "timings": timings,
    }


def table(result: dict) -> str:
    rows = []
    for name, t in result["timings"].items():
        tok_s = result["tokens_per_step"] / t.median_s
        mfu = tok_s * result["flops_per_token"] / result["peak_flops"]
        speed = 1 / t.ratio  # relative to our GPT: > 1 means faster than ours
        rows.append(
            [name, f"{1000 * t.median_s:.1f}", f"{tok_s:,.0f}", f"{100 * mfu:.1f}%", f"{speed:.3f}"]
        )
    return format_table(["model", "ms/iter", "tokens/s", "MFU", "speed vs ours"], rows)
