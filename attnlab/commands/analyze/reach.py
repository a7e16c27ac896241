"""`attnlab analyze reach STUDY --target T`: when each variant reaches T's final val loss."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.commands._common import path_arg
from attnlab.commands.analyze import checked_out, default_out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "reach", help="the iteration at which each study variant reaches a target's final loss"
    )
    p.add_argument("study", type=path_arg, metavar="STUDY", help="a study folder with runs/")
    p.add_argument("--target", required=True, metavar="VARIANT", help="whose final loss to reach")
    p.add_argument(
        "--variants",
        metavar="A,B,...",
        help="the variants to compare (comma list; default: every other one)",
    )
    p.add_argument("--out", type=path_arg, help="output folder (default: STUDY/analysis)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.studies import curves, reach

    names = reach.files(args.target)
    study = Path(args.study)
    curves.check_study(study)
    out = checked_out(args.out, names) if args.out else default_out(study / "analysis", names)
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else None
    result = reach.reach(study, args.target, variants)
    paths = reach.write(result, out)
    print(f"first iteration at {args.target}'s final val loss (same seed), / its last iteration:")
    for r in result.rows:
        at = (
            f"{r['reach_iter']:7.0f}  ratio {r['ratio']:.3f}"
            if r["ratio"] == r["ratio"]
            else "never"
        )
        print(
            f"  {r['variant']:>16} seed {r['seed']}: target {r['target_final_loss']:.4f}, "
            f"own final {r['variant_final_loss']:.4f}; reaches it at {at}"
        )
    for s in result.summary:
        ratio = (
            f"ratio {s['ratio_mean']:.3f} (95 % CI {s['ratio_ci95_low']:.3f} to "
            f"{s['ratio_ci95_high']:.3f}), {s['fewer_steps_pct']:.1f} % fewer steps"
            if s["reached"] == s["seeds"] and s["seeds"] > 1
            else "no interval"
        )
        print(f"{s['variant']}: reached on {s['reached']} of {s['seeds']} seeds; {ratio}")
    print(f"wrote {', '.join(map(str, paths))}")
    return 0
