"""`attnlab bench overhead`: step-time overhead of each mechanism vs vanilla, across widths."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg
from attnlab.commands.bench import add_timing_args, figure_path, out_help, sizes
from attnlab.errors import AttnlabError
from attnlab.plotting import SMOKE

# the flags' defaults, and what --quick runs instead where a flag is not given: a smoke test
FULL = dict(widths="128,256,384,512,640,768", layers=6, heads=4, batch=8, block=256, reps=5)
QUICK = dict(widths="16,32", layers=1, batch=1, block=16, reps=1)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "overhead", help="step-time overhead of each mechanism vs vanilla, across widths"
    )
    p.add_argument(
        "--widths", help=f"comma-separated vanilla n_embd values (default {FULL['widths']})"
    )
    for flag in ("layers", "heads", "batch", "block"):
        p.add_argument(f"--{flag}", type=int, help=f"(default {FULL[flag]})")
    add_timing_args(
        p,
        reps=FULL["reps"],
        reps_help="interleaved repetitions per width",
        compile_help="torch.compile every model (during warm-up)",
        quick_help=f"widths {QUICK['widths']}, {QUICK['layers']} layer, batch {QUICK['batch']}, "
        f"block {QUICK['block']}, {QUICK['reps']} repetition: a smoke test, not a measurement "
        "(a size flag given beside it is kept)",
    )
    p.add_argument("--out", type=path_arg, help=out_help("overhead"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.bench import overhead

    out = figure_path(args.out, "overhead", args.quick)
    opts = sizes(args, FULL, QUICK)
    try:
        opts["widths"] = [int(w) for w in opts["widths"].split(",") if w.strip()]
    except ValueError:
        opts["widths"] = []
    if not opts["widths"] or min(opts["widths"]) < 1:  # none at all wrote an empty table
        raise AttnlabError(f"--widths must be comma-separated integers >= 1, got {args.widths!r}")
    opts["n_head"] = opts.pop("heads")
    if args.quick:
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
