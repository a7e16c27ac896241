"""When does each variant of a study reach a target variant's final validation loss?

For every seed, the target's final loss (at its last evaluation) is the level; each other
variant's first iteration at or below it is read off its own curve of the same seed, linearly
interpolated between the two evaluations around the crossing. Divided by the target's last
iteration it is the fraction of the target's budget the variant needs ("20 % fewer steps" is a
ratio of 0.8); its mean and 95 % t interval over seeds say whether that holds, and a seed that
never reaches the level leaves the interval undefined (it is counted, never dropped).
``attnlab analyze reach`` runs it (here beside attnlab.studies.curves, for the same reason).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.analysis.inputs import write_csv
from attnlab.errors import AttnlabError
from attnlab.plotting import legend_outside, pyplot, save_figure, series_styles
from attnlab.studies.curves import check_study, seed_curves
from attnlab.studies.output import RUNS
from attnlab.studies.stats import summarize

log = logging.getLogger(__name__)


def files(target: str) -> list[str]:
    """The files ``reach`` writes for ``target``."""
    return [f"reach-{target}.csv", f"reach-{target}.png"]


def first_reach(curve: dict[int, float], level: float) -> float:
    """The first iteration at which ``curve`` is at or below ``level``, interpolated linearly
    between the evaluations around the crossing (NaN: never)."""
    iters = sorted(curve)
    for j, it in enumerate(iters):
        if curve[it] <= level:
            if j == 0:
                return float(it)
            before = iters[j - 1]
            drop = curve[before] - curve[it]
            return before + (it - before) * (curve[before] - level) / drop
    return math.nan


@dataclass
class Reach:
    """``reach``'s result: one row per variant and seed, one summary row per variant."""

    study: str
    target: str
    variants: list[str]
    order: list[str]  # every variant of the study: each keeps its style in every reach figure
    curves: dict[str, dict[int, dict[int, float]]]  # variant -> seed -> iteration -> loss
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]


def reach(study: Path, target: str, variants: list[str] | None = None) -> Reach:
    """Each of ``variants`` (default: every other variant of ``study``) against ``target``'s
    final loss, seed by seed."""
    check_study(study)
    order = sorted(p.name for p in (study / RUNS).iterdir() if p.is_dir())
    if variants is None:
        variants = [name for name in order if name != target]
    if target in variants:
        raise AttnlabError(f"the target {target!r} is also one of the variants compared with it")
    if not variants:
        raise AttnlabError(f"{study} has no variant besides {target!r} to compare")
    curves = {name: seed_curves(study, name) for name in [target, *variants]}
    rows, summary = [], []
    for name in variants:
        seeds = sorted(set(curves[target]) & set(curves[name]))
        if not seeds:
            raise AttnlabError(f"{name} and the target {target} share no seed in {study}")
        ratios = []
        for s in seeds:
            goal = curves[target][s]
            end = max(goal)
            at = first_reach(curves[name][s], goal[end])
            ratios.append(at / end)
            rows.append(
                {
                    "variant": name,
                    "seed": s,
                    "target_final_iter": end,
                    "target_final_loss": goal[end],
                    "variant_final_loss": curves[name][s][max(curves[name][s])],
                    "reach_iter": at,
                    "ratio": at / end,
                    "fewer_steps_pct": 100 * (1 - at / end),
                }
            )
        reached = [r for r in ratios if math.isfinite(r)]
        # a seed that never reaches the level has no ratio: the mean over the others would
        # flatter the variant, so the interval is given only when every seed reaches it
        spread = summarize(ratios) if len(reached) == len(ratios) else summarize([])
        summary.append(
            {
                "variant": name,
                "seeds": len(seeds),
                "reached": len(reached),
                "ratio_mean": spread["mean"],
                "ratio_ci95_low": spread["ci95_low"],
                "ratio_ci95_high": spread["ci95_high"],
                "fewer_steps_pct": 100 * (1 - spread["mean"]),
            }
        )
    return Reach(study.name, target, variants, order, curves, rows, summary)


def write(result: Reach, out: Path) -> list[Path]:
    """The per-seed CSV (with the summary rows below it) and the figure, into ``out``."""
    csv_path, png = (out / name for name in files(result.target))
    # the per-variant summary in the same columns below the seeds, its interval beside it
    rows = [{**r, "ratio_ci95_low": math.nan, "ratio_ci95_high": math.nan} for r in result.rows]
    for s in result.summary:
        rows.append(
            {
                **dict.fromkeys(rows[0], math.nan),
                "variant": s["variant"],
                "seed": f"mean ({s['reached']} of {s['seeds']} reached)",
                "ratio": s["ratio_mean"],
                "fewer_steps_pct": s["fewer_steps_pct"],
                "ratio_ci95_low": s["ratio_ci95_low"],
                "ratio_ci95_high": s["ratio_ci95_high"],
            }
        )
    plot(result, png)
    paths = [write_csv(csv_path, rows), png]
    log.info("wrote %s", ", ".join(map(str, paths)))
    return paths


def mean_curve(seeds: dict[int, dict[int, float]]) -> tuple[list[int], np.ndarray]:
    """The iterations every seed evaluated and the mean loss over seeds there."""
    iters = sorted(set.intersection(*(set(c) for c in seeds.values())))
    return iters, np.array([np.mean([c[i] for c in seeds.values()]) for i in iters])


def fit_y(ax: Any, curves: dict[str, dict[int, dict[int, float]]], start: float) -> None:
    """``ax``'s y range: every seed's losses from iteration ``start`` on, with a 5 % margin."""
    shown = [
        v for seeds in curves.values() for c in seeds.values() for i, v in c.items() if i >= start
    ]
    margin = 0.05 * (max(shown) - min(shown))
    ax.set_ylim(min(shown) - margin, max(shown) + margin)


def plot(result: Reach, path: Path) -> Any:
    """Mean val loss over seeds against iteration for the target and each variant, the
    target's mean final loss as a dashed line, each seed's crossing marked; a second panel
    zooms into the last half of the iterations, where the crossings happen."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained", width_ratios=[2, 3])
    names = [result.target, *result.variants]
    styles = series_styles(names, result.order)
    level = float(np.mean([r["target_final_loss"] for r in result.rows]))
    crossings = [r for r in result.rows if math.isfinite(r["reach_iter"])]
    for ax in axes:
        for name in names:
            iters, mean = mean_curve(result.curves[name])
            n = len(result.curves[name])
            ax.plot(iters, mean, **styles[name], ms=3, mfc="none", label=f"{name} (mean of {n})")
        ax.axhline(level, color="k", lw=0.9, ls="--", label=f"{result.target}'s final loss (mean)")
        for r in crossings:
            ax.plot(
                r["reach_iter"],
                r["target_final_loss"],
                "x",
                color=styles[r["variant"]]["color"],
                ms=7,
                label=f"{r['variant']} reaches it (one seed)",
            )
        ax.set(xlabel="iteration", ylabel="validation loss (nats per token)")
        ax.grid(alpha=0.3)
    end = max(max(c) for seeds in result.curves.values() for c in seeds.values())
    # the first evaluation (near log(vocab)) would flatten the descent after it
    fit_y(axes[0], result.curves, 1)
    axes[0].set_title("whole run (from the first evaluation after iteration 0)", fontsize=9)
    axes[1].set_xlim(end / 2, end * 1.02)
    fit_y(axes[1], result.curves, end / 2)
    axes[1].set_title("last half of training, zoomed", fontsize=9)
    reached = ", ".join(f"{s['variant']} {s['reached']}/{s['seeds']}" for s in result.summary)
    fig.suptitle(
        f"{result.study}: when each variant first reaches {result.target}'s final val loss "
        f"(seeds reaching it: {reached})",
        fontsize=11,
    )
    legend_outside(fig, list(axes), ncol=4)
    save_figure(fig, path)
    return fig  # still readable: tests check its axes
