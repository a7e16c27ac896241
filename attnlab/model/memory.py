"""Will a model fit? A lower bound on its memory, from the config alone, before allocating.

A typo such as ``n_layer=1000000000`` would otherwise hang for minutes building modules or die
in the allocator. ``check_fits`` estimates parameters (the backbone's matrices; mechanisms
only add to it) and, for training, gradients, AdamW's two moments and the activations kept for
the backward pass, and refuses a model whose lower bound exceeds the device's total memory.
Being a lower bound, it never refuses a model that would fit.
"""

from __future__ import annotations

import os

import torch

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError

FLOAT_BYTES = 4  # parameters and optimizer state are kept in float32


def parameter_count(config: ModelConfig) -> int:
    """Parameters of the backbone (embeddings, attention, FFN), excluding norms and mechanisms."""
    e, kv, ffn = config.n_embd, config.kv_dim, config.d_ffn or 4 * config.n_embd
    embeddings = config.vocab_size * e * (1 if config.tie_embeddings else 2)
    if config.pos == "learned":
        embeddings += config.block_size * e
    attention = e * (e + 2 * kv) + e * e
    per_ffn = (3 if config.mlp == "swiglu" else 2) * e * ffn
    return embeddings + config.n_layer * (attention + config.ffn_sublayers * per_ffn)


def memory_needed(config: ModelConfig, batch_size: int | None = None, shards: int = 1) -> int:
    """Bytes at least: weights alone (``batch_size`` None), or a training step of that batch.

    Training keeps weights, gradients and two AdamW moments, plus per layer and position at
    least the block's input, the attention output and the FFN hidden state, and the logits with
    their gradient. ``shards``: FSDP's world size, over which those four states are split.
    """
    params = parameter_count(config)
    if batch_size is None:
        return params * FLOAT_BYTES
    params = -(-params // shards)
    positions = batch_size * config.block_size
    e, ffn = config.n_embd, config.d_ffn or 4 * config.n_embd
    activations = positions * (config.n_layer * (2 * e + ffn) + 2 * config.vocab_size)
    return (4 * params + activations) * FLOAT_BYTES


def device_memory(device: torch.device) -> int | None:
    """Total memory of ``device`` in bytes (RAM for cpu and mps), None where unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # e.g. Windows
        return None


def gib(n: int) -> str:
    """``n`` bytes in GiB, for messages: ``1,024.0 GiB``."""
    return f"{n / 2**30:,.1f} GiB"


def check_fits(
    config: ModelConfig,
    device: torch.device | str = "cpu",
    batch_size: int | None = None,
    what: str = "the model",
    ranks: int = 1,
    shards: int = 1,
    sharing: int = 1,
) -> None:
    """Raise (naming the memory needed) if ``config`` cannot fit on ``device``.

    Under torchrun ``batch_size`` is the global batch: each of the ``ranks`` processes runs its
    share, and under FSDP holds a 1/``shards`` share of the weights and optimizer state (shards:
    the world size, or the ranks of one node under HSDP). ``sharing``: the processes that share
    this device's memory (the ranks of one host, for the CPU's RAM).
    """
    device = torch.device(device)
    have = device_memory(device)
    per_rank = -(-batch_size // ranks) if batch_size is not None else None
    need = sharing * memory_needed(config, per_rank, shards)
    if have is None or need <= have:
        return
    task = f"to train with batch_size={batch_size}" if batch_size is not None else "for the weights"
    if ranks > 1 and batch_size is not None:
        split = f", weights sharded {shards} ways" if shards > 1 else ""
        task += f" ({per_rank} rows on each of {ranks} ranks{split})"
    # "more than": parameter_count leaves out the norms (and mechanisms), which every model has
    raise AttnlabError(
        f"{what} cannot fit: more than {parameter_count(config):,} parameters need at least "
        f"{gib(need)} {task}, and {device.type} has {gib(have)}; make it smaller (n_layer, "
        f"n_embd, block_size, vocab_size{', batch_size' if batch_size is not None else ''})"
    )
