"""torchrun integration: one process per device, DDP by default, FSDP2 when asked.

Launched by ``torchrun`` the usual environment variables (RANK, WORLD_SIZE, LOCAL_RANK) are set;
without them everything here is a no-op and training runs in a single process.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device_type: str) -> DistEnv:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistEnv()
    env = DistEnv(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        torch.cuda.set_device(env.local_rank)
    return env


def teardown(env: DistEnv) -> None:
    if env.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, env: DistEnv, device: torch.device, fsdp: bool) -> torch.nn.Module:
    """DDP (or FSDP2 sharding each block) around the model; the bare model when not distributed."""
    if not env.enabled:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def sync_context(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce on all but the last micro-step of an accumulation."""
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG)
    return value
