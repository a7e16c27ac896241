"""report.md for a finished study: tables, statistics and PNG figures embedded by relative path."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from attnlab.plotting import legend_outside, pyplot, save_figure
from attnlab.rundir import RunDir
from attnlab.studies.spec import StudySpec

FIGURES = "figures"


def _num(x: Any, fmt: str = ".4f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:{fmt}}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _p(p: Any) -> str:
    if p is None or (isinstance(p, float) and not math.isfinite(p)):
        return "–"
    return f"{p:.2e}" if p < 1e-3 else f"{p:.4f}"


# --- language-model studies --------------------------------------------------------------------
def _scale_lines(spec: StudySpec, preset: str) -> list[str]:
    """What this preset changes against the seed's settings (the paper preset changes nothing)."""
    scale = spec.scale(preset)
    lines = [f"**Preset `{preset}`.** {scale.notes}".rstrip(), ""]
    changed = [f"`{k}={v}`" for k, v in {**scale.model, **scale.train}.items()]
    if changed:
        lines.append("Changed for every variant: " + ", ".join(changed) + ".")
    for name, over in scale.variants.items():
        pairs = [
            f"`{k}={v}`" for k, v in {**over.get("model", {}), **over.get("train", {})}.items()
        ]
        if pairs:
            lines.append(f"Changed for {name}: " + ", ".join(pairs) + ".")
    if scale.data is not None:
        lines.append(f"Data: `{scale.data}`.")
    return [*lines, ""]


def _variant_table(stats: dict[str, dict[str, Any]]) -> list[str]:
    rows = []
    for name, s in stats.items():
        mean = s["mean"]
        ppl = math.exp(mean) if mean is not None and math.isfinite(mean) else None
        rows.append(
            [
                name,
                s["description"],
                f"{s['params']:,}" if s["params"] else "–",
                f"{s['n']}" + (f" ({s['failed']} failed)" if s["failed"] else ""),
                f"{_num(mean)} ± {_num(s['std'])}",
                f"{_num(s['ci95_low'])} – {_num(s['ci95_high'])}",
                _num(ppl, ".3f"),
                _num(s["reference"]),
                _num(s["iters"], "d"),
                _num(1000 * s["sec_per_step"] if s["sec_per_step"] else None, ".1f"),
            ]
        )
    return _table(
        [
            "variant",
            "what",
            "params",
            "seeds",
            "val loss mean ± std",
            "95 % CI",
            "ppl",
            "seed's value",
            "iters",
            "ms/step",
        ],
        rows,
    )


def _comparison_table(comparisons: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            f"{c['variant']} vs {c['baseline']}",
            str(c["n"]),
            _num(c["mean_diff"], "+.4f"),
            _num(c["ppl_change_pct"], "+.2f") + " %",
            f"{_num(c['t'], '.2f')} ({c['df']})",
            _p(c["p"]),
            _p(c["p_holm"]),
            c["wins"],
        ]
        for c in comparisons
    ]
    return _table(
        ["comparison", "n", "mean diff", "ppl change", "t (df)", "p", "p Holm", "wins"], rows
    )


def _curves(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant, at each evaluated iteration every finished seed logged: the mean val loss
    over seeds, its lowest and highest seed, and the number of seeds."""
    per_variant: dict[str, list[dict[int, float]]] = {}
    for r in runs:
        path = RunDir(r["run_dir"]).metrics
        if r["status"] != "ok" or not path.is_file():
            continue
        with path.open() as f:
            points = {
                int(row["iter"]): float(row["val_loss"])
                for row in csv.DictReader(f)
                if row.get("val_loss")
            }
        per_variant.setdefault(r["variant"], []).append(points)
    curves = {}
    for name, seeds in per_variant.items():
        iters = sorted(set.intersection(*(set(s) for s in seeds)))
        curves[name] = {
            "iters": iters,
            "mean": [sum(s[i] for s in seeds) / len(seeds) for i in iters],
            "low": [min(s[i] for s in seeds) for i in iters],
            "high": [max(s[i] for s in seeds) for i in iters],
            "seeds": len(seeds),
        }
    return curves


# line styles and markers cycle independently of colours, so coinciding curves stay visible
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def plot_curves(runs: list[dict[str, Any]], path: Path, title: str) -> bool:
    """The seed's Figure 1: val loss against iteration per variant, the mean over seeds as a
    line and the spread between the lowest and highest seed as a band."""
    curves = _curves(runs)
    if not curves:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    for i, (name, c) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        ax.plot(
            c["iters"],
            c["mean"],
            color=colour,
            ls=_STYLES[i % len(_STYLES)],
            marker=_MARKERS[i % len(_MARKERS)],
            ms=4,
            mfc="none",
            label=f"{name} (mean of {c['seeds']} seed{'s' if c['seeds'] > 1 else ''})",
        )
        if c["seeds"] > 1:
            ax.fill_between(c["iters"], c["low"], c["high"], color=colour, alpha=0.15, lw=0)
    # the first eval (iter 0) is near log(vocab) and would flatten everything after it
    later = [
        v for c in curves.values() for i, v in zip(c["iters"], c["high"], strict=True) if i > 0
    ]
    later += [v for c in curves.values() for i, v in zip(c["iters"], c["low"], strict=True) if i]
    if later:
        lo, hi = min(later), max(later)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.05 * (hi - lo + 1e-9))
    ax.set(
        xlabel="iteration",
        ylabel="validation loss (nats per token)",
        title=f"{title}\nline: mean over seeds; band: lowest to highest seed",
    )
    ax.grid(alpha=0.3)
    legend_outside(fig, [ax], ncol=2)
    save_figure(fig, path)
    return True


def _lm_sections(
    out: Path, spec: StudySpec, results: dict[str, Any], study: dict[str, Any]
) -> list[str]:
    planned = len(study["seeds"]) * len(spec.variants)
    finished = sum(r["status"] == "ok" for r in results["runs"])
    lines = []
    if finished < planned:
        lines += [
            f"**Partial: {finished} of {planned} runs finished.** Rerunning the command above "
            "continues the study (an unfinished run resumes from its last checkpoint).",
            "",
        ]
    lines += [
        "## Variants",
        "",
        "Final validation loss of each run (the same fixed validation batches "
        "for every run), over the seeds that finished.",
        "",
        *_variant_table(study["variants"]),
    ]
    for name, b in study.get("wallclock", {}).items():
        lines += [
            f"**Wall-clock matching.** {b['mechanism']} takes {b['ratio']:.3f}x the time per step of "
            f"{b['baseline']} ({1000 * b['mechanism_sec_per_step']:.1f} vs "
            f"{1000 * b['baseline_sec_per_step']:.1f} ms, mean over seeds), so `{name}` trains "
            f"{b['baseline']} for {b['iters']} iterations.",
            "",
        ]
    if study.get("wallclock") and study["jobs"] > 1:
        lines += [
            f"Runs shared the machine ({study['jobs']} at a time), so seconds per step include "
            "contention; rerun with `--jobs 1` for clean wall-clock matching.",
            "",
        ]
    lines += [
        "## Comparisons",
        "",
        "Paired by seed (same initial stream and batches): "
        "`scipy.stats.ttest_rel(variant, baseline)` on final val losses; Holm-corrected over "
        "this study's comparisons; wins = seeds where the variant's loss is lower.",
        "",
        *_comparison_table(results["comparisons"]),
    ]
    failed = [r for r in results["runs"] if r["status"] == "failed"]
    if failed:
        lines += [
            "## Failed runs",
            "",
            *(f"- {r['variant']} seed {r['seed']}: `{r['error']}`" for r in failed),
            "",
        ]
    if plot_curves(results["runs"], out / FIGURES / "curves.png", f"{spec.name}: validation loss"):
        lines += [
            "## Training curves",
            "",
            f"![validation loss against iteration]({FIGURES}/curves.png)",
            "",
        ]
    return lines


def _analysis_sections(analyses: dict[str, Any]) -> list[str]:
    titles = {
        "per_position": "Per-position loss",
        "names": "Name test",
        "gates": "Boosting gates",
        "entropy": "Attention entropy",
    }
    lines = []
    for name, a in analyses.items():
        lines += [
            f"## {titles.get(name, name)} ({' vs '.join(a.get('runs') or [])}, seed {a.get('seed', 0)})",
            "",
        ]
        if "error" in a:
            lines += [f"Unavailable: `{a['error']}`.", ""]
            continue
        if name == "per_position":
            lines += [
                "Mean loss by region of the text (A = first run, B = second):",
                "",
                *_table(
                    ["region", "targets", "loss A", "loss B", "B - A"],
                    [
                        [
                            r["group"],
                            str(r["count"]),
                            _num(r["loss_a"]),
                            _num(r["loss_b"]),
                            _num(r["b_minus_a"], "+.4f"),
                        ]
                        for r in a["by_region"]
                    ],
                ),
                "Targets where B gains most over A:",
                "",
                *_table(
                    ["rank", "context", "target", "loss A", "loss B"],
                    [
                        [
                            str(r["rank"]),
                            f"`{r['context']}`",
                            f"`{r['target']}`",
                            _num(r["loss_a"]),
                            _num(r["loss_b"]),
                        ]
                        for r in a["top"]
                    ],
                ),
                f"![loss difference by region, column and distance from a header]({a['figure']})",
                "",
            ]
        elif name == "names":
            lines += [
                f"Speaker headers in generated samples against the {a['cast_size']} speakers of the "
                "training text:",
                "",
                *_table(
                    ["run", "headers", "canonical", "fraction canonical"],
                    [
                        [
                            run,
                            str(s["headers"]),
                            str(s["canonical_headers"]),
                            _num(s["fraction_canonical"], ".3f"),
                        ]
                        for run, s in zip(a["runs"], a["scores"], strict=True)
                    ],
                ),
                f"![speaker headers in generated samples]({a['figure']})",
                "",
            ]
        elif name == "gates":
            lines += [
                *_table(
                    ["layer", "gate mean", "std over dims"],
                    [[str(r["layer"]), _num(r["mean"]), _num(r["std"])] for r in a["layers"]],
                ),
                f"![gate per layer and dimension]({a['figure']})",
                "",
            ]
        elif name == "entropy":
            lines += [
                *_table(
                    ["source", "mean entropy (nats)"],
                    [[r["source"], _num(r["mean"])] for r in a["rows"]],
                ),
                f"![attention entropy]({a['figure']})",
                "",
            ]
    return lines


# --- retrieval and overhead --------------------------------------------------------------------
def _retrieval_sections(spec: StudySpec, study: dict[str, Any]) -> list[str]:
    lines = []
    order = list(spec.params.get("protocols", {}))
    for table in study["tables"]:
        cells = table["cells"]
        if not cells:
            continue
        found = dict.fromkeys(p for c in cells for p in c["protocols"])
        protocols = [p for p in order if p in found] + [p for p in found if p not in order]
        methods = list(
            dict.fromkeys(m for c in cells for p in c["protocols"].values() for m in p["accuracy"])
        )
        rows = []
        for m in methods:
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
            *_table(["method", "source", *(c["column"] for c in cells)], rows),
        ]
        if table.get("comparisons"):
            lines += [
                f"Paired by seed against {table['baseline']} (`scipy.stats.ttest_rel`, "
                "Holm-corrected within each protocol); difference in accuracy points, mean ± "
                "std over seeds; wins = seeds where the column is higher.",
                "",
                *_table(
                    ["protocol", "column", "n", "difference", "t (df)", "p", "p Holm", "wins"],
                    [
                        [
                            c["protocol"],
                            c["column"],
                            str(c["n"]),
                            f"{c['mean_diff']:+.1f} ± {c['std_diff']:.1f}",
                            f"{_num(c['t'], '.2f')} ({c['df']})",
                            _p(c["p"]),
                            _p(c["p_holm"]),
                            c["wins"],
                        ]
                        for c in sorted(
                            table["comparisons"],
                            key=lambda c: (
                                protocols.index(c["protocol"])
                                if c["protocol"] in protocols
                                else len(protocols)
                            ),
                        )
                    ],
                ),
            ]
    return lines


def plot_retrieval(spec: StudySpec, study: dict[str, Any], path: Path) -> bool:
    """One panel per table: accuracy of its trained method (one-step in Table 2, else the
    table's one method) in every column, per source: the paper, the authors' repository
    revision, and each protocol as mean with a bar of one standard deviation over seeds."""
    tables = [{**t, "cells": [c for c in t["cells"] if c["protocols"]]} for t in study["tables"]]
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
        methods = list(
            dict.fromkeys(m for c in cells for p in c["protocols"].values() for m in p["accuracy"])
        )
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


def _overhead_sections(study: dict[str, Any]) -> list[str]:
    lines = [
        "## Step time against width",
        "",
        "Forward + backward + AdamW step on random data, all "
        "models of one width timed interleaved; ratio = median of per-repetition ratios to vanilla.",
        "",
        "```",
        study["overhead_table"],
        "```",
        "",
        f"![step time and overhead against width]({FIGURES}/overhead.png)",
        "",
    ]
    if study["unavailable"]:
        lines += [f"Not available in this build: {', '.join(study['unavailable'])}.", ""]
    return lines


def _provenance(study: dict[str, Any]) -> list[str]:
    """Which command and which commit produced this report (when known)."""
    command, commit = study.get("command"), study.get("git_commit")
    parts = [f"Produced by `{command}`" if command else "Produced"]
    parts.append(f"at commit `{commit}`." if commit else "(commit unknown).")
    return [" ".join(parts), ""]


def write_report(
    out: Path, spec: StudySpec, preset: str, results: dict[str, Any], study: dict[str, Any]
) -> Path:
    """Write ``out/report.md`` (and its figures) and return its path."""
    seeds = study["seeds"]
    lines = [
        f"# Study `{spec.name}`",
        "",
        spec.description,
        "",
        f"Seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}); study spec `{spec.source}`; "
        f"{study['elapsed_s']:.0f} s this invocation.",
        "",
        *_provenance(study),
        *_scale_lines(spec, preset),
    ]
    if spec.kind == "lm":
        lines += _lm_sections(out, spec, results, study) + _analysis_sections(
            study.get("analyses", {})
        )
    elif spec.kind == "retrieval":
        lines += _retrieval_sections(spec, study)
        if plot_retrieval(spec, study, out / FIGURES / "retrieval.png"):
            lines += [
                "## Figure",
                "",
                f"![accuracy per table against the paper]({FIGURES}/retrieval.png)",
                "",
            ]
    else:
        lines += _overhead_sections(study)
    path = out / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path
