"""Language-model studies: the final validation loss of every (variant, seed) training run.

Seed ``s`` is the training seed of every variant, so paired runs see the same initial stream and
the same batches; each comparison is a paired t-test over seeds, Holm-corrected over the study.
A wall-clock-matched variant retrains its baseline for as many iterations as take the
mechanism's time, timed before anything trains, so its runs queue behind the others. Runs live
in ``OUT/runs/<variant>/seed<s>``: a finished run is not retrained, an unfinished one resumes
from its ``latest/`` checkpoint and a run that raises is recorded as failed (its error in
results.json) while the others go on.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnlab.data.prepare import default_data_dir, is_data_folder, load_dataset, shipped_default
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_manifest
from attnlab.presets import get_preset
from attnlab.rundir import BEST, LATEST, copied_from, copy_run, finished_summary, has_weights
from attnlab.studies import output, protocol, provenance
from attnlab.studies.jobs import (
    Job,
    Pace,
    identical_run,
    planned,
    record_problem,
    refuse_other_setups,
    time_steps,
    train_one,
)
from attnlab.studies.kinds import lm_plan, lm_protocol, lm_report
from attnlab.studies.kinds.base import Outcome, Study
from attnlab.studies.kinds.lm_analyses import run_analyses
from attnlab.studies.output import StudyDir
from attnlab.studies.progress import Tracker
from attnlab.studies.spec import StudySpec, Variant
from attnlab.studies.stats import holm, paired_comparison, summarize
from attnlab.train.environment import process_git_state
from attnlab.train.spec import as_overrides, configs, default_data_for

WALLCLOCK_REPS = 30  # interleaved training steps per arm behind a wall-clock-matched budget


class LanguageModel:
    """Training runs per (variant, seed), paired comparisons, the seed-0 analyses."""

    def check(self, spec: StudySpec, preset: str) -> None:
        """Every variant's model and training values at ``preset`` are valid: a wrong one fails
        here, not in each of its runs once the study folder is made."""
        for name, variant in spec.variants.items():
            model, train = spec.layered(variant, preset)
            try:
                configs(variant.preset, as_overrides(model) + as_overrides(train))
            except AttnlabError as e:
                raise AttnlabError(f"{spec.source}: variant {name!r} at {preset}: {e}") from None

    def refuse(self, study: Study) -> None:
        """A named data folder that is missing or unprepared (a table is prepared by the study),
        a wall-clock budget in the folder timed for another pair, and a run folder there of
        another setup or with records that disagree: each refused here, not in every run once
        the study folder is made."""
        scale = study.spec.scale(study.preset)
        if study.data is None and isinstance(scale.data, str):
            try:
                load_dataset(scale.data)
            except AttnlabError as e:
                raise AttnlabError(
                    f"{study.spec.source}: scale {study.preset}: data: {e}"
                ) from None
        budgets = kept_budgets(study)
        variants = study.spec.variants
        if study.out.has_runs():  # (resolving the jobs' data folders may prepare one)
            names = [n for n in variants if not variants[n].clock_of or n in budgets]
            _jobs(study, names, _budget_iters(budgets))

    def run(self, study: Study) -> Outcome:
        """Every run; a protocol scale's in its phases (attnlab.studies.protocol: tuning, then
        the evaluation seeds at the best LRs, n chosen after a pilot), each phase's choices
        kept in study.json before the next one trains."""
        while True:
            outcome = self._run(study)
            spec = protocol.advance(study.spec, study.preset, outcome.runs)
            if spec is study.spec:
                return outcome
            study = replace(study, spec=spec)

    def _run(self, study: Study) -> Outcome:
        """Every run, the wall-clock-matched ones last; publish after each finished run.

        A wall-clock budget, once computed, is kept in study.json and reused when the study is
        resumed, so every seed of a wall-clock-matched variant trains for the same iterations.
        A variant the invocation does not train (``--variants``) is still reported from its
        finished runs (a wall-clock-matched one needs its kept budget); its budget stays too.
        """
        spec = study.spec
        clocked = [n for n, v in spec.variants.items() if v.clock_of]
        first = [n for n in spec.variants if n not in clocked]
        runs: list[dict[str, Any]] = []
        budgets = kept_budgets(study)
        first_jobs = _jobs(study, first, {})
        _copy_reused(study, first_jobs)
        # each copy records its source (a run trained here since, in its place, is no copy)
        reused = {
            f"{job.variant} seed {job.seed}": source
            for job in first_jobs
            if (source := copied_from(job.run_dir)) is not None
        }
        # hashed once: the bins' sha256 (kept in study.json, taken again only if a bin changed)
        folders = {job.variant: job.data for job in first_jobs}
        data = provenance.data_provenance(folders.values(), study.out.previous().get("data", {}))
        # the runs considered: every seed of a trained variant, the finished ones of the others
        total = len(first_jobs) + sum(
            len(_considered(study, name))
            for name in clocked
            if spec.trains(name) or name in budgets
        )
        tracker = Tracker(total, study.progress, parallel=study.jobs)
        analyses = study.out.previous().get("analyses") or {}

        def publish(rows: list[dict[str, Any]]) -> None:
            """Add the finished ``rows``, rewrite the study folder, then tell each one (so
            results.json already holds a run when its line arrives)."""
            for row in rows:
                if row["status"] == "ok":
                    row.update(output.convergence(row["run_dir"], row["iters"]))
            runs.extend(rows)  # a run times itself: row["seconds"]
            nonlocal analyses
            analyses = run_analyses(study, runs, analyses)
            kept = {"wallclock": budgets, "reused": reused, "analyses": analyses}
            study.publish(_outcome(study, runs, kept, folders, data))
            for row in rows:
                if row["status"] == "ok":
                    result = f"val loss {row['val_loss']:.4f} after {row['iters']} iters"
                else:
                    result = f"FAILED {row.get('error', '')}"
                what = f"{row['variant']} seed {row['seed']}"
                # a resumed run's training time in all (wall_s) sets the ETA, not its part here
                whole = row.get("wall_s") or 0.0
                tracker.done(what, result, row.get("seconds", 0), row["skipped"], whole)

        def on_done(_index: int, row: dict[str, Any], _wall: float) -> None:
            publish([row])

        # The runs that finished earlier (a kept wall-clock budget's too) at once, here, in
        # one report: a resumed study's report never lists fewer runs than it had.
        kept_jobs = _jobs(study, list(budgets), _budget_iters(budgets))
        earlier = [
            job for job in first_jobs + kept_jobs if finished_summary(job.run_dir) is not None
        ]
        if earlier or spec.expanded is not None:  # a protocol's new phase: its choices at once
            publish([train_one(job) for job in earlier])
        done = {job.run_dir for job in earlier}
        # The budgets not yet kept are timed now, before anything trains: the machine is as idle
        # as the timing wants, and their runs then queue behind the others, not after them all
        # (a slot of --jobs would idle while the last equal-iteration runs finish).
        untimed = [n for n in clocked if n not in budgets and spec.trains(n)]
        for name in untimed:
            budgets[name] = wallclock_budget(study, name)
        clocked_jobs = kept_jobs
        if untimed:  # kept in study.json now: a run stopped before any finishes resumes on it
            publish([])
            clocked_jobs = _jobs(study, list(budgets), _budget_iters(budgets))
        queue = [job for job in first_jobs + clocked_jobs if job.run_dir not in done]
        study.run_all(train_one, queue, on_done)
        analyses = run_analyses(study, runs, analyses)
        extra = {"wallclock": budgets, "reused": reused, "analyses": analyses}
        return _outcome(study, runs, extra, folders, data)

    def rebuild(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> Outcome:
        """The comparisons and per-variant statistics again from results.json's runs, each
        run's convergence again where the study folder still holds that run (a study made
        before convergence was measured gains it); the wall-clock budgets and analyses as
        recorded (they need the run folders)."""
        known = record.get("data") or {}
        folders = {n: c.get("data") for n, c in (record.get("configs") or {}).items()}
        extra = {k: record[k] for k in ("wallclock", "reused", "analyses") if k in record}
        data = provenance.as_recorded(known)
        runs = [_converged_again(study, r) for r in results["runs"]]
        return _outcome(study, runs, extra, folders, data)

    def sections(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
        if record.get("protocol"):
            return lm_protocol.sections(study, results, record)
        return lm_report.sections(study, results, record)

    def plan(self, study: Study, timed: bool = True) -> dict[str, Any]:
        """What the study would do now, writing nothing: every run it considers with its state
        (finished, resumes, copied from another study, trains) and iterations, and, ``timed``,
        each variant's training step timed here and the estimated time of what is left.

        A wall-clock-matched arm not yet timed gets its mechanism's iterations times the step
        ratio measured here, marked estimated.
        """
        spec = study.spec
        clocked = [n for n, v in spec.variants.items() if v.clock_of]
        budgets = study.out.previous().get("wallclock", {})
        jobs = _jobs(study, [n for n in spec.variants if n not in clocked], {})
        jobs += _jobs(study, [n for n in clocked if n in budgets], _budget_iters(budgets))
        # a wall-clock-matched arm trains its baseline's model, a protocol's cell its arm's at
        # its size: timed under that name
        model_of = {n: model_name(v) for n, v in spec.variants.items()}
        steps: dict[str, float] = {}
        for job in jobs if timed else []:
            if model_of[job.variant] not in steps:
                steps[model_of[job.variant]] = lm_plan.step_seconds(job)
        rows = [lm_plan.plan_row(study, job, steps.get(model_of[job.variant])) for job in jobs]
        for name in clocked:
            v = spec.variants[name]
            if name in budgets or not spec.trains(name):
                continue
            base = next((j for j in jobs if j.variant == v.matches), None)
            mech = [r for r in rows if r["variant"] == v.clock_of]
            if base is None or not mech:
                continue
            ratio = None
            if timed and steps.get(v.clock_of) and steps.get(base.variant):
                ratio = steps[v.clock_of] / steps[base.variant]
            iters = round(mech[0]["iters"] * ratio) if ratio else None  # None: not timed
            for seed in spec.seeds_of(name, study.preset, study.seeds):
                run_dir = str(study.out.run_dir(name, seed))
                job = replace(base, variant=name, seed=seed, run_dir=run_dir, max_iters=iters)
                row = lm_plan.plan_row(study, job, steps.get(base.variant) if iters else None)
                rows.append({**row, "iters": iters, "estimated": True})
        if spec.expanded is not None:
            rows += _protocol_rows(study, steps if timed else {})
        left = [r for r in rows if r.get("seconds_left") is not None]
        if spec.expanded is not None:  # what is sure to train, the rest only if the pilot asks
            sure = [r for r in left if "pilot" not in r.get("waits", "")]
            tuning = set(spec.expanded.protocol.tuning_seeds)
            summary = {
                "tuning_runs": sum(r["seed"] in tuning for r in rows),
                "evaluation_runs": sum(r["seed"] not in tuning for r in rows),
                "sure_runs": len(sure),
                "sure_seconds": sum(r["seconds_left"] for r in sure) if timed else None,
            }
        return {
            **({"protocol": summary} if spec.expanded is not None else {}),
            "rows": rows,
            "sec_per_step": steps,
            "threads": torch.get_num_threads(),
            "seconds_left": sum(r["seconds_left"] for r in left) if timed else None,
        }

    def reusable(self, study: Study, donors: list[StudyDir]) -> dict[str, str]:
        """``{run folder: another study's run folder}`` for every run this study would start
        (not one already begun here) that one of ``donors`` trained identically, preferring
        one trained at this code state. Wall-clock matched arms are left out: their budget is
        timed in this study."""
        first = [
            n for n, v in study.spec.variants.items() if not v.clock_of and study.spec.trains(n)
        ]
        git = process_git_state()
        now = [(git["commit"], git["dirty"], git["diff_sha256"])]
        plan = {}
        starts = [job for job in _jobs(study, first, {}) if not Path(job.run_dir).exists()]
        for job in starts:
            # a run of a published copy holds its records only: nothing to copy a model from
            candidates = [r for d in donors for r in d.seed_runs(job.seed) if has_weights(r)]
            # one trained at this code state first: a copy of another is refused as mixed
            candidates.sort(key=lambda r: provenance.run_states(r) != now)
            found = identical_run(job, candidates)
            if found is None:
                continue
            # copied, its summary.json would enter the statistics unchecked, and a damaged
            # model.safetensors would be this study's
            problem = record_problem(found) or _damaged_checkpoint(found)
            if problem:
                raise AttnlabError(
                    f"--reuse-from: {found}: {problem}, so it cannot be copied: restore the "
                    "run's files as it wrote them, or leave out --reuse-from"
                )
            plan[job.run_dir] = str(found)
        if starts and not plan and study.progress is not None:  # said, not left to guess
            study.progress(
                f"--reuse-from: none of the {len(starts)} runs this study starts was trained "
                "identically there; they train here"
            )
        return plan


def _protocol_rows(study: Study, steps: dict[str, float]) -> list[dict[str, Any]]:
    """The evaluation runs of a protocol study that its choices have not fixed yet: each arm
    at its recipe's LR and at its tuned one (named ``...lr(tuned)`` before tuning chooses it;
    it shares the recipe's runs where that is the best), on the seeds not reached yet, up to
    max_seeds while the pilot has not fixed n; each row says what it waits for."""
    spec = study.spec
    state: protocol.Expanded = spec.expanded
    p = state.protocol
    open_n = p.auto and state.n is None
    top = p.max_seeds if open_n else (state.n or 0) if p.auto else state.fixed_seeds
    reached = set(state.eval_seeds())
    future = [s for s in range(top) if s not in reached]
    rows = []
    for (arm, size), recipe in state.recipe.items():
        tuned = state.tuned((arm, size))
        name = state.cell(arm, size, recipe)
        cells = {name: "recipe"}
        if tuned is None:
            cells[name.removesuffix(f".lr{recipe:g}") + ".lr(tuned)"] = "tuned"
        elif not math.isclose(tuned, recipe):
            cells[state.cell(arm, size, tuned)] = "tuned"
        job = _arm(study, name)
        sec = steps.get(model_name(spec.variants[name]))
        for cell, basis in cells.items():
            for seed in future:
                run = replace(
                    job, variant=cell, seed=seed, run_dir=str(study.out.run_dir(cell, seed))
                )
                waits = ["after tuning"] if tuned is None else []
                if open_n and seed >= p.pilot_seeds:
                    waits.append("if the pilot asks for it")
                row = lm_plan.plan_row(study, run, sec)
                rows.append({**row, "waits": " and ".join(waits), "protocol": basis})
    return rows


def model_name(variant: Variant) -> str:
    """The variant whose model ``variant`` trains: a wall-clock-matched arm's baseline, a
    protocol cell's arm at its size, else itself (one step time serves them all)."""
    if variant.clock_of:
        return variant.matches or variant.name
    if variant.arm is not None:
        return variant.arm + (f".{variant.size}" if variant.size is not None else "")
    return variant.name


def _outcome(
    study: Study,
    runs: list[dict[str, Any]],
    extra: dict[str, Any],
    folders: dict[str, str],
    data: dict[str, Any],
) -> Outcome:
    """The outcome of ``runs``, with what each variant trains and on which data (study.json)."""
    spec = study.spec
    configs = resolved_configs(study, extra.get("wallclock", {}), folders, data)
    setup = {"configs": configs, "data": data}
    if spec.expanded is not None:
        rows = protocol.comparisons(spec, runs)
        tuning = set(spec.expanded.protocol.tuning_seeds)  # the cells' statistics: evaluation
        evaluated = [r for r in runs if r["seed"] not in tuning]
        setup["protocol"] = protocol.record(spec, runs, rows)
        return Outcome(list(runs), rows, variant_stats(evaluated, spec), {**extra, **setup})
    if not runs:
        return Outcome(extra={**extra, **setup})
    return Outcome(list(runs), compare(runs, spec), variant_stats(runs, spec), {**extra, **setup})


def resolved_configs(
    study: Study, budgets: dict[str, dict[str, Any]], folders: dict[str, str], data: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Each variant's model and training config as its runs train them (the seed aside: run
    ``s`` trains with seed ``s``), a wall-clock-matched one at its budget once timed, and its
    data folder (``folders``, None where unknown). The vocabulary is the data's where the runs
    take it from their data (None if that folder's provenance is not recorded)."""
    spec, out = study.spec, {}
    for name, variant in spec.variants.items():
        if variant.clock_of and name not in budgets:
            continue  # not timed yet: its iterations are not known
        folder = folders.get(name) or folders.get(variant.matches or "")
        model, train = spec.layered(variant, study.preset)
        budget = budgets.get(name, {}).get("iters")
        # a folder path that is never read: an empty one would make resolve prepare the data
        job = Job(name, 0, variant.preset, model, train, folder or "(not recorded)", "", budget)
        plan = planned(job)
        model_config = plan.model.to_dict()
        if plan.vocab_from_data:  # None: the data's, which was not recorded
            model_config["vocab_size"] = data.get(folder, {}).get("meta", {}).get("vocab_size")
        train_config = {k: v for k, v in plan.train.to_dict().items() if k != "seed"}
        out[name] = {"model": model_config, "train": train_config, "data": folder}
    return out


def _data_folder(study: Study, variant: Variant) -> str:
    """The prepared data folder a variant trains on, prepared here once (not in every worker;
    not at all for a plan)."""
    chosen = study.data if study.data is not None else study.spec.scale(study.preset).data
    if isinstance(chosen, dict):
        folder = default_data_for(chosen)
    elif chosen is not None:
        folder = Path(chosen).expanduser()
    else:
        folder = default_data_for(get_preset(variant.preset).data)
    folder = default_data_dir() if folder is None else folder  # None: the embedded corpus
    if study.planning and not is_data_folder(folder) and shipped_default(folder) is not None:
        return str(folder)
    return str(load_dataset(folder).dir)  # a shipped corpus is prepared now, once


def _jobs(study: Study, names: list[str], budgets: dict[str, int]) -> list[Job]:
    """Seed-major order: every variant of seed 0, then of seed 1, ... so an unfinished study
    already holds complete pairs; runs that finished earlier go first, so a resumed study
    reports everything it has before it trains again. A variant the study does not train
    (``--variants``) has only its finished runs here: they are reported, never trained."""
    arms = [(_arm(study, name), seeds) for name in names if (seeds := _considered(study, name))]
    jobs = [
        replace(
            arm,
            seed=seed,
            run_dir=str(study.out.run_dir(arm.variant, seed)),
            max_iters=budgets.get(arm.variant),
        )
        for seed in study.seeds
        for arm, seeds in arms
        if seed in seeds
    ]
    refuse_other_setups(jobs)
    return sorted(jobs, key=lambda job: finished_summary(job.run_dir) is None)  # stable


def _arm(study: Study, name: str) -> Job:
    """What every run of variant ``name`` shares (its preset, values and data folder), as a job
    of seed 0 without a folder."""
    variant = study.spec.variants[name]
    model, train = study.spec.layered(variant, study.preset)
    data = _data_folder(study, variant)
    return Job(name, 0, variant.preset, model, train, data, "", tracking=study.tracking)


def _budget_iters(budgets: dict[str, dict[str, Any]]) -> dict[str, int]:
    return {name: b["iters"] for name, b in budgets.items()}


def _converged_again(study: Study, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its convergence measured again from the run in this study folder (not the
    recorded run_dir: relative to where the study ran, or another study's after a copy), when
    that run is the one recorded (the same final val loss); else as recorded."""
    if row.get("status") != "ok":
        return row
    folder = study.out.run_dir(row["variant"], row["seed"])
    summary = finished_summary(folder)
    if summary is None or summary.get("final_val_loss") != row.get("val_loss"):
        return row
    return {**row, **output.convergence(folder, row["iters"])}


def _damaged_checkpoint(run: Path) -> str | None:
    """What of ``run``'s latest/ and best/ is not the file its manifest records (every file
    hashed), None when nothing is."""
    for name in (LATEST, BEST):
        if (run / name).is_dir():
            try:
                check_manifest(run / name, full=True)
            except AttnlabError as e:
                return str(e).partition(";")[0]  # the refusal's own advice is given below
    return None


def _copy_reused(study: Study, jobs: list[Job]) -> None:
    """Copy in the runs ``study.reuse`` names (``--reuse-from``) that are not here yet."""
    for job in jobs:
        donor = study.reuse.get(job.run_dir)
        if donor is None or Path(job.run_dir).exists():
            continue
        copy_run(donor, job.run_dir)
        if study.progress is not None:
            study.progress(f"{job.variant} seed {job.seed}: copied from {donor} (trained alike)")


def _considered(study: Study, name: str) -> list[int]:
    """The seeds of ``name`` the study runs or reports: all of the variant's when it trains
    it, else those whose run already finished (``--variants`` left it out)."""
    seeds = study.spec.seeds_of(name, study.preset, study.seeds)
    if study.spec.trains(name):
        return seeds
    return [s for s in seeds if finished_summary(study.out.run_dir(name, s)) is not None]


def kept_budgets(study: Study) -> dict[str, dict[str, Any]]:
    """The wall-clock budgets study.json keeps for this spec's clocked variants; refused where
    one was timed for another pair than the spec now names (its runs trained that budget)."""
    clocked = [n for n, v in study.spec.variants.items() if v.clock_of]
    kept = {k: b for k, b in study.out.previous().get("wallclock", {}).items() if k in clocked}
    for name, budget in kept.items():
        v = study.spec.variants[name]
        timed = (budget.get("baseline"), budget.get("mechanism"))
        if timed != (v.matches, v.clock_of):
            raise AttnlabError(
                f"{study.out.path}: its {name!r} budget was timed for {timed[1]!r} against "
                f"{timed[0]!r}, the spec now matches {name!r} to {v.clock_of!r} against "
                f"{v.matches!r}; choose another --out"
            )
    return kept


def wallclock_budget(study: Study, name: str) -> dict[str, Any]:
    """Iterations for the wall-clock-matched variant ``name`` (its baseline's model) that take
    as long as its mechanism's run.

    ``iters = the mechanism's iterations * step-time ratio``, the ratio timed side by side
    (``time_steps``: both arms' models as their runs train them, interleaved, with the threads a
    run gets), not taken from the runs' logged step times: those include whatever else shared
    the machine while each trained.
    """
    v = study.spec.variants[name]
    baseline, mechanism = v.matches or "", v.clock_of or ""
    pace = Pace(_arm(study, name), _arm(study, mechanism), WALLCLOCK_REPS)
    if study.progress is not None:
        study.progress(
            f"timing {mechanism} against {baseline} side by side ({pace.reps} interleaved "
            "training steps each) for the wall-clock-matched budget"
        )
    timed: list[dict[str, Any]] = []
    # as many timings at once as the study runs runs (--jobs), each with a run's threads: the
    # ratio under the study's own conditions, where its runs share the machine's cores (a
    # cluster's runs each have their own allocation: one timing job there)
    at_once = study.jobs if study.executor is None else 1
    study.run_all(time_steps, [pace] * at_once, lambda _i, r, _s: timed.append(r))
    chosen = middle_timing(timed)
    mech_iters = planned(pace.mechanism).train.max_iters
    return {
        "baseline": baseline,
        "mechanism": mechanism,
        **chosen,
        **({"concurrent": len(timed)} if len(timed) > 1 else {}),
        "iters": max(1, round(mech_iters * chosen["ratio"])),
    }


def middle_timing(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """Of timings made at once, the one of the median ratio (the lower middle of an even
    count): one timing's own step times, IQR and ratio, not a mixture of several."""
    ranked = sorted(timed, key=lambda t: t["ratio"])
    return ranked[(len(ranked) - 1) // 2]


def _mean_sps(rows: list[dict[str, Any]]) -> float:
    return sum(r["sec_per_step"] for r in rows) / len(rows)


def _finished(runs: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["variant"] == variant and r["status"] == "ok"]


def compare(runs: list[dict[str, Any]], spec: StudySpec) -> list[dict[str, Any]]:
    """Paired t-test per comparison over the seeds where both arms finished, Holm over all; the
    seed's claimed difference is its reference of the variant less that of the baseline."""
    losses = {
        (r["variant"], r["seed"]): r["val_loss"]
        for r in runs
        if r["status"] == "ok" and r.get("val_loss") is not None
    }
    rows = []
    for comp in spec.comparisons:
        seeds = sorted(s for (v, s) in losses if v == comp.variant and (comp.baseline, s) in losses)
        refs = [spec.variants[name].reference for name in (comp.variant, comp.baseline)]
        stats = paired_comparison(
            [losses[comp.variant, s] for s in seeds],
            [losses[comp.baseline, s] for s in seeds],
            claimed=refs[0] - refs[1] if None not in refs else None,
        )
        rows.append(
            {
                "baseline": comp.baseline,
                "variant": comp.variant,
                **stats,
                "reference_t": comp.reference_t,
                "seeds": seeds,
            }
        )
    for row, p in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = p
    return rows


def variant_stats(runs: list[dict[str, Any]], spec: StudySpec) -> dict[str, dict[str, Any]]:
    """Per variant: mean, std and 95 % CI of the final val loss, plus mean params and sec/step."""
    out = {}
    for name, variant in spec.variants.items():
        ok = [r for r in _finished(runs, name) if r.get("val_loss") is not None]
        out[name] = {
            **summarize([r["val_loss"] for r in ok]),
            "reference": variant.reference,
            "description": variant.description,
            "failed": sum(r["variant"] == name and r["status"] == "failed" for r in runs),
            "params": ok[0]["params"] if ok else None,
            "iters": ok[0]["iters"] if ok else None,
            "sec_per_step": _mean_sps(ok) if ok else None,
        }
    return out
