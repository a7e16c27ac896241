"""Two variants of a study compared at every evaluation: the paired difference of their val
losses over seeds, where it lies below zero, and whether it narrows as training goes on.

Reads a study folder (``attnlab study --out``, or a published copy under results/) whose
``runs/<variant>/seed<s>/metrics.csv`` hold the per-evaluation losses. At each iteration every
paired seed evaluated, the difference ``A - B`` is tested with a paired t (its 95 % CI over
seeds, attnlab.studies.stats). From iteration ``start`` on, each seed's differences are fitted
by least squares against the iteration; the slopes' mean and its t interval say whether the
gap closes (a slope against the sign of the mean difference), widens, or cannot be told.

Here, not in attnlab.analysis, because it reads study folders and their statistics (studies
import the analyses, so the analyses may not import studies back); ``attnlab analyze curves``
runs it.
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
from attnlab.plotting import legend_outside, pyplot, save_figure
from attnlab.studies.output import RESULTS_JSON, RUNS, val_curve
from attnlab.studies.stats import paired_comparison, summarize

log = logging.getLogger(__name__)

PER_ITER = 1000  # slopes are quoted per this many iterations (nats per 1,000 iterations)


def files(a: str, b: str) -> list[str]:
    """The files ``compare`` writes for variants ``a`` and ``b``."""
    stem = f"curves-{a}-vs-{b}"
    return [f"{stem}.csv", f"{stem}-seeds.csv", f"{stem}.png"]


def check_study(study: Path) -> None:
    """Refuse a STUDY that is not a folder holding its runs' records."""
    if not study.is_dir():
        raise AttnlabError(f"{study} is not a study folder")
    if not (study / RUNS).is_dir():
        held = (
            "its results.json holds final losses only" if (study / RESULTS_JSON).is_file() else ""
        )
        raise AttnlabError(
            f"{study} has no {RUNS}/ folder with per-evaluation losses"
            + (f" ({held}: the study was published without its runs' records)" if held else "")
        )


def seed_curves(study: Path, variant: str) -> dict[int, dict[int, float]]:
    """Seed -> (iteration -> val loss) of every run of ``variant`` that logged an evaluation."""
    folder = study / RUNS / variant
    if not folder.is_dir():
        known = sorted(p.name for p in (study / RUNS).iterdir() if p.is_dir())
        raise AttnlabError(
            f"{study} has no variant {variant!r} (it has: {', '.join(known) or 'none'})"
        )
    curves = {}
    for run in sorted(folder.glob("seed*")):
        seed = run.name.removeprefix("seed")
        if seed.isdigit() and (points := val_curve(run)):
            curves[int(seed)] = points
    if not curves:
        raise AttnlabError(f"{folder} holds no run with a logged evaluation")
    return curves


def paired_seeds(
    study: Path, a: str, b: str
) -> tuple[list[int], dict[int, dict[int, float]], dict[int, dict[int, float]]]:
    """The seeds both variants ran, and each variant's curves."""
    curves_a, curves_b = seed_curves(study, a), seed_curves(study, b)
    seeds = sorted(set(curves_a) & set(curves_b))
    if not seeds:
        raise AttnlabError(
            f"{a} (seeds {sorted(curves_a)}) and {b} (seeds {sorted(curves_b)}) share no seed "
            f"in {study}"
        )
    return seeds, curves_a, curves_b


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of y on x (NaN with fewer than two distinct x, or a loss that is
    not finite: a diverged run has no trend to fit)."""
    if np.unique(x).size < 2 or not np.isfinite(y).all():
        return math.nan
    return float(np.polyfit(x, y, 1)[0])


@dataclass
class CurveComparison:
    """``compare``'s result: per iteration and per seed rows (as written to CSV) and the summary."""

    a: str
    b: str
    start: int
    iters: list[int]
    diffs: np.ndarray  # [seed, iteration] differences A - B
    per_iter: list[dict[str, Any]]
    per_seed: list[dict[str, Any]]
    summary: dict[str, Any]


def compare(study: Path, a: str, b: str, start: int | None = None) -> CurveComparison:
    """Paired difference ``a - b`` at every iteration all paired seeds evaluated; counts and
    slope over the iterations from ``start`` (default: the first evaluation after iteration 0).
    """
    check_study(study)
    if a == b:
        raise AttnlabError(f"--a and --b name the same variant {a!r}")
    seeds, curves_a, curves_b = paired_seeds(study, a, b)
    iters = sorted(set.intersection(*(set(curves_a[s]) & set(curves_b[s]) for s in seeds)))
    if not iters:
        raise AttnlabError(f"{a} and {b} share no evaluated iteration over seeds {seeds}")
    if start is None:
        start = next((i for i in iters if i > 0), iters[0])
    tail = [i for i in iters if i >= start]
    if not tail:
        raise AttnlabError(f"--from {start} is after the last shared evaluation ({iters[-1]})")
    diffs = np.array([[curves_a[s][i] - curves_b[s][i] for i in iters] for s in seeds])
    per_iter = []
    for j, it in enumerate(iters):
        c = paired_comparison([curves_a[s][it] for s in seeds], [curves_b[s][it] for s in seeds])
        per_iter.append(
            {
                "iter": it,
                "n": c["n"],
                f"{a}_mean": float(np.mean([curves_a[s][it] for s in seeds])),
                f"{b}_mean": float(np.mean([curves_b[s][it] for s in seeds])),
                "mean_diff": c["mean_diff"],
                "ci95_low": c["ci95"][0],
                "ci95_high": c["ci95"][1],
                "t": c["t"],
                "p": c["p"],
                "seeds_below_zero": int((diffs[:, j] < 0).sum()),
                **{f"diff_seed{s}": float(diffs[k, j]) for k, s in enumerate(seeds)},
            }
        )
    cols = [iters.index(i) for i in tail]
    x = np.asarray(tail, dtype=np.float64)
    slopes = [PER_ITER * slope(x, diffs[k, cols]) for k in range(len(seeds))]
    per_seed = [
        {
            "seed": str(s),
            "evals_from_start": len(tail),
            "below_zero": int((diffs[k, cols] < 0).sum()),
            "below_at_every_eval": bool((diffs[k, cols] < 0).all()),
            "mean_diff_from_start": float(diffs[k, cols].mean()),
            "slope_per_1k_iters": slopes[k],
        }
        for k, s in enumerate(seeds)
    ]
    rows = [per_iter[j] for j in cols]
    mean_diff = float(diffs[:, cols].mean())
    spread = summarize([v for v in slopes if math.isfinite(v)])
    summary = {
        "study": str(study),
        "a": a,
        "b": b,
        "seeds": seeds,
        "start": start,
        "evals_from_start": len(tail),
        "mean_below_zero": sum(r["mean_diff"] < 0 for r in rows),
        "ci_below_zero": sum(r["ci95_high"] < 0 for r in rows),
        "ci_above_zero": sum(r["ci95_low"] > 0 for r in rows),
        "seeds_below_at_every_eval": sum(r["below_at_every_eval"] for r in per_seed),
        "mean_diff_from_start": mean_diff,
        "slope_per_1k_iters": spread["mean"],
        "slope_ci95": [spread["ci95_low"], spread["ci95_high"]],
        "trend": trend(mean_diff, spread["ci95_low"], spread["ci95_high"]),
    }
    per_seed.append(
        {
            "seed": "mean",
            "evals_from_start": len(tail),
            "below_zero": summary["mean_below_zero"],
            "below_at_every_eval": summary["mean_below_zero"] == len(tail),
            "mean_diff_from_start": mean_diff,
            "slope_per_1k_iters": spread["mean"],
            "slope_ci95_low": spread["ci95_low"],
            "slope_ci95_high": spread["ci95_high"],
        }
    )
    for row in per_seed[:-1]:  # one shape for the CSV: the interval belongs to the mean row
        row.update(slope_ci95_low=math.nan, slope_ci95_high=math.nan)
    return CurveComparison(a, b, start, iters, diffs, per_iter, per_seed, summary)


def trend(mean_diff: float, low: float, high: float) -> str:
    """ "narrowing" when the slope's CI lies wholly against the sign of the mean difference (the
    gap closes), "widening" when wholly with it, else "no trend resolved"."""
    if not (math.isfinite(low) and math.isfinite(high)) or mean_diff == 0:
        return "no trend resolved"
    sign = math.copysign(1.0, mean_diff)
    if max(sign * low, sign * high) < 0:
        return "narrowing"
    if min(sign * low, sign * high) > 0:
        return "widening"
    return "no trend resolved"


def write(result: CurveComparison, out: Path) -> list[Path]:
    """The per-iteration CSV, the per-seed CSV and the figure, into ``out``."""
    csv_iter, csv_seed, png = (out / name for name in files(result.a, result.b))
    paths = [write_csv(csv_iter, result.per_iter), write_csv(csv_seed, result.per_seed)]
    plot(result, png)
    paths.append(png)
    log.info("wrote %s", ", ".join(map(str, paths)))
    return paths


def plot(result: CurveComparison, path: Path) -> Any:
    """The difference against iteration: the mean over seeds with its 95 % CI band, each seed
    as a thin line, zero marked, the iterations the counts and slope weigh shaded."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    s = result.summary
    x = np.asarray(result.iters)
    for k in range(len(s["seeds"])):  # one legend entry for them all: they are alike
        label = f"each seed ({', '.join(map(str, s['seeds']))})" if k == 0 else None
        ax.plot(x, result.diffs[k], color="0.55", lw=0.8, label=label)
    rows = result.per_iter
    low = np.array([r["ci95_low"] for r in rows], dtype=np.float64)
    high = np.array([r["ci95_high"] for r in rows], dtype=np.float64)
    ax.fill_between(x, low, high, color="C0", alpha=0.25, lw=0, label="95 % CI (paired t)")
    ax.plot(
        x,
        [r["mean_diff"] for r in rows],
        color="C0",
        marker="o",
        ms=4,
        label=f"mean over {len(s['seeds'])} seeds",
    )
    ax.axhline(0.0, color="k", lw=0.8, ls="--", label="no difference")
    ax.axvline(
        s["start"], color="C3", lw=0.9, ls=":", label=f"counted from iteration {s['start']:,}"
    )
    ax.set(
        xlabel="iteration",
        ylabel=f"val loss {result.a} − {result.b} (nats per token)",
    )
    ax.grid(alpha=0.3)
    ax.set_title(
        f"mean below 0 at {s['mean_below_zero']} of {s['evals_from_start']} evaluations; "
        f"slope {s['slope_per_1k_iters']:+.4f} nats per 1k iters "
        f"(CI {s['slope_ci95'][0]:+.4f} to {s['slope_ci95'][1]:+.4f}): {s['trend']}",
        fontsize=9,
    )
    fig.suptitle(f"{Path(s['study']).name}: {result.a} minus {result.b} at every evaluation")
    legend_outside(fig, [ax], ncol=4)
    save_figure(fig, path)
    return fig  # still readable: tests check its axes
