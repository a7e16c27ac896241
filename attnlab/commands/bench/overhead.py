"""`attnlab bench overhead`: step-time overhead of each mechanism vs vanilla, across widths."""

from __future__ import annotations

import argparse

from attnlab.commands.bench import add_timing_args, figure_path, out_help
from attnlab.errors import AttnlabError
from attnlab.plotting import SMOKE

# what --quick runs: a smoke test
QUICK = dict(widths=[16, 32], layers=1, batch=1, block=16, reps=1, n_head=4)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "overhead", help="step-time overhead of each mechanism vs vanilla, across widths"
    )
    p.add_argument(
        "--widths", default="128,256,384,512,640,768", help="comma-separated vanilla n_embd values"
    )
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=256)
    add_timing_args(
        p,
        reps=5,
        reps_help="interleaved repetitions per width",
        compile_help="torch.compile every model (during warm-up)",
        quick_help=f"widths {', '.join(map(str, QUICK['widths']))}, {QUICK['layers']} layer, "
        f"block {QUICK['block']}, {QUICK['reps']} repetition: a smoke test, not a measurement",
    )
    p.add_argument("--out", help=out_help("overhead"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.bench import overhead

    out = figure_path(args.out, "overhead", args.quick)
    try:
        widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        raise AttnlabError(
            f"--widths must be comma-separated integers, got {args.widths!r}"
        ) from None
    opts = dict(
        widths=widths,
        layers=args.layers,
        batch=args.batch,
        block=args.block,
        reps=args.reps,
        n_head=args.heads,
    )
    if args.quick:
        opts.update(QUICK)
        print(SMOKE)
    rows, missing = overhead.measure(
        **opts, warmup=args.warmup, device=args.device, compile=args.compile
    )
    print(overhead.table(rows))
    for name in missing:
        print(f"{name}: not available (the mechanism adds no parameters in this build)")
    title = (
        f"bench overhead: {opts['layers']} layers, batch {opts['batch']}, block {opts['block']}, "
        f"{opts['reps']} interleaved reps, {args.device}{', compiled' if args.compile else ''}"
    )
    overhead.plot(rows, out, f"{SMOKE}\n{title}" if args.quick else title)
    print(f"wrote {out}")
    return 0
