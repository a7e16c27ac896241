"""The report of a retrieval study: each table beside the paper's values (the arXiv text and the
authors' repository revision), its paired comparisons, and one figure of every table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnlab.plotting import legend_outside, pyplot, save_figure
from attnlab.studies.kinds.base import Study
from attnlab.studies.output import figure_link
from attnlab.studies.report import md_table, num, p_cell, p_value
from attnlab.studies.spec import StudySpec

FIGURE = "retrieval.png"


def sections(study: Study, record: dict[str, Any]) -> list[str]:
    lines = []
    order = list(study.spec.params.get("protocols", {}))
    for table in record["tables"]:
        cells = table["cells"]
        if not cells:
            continue
        found = dict.fromkeys(p for c in cells for p in c["protocols"])
        protocols = [p for p in order if p in found] + [p for p in found if p not in order]
        rows = []
        for m in _methods(cells):
            sources = [
                ("paper", lambda c, m=m: _acc(c["paper"].get(m), None)),
                (
                    "paper (authors' repo)",
                    lambda c, m=m: _acc(c.get("repo_paper", {}).get(m), None),
                ),
            ]
            sources += [
                (
                    f"{p} protocol",
                    lambda c, m=m, p=p: _acc(
                        c["protocols"].get(p, {}).get("accuracy", {}).get(m),
                        c["protocols"].get(p, {}).get("std", {}).get(m),
                    ),
                )
                for p in protocols
            ]
            shown = [(src, [value(c) for c in cells]) for src, value in sources]
            shown = [(src, vals) for src, vals in shown if any(v != "–" for v in vals)]
            for k, (source, values) in enumerate(shown):
                rows.append([table["rows"].get(m, m) if k == 0 else "", source, *values])
        lines += [
            f"## {table['title']}",
            "",
            "Accuracy %: the paper's value (arXiv text; then the later revision in the authors' "
            "repository, paper/main.tex, where it differs), then attnlab's mean ± std over "
            "seeds under each protocol.",
            "",
            *md_table(["method", "source", *(c["column"] for c in cells)], rows),
        ]
        if table.get("comparisons"):
            lines += _comparison_lines(table, protocols)
    if plot_retrieval(study.spec, record, study.out.figure(FIGURE)):
        lines += [
            "## Figure",
            "",
            f"![accuracy per table against the paper]({figure_link(FIGURE)})",
            "",
        ]
    return lines


def _comparison_lines(table: dict[str, Any], protocols: list[str]) -> list[str]:
    def position(c: dict[str, Any]) -> int:
        return protocols.index(c["protocol"]) if c["protocol"] in protocols else len(protocols)

    rows = [
        [
            c["protocol"],
            c["column"],
            str(c["n"]),
            f"{c['mean_diff']:+.1f} ± {c['std_diff']:.1f}",
            f"{num(c['t'], '.2f')} ({c['df']})",
            p_cell(c),
            p_value(c["p_holm"]),
            c["wins"],
        ]
        for c in sorted(table["comparisons"], key=position)
    ]
    return [
        f"Paired by seed against {table['baseline']} (`scipy.stats.ttest_rel`, "
        "Holm-corrected within each protocol); difference in accuracy points, mean ± "
        "sample std (n − 1) over seeds; wins = seeds where the column is higher.",
        "",
        *md_table(["protocol", "column", "n", "difference", "t (df)", "p", "p Holm", "wins"], rows),
    ]


def _methods(cells: list[dict[str, Any]]) -> list[str]:
    """Every method scored in any cell under any protocol, in first-seen order."""
    return list(
        dict.fromkeys(m for c in cells for p in c["protocols"].values() for m in p["accuracy"])
    )


def plot_retrieval(spec: StudySpec, record: dict[str, Any], path: Path) -> bool:
    """One panel per table: accuracy of its trained method (one-step in Table 2, else the
    table's one method) in every column, per source: the paper, the authors' repository
    revision, and each protocol as mean with a bar of one standard deviation over seeds."""
    tables = [{**t, "cells": [c for c in t["cells"] if c["protocols"]]} for t in record["tables"]]
    tables = [t for t in tables if t["cells"]]
    if not tables:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(tables), figsize=(4.6 * len(tables), 4.2), layout="constrained", squeeze=False
    )
    protocols = list(spec.params.get("protocols", {}))
    for ax, table in zip(axes[0], tables, strict=True):
        cells = table["cells"]
        methods = _methods(cells)
        method = "one-step" if "one-step" in methods else methods[-1]
        x = list(range(len(cells)))
        for k, key in enumerate(("paper", "repo_paper")):
            ys = [_nan(c.get(key, {}).get(method)) for c in cells]
            if any(math.isfinite(y) for y in ys):
                label = "paper (arXiv)" if key == "paper" else "paper (authors' repo)"
                ax.plot(x, ys, ls="none", marker="x+"[k], ms=9, color="k", label=label)
        for k, protocol in enumerate(protocols):
            got = [c["protocols"].get(protocol) for c in cells]
            mean = [_nan(g["accuracy"].get(method)) if g else math.nan for g in got]
            std = [_nan(g["std"].get(method)) if g else math.nan for g in got]
            offset = [i + (k - (len(protocols) - 1) / 2) * 0.12 for i in x]
            ax.errorbar(
                offset,
                mean,
                yerr=std,
                fmt="os"[k % 2],
                mfc="none",
                capsize=3,
                color=f"C{k}",
                label=f"attnlab, {protocol} protocol (mean ± std)",
            )
        ax.set_xticks(x, [c["column"] for c in cells], rotation=30, ha="right", fontsize=8)
        ax.set(
            ylabel=f"{table['rows'].get(method, method)}: accuracy (%)",
            title=table["title"].split(":")[0],
        )
        ax.grid(alpha=0.3)
    fig.suptitle(f"{spec.name}: attnlab against the paper")
    legend_outside(fig, list(axes[0]), ncol=2)
    save_figure(fig, path)
    return True


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _acc(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "–"
    return f"{mean:.1f}" + ("" if std is None or not math.isfinite(std) else f" ± {std:.1f}")
