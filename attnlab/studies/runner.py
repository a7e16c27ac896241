"""Run a study: every (variant, seed) training run, wall-clock matching, statistics, report.

Runs live in ``OUT/runs/<variant>/seed<s>``. A run whose ``summary.json`` exists is not
retrained; one with a ``latest/`` checkpoint but no summary is resumed; a run that raises is
recorded as failed (its error in ``results.json``) and the others go on. Seed ``s`` is the
training seed of every variant, so paired runs see the same initial stream and the same batches.
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis import entropy, gates, names, per_position
from attnlab.analysis.inputs import load_baseline, load_inputs
from attnlab.analysis.retrieval import run_retrieval
from attnlab.bench import overhead
from attnlab.data.prepare import load_dataset
from attnlab.errors import AttnlabError
from attnlab.fsutil import write_json
from attnlab.presets import get_preset
from attnlab.rundir import RunDir, finished_summary
from attnlab.studies.report import write_report
from attnlab.studies.spec import StudySpec, Variant
from attnlab.studies.stats import holm, paired_comparison, summarize
from attnlab.train import checkpoint as ckpt
from attnlab.train.environment import environment
from attnlab.train.spec import as_overrides, default_data_for, resolve
from attnlab.train.trainer import Trainer

RUN_FIELDS = (
    "variant",
    "seed",
    "val_loss",
    "iters",
    "wall_s",
    "status",
    "sec_per_step",
    "best_val_loss",
    "params",
    "error",
    "run_dir",
)

# Receives one human-readable line per finished run or table cell (the CLI passes print).
Progress = Callable[[str], None]


def run_dir_for(out: Path, variant: str, seed: int) -> Path:
    return out / "runs" / variant / f"seed{seed}"


@dataclass(frozen=True)
class Job:
    """One training run of a study: a variant's preset and overrides, one seed, one folder."""

    variant: str
    seed: int
    preset: str
    model: dict[str, Any]
    train: dict[str, Any]
    data: str
    run_dir: str
    max_iters: int | None = None  # the wall-clock-matched budget; the schedule stretches with it


class Tracker:
    """Counts finished units of work and reports each as one line with what is left and an ETA.

    The ETA averages the units actually computed in this invocation (not ones found finished)
    and divides by how many run at a time.
    """

    def __init__(self, total: int, progress: Progress | None, parallel: int = 1) -> None:
        self.total, self.progress, self.parallel = total, progress, parallel
        self.finished = self.computed = 0
        self.seconds = 0.0

    def done(self, what: str, result: str, seconds: float, cached: bool = False) -> None:
        self.finished += 1
        if not cached:
            self.computed += 1
            self.seconds += seconds
        if self.progress is None:
            return
        left = self.total - self.finished
        eta = ""
        if left and self.computed:
            eta = f", ETA {_duration(self.seconds / self.computed * left / self.parallel)}"
        took = "finished earlier" if cached else f"{_duration(seconds)}"
        self.progress(f"[{self.finished}/{self.total}] {what}: {result} ({took}); {left} left{eta}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


# --- one training run (also the worker of the process pool) -----------------------------------
def train_one(job: Job, threads: int | None = None) -> dict[str, Any]:
    """Train (or skip, or resume) one run; never raises: failures come back as status "failed".

    A run with a ``latest/`` checkpoint but no summary resumes from that checkpoint, so a study
    stopped in the middle of a run loses at most the steps since the last checkpoint.
    """
    run_dir = Path(job.run_dir)
    row: dict[str, Any] = {"variant": job.variant, "seed": job.seed, "run_dir": str(run_dir)}
    t0 = time.perf_counter()
    try:
        summary = finished_summary(run_dir)
        if summary is not None:
            return {**row, **_summary_fields(summary), "status": "ok", "skipped": True}
        if threads is not None:
            torch.set_num_threads(threads)
        if ckpt.checkpoint_dir(RunDir(run_dir).latest) is not None:
            trainer = Trainer.resume(run_dir, quiet=True)
        else:
            trainer = _new_trainer(job, run_dir)
        try:
            summary = trainer.run()
        finally:
            trainer.close()
        return {
            **row,
            **_summary_fields(summary),
            "status": "ok",
            "skipped": False,
            "seconds": time.perf_counter() - t0,
        }
    except Exception as e:  # a broken variant must not stop the study
        return {
            **row,
            "status": "failed",
            "error": f"{type(e).__name__}: {e}",
            "skipped": False,
            "seconds": time.perf_counter() - t0,
        }


def _new_trainer(job: Job, run_dir: Path) -> Trainer:
    spec = resolve(job.preset, None, as_overrides(job.model) + as_overrides(job.train), job.data)
    train = spec.train.replace(
        seed=job.seed, extra={**spec.train.extra, "study_variant": job.variant}
    )
    if job.max_iters:
        decay = train.lr_decay_iters
        train = train.replace(
            max_iters=job.max_iters,
            lr_decay_iters=None if decay in (None, train.max_iters) else decay,
        )
    return Trainer.start(
        run_dir, spec.model, train, spec.data_dir, vocab_from_data=spec.vocab_from_data, quiet=True
    )


def _summary_fields(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "val_loss": summary.get("final_val_loss"),
        "best_val_loss": summary.get("best_val_loss"),
        "iters": summary.get("iters"),
        "wall_s": summary.get("train_seconds"),
        "sec_per_step": summary.get("sec_per_step"),
        "params": summary.get("params"),
    }


def execute(
    jobs: list[Job], n_jobs: int = 1, on_done: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Run ``jobs`` (in ``n_jobs`` spawned processes, torch threads split between them).

    ``on_done`` sees each result as it finishes; the returned list is in job order.
    """
    results: list[dict[str, Any] | None] = [None] * len(jobs)

    def finish(i: int, result: dict[str, Any]) -> None:
        results[i] = result
        if on_done is not None:
            on_done(result)

    if n_jobs <= 1:
        for i, job in enumerate(jobs):
            finish(i, train_one(job))
    else:
        threads = max(1, (os.cpu_count() or 1) // n_jobs)
        with ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(train_one, job, threads): i for i, job in enumerate(jobs)}
            for future in as_completed(futures):
                finish(futures[future], future.result())
    return [r for r in results if r is not None]


# --- language-model studies --------------------------------------------------------------------
def _data_folder(spec: StudySpec, variant: Variant, preset: str, data: str | Path | None) -> str:
    """The prepared data folder a variant trains on, prepared here once (not in every worker)."""
    chosen = data if data is not None else spec.scale(preset).data
    if isinstance(chosen, dict):
        folder = default_data_for(chosen)
    elif chosen is not None:
        folder = Path(chosen).expanduser()
    else:
        folder = default_data_for(get_preset(variant.preset).data)
    return str(folder if folder is not None else load_dataset(None).dir)


def _jobs(
    spec: StudySpec,
    preset: str,
    out: Path,
    seeds: list[int],
    names: list[str],
    data: str | Path | None,
    budgets: dict[str, int],
) -> list[Job]:
    """Seed-major order: every variant of seed 0, then of seed 1, ... so an unfinished study
    already holds complete pairs."""
    arms = []
    for name in names:
        variant = spec.variants[name]
        model, train = spec.layered(variant, preset)
        arms.append((name, variant.preset, model, train, _data_folder(spec, variant, preset, data)))
    return [
        Job(
            name,
            seed,
            variant_preset,
            model,
            train,
            folder,
            str(run_dir_for(out, name, seed)),
            budgets.get(name),
        )
        for seed in seeds
        for name, variant_preset, model, train, folder in arms
    ]


def wallclock_budget(
    runs: list[dict[str, Any]], baseline: str, mechanism: str
) -> dict[str, Any] | None:
    """Iterations for ``baseline`` that take as long as ``mechanism``'s runs (means over seeds).

    ``iters = baseline iters * mechanism sec/step / baseline sec/step``; None when either arm
    has no finished run to time.
    """

    def ok(name: str) -> list[dict[str, Any]]:
        return [
            r
            for r in runs
            if r["variant"] == name and r["status"] == "ok" and r.get("sec_per_step")
        ]

    base, mech = ok(baseline), ok(mechanism)
    if not base or not mech:
        return None
    base_sps = sum(r["sec_per_step"] for r in base) / len(base)
    mech_sps = sum(r["sec_per_step"] for r in mech) / len(mech)
    mech_iters = sum(r["iters"] for r in mech) / len(mech)
    iters = max(1, round(mech_iters * mech_sps / base_sps))
    return {
        "baseline": baseline,
        "mechanism": mechanism,
        "baseline_sec_per_step": base_sps,
        "mechanism_sec_per_step": mech_sps,
        "ratio": mech_sps / base_sps,
        "iters": iters,
    }


def compare(runs: list[dict[str, Any]], spec: StudySpec) -> list[dict[str, Any]]:
    """Paired t-test per comparison over the seeds where both arms finished, Holm over all."""
    losses = {
        (r["variant"], r["seed"]): r["val_loss"]
        for r in runs
        if r["status"] == "ok" and r.get("val_loss") is not None
    }
    rows = []
    for comp in spec.comparisons:
        seeds = sorted(s for (v, s) in losses if v == comp.variant and (comp.baseline, s) in losses)
        stats = paired_comparison(
            [losses[comp.variant, s] for s in seeds], [losses[comp.baseline, s] for s in seeds]
        )
        rows.append({"baseline": comp.baseline, "variant": comp.variant, **stats, "seeds": seeds})
    for row, p in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = p
    return rows


def variant_stats(runs: list[dict[str, Any]], spec: StudySpec) -> dict[str, dict[str, Any]]:
    """Per variant: mean, std and 95 % CI of the final val loss, plus mean params and sec/step."""
    out = {}
    for name, variant in spec.variants.items():
        ok = [
            r
            for r in runs
            if r["variant"] == name and r["status"] == "ok" and r.get("val_loss") is not None
        ]
        out[name] = {
            **summarize([r["val_loss"] for r in ok]),
            "reference": variant.reference,
            "description": variant.description,
            "failed": sum(r["variant"] == name and r["status"] == "failed" for r in runs),
            "params": ok[0]["params"] if ok else None,
            "iters": ok[0]["iters"] if ok else None,
            "sec_per_step": (sum(r["sec_per_step"] for r in ok) / len(ok)) if ok else None,
        }
    return out


def _run_lm(
    spec: StudySpec,
    preset: str,
    out: Path,
    seeds: list[int],
    n_jobs: int,
    data: str | Path | None,
    publish: Callable[[list[dict[str, Any]], dict[str, Any]], None],
    progress: Progress | None,
) -> dict[str, Any]:
    """Every run, then the wall-clock-matched ones; ``publish`` after each finished run.

    A wall-clock budget, once computed, is kept in study.json and reused when the study is
    resumed, so every seed of a wall-clock-matched variant trains for the same iterations.
    """
    clocked = [n for n, v in spec.variants.items() if v.clock_of]
    first = [n for n in spec.variants if n not in clocked]
    tracker = Tracker(len(seeds) * len(spec.variants), progress, parallel=n_jobs)
    runs: list[dict[str, Any]] = []
    budgets: dict[str, dict[str, Any]] = {
        k: b for k, b in _previous(out).get("wallclock", {}).items() if k in clocked
    }

    def on_done(row: dict[str, Any]) -> None:
        runs.append(row)
        if row["status"] == "ok":
            result = f"val loss {row['val_loss']:.4f} after {row['iters']} iters"
        else:
            result = f"FAILED {row.get('error', '')}"
        publish(runs, {"wallclock": budgets})
        tracker.done(
            f"{row['variant']} seed {row['seed']}", result, row.get("seconds", 0), row["skipped"]
        )

    execute(_jobs(spec, preset, out, seeds, first, data, {}), n_jobs, on_done)
    for name in clocked:
        v = spec.variants[name]
        if name not in budgets:
            budget = wallclock_budget(runs, v.matches or "", v.clock_of or "")
            if budget is not None:
                budgets[name] = budget
    iters = {k: b["iters"] for k, b in budgets.items()}
    execute(_jobs(spec, preset, out, seeds, list(budgets), data, iters), n_jobs, on_done)
    for name in clocked:
        if name not in budgets:
            runs += [
                {
                    "variant": name,
                    "seed": s,
                    "status": "failed",
                    "run_dir": str(run_dir_for(out, name, s)),
                    "error": "no finished runs to time the wall-clock budget from",
                }
                for s in seeds
            ]
    return {"runs": runs, "wallclock": budgets}


def _previous(out: Path) -> dict[str, Any]:
    """study.json of an earlier invocation in ``out`` ({} if none or unreadable)."""
    try:
        return json.loads((out / "study.json").read_text())
    except (OSError, ValueError):
        return {}


# --- the study's own analyses of its seed-0 runs ----------------------------------------------
def run_analyses(
    spec: StudySpec, preset: str, out: Path, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per-position losses, the name test, gates and entropy, as the spec's ``params.analyses`` asks.

    Each reads the runs of the first seed; an analysis that cannot run (a failed run, a module
    missing from this build) is reported with its reason instead of stopping the study.
    """
    wanted = spec.params.get("analyses", {})
    sizes = spec.scale(preset).params
    seed = min((r["seed"] for r in runs), default=0)
    done = {r["variant"]: r["run_dir"] for r in runs if r["seed"] == seed and r["status"] == "ok"}
    results: dict[str, Any] = {}
    for name, opts in wanted.items():
        try:
            missing = [v for v in opts["runs"] if v not in done]
            if missing:
                raise AttnlabError(f"no finished seed-{seed} run of {', '.join(missing)}")
            results[name] = {
                "runs": opts["runs"],
                "seed": seed,
                **_ANALYSES[name]([done[v] for v in opts["runs"]], sizes, out),
            }
        except Exception as e:  # an analysis is an extra; the statistics stand without it
            results[name] = {"runs": opts.get("runs"), "error": f"{type(e).__name__}: {e}"}
    return results


def _per_position(runs: list[str], sizes: dict[str, Any], out: Path) -> dict[str, Any]:
    cmp = per_position.compare(runs[0], runs[1], max_tokens=sizes.get("per_position_tokens"))
    groups = per_position.groupings(cmp)
    figure = out / "figures" / "per_position.png"
    per_position.plot(groups, figure, _run_label(runs[0]), _run_label(runs[1]))
    return {
        "figure": "figures/per_position.png",
        "by_region": groups["by_region"],
        "top": per_position.top_positions(cmp, 10),
    }


def _names(runs: list[str], sizes: dict[str, Any], out: Path) -> dict[str, Any]:
    report = names.name_test(
        runs, samples=sizes.get("name_samples", 30), length=sizes.get("name_length", 2000)
    )
    names.plot(report, out / "figures" / "names.png")
    return {
        "figure": "figures/names.png",
        "cast_size": report["cast_size"],
        "scores": list(report["runs"].values()),
    }


def _gates(runs: list[str], sizes: dict[str, Any], out: Path) -> dict[str, Any]:
    inputs = load_inputs(runs[0], None, sizes.get("analysis_sequences", 50))
    means = gates.gate_means(inputs.model, inputs.x)
    gates.plot(means, out / "figures" / "gates.png", _run_label(runs[0]))
    return {
        "figure": "figures/gates.png",
        "layers": [
            {"layer": i, "mean": float(m.mean()), "std": float(m.std())}
            for i, m in enumerate(means)
        ],
    }


def _entropy(runs: list[str], sizes: dict[str, Any], out: Path) -> dict[str, Any]:
    inputs = load_inputs(runs[1], None, sizes.get("analysis_sequences", 50))
    sources = {"standard": entropy.entropies(load_baseline(runs[0], inputs.model), inputs.x)[0]}
    for m, ent in enumerate(entropy.entropies(inputs.model, inputs.x)):
        sources[f"round{m}"] = ent
    entropy.plot(
        sources, out / "figures" / "entropy.png", f"{_run_label(runs[1])} vs {_run_label(runs[0])}"
    )
    return {
        "figure": "figures/entropy.png",
        "rows": [r for r in entropy.summary_rows(sources) if r["layer"] == "all"],
    }


def _run_label(run_dir: str) -> str:
    """``OUT/runs/<variant>/seed<s>`` as "<variant> seed <s>" for figure titles."""
    path = Path(run_dir)
    return f"{path.parent.name} seed {path.name.removeprefix('seed')}"


_ANALYSES = {"per_position": _per_position, "names": _names, "gates": _gates, "entropy": _entropy}


# --- retrieval and overhead studies ------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One retrieval table cell under one protocol: its arguments, settings and seeds."""

    table: str
    column: str
    protocol: str
    args: dict[str, Any]
    settings: dict[str, Any]
    seeds: tuple[int, ...]
    known: tuple[dict[str, float], ...] = ()  # results of the first seeds, from an earlier run


def score_cell(cell: Cell, threads: int | None = None) -> list[dict[str, float]]:
    """Accuracy of every method of ``cell`` for each seed, reusing ``cell.known`` for the
    first seeds (also the worker of the pool)."""
    if threads is not None:
        torch.set_num_threads(threads)
    a = cell.args
    return [*cell.known] + [
        run_retrieval(
            a["d"],
            a["patterns"],
            a["sigma"],
            a["methods"],
            rounds=a.get("rounds", 2),
            gate=a.get("gate", "mlp"),
            seed=s,
            protocol=cell.protocol,
            **cell.settings,
        )
        for s in cell.seeds[len(cell.known) :]
    ]


def _run_retrieval(
    spec: StudySpec,
    preset: str,
    out: Path,
    seeds: list[int],
    n_jobs: int,
    publish: Callable[[list[dict[str, Any]], dict[str, Any]], None],
    progress: Progress | None,
) -> dict[str, Any]:
    """Every table cell under every protocol of ``params.protocols``: accuracy per seed, mean
    and std over seeds. Cells an earlier invocation scored with the same settings and seeds
    are kept; ``publish`` after each cell; ``n_jobs`` cells at a time in spawned processes."""
    scale = spec.scale(preset).params
    protocols: dict[str, dict[str, Any]] = spec.params.get("protocols", {"attnlab": {}})
    base = dict(queries=scale.get("queries", 5000), steps=scale.get("steps", 150))
    earlier = {
        (t["title"], c["column"], name): entry
        for t in _previous(out).get("tables", [])
        for c in t.get("cells", [])
        for name, entry in c.get("protocols", {}).items()
    }
    tables, cells, slots = [], [], []
    for table in spec.params.get("tables", []):
        rows = []
        tables.append(
            {
                "title": table["title"],
                "rows": table.get("rows", {}),
                "cells": rows,
                "baseline": table.get("baseline"),
            }
        )
        for spec_cell in table["cells"]:
            args = {**table.get("defaults", {}), **spec_cell.get("args", {})}
            row = {"column": spec_cell["column"], "args": args, "protocols": {}}
            row["paper"] = spec_cell.get("paper", {})
            row["repo_paper"] = spec_cell.get("repo_paper", {})
            rows.append(row)
            for protocol, extra in protocols.items():
                cell = Cell(
                    table["title"],
                    spec_cell["column"],
                    protocol,
                    args,
                    {**base, **extra},
                    tuple(seeds),
                )
                cells.append(cell)
                slots.append(row["protocols"])
    tracker = Tracker(len(cells), progress)

    def record(
        k: int, per_seed: list[dict[str, float]], seconds: float, cached: bool, now: bool = True
    ) -> None:
        cell = cells[k]
        stats = {m: summarize([r[m] for r in per_seed]) for m in cell.args["methods"]}
        slots[k][cell.protocol] = {
            "settings": cell.settings,
            "accuracy": {m: st["mean"] for m, st in stats.items()},
            "std": {m: st["std"] for m, st in stats.items()},
            "per_seed": per_seed,
        }
        if now:
            publish([], {"tables": _with_comparisons(tables)})
        result = ", ".join(f"{m} {st['mean']:.1f} %" for m, st in stats.items())
        where = f"{cell.table.split(':')[0]} {cell.column} ({cell.protocol})"
        tracker.done(where, result, seconds, cached)

    todo = []
    for k, cell in enumerate(cells):
        old = earlier.get((cell.table, cell.column, cell.protocol))
        known = old["per_seed"] if old and old.get("settings") == cell.settings else []
        if len(known) >= len(seeds):  # seed s is always the s-th entry
            record(k, known[: len(seeds)], 0.0, True, now=False)
        else:
            cells[k] = replace(cell, known=tuple(known))
            todo.append(k)
    # study.json is where scored cells live: never rewrite it with fewer than were found
    publish([], {"tables": _with_comparisons(tables)})
    if n_jobs <= 1:
        for k in todo:
            t0 = time.perf_counter()
            record(k, score_cell(cells[k]), time.perf_counter() - t0, False)
    else:
        threads = max(1, (os.cpu_count() or 1) // n_jobs)
        with ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            started = {pool.submit(score_cell, cells[k], threads): k for k in todo}
            t0 = time.perf_counter()
            for future in as_completed(started):
                # wall time since the previous finish: with n_jobs cells in flight, the ETA
                # from these is the study's, not one cell's
                now = time.perf_counter()
                record(started[future], future.result(), now - t0, False)
                t0 = now
    return {"tables": _with_comparisons(tables)}


def _with_comparisons(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each table with a ``baseline`` column gets paired t-tests (over seeds) of its single
    trained method in every other column against that column, per protocol, Holm-corrected
    within the table and protocol. Higher accuracy is better: ``mean_diff`` is column minus
    baseline and ``wins`` counts seeds where the column is higher."""
    out = []
    for table in tables:
        comparisons: list[dict[str, Any]] = []
        base = next((c for c in table["cells"] if c["column"] == table.get("baseline")), None)
        for protocol, base_scores in (base or {}).get("protocols", {}).items():
            method = next(iter(base_scores["accuracy"]))
            b = [r[method] for r in base_scores["per_seed"]]
            rows = []
            for cell in table["cells"]:
                got = cell["protocols"].get(protocol)
                if cell is base or got is None or method not in got["accuracy"]:
                    continue
                v = [r[method] for r in got["per_seed"]]
                stats = paired_comparison(v, b)
                rows.append(
                    {
                        "protocol": protocol,
                        "method": method,
                        "column": cell["column"],
                        "baseline": base["column"],
                        **{k: stats[k] for k in ("n", "t", "df", "p", "mean_diff")},
                        "std_diff": summarize([x - y for x, y in zip(v, b, strict=True)])["std"],
                        "wins": f"{sum(x > y for x, y in zip(v, b, strict=True))}/{len(v)}",
                    }
                )
            for row, p in zip(rows, holm([r["p"] for r in rows]), strict=True):
                row["p_holm"] = p
            comparisons += rows
        out.append({**table, "comparisons": comparisons})
    return out


def _run_overhead(spec: StudySpec, preset: str, out: Path) -> dict[str, Any]:
    """The kv-bias seed's Figure 2 through `attnlab bench overhead`'s interleaved timer."""
    opts = {**spec.params, **spec.scale(preset).params}
    rows, missing = overhead.measure(**opts)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    title = (
        f"{opts.get('layers', 6)} layers, batch {opts.get('batch', 8)}, block {opts.get('block', 256)}, "
        f"{opts.get('reps', 5)} interleaved reps"
    )
    overhead.plot(rows, str(out / "figures" / "overhead.png"), title)
    return {
        "overhead": [asdict(r) for r in rows],
        "overhead_table": overhead.table(rows),
        "unavailable": missing,
    }


# --- the study ---------------------------------------------------------------------------------
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
) -> dict[str, Any]:
    """Run (or finish) the study in ``out``; write results.json, results.csv, study.json, report.md.

    The four files are rewritten after every finished run or table cell, so an interrupted
    study shows what it has. ``variants`` restricts an LM study to those arms (and the
    comparisons between them); ``command`` is recorded at the top of the report.
    """
    if variants:
        spec = spec.select(variants)
    scale = spec.scale(preset)
    n_seeds = seeds if seeds is not None else scale.seeds
    if n_seeds < 1 or jobs < 1:
        raise AttnlabError(f"--seeds and --jobs must be >= 1 (got {n_seeds} and {jobs})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed_list = list(range(n_seeds))
    t0 = time.perf_counter()
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
        "git_commit": environment(torch.device("cpu"))["git_commit"],
    }

    def publish(runs: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
        results = {
            "runs": [{k: r.get(k) for k in RUN_FIELDS} for r in runs],
            "comparisons": compare(runs, spec) if runs else [],
        }
        _write_json(out / "results.json", results)
        _write_csv(out / "results.csv", results["runs"])
        study = {
            **header,
            "elapsed_s": time.perf_counter() - t0,
            "retrained": sum(not r.get("skipped", True) for r in runs),
            "variants": variant_stats(runs, spec) if runs else {},
            **extra,
        }
        _write_json(out / "study.json", study)
        write_report(out, spec, preset, results, study)
        return {**results, "study": study}

    runs: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if spec.kind == "lm":
        result = _run_lm(spec, preset, out, seed_list, jobs, data, publish, progress)
        runs, extra["wallclock"] = result["runs"], result["wallclock"]
        extra["analyses"] = run_analyses(spec, preset, out, runs)
    elif spec.kind == "retrieval":
        extra.update(_run_retrieval(spec, preset, out, seed_list, jobs, publish, progress))
    else:
        extra.update(_run_overhead(spec, preset, out))
    return publish(runs, extra)


def _write_json(path: Path, data: Any) -> None:
    # NaN (t and p of a single pair) becomes null, so the file is strict JSON
    write_json(path, _nan_to_none(data))


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x


def _write_csv(path: Path, runs: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RUN_FIELDS)
        writer.writeheader()
        writer.writerows(runs)
    tmp.replace(path)
