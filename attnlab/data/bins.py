"""Batch drawing from token files (written and memory-mapped by attnlab.data.token_files).

Batches come from a sampler with its own ``torch.Generator`` on the CPU, never the global RNG:
the same seed gives the same batches whatever model, device or initialisation consumes them,
so variants of an experiment train on identical data streams.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from attnlab.errors import AttnlabError


def _to_device(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "cuda":  # pinned host memory lets the copy overlap with compute
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _windows(
    tokens: np.ndarray, offsets: np.ndarray, block_size: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y windows of ``block_size`` tokens starting at ``offsets`` (y shifted by one)."""
    rows = torch.from_numpy(tokens[offsets[:, None] + np.arange(block_size + 1)].astype(np.int64))
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    return _to_device(x, device), _to_device(y, device)


class SeededSampler:
    """What makes a training sampler reproducible and rank-splittable.

    It has its OWN torch.Generator (same seed -> same batches whatever the model), and
    ``batch_size`` is the global batch: every rank draws the same ``batch_size`` indices and keeps
    its slice of ``batch_size // world_size`` rows, so N ranks together see exactly the batches
    of a single process. ``state_dict`` resumes the identical stream. Subclasses draw with
    ``_draw`` and name in ``_identity`` what must match for a saved state to apply.
    """

    def __init__(
        self, batch_size: int, seed: int, rank: int, world_size: int, device: str | torch.device
    ) -> None:
        if not 0 <= rank < world_size:
            raise AttnlabError(f"rank {rank} is outside world size {world_size}")
        if batch_size % world_size:
            raise AttnlabError(
                f"batch size {batch_size} is not divisible by world size {world_size}"
            )
        self.batch_size, self.device = batch_size, device
        per_rank = batch_size // world_size
        self._rows = slice(rank * per_rank, (rank + 1) * per_rank)
        self.generator = torch.Generator().manual_seed(seed)
        self.batches_drawn = 0

    def _draw(self, high: int) -> torch.Tensor:
        """This rank's rows of the global batch's random indices in [0, high)."""
        picks = torch.randint(high, (self.batch_size,), generator=self.generator)
        self.batches_drawn += 1
        return picks[self._rows]

    def _identity(self) -> dict[str, int]:
        return {"batch_size": self.batch_size}

    def state_dict(self) -> dict:
        """Everything needed to continue the identical stream after a restart."""
        return {
            "generator": self.generator.get_state(),
            "batches_drawn": self.batches_drawn,
            **self._identity(),
        }

    def load_state_dict(self, state: dict) -> None:
        for key, mine in self._identity().items():
            if state.get(key) != mine:
                raise AttnlabError(
                    f"sampler state has {key} {state.get(key)}, this run uses {mine}"
                )
        self.generator.set_state(state["generator"])
        self.batches_drawn = state["batches_drawn"]


class BatchSampler(SeededSampler):
    """Random (x, y) windows of the token stream (see SeededSampler for seeding and ranks)."""

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        if block_size < 1 or batch_size < 1:
            raise AttnlabError(
                f"block_size and batch_size must be >= 1, got {block_size}, {batch_size}"
            )
        if len(tokens) < block_size + 1:
            raise AttnlabError(
                f"{len(tokens)} tokens are too few for block size {block_size} (need {block_size + 1})"
            )
        super().__init__(batch_size, seed, rank, world_size, device)
        self.tokens, self.block_size = tokens, block_size

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) pair, int64 of shape [batch_size // world_size, block_size]."""
        offsets = self._draw(len(self.tokens) - self.block_size)
        return _windows(self.tokens, offsets.numpy(), self.block_size, self.device)

    def _identity(self) -> dict[str, int]:
        return {**super()._identity(), "block_size": self.block_size}


def fixed_batches(
    tokens: np.ndarray,
    block_size: int,
    batch_size: int,
    n_batches: int,
    seed: int,
    device: str | torch.device = "cpu",
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Validation batches drawn once from their own generator: identical at every evaluation."""
    sampler = BatchSampler(tokens, block_size, batch_size, seed, device=device)
    return [sampler.next_batch() for _ in range(n_batches)]


def sequential_windows(
    tokens: np.ndarray, block_size: int, batch_size: int, device: str | torch.device = "cpu"
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive windows over the whole split: every token after the first is a target once.

    All batches are [rows, block_size] with rows <= batch_size (the last batch may have fewer);
    the final window is padded with input 0 and target -1 (``ignore_index``). Padding sits
    after the real tokens, so under causal attention it cannot change their predictions.
    """
    if block_size < 1 or batch_size < 1:
        raise AttnlabError(
            f"block_size and batch_size must be >= 1, got {block_size}, {batch_size}"
        )
    if len(tokens) < 2:
        raise AttnlabError(f"{len(tokens)} token(s): nothing to predict")
    n_windows = -(-(len(tokens) - 1) // block_size)

    # An inner generator so the checks above run at the call, not at the first next().
    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for first in range(0, n_windows, batch_size):
            rows = min(batch_size, n_windows - first)
            start = first * block_size
            chunk = np.full(rows * block_size + 1, -1, dtype=np.int64)
            data = tokens[start : start + len(chunk)]
            chunk[: len(data)] = data
            x = torch.from_numpy(chunk[:-1].clip(min=0).reshape(rows, block_size))
            y = torch.from_numpy(chunk[1:].reshape(rows, block_size))
            yield _to_device(x, device), _to_device(y, device)

    return batches()
