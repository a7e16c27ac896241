"""torchrun integration: one process per device, DDP by default, FSDP2 when asked.

Launched by ``torchrun`` the usual environment variables (RANK, WORLD_SIZE, LOCAL_RANK) are set;
without them everything here is a no-op and training runs in a single process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from attnlab.errors import AttnlabError

# what torchrun sets for every rank, and init_process_group's env:// rendezvous reads
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


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


def launched_as_main() -> bool:
    """Whether this process is rank 0 (or the only one), before it joins the process group."""
    return (os.environ.get("RANK") or "0") == "0"


def setup(device_type: str) -> DistEnv:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA)."""
    launch = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    try:
        world_size = int(launch["WORLD_SIZE"] or "1")
        rank = int(launch["RANK"] or "0")
        local_rank = int(os.environ.get("LOCAL_RANK") or "0")
    except ValueError:
        shown = ", ".join(f"{k}={v}" for k, v in launch.items() if v is not None)
        raise AttnlabError(f"torchrun's variables must be integers ({shown})") from None
    if world_size == 1:
        return DistEnv()
    missing = [name for name, value in launch.items() if value is None]
    if missing:  # a WORLD_SIZE left in the shell (a cluster job's): KeyError, or a silent wait
        names = (
            f"{', '.join(missing[:-1])} and {missing[-1]} are"
            if missing[1:]
            else f"{missing[0]} is"
        )
        raise AttnlabError(
            f"WORLD_SIZE={world_size} is set but {names} not: start one process per rank with "
            "torchrun (see README), or unset WORLD_SIZE to train in one process"
        )
    env = DistEnv(rank, world_size, local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        torch.cuda.set_device(env.local_rank)
    return env


def teardown(env: DistEnv) -> None:
    if env.enabled and dist.is_initialized():
        # wait for every rank (rank 0 may still be writing summary.json): a rank tearing gloo
        # down while a peer is still connected can abort ("terminate called without an active
        # exception", SIGABRT) and fail the whole torchrun
        dist.barrier()
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


def max_over_ranks(values: list[float], env: DistEnv, device: torch.device) -> list[float]:
    """Each value's maximum over the ranks, on every rank: for decisions all ranks must take at
    the same step (one rank stopping alone leaves the others waiting in a collective)."""
    if not env.enabled:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def rank_stream_seed(seed: int, rank: int, start_iter: int) -> int:
    """The seed of rank ``rank``'s dropout stream from iteration ``start_iter`` on: distinct for
    every (seed, rank, start), where ``seed + rank`` would give seed 1's rank 0 the masks of
    seed 0's rank 1 and correlate the runs of a multi-seed study."""
    return int(np.random.SeedSequence([seed, rank, start_iter]).generate_state(1)[0])


def from_rank0(value: Any, env: DistEnv) -> Any:
    """Rank 0's ``value`` on every rank (``value`` itself in one process)."""
    if not env.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(value: Any, env: DistEnv) -> list[Any] | None:
    """Every rank's ``value``, in rank order, on every rank (None in one process)."""
    if not env.enabled:
        return None
    values: list[Any] = [None] * env.world_size
    dist.all_gather_object(values, value)
    return values


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's own order (the ids of a plain optimizer state_dict)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def rebuild_optimizer(
    model: torch.nn.Module, make: Callable[[], torch.optim.Optimizer], state: dict[str, Any]
) -> torch.optim.Optimizer:
    """After fully_shard swapped every parameter: a new optimizer over the sharded ones, with
    ``state`` (a plain, single-process optimizer state_dict, possibly empty) loaded into it."""
    optimizer = make()
    if state["state"]:
        names = _param_names(model, optimizer)
        by_name = {
            "state": {names[i]: s for i, s in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            model, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
        )
    return optimizer


def full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    env: DistEnv,
    fsdp: bool,
    make_model: Callable[[], torch.nn.Module],
) -> tuple[torch.nn.Module | None, dict[str, Any] | None]:
    """The model and optimizer state_dict as one process would hold them, on rank 0 (None elsewhere).

    Under FSDP this is a collective (every rank must call it): the shards are gathered to rank 0's
    CPU, loaded into a plain model from ``make_model`` and re-keyed to optimizer ids, so the
    checkpoint is the same as a single process writes and resumes anywhere.
    """
    if not (fsdp and env.enabled):
        return (model, optimizer.state_dict()) if env.is_main else (None, None)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    if not env.is_main:
        return None, None
    plain = make_model()
    plain.load_state_dict(model_sd)
    ids = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    groups, start = [], 0
    for group in optimizer.param_groups:
        groups.append(
            {
                **{k: v for k, v in group.items() if k != "params"},
                "params": list(range(start, start + len(group["params"]))),
            }
        )
        start += len(group["params"])
    return plain, {
        "state": {ids[n]: s for n, s in optim_sd["state"].items()},
        "param_groups": groups,
    }
