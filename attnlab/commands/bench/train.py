"""`attnlab bench train`: training tokens/s, MFU, and attnlab's step against a plain reference."""

from __future__ import annotations

import argparse

from attnlab.commands.bench import sizes
from attnlab.plotting import SMOKE

# the flags' defaults, and what --quick runs instead where a flag is not given: a smoke test
FULL = dict(steps=20)
QUICK = dict(steps=2)
# --quick's model, batch and matmul-peak size, whatever the preset's
QUICK_MODEL = dict(n_layer=1, n_embd=16, n_head=4, block_size=16, batch=2, peak_n=128)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="training tokens/s, MFU, and our step vs a plain reference"
    )
    p.add_argument(
        "--preset", default="shakespeare-char", help="model and batch size of this preset"
    )
    p.add_argument("--steps", type=int, help=f"interleaved repetitions (default {FULL['steps']})")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_MODEL['n_layer']} layer x {QUICK_MODEL['n_embd']} wide; "
        f"{QUICK['steps']} steps: a smoke test, not a measurement (a given --steps is kept)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.bench import overhead, train

    cfg, batch = train.bench_config(args.preset)
    steps = sizes(args, FULL, QUICK)["steps"]
    peak_n = 2048
    if args.quick:
        q = QUICK_MODEL
        cfg = overhead.with_width(
            cfg, q["n_embd"], n_layer=q["n_layer"], n_head=q["n_head"], block_size=q["block_size"]
        )
        batch, peak_n = q["batch"], q["peak_n"]
        print(SMOKE)
    result = train.measure(cfg, batch, steps, args.warmup, args.device, peak_n)
    print(
        f"preset {args.preset}: {result['params']:,} parameters, batch {batch} x block {cfg.block_size}, "
        f"{args.device}"
    )
    print(
        f"matmul peak ({peak_n}^3 fp32): {result['peak_flops'] / 1e9:.1f} GFLOP/s; "
        f"model {result['flops_per_token'] / 1e6:.2f} MFLOP per token (fwd + bwd)"
    )
    print(train.table(result))
    timings = result["timings"]
    if "plain reference" in timings:
        speed = timings["plain reference"].ratio  # median of reference time / our time
        target = "smoke test: no target" if args.quick else "target >= 0.98x"
        print(
            f"attnlab GPT speed relative to the plain reference: {speed:.3f}x, the median of "
            f"paired per-repetition ratios ({target})"
        )
    else:
        print(
            "no plain reference: the preset is not nanoGPT-shaped (components or mechanisms differ)"
        )
    return 0
