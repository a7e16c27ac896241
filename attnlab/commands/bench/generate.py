"""`attnlab bench generate`: KV-cached against full-recompute decoding speed, per mechanism."""

from __future__ import annotations

import argparse

from attnlab.commands.bench import add_timing_args, figure_path, out_help
from attnlab.errors import AttnlabError
from attnlab.plotting import SMOKE

# what --quick runs: a smoke test
QUICK = dict(n_layer=1, n_embd=16, n_head=4, tokens=12, reps=1)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="KV-cached vs full-recompute decoding speed, per mechanism"
    )
    p.add_argument(
        "--preset", default="shakespeare-char", help="model of this preset (block widened to fit)"
    )
    p.add_argument("--tokens", type=int, default=256, help="tokens to generate")
    add_timing_args(
        p,
        reps=3,
        reps_help="interleaved repetitions",
        compile_help="torch.compile each model's cached step first (recompute stays eager, "
        "as in sample --compile)",
        quick_help=f"{QUICK['n_layer']} layer x {QUICK['n_embd']} wide, {QUICK['tokens']} "
        f"tokens, {QUICK['reps']} repetition: a smoke test, not a measurement",
    )
    p.add_argument("--out", help=out_help("generate"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.bench import generate, overhead, train

    out = figure_path(args.out, "generate", args.quick)
    cfg, _ = train.bench_config(args.preset)
    tokens, reps = args.tokens, args.reps
    if args.quick:
        cfg = overhead.with_width(
            cfg, QUICK["n_embd"], n_layer=QUICK["n_layer"], n_head=QUICK["n_head"]
        )
        tokens, reps = QUICK["tokens"], QUICK["reps"]
        print(SMOKE)
    if tokens < 4:
        raise AttnlabError(f"--tokens must be at least 4 (to compare quarters), got {tokens}")
    rows, missing = generate.measure(
        cfg, tokens, reps, args.warmup, args.device, compile=args.compile
    )
    print(
        f"preset {args.preset}: {cfg.n_layer} layers, n_embd {cfg.n_embd}, {tokens} tokens, greedy, "
        f"batch 1, {reps} reps, {args.device}{', compiled' if args.compile else ''}, "
        f"{torch.get_num_threads()} CPU threads"
    )
    print(generate.table(rows))
    for name in missing:
        print(f"{name}: not available (the mechanism adds no parameters in this build)")
    title = f"bench generate, {args.preset}: per-token latency over {tokens} tokens"
    generate.plot(rows, out, f"{SMOKE}\n{title}" if args.quick else title)
    print(f"wrote {out}")
    return 0
