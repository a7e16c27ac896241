"""Retrieval studies: accuracy of each method on the synthetic pattern-retrieval task (no
language-model training), one table cell per column of the spec's ``params.tables``, under every
protocol of ``params.protocols``; mean and std over seeds, and paired t-tests of every column
against a table's baseline column.

A cell that an earlier invocation scored with the same settings keeps its per-seed results
(seed ``s`` is always the ``s``-th), so a rerun computes nothing and more seeds compute only the
new ones.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

from attnlab.analysis.retrieval import LOSSES, METHODS, PROTOCOLS, check_memory, run_retrieval
from attnlab.errors import AttnlabError
from attnlab.model.mechanisms.boost_gates import GATE_KINDS
from attnlab.studies.jobs import Cell, score_cell
from attnlab.studies.kinds import retrieval_report
from attnlab.studies.kinds.base import Outcome, Study, TrainsNoRuns
from attnlab.studies.progress import Tracker
from attnlab.studies.spec import (
    FINITE,
    LABEL,
    POSITIVE,
    TABLE,
    StudySpec,
    check_table,
    list_of,
    one_of,
    whole_number,
)
from attnlab.studies.stats import holm, paired_comparison, summarize

_ARGUMENTS = inspect.signature(run_retrieval).parameters
# run_retrieval's keywords as a spec gives them (``seed`` and ``protocol`` are the study's): a
# cell's arguments (a table's ``defaults``, then the cell's ``args``) and a protocol's settings
# (the preset's ``queries`` and ``steps``, then the protocol's table)
_ARGS = {
    "d": whole_number(1),
    "patterns": whole_number(2),
    "sigma": POSITIVE,
    "methods": list_of(one_of(METHODS)),
    "rounds": whole_number(1),
    "gate": one_of(GATE_KINDS),
}
_SETTINGS = {"queries": whole_number(1), "steps": whole_number(1), "loss": one_of(LOSSES)}
_SIZES = {k: _SETTINGS[k] for k in ("queries", "steps")}  # what a preset's params may set
_DEFAULTS = {k: p.default for k, p in _ARGUMENTS.items() if p.default is not p.empty}
_PARAMS = {"tables": list_of(TABLE), "protocols": TABLE}
_TABLE = {
    "title": LABEL,
    "defaults": TABLE,
    "rows": TABLE,
    "cells": list_of(TABLE),
    "baseline": LABEL,
}
_CELL = {"column": LABEL, "args": TABLE, "paper": TABLE, "repo_paper": TABLE}
_ROWS = dict.fromkeys(METHODS, LABEL)  # a method's row label in the report
_SCORES = dict.fromkeys(METHODS, FINITE)  # a published accuracy (%) of a method


class Retrieval(TrainsNoRuns):
    """Table cells per protocol, paired against each table's baseline column."""

    def check(self, spec: StudySpec, preset: str) -> None:
        """The tables, protocols and sizes, and every cell's arguments and memory as
        run_retrieval takes them: a wrong value fails here, not once the study folder (and a
        report of no cells) is written."""
        src = spec.source
        check_table(spec.params, _PARAMS, f"{src} params", "params", ("tables",))
        check_table(spec.scale(preset).params, _SIZES, f"{src} scale {preset} params", "params")
        for name, settings in spec.params.get("protocols", {}).items():
            if name not in PROTOCOLS:
                raise AttnlabError(
                    f"{src} params.protocols: unknown protocol {name!r}; "
                    f"choose from {', '.join(PROTOCOLS)}"
                )
            check_table(settings, _SETTINGS, f"{src} protocol {name}", "protocol")
        titles: set[str] = set()
        for table in spec.params.get("tables", []):
            check_table(table, _TABLE, f"{src} params.tables", "table", ("title", "cells"))
            _check_table(table, f"{src} table {table['title']!r}")
            if table["title"] in titles:  # cells are found again by title and column
                raise AttnlabError(f"{src}: table {table['title']!r} is listed twice")
            titles.add(table["title"])
        for cell in _layout(spec, preset, ())[1]:
            a = {**_DEFAULTS, **cell.args, **cell.settings}  # as score_cell calls run_retrieval
            where = f"{src} table {cell.table!r} column {cell.column!r}"
            missing = [k for k in _ARGUMENTS if k not in a]
            if missing:
                raise AttnlabError(f"{where}: needs {missing[0]} (in its args or the defaults)")
            try:
                check_memory(
                    a["d"], a["patterns"], a["methods"], a["rounds"], a["queries"], cell.protocol
                )
            except AttnlabError as e:
                raise AttnlabError(f"{where} ({cell.protocol}): {e}") from None

    def run(self, study: Study) -> Outcome:
        """Every cell not scored before, ``study.jobs`` at a time; publish after each cell."""
        seeds = study.seeds
        tables, cells, slots = _layout(study.spec, study.preset, tuple(seeds))
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
        study.run_all(
            score_cell,
            [cells[k] for k in todo],
            lambda i, per_seed, seconds: record(todo[i], per_seed, seconds, cached=False),
        )
        return outcome()

    def rebuild(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> Outcome:
        """The comparisons again from the recorded per-seed scores of every cell."""
        return Outcome(extra={"tables": with_comparisons(record.get("tables", []))})

    def sections(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
        return retrieval_report.sections(study, record)


def _check_table(table: dict[str, Any], where: str) -> None:
    """One of ``params.tables``: its defaults, row labels and cells (each column once), and a
    baseline that is one of its columns."""
    check_table(table.get("defaults", {}), _ARGS, f"{where} defaults", "cell argument")
    check_table(table.get("rows", {}), _ROWS, f"{where} rows", "method")
    columns: set[str] = set()
    for cell in table["cells"]:
        check_table(cell, _CELL, f"{where} cells", "cell", ("column",))
        at = f"{where} column {cell['column']!r}"
        if cell["column"] in columns:  # its results would be taken for the first one's
            raise AttnlabError(f"{where}: column {cell['column']!r} is listed twice")
        columns.add(cell["column"])
        check_table(cell.get("args", {}), _ARGS, f"{at} args", "cell argument")
        for source in ("paper", "repo_paper"):
            check_table(cell.get(source, {}), _SCORES, f"{at} {source}", "method")
    if "baseline" in table and table["baseline"] not in columns:
        raise AttnlabError(
            f"{where}: baseline {table['baseline']!r} is not one of its columns "
            f"({', '.join(sorted(columns))})"
        )


def _layout(
    spec: StudySpec, preset: str, seeds: tuple[int, ...]
) -> tuple[list[dict[str, Any]], list[Cell], list[dict[str, Any]]]:
    """The tables of study.json (their cells' ``protocols`` still empty), every cell to score
    for ``seeds`` and, for each cell, the ``protocols`` slot of its table column where its
    result goes."""
    scale = spec.scale(preset).params
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
