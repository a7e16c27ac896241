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
    """Paired t-test of per-seed losses ``variant`` vs ``baseline`` (lower is better).

    Seeds where either loss is not finite (a diverged or failed run) are left out, and
    ``left_out`` says how many: counted, they made "2/3 wins" of two wins and a missing seed.
    When every seed differs by the same amount the t-test has no spread to weigh (t infinite,
    p 0): t and p are NaN and ``no_spread`` is set.
    """
    v = np.asarray(variant, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if v.shape != b.shape or v.ndim != 1:
        raise ValueError(f"need two equal-length sequences; got {v.shape} and {b.shape}")
    finite = np.isfinite(v) & np.isfinite(b)
    left_out = int(v.size - finite.sum())
    v, b = v[finite], b[finite]
    n = int(v.size)
    diff = v - b
    mean_diff = float(diff.mean()) if n else math.nan
    # relative to the difference itself: equal "down to rounding" is no spread either
    no_spread = n >= 2 and float(np.ptp(diff)) <= 1e-12 * max(1.0, abs(mean_diff))
    if n >= 2 and not no_spread:
        res = stats.ttest_rel(v, b)
        t, p = float(res.statistic), float(res.pvalue)
    else:
        t = p = math.nan
    wins = int((v < b).sum())
    return {
        "n": n,
        "t": t,
        "df": n - 1,
        "p": p,
        "mean_diff": mean_diff,
        # exp overflows past a loss difference of ~709 (a diverged run): an unbounded change
        "ppl_change_pct": math.inf if mean_diff >= 700 else 100.0 * math.expm1(mean_diff),
        "wins": f"{wins}/{n}" + (f" ({left_out} non-finite left out)" if left_out else ""),
        "left_out": left_out,
        "no_spread": no_spread,
    }


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values in input order.

    A NaN entry (a comparison without a test) stays NaN but counts in the family as p = 1:
    dropped, it made every other correction smaller, so that one comparison failing could make
    another significant.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    ranked = np.where(np.isnan(p), 1.0, p)
    m = p.size
    adjusted = np.full(p.shape, math.nan)
    running = 0.0
    for rank, idx in enumerate(np.argsort(ranked, kind="stable")):
        # Step-down: scale the rank-th smallest by (m - rank), then keep the sequence monotone.
        running = max(running, min(1.0, (m - rank) * ranked[idx]))
        if not np.isnan(p[idx]):
            adjusted[idx] = running
    return adjusted.tolist()
