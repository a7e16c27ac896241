"""Interleaved A/B timing shared by the benchmarks (and by studies that time variants).

Machines drift (thermal throttling, other processes, turbo states), so timing variant A for a
minute and then variant B for a minute compares the machine as much as the variants. Here every
repetition runs each variant once, in a rotating order, and the result is the median over
repetitions of the per-repetition ratio to the baseline: drift that is slow compared with one
repetition cancels in each ratio.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.config import ModelConfig
from attnlab.device import synchronize
from attnlab.errors import ConfigError
from attnlab.model import GPT


@dataclass(frozen=True)
class Timing:
    """Seconds per repetition of one variant, and its per-repetition ratios to the baseline."""

    name: str
    seconds: list[float]
    ratios: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def ratio(self) -> float:
        """Median of the per-repetition ratios to the baseline (1.0 for the baseline itself)."""
        return statistics.median(self.ratios)

    @property
    def ratio_iqr(self) -> tuple[float, float]:
        """25th and 75th percentile of the ratios: how much to trust ``ratio``."""
        if len(self.ratios) < 2:
            return self.ratio, self.ratio
        q = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return q[0], q[2]


def relative(a: Timing, b: Timing) -> Timing:
    """a's per-repetition ratios to b (both from the same interleaved run)."""
    return Timing(a.name, a.seconds, [x / y for x, y in zip(a.seconds, b.seconds, strict=True)])


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """Wait for queued kernels before reading the clock (a no-op on CPU)."""
    device = torch.device(device)
    return lambda: synchronize(device)


def interleaved(
    variants: dict[str, Callable[[], Any]],
    baseline: str,
    reps: int,
    warmup: int = 1,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, Timing]:
    """Time each callable ``reps`` times, alternating variants within each repetition.

    The order rotates by one each repetition so that no variant always runs first (right after
    the previous repetition's last variant has warmed or evicted the caches).
    """
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {list(variants)}")
    if reps < 1:
        raise ConfigError(f"--reps {reps} must be >= 1")
    names = list(variants)
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    sync()
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            t0 = time.perf_counter()
            variants[name]()
            sync()
            seconds[name].append(time.perf_counter() - t0)
    base = seconds[baseline]
    return {
        n: Timing(n, s, [a / b for a, b in zip(s, base, strict=True)]) for n, s in seconds.items()
    }


def seeded_model(config: ModelConfig, seed: int = 0) -> GPT:
    """``GPT(config)`` initialised from ``seed``, the caller's global random stream left as it
    was (a benchmark inside a study or a notebook must not reseed it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(config)


def train_step(
    config: ModelConfig,
    batch_size: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    compile: bool = False,
    amp_dtype: torch.dtype | None = None,
) -> tuple[Callable[[], None], torch.nn.Module]:
    """A closure doing one forward + backward + AdamW step of ``GPT(config)`` on a fixed random batch.

    Returns (step, model). The loss is never read back, so no step forces a host sync. With
    ``compile`` the forward runs under ``torch.compile`` (compiled on the first step, i.e. warm-up);
    with ``amp_dtype`` under autocast, as the trainer runs it.
    """
    model = seeded_model(config, seed).to(device)
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.99), torch.device(device).type)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(config.vocab_size, (batch_size, config.block_size), generator=gen).to(device)
    y = torch.randint(config.vocab_size, (batch_size, config.block_size), generator=gen).to(device)

    forward = torch.compile(model) if compile else model
    kind = torch.device(device).type

    def step() -> None:
        with torch.autocast(kind, amp_dtype) if amp_dtype else contextlib.nullcontext():
            _, loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model


def allow_compiled_models(n: int) -> None:
    """Let ``n`` compiled models share a process without hitting torch's recompile limit.

    Dynamo keeps compiled graphs per code object (``GPT.forward``) for every model instance, and
    past its limit (8) a call silently falls back to eager, which would time half a benchmark eager.
    """
    import torch._dynamo.config as dynamo_config  # slow to import: only when compiling

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), 2 * n))


def matmul_peak_flops(
    n: int = 2048,
    reps: int = 5,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> float:
    """This machine's matmul rate in FLOP/s (float32, or ``dtype``): the best of ``reps``
    n x n x n products."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = synchronizer(device)
    a @ b  # warm-up (thread pool start, allocator)
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned first column, right-aligned numbers, two spaces between columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)
