"""Statistics for multi-seed studies: summaries, paired comparisons, Holm correction."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def summarize(values: Sequence[float]) -> dict:
    """n, mean, sample std (ddof=1) and a t-distribution 95% confidence interval."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    mean = float(x.mean()) if n else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "std": math.nan, "ci95_low": math.nan, "ci95_high": math.nan}
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half}


def paired_comparison(variant: Sequence[float], baseline: Sequence[float]) -> dict:
    """Paired t-test of per-seed losses ``variant`` vs ``baseline`` (lower is better)."""
    v = np.asarray(variant, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if v.shape != b.shape or v.ndim != 1:
        raise ValueError(f"need two equal-length sequences; got {v.shape} and {b.shape}")
    n = int(v.size)
    if n >= 2:
        res = stats.ttest_rel(v, b)
        t, p = float(res.statistic), float(res.pvalue)
    else:
        t = p = math.nan
    mean_v = float(v.mean()) if n else math.nan
    mean_b = float(b.mean()) if n else math.nan
    wins = int((v < b).sum())
    return {
        "n": n,
        "t": t,
        "df": n - 1,
        "p": p,
        "mean_diff": mean_v - mean_b,
        "ppl_change_pct": 100.0 * (math.exp(mean_v - mean_b) - 1.0),
        "wins": f"{wins}/{n}",
        "wins_n": wins,
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values in input order; NaN entries stay NaN and don't count."""
    p = np.asarray(pvalues, dtype=np.float64)
    adjusted = np.full(p.shape, math.nan)
    valid = np.flatnonzero(~np.isnan(p))
    m = valid.size
    order = valid[np.argsort(p[valid], kind="stable")]
    running = 0.0
    for rank, idx in enumerate(order):
        # Step-down: scale the rank-th smallest by (m - rank), then keep the sequence monotone.
        running = max(running, min(1.0, (m - rank) * p[idx]))
        adjusted[idx] = running
    return adjusted.tolist()
