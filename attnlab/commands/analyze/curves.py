"""`attnlab analyze curves STUDY --a A --b B`: the paired difference A - B at every evaluation."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.commands._common import path_arg
from attnlab.commands.analyze import checked_out, default_out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "curves",
        help="paired val-loss difference of two study variants at every evaluation, its trend",
    )
    p.add_argument("study", type=path_arg, metavar="STUDY", help="a study folder with runs/")
    p.add_argument("--a", required=True, metavar="VARIANT", help="the variant whose loss is A")
    p.add_argument("--b", required=True, metavar="VARIANT", help="the variant subtracted (B)")
    p.add_argument(
        "--from",
        dest="start",
        type=int,
        metavar="ITER",
        help="count and fit the evaluations from this iteration on "
        "(default: the first after iteration 0)",
    )
    p.add_argument("--out", type=path_arg, help="output folder (default: STUDY/analysis)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.studies import curves

    names = curves.files(args.a, args.b)
    study = Path(args.study)
    curves.check_study(study)
    out = checked_out(args.out, names) if args.out else default_out(study / "analysis", names)
    result = curves.compare(study, args.a, args.b, args.start)
    paths = curves.write(result, out)
    s = result.summary
    print(f"{args.a} - {args.b} over seeds {s['seeds']} (val loss, nats):")
    print(f"{'iter':>6} {'mean':>8} {'95% CI':>19} {'p':>7}  seeds below 0")
    for r in result.per_iter:
        print(
            f"{r['iter']:>6} {r['mean_diff']:+8.4f} [{r['ci95_low']:+8.4f},{r['ci95_high']:+8.4f}]"
            f" {r['p']:7.3f}  {r['seeds_below_zero']}/{r['n']}"
        )
    below = ", ".join(f"seed {r['seed']} {r['below_zero']}" for r in result.per_seed[:-1])
    print(
        f"from iteration {s['start']} ({s['evals_from_start']} evaluations): mean below 0 at "
        f"{s['mean_below_zero']}, CI below 0 at {s['ci_below_zero']}, above 0 at "
        f"{s['ci_above_zero']}; below 0 per seed: {below}; "
        f"{s['seeds_below_at_every_eval']} of {len(s['seeds'])} seeds below at every one"
    )
    low, high = s["slope_ci95"]
    print(
        f"slope of the difference: {s['slope_per_1k_iters']:+.4f} nats per 1,000 iterations "
        f"(95 % CI {low:+.4f} to {high:+.4f}): {s['trend']}"
    )
    print(f"wrote {', '.join(map(str, paths))}")
    return 0
