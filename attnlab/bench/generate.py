"""`attnlab bench generate`: KV-cached against full-recompute decoding, per mechanism.

Greedy decoding from a one-token prompt with untrained weights (speed does not depend on what
the weights say). The context is widened to hold every generated token, so the cache is used
for the whole run instead of falling back to the sliding window past block_size. Cached and
uncached runs alternate (attnlab.bench.timing.interleaved); per-token latency is averaged over
repetitions and "flatness" is the mean cached latency of the last quarter of positions over
that of the first quarter (1.0 = no growth with position).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.bench.overhead import available, bench_variants, check_variants
from attnlab.bench.timing import format_table, interleaved, seeded_model
from attnlab.config import ModelConfig
from attnlab.model.generation import compile_for_decoding, stream
from attnlab.plotting import legend_outside, plain_log_ticks, pyplot, save_figure
from attnlab.reporting import STDERR

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenRow:
    """One variant's decoding rate with and without the KV cache."""

    variant: str
    tokens_per_s_cache: float
    tokens_per_s_full: float
    speedup: float  # median over repetitions of full-recompute time / cached time
    flatness: float
    same_tokens: bool  # greedy output identical with and without the cache
    latency_cache_ms: list[float]  # per position, mean over repetitions
    latency_full_ms: list[float]


def decode_timed(
    model: torch.nn.Module, tokens: int, use_cache: bool
) -> tuple[list[float], list[int]]:
    """Greedy-decode ``tokens`` tokens after token 0; returns (seconds per token, the tokens)."""
    idx = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    seconds, out = [], []
    with torch.no_grad():
        t0 = time.perf_counter()
        for nxt in stream(model, idx, tokens, temperature=0.0, use_cache=use_cache):
            out.append(int(nxt))  # reading the token back also syncs an accelerator
            t1 = time.perf_counter()
            seconds.append(t1 - t0)
            t0 = t1
    return seconds, out


def _recorder(model, tokens: int, mode: str, sink: list) -> Callable[[], None]:
    """A timed decoding run that keeps its per-token latencies and tokens in ``sink``."""
    return lambda: sink.append(decode_timed(model, tokens, mode == "cache"))


def quarter_ratio(latency: list[float]) -> float:
    q = max(1, len(latency) // 4)
    return statistics.fmean(latency[-q:]) / statistics.fmean(latency[:q])


def measure(
    base: ModelConfig,
    tokens: int,
    reps: int = 3,
    warmup: int = 1,
    device: str = "cpu",
    mechanisms: list[str] | None = None,
    compile: bool = False,
) -> tuple[list[GenRow], list[str]]:
    """Time cached and uncached decoding for vanilla and each available mechanism.

    With ``compile`` the model is compiled for decoding first (``compile_for_decoding``): its
    cached step runs compiled and the full recompute eagerly, as in ``attnlab sample --compile``.
    """
    base = base.replace(block_size=max(base.block_size, tokens + 1), dropout=0.0)
    fields = bench_variants()
    names = mechanisms or list(fields)
    check_variants(names)
    missing = [n for n in names if not available(n, base)]
    variants = {"vanilla": {}, **{n: fields[n] for n in names if n not in missing}}
    rows = []
    for name, overrides in variants.items():
        logger.info(f"bench generate: {name}", extra=STDERR)
        model = seeded_model(base.replace(**overrides)).to(device).eval()
        if compile:
            # compiled graphs are kept per code object (GPT.forward) across models, and past
            # torch's recompile limit (8) a forward silently runs eagerly: start each model afresh
            torch.compiler.reset()
            model = compile_for_decoding(model)
        runs: dict[str, list[tuple[list[float], list[int]]]] = {"cache": [], "full": []}
        timings = interleaved(
            {mode: _recorder(model, tokens, mode, runs[mode]) for mode in runs},
            "full",
            reps,
            warmup,
        )
        lat = {
            mode: [
                1000 * statistics.fmean(col)
                for col in zip(*(s for s, _ in runs[mode][warmup:]), strict=True)
            ]
            for mode in runs
        }
        rows.append(
            GenRow(
                name,
                tokens / timings["cache"].median_s,
                tokens / timings["full"].median_s,
                1 / timings["cache"].ratio,
                quarter_ratio(lat["cache"]),
                runs["cache"][-1][1] == runs["full"][-1][1],
                lat["cache"],
                lat["full"],
            )
        )
    return rows, missing


def table(rows: list[GenRow]) -> str:
    body = [
        [
            r.variant,
            f"{r.tokens_per_s_cache:,.0f}",
            f"{r.tokens_per_s_full:,.0f}",
            f"{r.speedup:.2f}x",
            f"{r.flatness:.2f}",
            "yes" if r.same_tokens else "NO",
        ]
        for r in rows
    ]
    return format_table(
        [
            "model",
            "tok/s cache",
            "tok/s recompute",
            "speed-up",
            "latency last/first q",
            "same tokens",
        ],
        body,
    )


def plot(rows: list[GenRow], out: str, title: str) -> Any:
    """Per-token latency against position: one colour per model, solid cached, dotted recompute."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5.2), layout="constrained")
    for i, r in enumerate(rows):
        pos = range(1, len(r.latency_cache_ms) + 1)
        ax.plot(pos, r.latency_cache_ms, "-", color=f"C{i}", label=f"{r.variant}, KV cache")
        ax.plot(pos, r.latency_full_ms, ":", color=f"C{i}", label=f"{r.variant}, recompute")
    ax.set(
        xlabel="generated position (tokens)",
        ylabel="latency (ms per token)",
        yscale="log",
        title=title,
    )
    plain_log_ticks(ax)
    legend_outside(fig, [ax], ncol=2)
    save_figure(fig, out)
    return fig
