"""FSDP2: a model built on the meta device and sharded per block, and the checkpoints it writes.

What FSDP users expect, and why each is done so:

- No rank ever holds the whole model on its device. Every rank builds the model on the meta
  device (no memory, no random draws), ``fully_shard``s each block and the root, and only then
  allocates its shards. The values come from rank 0, which built the model on the CPU from
  nanoGPT's init stream: broadcast shard by shard, they are bit-identical to an unsharded run
  of the same seed (an init drawn on the shards themselves would not be).
- Under bf16 the all-gathers move bf16 parameters and the gradients are reduced in float32
  (``MixedPrecisionPolicy``).
- HSDP (``hsdp=true``): a 2-D mesh that shards within a node and replicates across nodes, so
  the all-gathers of every layer stay on the node's fast links.
- Checkpoints are either gathered to rank 0 (``full_state``: one process's checkpoint, resumable
  anywhere) or, with ``sharded_checkpoints=true``, written by every rank in
  ``torch.distributed.checkpoint``'s format (``save_shards``), which reshards on load: they resume
  on any number of ranks, in one process too, and ``read_shard_weights`` turns them into one
  state_dict for export.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.fsutil import no_space_message, out_of_space
from attnlab.model import GPT
from attnlab.train.dcp_safe import SafePlanner, SafeReader


def mesh(device_type: str, world_size: int, local_world_size: int, hybrid: bool) -> DeviceMesh:
    """All ranks in one shard group, or (``hybrid``) one shard group per node, replicated."""
    if not hybrid:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    if world_size % local_world_size:
        raise AttnlabError(
            f"hsdp=true needs the same number of ranks on every node: {world_size} ranks do not "
            f"divide into nodes of {local_world_size}"
        )
    return init_device_mesh(
        device_type,
        (world_size // local_world_size, local_world_size),
        mesh_dim_names=("replicate", "shard"),
    )


def shard(
    model: torch.nn.Module,
    unreachable: list[str],
    amp_dtype: torch.dtype | None = None,
    device_mesh: DeviceMesh | None = None,
) -> torch.nn.Module:
    """fully_shard per block, then the root, leaving replicated what ``_replicated`` names."""
    kept = _replicated(model, unreachable)
    replicated = {p for name, p in model.named_parameters() if name in kept}
    bf16 = amp_dtype == torch.bfloat16
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32 if bf16 else None
    )
    for block in model.transformer.h:
        fully_shard(block, mesh=device_mesh, mp_policy=policy, ignored_params=replicated)
    fully_shard(model, mesh=device_mesh, mp_policy=policy, ignored_params=replicated)
    return model


def _replicated(model: torch.nn.Module, unreachable: list[str]) -> dict[str, Callable]:
    """The parameters FSDP leaves whole on every rank, with the gradient hook each needs:

    - a 0-dim one (the boosted scalar gate's logit) has no dim 0 to shard; its gradient is
      averaged over the ranks;
    - one no loss reaches (``unreachable``: kv-bias's last W_gm) must keep no gradient, as in one
      process. FSDP's hooks pass the block's inputs, the Context and its M included, through an
      autograd function, which hands M, and so W_gm, a zero gradient; AdamW would then decay
      weights that one process leaves alone. Its gradient is dropped again.
    """
    kept: dict[str, Callable] = {}
    for name, p in model.named_parameters():
        if name in unreachable:
            kept[name] = _drop_grad
        elif p.dim() == 0:
            kept[name] = _average_grad
    return kept


def _hook_replicated(model: torch.nn.Module, unreachable: list[str]) -> None:
    """Register ``_replicated``'s hooks (on the parameters as they are once materialised: moving
    off the meta device makes new ones)."""
    kept = _replicated(model, unreachable)
    for name, p in model.named_parameters():
        if name in kept:
            p.register_post_accumulate_grad_hook(kept[name])


def _average_grad(param: torch.Tensor) -> None:
    dist.all_reduce(param.grad, op=dist.ReduceOp.AVG)


def _drop_grad(param: torch.Tensor) -> None:
    param.grad = None


def build(
    config: ModelConfig,
    source: GPT | None,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    device_mesh: DeviceMesh | None = None,
) -> GPT:
    """The sharded model on every rank (a collective), holding rank 0's ``source`` weights.

    ``source`` is the unsharded model on rank 0's CPU (None on the other ranks): its weights are
    broadcast into the shards, and it alone is probed for the parameters no loss reaches.
    """
    rank0 = dist.get_rank() == 0
    box = [source.unreachable_parameters() if rank0 and source is not None else None]
    dist.broadcast_object_list(box, src=0)
    with torch.device("meta"):
        model = GPT(config)
    shard(model, box[0], amp_dtype, device_mesh)
    model.materialise(device)
    _hook_replicated(model, box[0])
    set_model_state_dict(
        model,
        source.state_dict() if rank0 and source is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    return model


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's own order (the ids of a plain optimizer state_dict)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def load_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """``state`` (a plain, single-process optimizer state_dict) into the sharded optimizer."""
    if not state["state"]:
        return
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


def full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    is_main: bool,
    make_model: Callable[[], torch.nn.Module],
) -> tuple[torch.nn.Module | None, dict[str, Any] | None]:
    """The model and optimizer state_dict as one process would hold them, on rank 0 (None
    elsewhere): a collective. The shards are gathered to rank 0's CPU, loaded into a plain model
    from ``make_model`` and re-keyed to optimizer ids, so the checkpoint is the same as a single
    process writes and resumes anywhere."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    if not is_main:
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


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank writes its shards of the weights and optimizer state into ``folder`` (a
    collective; under torchrun ``folder`` must be on a file system every node sees)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(folder))
    except (dcp.api.CheckpointException, OSError, RuntimeError) as e:  # every rank's own line
        causes = [f[0] for f in getattr(e, "failures", {}).values()] or [e]
        if any(out_of_space(cause, folder.parent) for cause in causes):
            raise AttnlabError(no_space_message(folder)) from None
        first = causes[0]
        reason = (str(first).strip().splitlines() or [type(first).__name__])[-1][:200]
        raise AttnlabError(
            f"could not write the shards {folder} ({reason}); the previous checkpoint is intact"
        ) from None


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Weights and optimizer state from ``save_shards``'s ``folder``, resharded to however this
    model is split: FSDP on any number of ranks, DDP, or one process."""
    # the template: the optimizer's state as torch builds it (one zero-gradient, zero-lr step
    # if it has none); a parameter no loss reached has no saved state and keeps that template's
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    _load(state, folder)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def read_shard_weights(folder: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights of ``save_shards``'s ``folder`` as one process's state_dict (for export)."""
    with torch.device("meta"):
        model = GPT(config)
    sd = model.materialise("cpu").state_dict()
    _load({"model": sd}, folder)
    return sd


def _load(state: dict[str, Any], folder: Path) -> None:
    """torch.distributed.checkpoint's load into ``state``, its errors one line. Optimizer state
    may be missing (see load_shards); a weight may not: it would keep uninitialised memory."""
    reader = SafeReader(str(folder))  # never plain pickle: see attnlab.train.dcp_safe
    saved = reader.read_metadata().state_dict_metadata  # refused, or one line naming the file
    try:
        missing = [name for name in state["model"] if f"model.{name}" not in saved]
        if missing:
            raise ValueError(f"no {missing[0]} in it ({len(missing)} weights missing)")
        with warnings.catch_warnings():  # e.g. export: one process is meant, not a mistake
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(
                state,
                storage_reader=reader,
                planner=SafePlanner(folder, allow_partial_load=True),
                no_dist=not dist.is_initialized(),
            )
    except (dcp.api.CheckpointException, RuntimeError, OSError, ValueError, EOFError) as e:
        failures = getattr(e, "failures", {}).values()  # a rank's refusal: its own line
        refused = next((f[0] for f in failures if isinstance(f[0], AttnlabError)), None)
        if refused is not None:
            raise refused from None
        reason = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
        raise AttnlabError(f"{folder}: the sharded checkpoint does not load ({reason})") from None
