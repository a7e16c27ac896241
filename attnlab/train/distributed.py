"""torchrun integration: one process per device, DDP by default, FSDP2 when asked.

Launched by ``torchrun`` the usual environment variables (RANK, WORLD_SIZE, LOCAL_RANK) are set;
without them everything here is a no-op and training runs in a single process.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from attnlab.errors import AttnlabError

# what torchrun sets for every rank, and init_process_group's env:// rendezvous reads
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
# what torchrun sets for its workers alone: a WORLD_SIZE without it was left from another job
ELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
# seconds the ranks wait for each other at the start (torchrun starts them together)
JOIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class DistEnv:
    """This process's place among the ranks, as torchrun's environment variables give it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # the ranks on this host (they share its RAM)

    @property
    def enabled(self) -> bool:
        """More than one rank: a process group is needed."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_as_main() -> bool:
    """Whether this process is rank 0 (or the only one), before it joins the process group."""
    return (os.environ.get("RANK") or "0") == "0"


def setup(device_type: str, timeout_s: float = 600.0) -> DistEnv:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA); a collective that
    waits longer than ``timeout_s`` for a peer fails (see ``lost_peer``)."""
    launch = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    try:
        world_size = int(launch["WORLD_SIZE"] or "1")
        rank = int(launch["RANK"] or "0")
        local_rank = int(os.environ.get("LOCAL_RANK") or "0")
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE") or "1")
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
    if ELASTIC_RUN_ID not in os.environ:  # left in the shell: the peers would never come
        shown = ", ".join(f"{k}={v}" for k, v in launch.items())
        raise AttnlabError(
            f"{shown} are set, but this process was not started by torchrun (no "
            f"{ELASTIC_RUN_ID}): start every rank with torchrun (see README), or unset "
            f"{', '.join(LAUNCH_VARIABLES[:-1])} and {LAUNCH_VARIABLES[-1]} to train in one process"
        )
    env = DistEnv(rank, world_size, local_rank, local_world_size)
    if not dist.is_initialized():
        _join(env, launch, "nccl" if device_type == "cuda" else "gloo", timeout_s)
    if device_type == "cuda":
        torch.cuda.set_device(env.local_rank)
    return env


def _join(env: DistEnv, launch: dict[str, str | None], backend: str, timeout_s: float) -> None:
    """init_process_group, its rendezvous bounded by JOIN_TIMEOUT_S: a WORLD_SIZE, RANK and
    MASTER_* left in the shell made rank 0 wait for ranks that never came, silently, for torch's
    30 minutes. Collectives are bounded by ``timeout_s`` (train's dist_timeout)."""
    try:
        store, _, _ = next(
            dist.rendezvous(
                "env://", env.rank, env.world_size, timeout=timedelta(seconds=JOIN_TIMEOUT_S)
            )
        )
    except dist.DistError as e:  # DistStoreError (rank 0), DistNetworkError (the others)
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise AttnlabError(
            f"waited {JOIN_TIMEOUT_S} s for the {env.world_size} ranks of WORLD_SIZE="
            f"{env.world_size} to meet at MASTER_ADDR:MASTER_PORT {launch['MASTER_ADDR']}:"
            f"{launch['MASTER_PORT']} ({reason}); start every rank with torchrun (see README), "
            "or unset WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT to train in one process"
        ) from None
    try:
        dist.init_process_group(
            backend,
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except (dist.DistError, RuntimeError) as e:  # the message carries the backend's reason
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        raise AttnlabError(
            f"rank {env.rank}: the {env.world_size} ranks met, but the process group did not "
            f"form within dist_timeout={timeout_s:g} s (a rank hung, exited or was unreachable: "
            f"{reason}); nothing was trained: start the run again"
        ) from None


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective that failed for want of a peer: timed out (a hung or
    stopped rank) or cut off (a rank or machine gone), as gloo and NCCL raise it."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        mark in text
        for mark in (
            "Timed out",
            "timed out",
            "Connection closed by peer",
            "Connection reset by peer",
        )
    )


def teardown(env: DistEnv, goodbye: bool = True) -> None:
    """Leave the process group; ``goodbye``: after a barrier (False once a peer is lost)."""
    if env.enabled and dist.is_initialized() and goodbye:
        # wait for every rank (rank 0 may still be writing summary.json): a rank tearing gloo
        # down while a peer is still connected can abort ("terminate called without an active
        # exception", SIGABRT) and fail the whole torchrun
        dist.barrier()
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, env: DistEnv, device: torch.device) -> torch.nn.Module:
    """DDP around the model; the bare model when not distributed (FSDP: see fsdp.build)."""
    if not env.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    # parameters the reference architecture keeps but no loss reaches (kv-bias's last W_gm, every
    # W_gm when M is detached): DDP would wait for their gradients ("Expected to have finished
    # reduction in the prior iteration"). They never change, so every rank keeps its identical
    # init; find_unused_parameters would instead walk the autograd graph at every step.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, model.unreachable_parameters()
    )
    return DistributedDataParallel(model, device_ids=ids)


def sync_context(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip DDP's gradient all-reduce on all but the last micro-step of an accumulation."""
    if sync or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def barrier(env: DistEnv) -> None:
    """Every rank waits here for the others (nothing in one process)."""
    if env.enabled:
        dist.barrier()


def all_reduce(value: torch.Tensor, env: DistEnv, op: str = "avg") -> torch.Tensor:
    """``value`` averaged (``op="avg"``) or summed (``"sum"``) over the ranks, on every rank."""
    if env.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM)
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
