"""`attnlab bench generate`: KV-cached against full-recompute decoding speed, per mechanism."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg
from attnlab.commands.bench import add_timing_args, figure_path, out_help, sizes
from attnlab.errors import AttnlabError
from attnlab.plotting import SMOKE

# the flags' defaults, and what --quick runs instead where a flag is not given: a smoke test
FULL = dict(tokens=256, reps=3)
QUICK = dict(tokens=12, reps=1)
QUICK_MODEL = dict(n_layer=1, n_embd=16, n_head=4)  # --quick's model, whatever the preset's


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="KV-cached vs full-recompute decoding speed, per mechanism"
    )
    p.add_argument(
        "--preset", default="shakespeare-char", help="model of this preset (block widened to fit)"
    )
    p.add_argument("--tokens", type=int, help=f"tokens to generate (default {FULL['tokens']})")
    add_timing_args(
        p,
        reps=FULL["reps"],
        reps_help="interleaved repetitions",
        compile_help="torch.compile each model's cached step first (recompute stays eager, "
        "as in sample --compile)",
        quick_help=f"{QUICK_MODEL['n_layer']} layer x {QUICK_MODEL['n_embd']} wide; "
        f"{QUICK['tokens']} tokens, {QUICK['reps']} repetition: a smoke test, not a measurement "
        "(a given --tokens or --reps is kept)",
    )
    p.add_argument("--out", type=path_arg, help=out_help("generate"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.bench import generate, overhead, train

    out = figure_path(args.out, "generate", args.quick)
    cfg, _ = train.bench_config(args.preset)
    chosen = sizes(args, FULL, QUICK)
    tokens, reps = chosen["tokens"], chosen["reps"]
    if tokens < 4:  # before any output, the smoke-test line included
        raise AttnlabError(f"--tokens must be at least 4 (to compare quarters), got {tokens}")
    if args.quick:
        q = QUICK_MODEL
        cfg = overhead.with_width(cfg, q["n_embd"], n_layer=q["n_layer"], n_head=q["n_head"])
        print(SMOKE)
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
