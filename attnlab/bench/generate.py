"""`attnlab bench generate`: KV-cached against full-recompute decoding, per mechanism.

Greedy decoding from a one-token prompt with untrained weights (speed does not depend on what
the weights say). The context is widened to hold every generated token, so the cache is used
for the whole run instead of falling back to the sliding window past block_size. Cached and
uncached runs alternate (attnlab.bench._timing.interleaved); per-token latency is averaged over
repetitions and "flatness" is the mean cached latency of the last quarter of positions over
that of the first quarter (1.0 = no growth with position).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnlab.bench._timing import figure_path, out_help

QUICK = dict(n_layer=1, n_embd=16, n_head=4, tokens=12, reps=1)


@dataclass(frozen=True)
class GenRow:
    variant: str
    tokens_per_s_cache: float
    tokens_per_s_full: float
    speedup: float  # median over repetitions of full-recompute time / cached time
    flatness: float
    same_tokens: bool  # greedy output identical with and without the cache
    latency_cache_ms: list[float]  # per position, mean over repetitions
    latency_full_ms: list[float]


def decode_timed(model, tokens: int, use_cache: bool) -> tuple[list[float], list[int]]:
    """Greedy-decode ``tokens`` tokens after token 0; returns (seconds per token, the tokens)."""
    import torch

    from attnlab.model.generation import stream

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
    base,
    tokens: int,
    reps: int = 3,
    warmup: int = 1,
    device: str = "cpu",
    mechanisms: list[str] | None = None,
    compile: bool = False,
) -> tuple[list[GenRow], list[str]]:
    """Time cached and uncached decoding for vanilla and each available mechanism.

    With ``compile`` both modes run the same ``torch.compile``d model (compiled before timing).
    """
    import torch

    from attnlab.bench._timing import interleaved
    from attnlab.bench.overhead import available, bench_variants
    from attnlab.model import GPT
    from attnlab.model.generation import compile_for_decoding

    base = base.replace(block_size=max(base.block_size, tokens + 1), dropout=0.0)
    fields = bench_variants()
    names = mechanisms or list(fields)
    missing = [n for n in names if not available(n, base)]
    variants = {"vanilla": {}, **{n: fields[n] for n in names if n not in missing}}
    rows = []
    for name, overrides in variants.items():
        print(f"bench generate: {name}", file=sys.stderr)
        torch.manual_seed(0)
        model = GPT(base.replace(**overrides)).to(device).eval()
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
    from attnlab.bench._timing import format_table

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
    from attnlab.plotting import legend_outside, plain_log_ticks, pyplot, save_figure

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


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="KV-cached vs full-recompute decoding speed, per mechanism"
    )
    p.add_argument(
        "--preset", default="shakespeare-char", help="model of this preset (block widened to fit)"
    )
    p.add_argument("--tokens", type=int, default=256, help="tokens to generate")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile each model first (both modes)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['n_layer']} layer x {QUICK['n_embd']} wide, {QUICK['tokens']} tokens, "
        f"{QUICK['reps']} repetition: a smoke test, not a measurement",
    )
    p.add_argument("--out", help=out_help("generate"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.bench.overhead import with_width
    from attnlab.bench.train import bench_config
    from attnlab.errors import AttnlabError
    from attnlab.plotting import SMOKE

    cfg, _ = bench_config(args.preset)
    tokens, reps = args.tokens, args.reps
    if args.quick:
        cfg = with_width(cfg, QUICK["n_embd"], n_layer=QUICK["n_layer"], n_head=QUICK["n_head"])
        tokens, reps = QUICK["tokens"], QUICK["reps"]
        print(SMOKE)
    if tokens < 4:
        raise AttnlabError(f"--tokens must be at least 4 (to compare quarters), got {tokens}")
    rows, missing = measure(cfg, tokens, reps, args.warmup, args.device, compile=args.compile)
    print(
        f"preset {args.preset}: {cfg.n_layer} layers, n_embd {cfg.n_embd}, {tokens} tokens, greedy, "
        f"batch 1, {reps} reps, {args.device}{', compiled' if args.compile else ''}"
    )
    print(table(rows))
    for name in missing:
        print(f"{name}: not available (the mechanism adds no parameters in this build)")
    title = f"bench generate, {args.preset}: per-token latency over {tokens} tokens"
    out = figure_path(args.out, "generate", args.quick)
    plot(rows, out, f"{SMOKE}\n{title}" if args.quick else title)
    print(f"wrote {out}")
    return 0
