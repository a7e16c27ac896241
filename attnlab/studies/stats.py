"""Statistics for multi-seed studies: summaries, paired comparisons, power, Holm correction."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05  # two-sided significance level of every test, CI and power figure here
POWER = 0.80  # the power at which a detectable effect and a number of seeds are quoted
BOOTSTRAP_MIN_N = 8  # fewer seeds have too few distinct resamples for a percentile interval
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed: a report is the same each time it is rendered
MAX_SEEDS = 1_000_000  # beyond this "seeds needed" is reported as not reachable


def summarize(values: Sequence[float]) -> dict:
    """n, mean, sample std (ddof=1) and a t-distribution 95% confidence interval."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    mean = float(x.mean()) if n else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "std": math.nan, "ci95_low": math.nan, "ci95_high": math.nan}
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half}


def paired_power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Exact power of a two-sided paired t-test over ``n`` pairs whose differences have mean
    ``effect`` and standard deviation ``sd`` (the noncentral t, not a normal approximation)."""
    if n < 2 or not sd > 0:
        return math.nan
    df = n - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    nc = abs(effect) * math.sqrt(n) / sd
    # the far tail (a t below -crit for a positive effect) underflows to NaN in scipy's nct for
    # large nc; it is then below any float that could matter beside the near tail
    far = float(stats.nct.cdf(-crit, df, nc))
    return float(stats.nct.sf(crit, df, nc)) + (far if math.isfinite(far) else 0.0)


def detectable_effect(sd: float, n: int, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest |mean difference| a two-sided paired t-test over ``n`` pairs detects with
    ``power`` when the differences spread by ``sd`` (NaN without a spread to weigh)."""
    if n < 2 or not sd > 0 or not math.isfinite(sd):
        return math.nan
    # power rises with the effect; alpha itself is the power at effect 0, so a root exists
    high = sd
    while paired_power(high, sd, n, alpha) < power:
        high *= 2
    return float(optimize.brentq(lambda e: paired_power(e, sd, n, alpha) - power, 0.0, high))


def seeds_needed(
    effect: float, sd: float, power: float = POWER, alpha: float = ALPHA
) -> int | None:
    """The fewest seeds whose paired t-test detects ``effect`` with ``power`` given the spread
    ``sd`` of the differences; None when there is no effect or spread to weigh, or when not
    even MAX_SEEDS would do."""
    if not (math.isfinite(effect) and effect != 0 and math.isfinite(sd) and sd > 0):
        return None
    if paired_power(effect, sd, MAX_SEEDS, alpha) < power:
        return None
    low, high = 1, 2  # power rises with n: double past the target, then bisect
    while paired_power(effect, sd, high, alpha) < power:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        if paired_power(effect, sd, mid, alpha) >= power:
            high = mid
        else:
            low = mid
    return high


def bootstrap_ci(diff: Sequence[float], seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """Percentile bootstrap 95 % interval of the mean of ``diff`` (resampling seeds with
    replacement, a fixed generator seed), or None below BOOTSTRAP_MIN_N values."""
    d = np.asarray(diff, dtype=np.float64)
    if d.size < BOOTSTRAP_MIN_N:
        return None
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(BOOTSTRAP_RESAMPLES, d.size))].mean(axis=1)
    low, high = np.percentile(means, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return [float(low), float(high)]


def _ppl_pct(loss_diff: float) -> float:
    """A loss difference (nats) as a change of perplexity in percent."""
    # exp overflows past a loss difference of ~709 (a diverged run): an unbounded change
    return math.inf if loss_diff >= 700 else 100.0 * math.expm1(loss_diff)


def paired_comparison(
    variant: Sequence[float], baseline: Sequence[float], claimed: float | None = None
) -> dict:
    """Paired t-test of per-seed losses ``variant`` vs ``baseline`` (lower is better), with the
    difference's 95 % CI (t, and a bootstrap one from BOOTSTRAP_MIN_N seeds), its perplexity
    change and CI, the effect detectable at 80 % power given the observed spread and, for a
    ``claimed`` difference (the seed's), the seeds that would detect it at that spread.

    Seeds where either loss is not finite (a diverged or failed run) are left out, and
    ``left_out`` says how many: counted, they made "2/3 wins" of two wins and a missing seed.
    When every seed differs by the same amount the t-test has no spread to weigh (t infinite,
    p 0): t, p, the CIs and the power figures are NaN and ``no_spread`` is set.
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
    tested = n >= 2 and not no_spread
    t = p = sd = low = high = math.nan
    if tested:
        res = stats.ttest_rel(v, b)
        t, p = float(res.statistic), float(res.pvalue)
        sd = float(diff.std(ddof=1))
        summary = summarize(diff)
        low, high = summary["ci95_low"], summary["ci95_high"]
    wins = int((v < b).sum())
    has_claim = claimed is not None and math.isfinite(claimed)
    return {
        "n": n,
        "t": t,
        "df": n - 1,
        "p": p,
        "mean_diff": mean_diff,
        "sd_diff": sd,
        "ci95": [low, high],
        "bootstrap_ci95": bootstrap_ci(diff) if tested else None,
        "ppl_change_pct": _ppl_pct(mean_diff),
        "ppl_ci95_pct": [_ppl_pct(low), _ppl_pct(high)],
        "mde": detectable_effect(sd, n),
        "claimed_diff": claimed if has_claim else None,
        "seeds_for_claim": seeds_needed(claimed, sd) if has_claim else None,
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


def holm_ci(row: dict) -> list[float]:
    """A paired comparison's t interval at the level whose test rejects exactly when Holm's
    adjusted p is below ALPHA: 1 - ALPHA·p/p_holm (ALPHA/m for the smallest p, Bonferroni's).
    ``row`` holds p, p_holm, n, mean_diff and sd_diff (a study's comparison)."""
    p, adjusted, n = row["p"], row["p_holm"], row["n"]
    if not (math.isfinite(p) and math.isfinite(adjusted) and adjusted > 0 and n >= 2):
        return [math.nan, math.nan]
    level = ALPHA * p / adjusted
    half = float(stats.t.ppf(1 - level / 2, n - 1)) * row["sd_diff"] / math.sqrt(n)
    return [row["mean_diff"] - half, row["mean_diff"] + half]
