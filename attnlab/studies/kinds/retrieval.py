"""Retrieval studies: accuracy of each method on the synthetic pattern-retrieval task (no
language-model training), one table cell per column of the spec's ``params.tables``, under every
protocol of ``params.protocols``; mean and std over seeds, and paired t-tests of every column
against a table's baseline column.

A cell that an earlier invocation scored with the same settings keeps its per-seed results
(seed ``s`` is always the ``s``-th), so a rerun computes nothing and more seeds compute only the
new ones.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnlab.studies.jobs import Cell, run_all, score_cell
from attnlab.studies.kinds import retrieval_report
from attnlab.studies.kinds.base import Outcome, Study, TrainsNoRuns
from attnlab.studies.progress import Tracker
from attnlab.studies.spec import StudySpec
from attnlab.studies.stats import holm, paired_comparison, summarize


class Retrieval(TrainsNoRuns):
    """Table cells per protocol, paired against each table's baseline column."""

    def check(self, spec: StudySpec, preset: str) -> None:
        """Nothing beyond what reading the spec already checked."""

    def run(self, study: Study) -> Outcome:
        """Every cell not scored before, ``study.jobs`` at a time; publish after each cell."""
        seeds = study.seeds
        tables, cells, slots = _layout(study)
        earlier = {
            (t["title"], c["column"], name): entry
            for t in study.out.previous().get("tables", [])
            for c in t.get("cells", [])
            for name, entry in c.get("protocols", {}).items()
        }
        tracker = Tracker(len(cells), study.progress)

        def outcome() -> Outcome:
            return Outcome(extra={"tables": with_comparisons(tables)})

        def record(k: int, per_seed: list[dict[str, float]], seconds: float, cached: bool) -> None:
            cell = cells[k]
            stats = {m: summarize([r[m] for r in per_seed]) for m in cell.args["methods"]}
            slots[k][cell.protocol] = {
                "settings": cell.settings,
                "accuracy": {m: st["mean"] for m, st in stats.items()},
                "std": {m: st["std"] for m, st in stats.items()},
                "per_seed": per_seed,
            }
            if not cached:
                study.publish(outcome())
            result = ", ".join(f"{m} {st['mean']:.1f} %" for m, st in stats.items())
            where = f"{cell.table.split(':')[0]} {cell.column} ({cell.protocol})"
            tracker.done(where, result, seconds, cached)

        todo = []
        for k, cell in enumerate(cells):
            old = earlier.get((cell.table, cell.column, cell.protocol))
            known = old["per_seed"] if old and old.get("settings") == cell.settings else []
            if len(known) >= len(seeds):  # seed s is always the s-th entry
                record(k, known[: len(seeds)], 0.0, cached=True)
            else:
                cells[k] = replace(cell, known=tuple(known))
                todo.append(k)
        # study.json is where scored cells live: never rewrite it with fewer than were found
        study.publish(outcome())
        run_all(
            score_cell,
            [cells[k] for k in todo],
            study.jobs,
            lambda i, per_seed, seconds: record(todo[i], per_seed, seconds, cached=False),
        )
        return outcome()

    def rebuild(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> Outcome:
        """The comparisons again from the recorded per-seed scores of every cell."""
        return Outcome(extra={"tables": with_comparisons(record.get("tables", []))})

    def sections(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
        return retrieval_report.sections(study, record)


def _layout(study: Study) -> tuple[list[dict[str, Any]], list[Cell], list[dict[str, Any]]]:
    """The tables of study.json (their cells' ``protocols`` still empty), every cell to score
    and, for each cell, the ``protocols`` slot of its table column where its result goes."""
    spec = study.spec
    scale = spec.scale(study.preset).params
    protocols: dict[str, dict[str, Any]] = spec.params.get("protocols", {"attnlab": {}})
    base = dict(queries=scale.get("queries", 5000), steps=scale.get("steps", 150))
    tables, cells, slots = [], [], []
    for table in spec.params.get("tables", []):
        rows: list[dict[str, Any]] = []
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
                settings = {**base, **extra}
                seeds = tuple(study.seeds)
                cells.append(Cell(table["title"], row["column"], protocol, args, settings, seeds))
                slots.append(row["protocols"])
    return tables, cells, slots


def with_comparisons(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
                        **{k: stats[k] for k in ("n", "t", "df", "p", "mean_diff", "no_spread")},
                        "std_diff": summarize([x - y for x, y in zip(v, b, strict=True)])["std"],
                        "wins": f"{sum(x > y for x, y in zip(v, b, strict=True))}/{len(v)}",
                    }
                )
            for row, p in zip(rows, holm([r["p"] for r in rows]), strict=True):
                row["p_holm"] = p
            comparisons += rows
        out.append({**table, "comparisons": comparisons})
    return out
