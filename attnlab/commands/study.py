"""`attnlab study NAME`: rerun a seed's whole experiment (many runs, paired statistics, a report)."""

from __future__ import annotations

import argparse
import shlex
import sys

from attnlab.errors import AttnlabError
from attnlab.studies import output


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "study",
        help="run a multi-seed study (shipped name or TOML file) and write its report",
        description="Run every variant of a study over seeds, paired by seed; resumable. "
        f"Writes {output.RESULTS_JSON}, {output.RESULTS_CSV}, {output.STUDY_JSON} and "
        f"{output.REPORT} (figures in {output.FIGURES}/) in --out.",
    )
    p.add_argument("study", nargs="?", help="shipped study name (see --list) or a study TOML file")
    p.add_argument("--list", action="store_true", help="list the shipped studies")
    p.add_argument(
        "--preset",
        default="ci",
        choices=("ci", "cpu", "paper"),
        help="scale: ci (a smoke test, a few minutes), cpu (about an hour on 2 cores), paper (the seed's settings)",
    )
    p.add_argument("--out", help="study folder (re-running it skips finished runs)")
    p.add_argument("--seeds", type=int, help="number of seeds (default: the preset's)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs in parallel processes (threads split between them)",
    )
    p.add_argument("--data", help="prepared data folder for every run (default: the study's)")
    p.add_argument(
        "--variants",
        help="comma-separated variants to train (default: all); the results and report still "
        "cover the whole study, with the finished runs of the others",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.studies.spec import list_studies, load_spec

    if args.list:
        studies = list_studies()
        width = max(len(name) for name, _ in studies)
        for name, description in studies:
            print(f"{name:<{width}}  {description}")
        return 0
    if not args.study or not args.out:
        raise AttnlabError("give a study (name or TOML file) and --out DIR, or --list")
    from attnlab.studies.output import StudyDir
    from attnlab.studies.runner import run_study

    spec = load_spec(args.study)
    if args.data and spec.kind != "lm":  # it was ignored without a word
        raise AttnlabError(
            f"--data: kind = {spec.kind!r} studies train on no data folder; leave it out"
        )
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    result = run_study(
        spec,
        args.preset,
        args.out,
        seeds=args.seeds,
        jobs=args.jobs,
        data=args.data,
        variants=variants,
        progress=lambda line: print(line, flush=True),
        command=shlex.join(["attnlab", *sys.argv[1:]]),
    )
    failed = sum(r["status"] == "failed" for r in result["runs"])
    print(
        f"study {spec.name} ({args.preset}): {len(result['runs'])} runs, {failed} failed; "
        f"report in {StudyDir(args.out).report}"
    )
    return 1 if failed else 0
