"""`attnlab study NAME`: rerun a seed's whole experiment (many runs, paired statistics, a report)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError
from attnlab.studies import SCALES, output
from attnlab.studies.output import StudyDir

if TYPE_CHECKING:
    from attnlab.studies.executors import SlurmOptions

EXECUTORS = ("local", "slurm")
# the options that only SLURM takes (--jobs means runs at a time with either executor)
_SLURM_FLAGS = ["partition", "time", "cpus", "gpus", "retries", "sbatch"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "study",
        help="run a multi-seed study (shipped name or TOML file) and write its report",
        description="Run every variant of a study over seeds, paired by seed; resumable. "
        f"Writes {output.RESULTS_JSON}, {output.RESULTS_CSV}, {output.STUDY_JSON} and "
        f"{output.REPORT} (figures in {output.FIGURES}/) in --out.",
    )
    p.add_argument(
        "study",
        type=path_arg,
        nargs="?",
        help="shipped study name (see --list) or a study TOML file",
    )
    p.add_argument("--list", action="store_true", help="list the shipped studies")
    p.add_argument(
        "--preset",
        choices=SCALES,
        help="scale: ci (a smoke test; the default), cpu (early training on a CPU), converged "
        "(trained to a plateau on a CPU; the studies that have one), paper (the seed's "
        "settings), fair (each arm at its own best learning rate, at two sizes, seeds set by "
        "power; the studies that have one, docs/studies-protocol.md); --plan times it on this "
        "machine",
    )
    p.add_argument("--out", type=path_arg, help="study folder (re-running it skips finished runs)")
    p.add_argument("--seeds", type=int, help="number of seeds (default: the preset's)")
    p.add_argument(
        "--jobs",
        type=int,
        help="runs at a time: parallel processes here (threads split between them; default 1), "
        "or SLURM jobs with --executor slurm (default 16, or the config's jobs)",
    )
    p.add_argument(
        "--data", type=path_arg, help="prepared data folder for every run (default: the study's)"
    )
    p.add_argument(
        "--variants",
        help="comma-separated variants to train (default: all); the results and report still "
        "cover the whole study, with the finished runs of the others",
    )
    p.add_argument(
        "--allow-mixed-commits",
        action="store_true",
        help="report runs trained at different commits (or uncommitted diffs) together; "
        "refused otherwise",
    )
    p.add_argument(
        "--reuse-from",
        type=path_arg,
        action="append",
        metavar="STUDY_DIR",
        help="another study folder (repeatable): a run it trained identically (the same "
        "preset, resolved model and training config, data and seed) is copied in, not trained",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        help="where the runs train: local (this machine; the default) or slurm (each run a "
        "SLURM job submitted through submitit, the study folder on storage the nodes share; "
        "defaults from $ATTNLAB_SLURM_CONFIG or ~/.config/attnlab/slurm.toml)",
    )
    slurm = p.add_argument_group("with --executor slurm (each default from the config file)")
    slurm.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    slurm.add_argument(
        "--time",
        type=int,
        metavar="MINUTES",
        help="time limit per run's job (default 60; a run that needs longer is requeued and resumes)",
    )
    slurm.add_argument("--cpus", type=int, help="CPUs per run's job (default 1)")
    slurm.add_argument("--gpus", type=int, help="GPUs per run's job (default 0)")
    slurm.add_argument(
        "--retries",
        type=int,
        help="submit a job that ended without its result (cancelled, killed, failed) again up to "
        "this many times, resuming its run from its checkpoint (default 2)",
    )
    slurm.add_argument(
        "--sbatch",
        action="append",
        metavar="KEY=VALUE",
        help="another sbatch option, e.g. --sbatch account=lab --sbatch qos=high (repeatable; "
        "KEY alone for a flag)",
    )
    p.add_argument(
        "--trackers",
        help="comma-separated trackers for every run besides csv and tensorboard: wandb, "
        "mlflow (the study is a W&B group / an MLflow parent run; its report is attached)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="train nothing, write nothing: list every run the command would consider (finished, "
        "resumes, copied, trains), time each variant's training step here and estimate the "
        "time left",
    )
    p.add_argument(
        "--publish",
        type=path_arg,
        metavar="DIR",
        help=f"train nothing: copy the study in --out without its runs' weights ({output.REPORT}, "
        f"{output.RESULTS_JSON}, {output.RESULTS_CSV}, {output.STUDY_JSON}, "
        f"{output.FIGURES}/, and each listed run's records under runs/) to DIR, e.g. "
        "results/NAME to commit; a NOTES.md there is kept",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help=f"train nothing: rebuild {output.REPORT}, {output.RESULTS_JSON}, "
        f"{output.RESULTS_CSV} and {output.STUDY_JSON} in --out from its {output.RESULTS_JSON} "
        f"and {output.STUDY_JSON} with this version's statistics (the run folders may be gone)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.studies.spec import list_studies, load_spec

    if args.list:
        # each would be ignored: --list lists the shipped studies and nothing else
        other = [args.study] if args.study else []
        other += _given(args, ["out", "plan", "publish", "report_only", *_RUN_FLAGS])
        if other:
            raise AttnlabError(f"--list lists the shipped studies; leave out {other[0]}")
        studies = list_studies()
        width = max(len(name) for name, _ in studies)
        for name, description in studies:
            print(f"{name:<{width}}  {description}")
        return 0
    if not args.study or not args.out:
        raise AttnlabError("give a study (name or TOML file) and --out DIR, or --list")
    from attnlab.studies.runner import plan_study, report_study, run_study

    spec = load_spec(args.study)
    command = shlex.join(["attnlab", *sys.argv[1:]])
    publish = args.publish is not None
    if args.plan and (args.report_only or publish):
        raise AttnlabError("--plan trains nothing already; leave out --report-only and --publish")
    if args.plan and args.trackers:  # it would be ignored: a plan logs no run
        raise AttnlabError("--plan trains nothing to track; leave out --trackers")
    if args.plan and args.jobs not in (None, 1):  # the estimate is of runs one after another
        raise AttnlabError("--plan: --jobs does not change the plan; leave it out")
    if args.executor != "slurm":
        given = _given(args, _SLURM_FLAGS)
        if given:
            raise AttnlabError(f"{given[0]} is an option of --executor slurm; leave it out")
    if args.plan and args.executor is not None:  # the plan times the runs on this machine
        raise AttnlabError("--plan times the runs on this machine; leave out --executor")
    if args.report_only or publish:
        given = _given(args, _RUN_FLAGS)
        mode = "--report-only" if args.report_only else "--publish"
        if given:  # each would be ignored: the study folder says what ran
            raise AttnlabError(f"{mode} takes the study as it ran; leave out {given[0]}")
        if args.report_only:
            if publish:  # refused before the report is made again, which rewrites the folder
                StudyDir(args.out).check_publish(args.publish)
            report_study(spec, args.out, command=command)
            print(f"study {spec.name}: reported again in {StudyDir(args.out).report}")
        if publish:
            _publish(spec.name, StudyDir(args.out), args.publish)
        return 0
    if args.data and spec.kind != "lm":  # it was ignored without a word
        raise AttnlabError(
            f"--data: kind = {spec.kind!r} studies train on no data folder; leave it out"
        )
    variants = None  # every variant; `--variants ""` names none and is refused
    if args.variants is not None:
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    preset = args.preset or "ci"
    chosen = {
        "seeds": args.seeds,
        "data": args.data,
        "variants": variants,
        "allow_mixed_commits": args.allow_mixed_commits,
        "reuse_from": args.reuse_from,
    }
    if args.plan:
        _print_plan(spec.name, preset, plan_study(spec, preset, args.out, **chosen))
        return 0
    slurm = _slurm_options(args) if args.executor == "slurm" else None
    result = run_study(
        spec,
        preset,
        args.out,
        jobs=args.jobs if args.jobs is not None else slurm.jobs if slurm else 1,
        slurm=slurm,
        trackers=args.trackers.split(",") if args.trackers else None,
        progress=lambda line: print(line, flush=True),
        command=command,
        **chosen,
    )
    failed = sum(r["status"] == "failed" for r in result["runs"])
    print(
        f"study {spec.name} ({preset}): {len(result['runs'])} runs, {failed} failed; "
        f"report in {StudyDir(args.out).report}"
    )
    return 1 if failed else 0


# the options that shape the runs: --report-only, --publish and --list take none of them
_RUN_FLAGS = [
    "preset",
    "seeds",
    "data",
    "variants",
    "allow_mixed_commits",
    "reuse_from",
    "jobs",
    "executor",
    "trackers",
    *_SLURM_FLAGS,
]


def _slurm_options(args: argparse.Namespace) -> SlurmOptions:
    """The config file's SLURM options under the command line's."""
    from attnlab.studies.executors import slurm_options

    extra: dict[str, str | bool] | None = None
    if args.sbatch is not None:
        extra = {}
        for given in args.sbatch:
            key, eq, value = given.partition("=")
            key = key.strip().removeprefix("--")
            if not key:
                raise AttnlabError(f"--sbatch {given!r}: give KEY=VALUE (or KEY for a flag)")
            extra[key] = value if eq else True
    given = {k: getattr(args, k) for k in ("jobs", *_SLURM_FLAGS)}
    return slurm_options({**given, "sbatch": extra})


def _given(args: argparse.Namespace, dests: list[str]) -> list[str]:
    """The options among ``dests`` set away from their defaults (None, False, ``--jobs 1``)."""
    values = {dest: getattr(args, dest) for dest in dests}
    return [
        "--" + dest.replace("_", "-")
        for dest, value in values.items()
        if value is not None and value is not False and not (dest == "jobs" and value == 1)
    ]


def _publish(name: str, folder: StudyDir, dest: str) -> None:
    """Copy the study ``name`` in ``folder``, without its runs' weights, to ``dest``."""
    held = folder.previous().get("name")
    if held is not None and held != name:
        raise AttnlabError(
            f"{folder.path} holds study {held!r}, not {name!r}; name the study it holds"
        )
    folder.publish(dest)
    print(f"study {name}: published in {dest} (everything but the runs' model folders)")


def _print_plan(name: str, preset: str, plan: dict) -> None:
    """The plan as a table of runs, the step times and the time left."""
    from attnlab.studies.progress import duration

    rows = plan["rows"]
    width = max([len("variant"), *(len(r["variant"]) for r in rows)])
    print(f"study {name} ({preset}): {len(rows)} runs")
    if plan["in_use"] is not None:
        who = f" ({plan['in_use']})" if plan["in_use"] else ""
        print(f"a study is running in this folder{who}: its runs as they stand now")
    print(f"{'variant':<{width}}  seed  {'iters':>6}  state")
    for r in rows:
        iters = "?" if r["iters"] is None else f"{r['iters']}"
        mark = " (estimated)" if r.get("estimated") and r["iters"] is not None else ""
        state = "trains after the wall-clock timing" if r["iters"] is None else r["state"]
        if r.get("waits"):  # a protocol's evaluation run its choices have not fixed yet
            state += f" {r['waits']}"
        print(f"{r['variant']:<{width}}  {r['seed']:>4}  {iters:>6}  {state}{mark}")
    if "protocol" in plan:
        _print_protocol(plan)
    if not plan["sec_per_step"]:
        return
    print(f"seconds per training step ({plan['threads']} threads here), the median of:")
    for variant, s in plan["sec_per_step"].items():
        spread = f"{1000 * s.low:.0f} to {1000 * s.high:.0f} ms, " if s.high > s.low else ""
        print(f"  {variant:<{width}}  {1000 * s:.0f} ms ({spread}{s.source})")
    left = [r for r in rows if r.get("seconds_left")]
    if not left:
        print("nothing left to train")
        return
    print(
        f"left: {len(left)} runs, about {duration(plan['seconds_left'])} one after another on "
        "this machine as it is now (evaluation included; each run's start-up, checkpoints and "
        "analyses not; other work on it stretches this)"
    )


def _print_protocol(plan: dict) -> None:
    """How many runs a protocol study's plan holds: tuning, evaluation, and those sure to train."""
    from attnlab.studies.progress import duration

    p = plan["protocol"]
    sure = f" (about {duration(p['sure_seconds'])})" if p["sure_seconds"] is not None else ""
    print(
        f"protocol: {p['tuning_runs']} learning-rate tuning runs and {p['evaluation_runs']} "
        f"evaluation runs at most (the pilot fixes n); {p['sure_runs']} runs left are sure to "
        f"train{sure}, the others only if the pilot asks for them (fewer where tuning picks the recipe's LR)"
    )
