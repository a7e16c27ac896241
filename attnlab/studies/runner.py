"""Run a study: its kind's units of work (attnlab.studies.kinds), then statistics and report.

The study folder (attnlab.studies.output) is rewritten after every finished unit of work, so an
interrupted study shows what it has, and rerunning the same command finishes it. A study folder
can also be reported again from its results.json and study.json alone (``report_study``), with
the statistics and report of this attnlab, when its run folders are gone. ``plan_study`` says
what ``run_study`` would do, and how long it would take, with every refusal made and nothing
written; runs another study trained identically can be copied in (``reuse_from``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from attnlab.config import CHOICES, check_choice
from attnlab.data.prepare import load_dataset
from attnlab.errors import AttnlabError
from attnlab.rundir import finished_summary
from attnlab.studies import protocol, provenance
from attnlab.studies.executors import SlurmExecutor, SlurmOptions
from attnlab.studies.kinds import KINDS
from attnlab.studies.kinds.base import Outcome, Study
from attnlab.studies.output import FIGURES, RESULTS_JSON, RUN_FIELDS, STUDY_JSON, StudyDir
from attnlab.studies.progress import Progress
from attnlab.studies.report import render
from attnlab.studies.spec import StudySpec, load_spec_text, shipped_spec_at
from attnlab.train.environment import process_git_state
from attnlab.train.trackers import StudyTracking

# what a kind computes again when a study is reported again; the rest of study.json is kept
_REBUILT = ("variants", "run_commits")

# what study.json's ``invocations`` keeps of each invocation that ran the study in its folder
INVOCATION_FIELDS = (
    "started",
    "command",
    "git_commit",
    "git_dirty",
    "git_diff_sha256",
    "elapsed_s",
    "retrained",
)

STUDY_SEEDS = 10_000  # seeds 0 .. n - 1, each a training seed (< SEED_LIMIT)
JOBS_PER_CPU = 4  # --jobs' bound: parallel runs per CPU of the machine


def run_study(
    spec: StudySpec,
    preset: str,
    out: str | Path,
    seeds: int | None = None,
    jobs: int = 1,
    data: str | Path | None = None,
    variants: list[str] | None = None,
    progress: Progress | None = None,
    command: str | None = None,
    allow_mixed_commits: bool = False,
    reuse_from: list[str | Path] | None = None,
    slurm: SlurmOptions | None = None,
    trackers: list[str] | None = None,
) -> dict[str, Any]:
    """Run (or finish) the study in ``out``; write results.json, results.csv, study.json, report.md.

    ``variants`` restricts what an LM study trains to those arms: the results, comparisons and
    report still cover the whole study, with every finished run of the others found in ``out``.
    ``command`` is recorded at the top of the report. Runs made at different code states (commit,
    or uncommitted diff), counting the ones this invocation trains, are refused before anything
    is written unless ``allow_mixed_commits``. A run another study in ``reuse_from`` trained
    identically (preset, resolved configs, data, seed) is copied in instead of trained; its
    code state counts as the copy's. ``slurm``: each unit of work is a SLURM job, ``jobs``
    of them at a time (attnlab.studies.executors). ``trackers`` (wandb, mlflow, ...) get every
    run, grouped by the study, and the report once it is written. Returns results.json's content with
    study.json's as ``study``.
    """
    study = _prepared(
        spec,
        preset,
        out,
        seeds,
        jobs,
        data,
        variants,
        progress,
        command,
        allow_mixed_commits,
        reuse_from,
        cluster=slurm is not None,
    )
    if slurm is not None:  # refused before the folder is made where it cannot submit
        study = replace(study, executor=SlurmExecutor(slurm, study.out, progress))
    tracking = None
    if trackers:
        for name in trackers:
            check_choice("--trackers", name, CHOICES["trackers"])
        tracking = StudyTracking(trackers, spec.name, study.out.path)
        study = replace(study, tracking=tracking.context)
    # held until the study returns: a second study in this folder is refused
    with study.out.create():
        result = study.publish(KINDS[spec.kind].run(study))
    if tracking is not None:
        figures = sorted((study.out.path / FIGURES).glob("*"))
        files = [study.out.report, study.out.path / RESULTS_JSON, *figures]
        # as results.json holds them (its JSON has no NaN)
        written = json.loads((study.out.path / RESULTS_JSON).read_text())
        tracking.attach(files, {"comparisons": written["comparisons"]})
    return result


def plan_study(
    spec: StudySpec,
    preset: str,
    out: str | Path,
    seeds: int | None = None,
    data: str | Path | None = None,
    variants: list[str] | None = None,
    allow_mixed_commits: bool = False,
    reuse_from: list[str | Path] | None = None,
    timed: bool = True,
) -> dict[str, Any]:
    """What ``run_study`` with these arguments would do now, writing nothing in ``out``: the
    kind's plan (its runs and their states; ``timed``: step times and the time left) and
    ``in_use``, who runs a study in ``out`` now (None: no one). It is refused where the study
    would be, except that a folder in use is planned as it stands."""
    study = _prepared(
        spec,
        preset,
        out,
        seeds,
        1,
        data,
        variants,
        None,
        None,
        allow_mixed_commits,
        reuse_from,
        planning=True,
    )
    return {**KINDS[spec.kind].plan(study, timed), "in_use": study.out.in_use()}


def _refuse_another_study(folder: StudyDir, name: str, preset: str) -> None:
    """Refuse a folder whose study.json is another study's or another preset's: training there
    would replace that study's results and report with this one's, its runs left orphaned. One
    whose study.json cannot be read is refused too: what it keeps (the wall-clock budgets, the
    earlier invocations) would be lost, and runs it lists dropped from the report."""
    if not (folder.path / STUDY_JSON).is_file():
        return
    held = folder.written()
    there = (held.get("name"), held.get("preset"))
    if there != (name, preset):
        raise AttnlabError(
            f"{folder.path} holds study {there[0]!r} at preset {there[1]!r}, not {name!r} at "
            f"{preset!r}; choose another --out"
        )
    _check_times(held, folder.path / STUDY_JSON)


def _prepared(
    spec: StudySpec,
    preset: str,
    out: str | Path,
    seeds: int | None,
    jobs: int,
    data: str | Path | None,
    variants: list[str] | None,
    progress: Progress | None,
    command: str | None,
    allow_mixed_commits: bool,
    reuse_from: list[str | Path] | None,
    planning: bool = False,
    cluster: bool = False,
) -> Study:
    """The study as ``run_study`` runs it, every refusal made and nothing written in ``out``
    (``planning``: nor anywhere else; ``cluster``: its runs go to a cluster's nodes, so
    ``jobs`` is not bounded by this machine's CPUs)."""
    if variants is not None:
        if not variants and spec.variants:  # `--variants ,` ran every variant
            raise AttnlabError(f"--variants names none; choose from {', '.join(spec.variants)}")
        spec = spec.training(variants)
    scale = spec.scale(preset)
    n_seeds = seeds if seeds is not None else scale.seeds
    if n_seeds < 1 or jobs < 1:
        raise AttnlabError(f"--seeds and --jobs must be >= 1 (got {n_seeds} and {jobs})")
    # each job is a process of at least one thread: past a few per CPU they only queue
    most = JOBS_PER_CPU * (os.cpu_count() or 1)
    if jobs > most and not cluster:
        raise AttnlabError(
            f"--jobs must be between 1 and {most} ({JOBS_PER_CPU} per CPU here; got {jobs:,})"
        )
    if n_seeds > STUDY_SEEDS:  # a run folder (and a plan row) per variant and seed
        raise AttnlabError(f"--seeds must be at most {STUDY_SEEDS:,} (got {n_seeds:,})")
    kind = KINDS[spec.kind]
    kind.check(spec, preset)
    # a missing or unprepared folder fails here, not in every run once the study folder is made
    if data is not None:
        load_dataset(data)
    folder = StudyDir(out)
    folder.check_usable()  # what create() refuses, refused here for a plan too
    donors = _donors(reuse_from or [], folder)
    _refuse_another_study(folder, spec.name, preset)
    # a protocol scale's arms become its cells, with the choices an earlier invocation made
    spec = protocol.expand(spec, preset, folder.previous().get("protocol"), seeds)
    seed_list = spec.expanded.all_seeds() if spec.expanded else list(range(n_seeds))
    git = process_git_state()
    header = {
        "name": spec.name,
        "description": spec.description,
        "kind": spec.kind,
        "preset": preset,
        "seeds": seed_list,
        "jobs": jobs,
        "source": spec.source,
        "notes": scale.notes,
        "command": command,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **_git_fields(git),
        "packages": provenance.packages(),
        "spec_text": spec.text,
        "mixed_commits_allowed": allow_mixed_commits,
    }
    study = _study(
        spec, preset, folder, seed_list, jobs, data, progress, header, time.perf_counter()
    )
    study = replace(study, planning=planning)
    kind.refuse(study)
    if donors:
        study.reuse.update(kind.reusable(study, donors))
    if not allow_mixed_commits:
        hint = ", or leave out --reuse-from" if study.reuse else ""
        provenance.refuse_mixed(
            _code_states(spec, preset, folder, seed_list, git, study.reuse), hint
        )
    return study


def report_study(spec: StudySpec, out: str | Path, command: str | None = None) -> dict[str, Any]:
    """Report the study in ``out`` again from its results.json and study.json, training
    nothing: the statistics and report of this attnlab on the spec as that study ran it (its
    recorded text, else the shipped spec at its recorded commit). What ran the study (command,
    commit, time) is kept; what reported it now is recorded beside it as ``reported``."""
    folder = StudyDir(out)
    record = folder.written()
    results = folder.read_results()
    if record.get("name") != spec.name:
        raise AttnlabError(
            f"{folder.path} holds study {record.get('name')!r}, not {spec.name!r}; "
            "name the study it holds"
        )
    spec, origin = _spec_as_run(spec, record)
    kept = record.get("protocol")
    if isinstance(kept, dict) and record.get("preset") in spec.scales:
        fixed = (
            (kept.get("seeds") or {}).get("n")
            if kept.get("seeds", {}).get("rule") == "fixed"
            else None
        )
        spec = protocol.expand(spec, record["preset"], kept, fixed)
    _check_record(spec, record, results["runs"], folder)
    header = {k: v for k, v in record.items() if k not in _REBUILT}
    header["spec_text"] = spec.text
    header["reported"] = {
        "command": command,
        **_git_fields(process_git_state()),
        "packages": provenance.packages(),
        "spec_from": origin,
    }
    study = _study(spec, record["preset"], folder, record["seeds"], 1, None, None, header, None)
    try:  # before the folder is locked: a refused report leaves it as it was
        outcome = KINDS[spec.kind].rebuild(study, results, record)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise AttnlabError(
            f"{folder.path}: {STUDY_JSON} or {RESULTS_JSON} is not as the study wrote it "
            f"({type(e).__name__}: {e}); restore them, or run the study again"
        ) from None
    with folder.create():
        return study.publish(outcome)


def _check_record(
    spec: StudySpec, record: dict[str, Any], runs: list[dict[str, Any]], folder: StudyDir
) -> None:
    """Refuse a study.json without its preset and seeds, and results.json runs a study could
    not have made: a variant the spec does not have, a seed it did not run, a run listed twice
    (each would count in the statistics as a run of its own)."""
    where = folder.path / STUDY_JSON
    preset, seeds = record.get("preset"), record.get("seeds")
    if not isinstance(preset, str):
        raise AttnlabError(f"{where} names no preset; restore it as the study wrote it")
    spec.scale(preset)
    if not isinstance(seeds, list) or not all(type(s) is int for s in seeds):
        raise AttnlabError(f"{where} has seeds {seeds!r}, not a list of whole numbers")
    if not seeds:
        raise AttnlabError(f"{where} lists no seeds; restore it as the study wrote it")
    if len(set(seeds)) < len(seeds):
        raise AttnlabError(f"{where} has seeds {seeds!r}, one of them twice; restore it")
    _check_times(record, where)
    seen = set()
    for run in runs:
        what = f"{run['variant']} seed {run['seed']}"
        if run["variant"] not in spec.variants:
            raise AttnlabError(
                f"{folder.path / RESULTS_JSON}: run {what}: the study has no variant "
                f"{run['variant']!r}"
            )
        if run["seed"] not in seeds:
            raise AttnlabError(
                f"{folder.path / RESULTS_JSON}: run {what}: the study ran seeds {seeds}"
            )
        if (run["variant"], run["seed"]) in seen:
            raise AttnlabError(f"{folder.path / RESULTS_JSON}: run {what} is listed twice")
        seen.add((run["variant"], run["seed"]))
    ran = {run["seed"] for run in runs}
    unrun = [s for s in seeds if s not in ran]
    # the report would count seeds that no run has (study.json edited); a protocol study lists
    # every seed its phases may reach (up to max_seeds) before they are reached
    if runs and unrun and "protocol" not in record:
        raise AttnlabError(
            f"{where} has seeds {seeds}, but {folder.path / RESULTS_JSON} holds no run of seed "
            f"{unrun[0]}"
            + (f" (nor of {len(unrun) - 1} more)" if unrun[1:] else "")
            + "; restore it as the study wrote it, or run the study command again"
        )
    for name in spec.variants:  # a finished run left out would vanish from the report
        for seed in seeds:
            finished = finished_summary(folder.run_dir(name, seed)) is not None
            if finished and (name, seed) not in seen:
                raise AttnlabError(
                    f"{folder.path / RESULTS_JSON} does not list the finished run {name} seed "
                    f"{seed}; restore it, or run the study command again (it lists every "
                    "finished run)"
                )


def _check_times(record: dict[str, Any], where: Path) -> None:
    """Refuse a study.json whose invocations' times a report or a rerun would read wrongly (a
    traceback, or the earlier invocations dropped without a word)."""

    def seconds(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0

    if "elapsed_s" in record and not seconds(record["elapsed_s"]):
        raise AttnlabError(
            f"{where} has elapsed_s {record['elapsed_s']!r}, not a number of seconds; restore it"
        )
    held = record.get("invocations", [])
    if not isinstance(held, list) or not all(
        isinstance(i, dict) and seconds(i.get("elapsed_s")) for i in held
    ):
        raise AttnlabError(
            f"{where} has invocations that are not a list of tables with elapsed_s; restore it"
        )


def _git_fields(git: dict[str, Any]) -> dict[str, Any]:
    return {
        "git_commit": git["commit"],
        "git_dirty": git["dirty"],
        "git_diff_sha256": git["diff_sha256"],
    }


def _spec_as_run(spec: StudySpec, record: dict[str, Any]) -> tuple[StudySpec, str]:
    """The spec a recorded study ran, and where its text came from: study.json's own copy,
    else the shipped spec's file at the study's commit (shipped specs change), else ``spec``."""
    if record.get("spec_text"):  # where an earlier report-only found it, if one put it there
        origin = (record.get("reported") or {}).get("spec_from") or STUDY_JSON
        return load_spec_text(record["spec_text"], spec.source), origin
    commit = record.get("git_commit")
    text = shipped_spec_at(spec.source, commit) if commit else None
    if text is not None:
        return load_spec_text(text, spec.source), f"{spec.source} at commit {commit}"
    return spec, f"{spec.source} as it is now (the study recorded no spec text)"


def _donors(paths: list[str | Path], out: StudyDir) -> list[StudyDir]:
    """The study folders of ``--reuse-from``: each one a study's, none of them ``out``."""
    donors = []
    for path in paths:
        donor = StudyDir(Path(path).expanduser())
        if not donor.is_study():
            raise AttnlabError(f"--reuse-from {path}: not a study folder (no {STUDY_JSON})")
        if donor.path.resolve() == out.path.expanduser().resolve():
            raise AttnlabError(f"--reuse-from {path} is this study's --out; name another study")
        if not donor.has_weights():
            raise AttnlabError(
                f"--reuse-from {path} holds no run with its weights (a published copy?); name "
                "the study folder that trained them"
            )
        donors.append(donor)
    return donors


def _code_states(
    spec: StudySpec,
    preset: str,
    folder: StudyDir,
    seeds: list[int],
    git: dict[str, Any],
    reuse: dict[str, str],
) -> list[dict[str, Any]]:
    """The code states of the runs this invocation would report, grouped: each run folder's
    recorded ones, a run to be copied in its donor's (``reuse``), and the current one for
    every run it would train or resume."""
    now = (git["commit"], git["dirty"], git["diff_sha256"])
    states = {}
    for name in spec.variants:
        for seed in spec.seeds_of(name, preset, seeds):
            run_dir = folder.run_dir(name, seed)
            if str(run_dir) in reuse:
                states[name, seed] = provenance.run_states(reuse[str(run_dir)])
                continue
            finished = finished_summary(run_dir) is not None
            if finished or spec.trains(name):
                states[name, seed] = provenance.run_states(run_dir) + ([] if finished else [now])
    return provenance.group_states(states)


def _run_commits(runs: list[dict[str, Any]], earlier: list[dict[str, Any]] | None) -> Any:
    """The code states the finished runs trained at, from their env.json; ``earlier`` (the
    study's record) when none of their folders is here any more."""
    found = {
        (r["variant"], r["seed"]): states
        for r in runs
        if r.get("status") == "ok" and r.get("run_dir")
        if (states := provenance.run_states(r["run_dir"]))
    }
    return provenance.group_states(found) if found else earlier


def _earlier_invocations(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The invocations an earlier study.json records: its list, or, written before the list
    existed, the one invocation its top level describes (none for a folder without one)."""
    if "invocations" in record:  # checked by _check_times before anything runs
        return list(record["invocations"])
    if record.get("elapsed_s") is None:
        return []
    return [{k: record.get(k) for k in INVOCATION_FIELDS}]


def _study(
    spec: StudySpec,
    preset: str,
    folder: StudyDir,
    seeds: list[int],
    jobs: int,
    data: str | Path | None,
    progress: Progress | None,
    header: dict[str, Any],
    t0: float | None,
) -> Study:
    """The study, with its ``publish``: rewrite the study folder from an outcome (results,
    study.json from ``header`` and the outcome, report.md). ``t0`` None: reported again, so
    the time and retrained runs of the study's own invocation stay as recorded. Else this
    invocation's command, time and retrained runs are the top level's, and ``invocations``
    lists it after the earlier ones, so a resumed study or a rerun that trains nothing keeps
    what ran before."""
    earlier = _earlier_invocations(folder.previous()) if t0 is not None else []

    def publish(outcome: Outcome) -> dict[str, Any]:
        results = {
            "runs": [{k: r.get(k) for k in RUN_FIELDS} for r in outcome.runs],
            "comparisons": outcome.comparisons,
        }
        record = dict(header)
        if t0 is not None:
            record["elapsed_s"] = time.perf_counter() - t0
            record["retrained"] = sum(not r.get("skipped", True) for r in outcome.runs)
            record["invocations"] = [*earlier, {k: record.get(k) for k in INVOCATION_FIELDS}]
        record["variants"] = outcome.variants
        record.update(outcome.extra)
        record["run_commits"] = _run_commits(outcome.runs, folder.previous().get("run_commits"))
        # the report is made before the records are written: one that fails leaves them as
        # they were (only a figure it drew may be new)
        report = render(spec, preset, record, KINDS[spec.kind].sections(study, results, record))
        folder.write_results(results, record)
        folder.write_report(report)
        return {**results, "study": record}

    study = Study(spec, preset, folder, seeds, jobs, data, progress, publish)
    return study
