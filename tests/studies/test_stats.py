"""Study statistics against independent hand formulas."""

import math

import numpy as np
import pytest
from scipy import stats

from attnlab.studies.stats import holm, paired_comparison, summarize

VARIANT = [3.10, 3.05, 3.12, 3.00, 3.08]
BASELINE = [3.20, 3.11, 3.10, 3.09, 3.18]


def test_summarize_matches_hand_ci() -> None:
    x = [1.0, 2.0, 4.0, 7.0]
    mean = 14.0 / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / 3)
    half = stats.t.ppf(0.975, 3) * std / 2.0
    s = summarize(x)
    assert s["n"] == 4
    assert s["mean"] == pytest.approx(mean)
    assert s["std"] == pytest.approx(std)
    assert (s["ci95_low"], s["ci95_high"]) == pytest.approx((mean - half, mean + half))


def test_summarize_single_value_has_no_spread() -> None:
    s = summarize([2.5])
    assert s["mean"] == 2.5 and math.isnan(s["std"]) and math.isnan(s["ci95_low"])


def test_paired_t_by_hand() -> None:
    diffs = [v - b for v, b in zip(VARIANT, BASELINE, strict=True)]
    n = len(diffs)
    mean_d = sum(diffs) / n
    sd_d = math.sqrt(sum((d - mean_d) ** 2 for d in diffs) / (n - 1))
    t = mean_d / (sd_d / math.sqrt(n))
    p = 2 * stats.t.sf(abs(t), n - 1)
    r = paired_comparison(VARIANT, BASELINE)
    assert r["t"] == pytest.approx(t)
    assert r["p"] == pytest.approx(p)
    assert r["df"] == n - 1
    assert r["mean_diff"] == pytest.approx(mean_d)
    assert r["ppl_change_pct"] == pytest.approx(
        100 * (math.exp(np.mean(VARIANT)) / math.exp(np.mean(BASELINE)) - 1)
    )
    # The third pair is the only one where the variant loses.
    assert r["wins"] == "4/5" and r["left_out"] == 0 and not r["no_spread"]


def test_paired_single_pair_gives_nan_not_crash() -> None:
    r = paired_comparison([3.0], [3.1])
    assert math.isnan(r["t"]) and math.isnan(r["p"])
    assert r["wins"] == "1/1"


def test_paired_length_mismatch_raises() -> None:
    with pytest.raises(ValueError):
        paired_comparison([1.0, 2.0], [1.0])


def test_holm_hand_worked_example() -> None:
    # Sorted 0.01, 0.02, 0.03, 0.04 with m = 4: 0.04, 0.06, 0.06 (monotone), 0.06 (monotone).
    # In input order: [0.03, 0.01, 0.04, 0.02] -> [0.06, 0.04, 0.06, 0.06].
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])


def test_holm_caps_at_one_and_counts_a_missing_test_as_p_one() -> None:
    """A NaN (a comparison without a test) was dropped from the family: holm([0.01, nan, 0.04])
    gave 0.02 and 0.04, as if there were two comparisons, not three (0.03 and 0.08)."""
    out = holm([0.5, float("nan"), 0.4])
    # three in the family: 0.4 * 3 = 1.2 -> 1, then the rest can only be 1 as well
    assert out[0] == 1.0 and out[2] == 1.0 and math.isnan(out[1])
    out = holm([0.01, float("nan"), 0.04])
    assert out[0] == pytest.approx(0.03) and out[2] == pytest.approx(0.08) and math.isnan(out[1])
    assert holm([0.9, 0.8]) == [1.0, 1.0]
    assert holm([]) == []


def test_paired_comparison_leaves_out_non_finite_seeds_and_says_so() -> None:
    """[1, nan, 1.2] vs [1.1, 1.1, 1.3] showed "2/3" wins (a missing seed read as a loss) and no
    t or p at all."""
    r = paired_comparison([1.0, float("nan"), 1.2, 0.9], [1.1, 1.1, 1.3, 1.05])
    expected = paired_comparison([1.0, 1.2, 0.9], [1.1, 1.3, 1.05])
    assert r["wins"] == "3/3 (1 non-finite left out)" and r["left_out"] == 1 and r["n"] == 3
    assert r["t"] == expected["t"] and r["p"] == expected["p"]
    # a diverged run (loss 3000): an unbounded change, never an OverflowError
    r = paired_comparison([3000.0, 1.0, 1.2], [1.0, 1.1, 1.25])
    assert r["ppl_change_pct"] == math.inf and math.isfinite(r["p"])
    # no finite pair at all: no change to report (NaN, shown as "–"), not an unbounded one
    r = paired_comparison([float("nan")], [1.0])
    assert r["n"] == 0 and math.isnan(r["ppl_change_pct"]) and r["left_out"] == 1


def test_a_difference_equal_on_every_seed_has_no_p_value() -> None:
    """A constant difference gave t = -inf and p = 0, printed as overwhelming evidence."""
    r = paired_comparison([1.0, 2.0, 3.0], [1.25, 2.25, 3.25])
    assert r["no_spread"] and math.isnan(r["t"]) and math.isnan(r["p"])
    assert r["mean_diff"] == pytest.approx(-0.25) and r["wins"] == "3/3"
    # equal down to rounding is no spread either
    assert paired_comparison([1.0001, 2.0001], [1.0, 2.0])["no_spread"]
    assert not paired_comparison([1.0001, 2.0002], [1.0, 2.0])["no_spread"]


def test_p_values_are_never_rounded_across_a_threshold() -> None:
    from attnlab.studies.report import p_cell, p_value

    assert p_value(0.04996) == "0.04996" and p_value(0.05004) == "0.0500"
    assert p_value(0.009996) == "0.009996" and p_value(0.0182) == "0.0182"
    assert p_value(2.5e-5) == "2.50e-05" and p_value(0.0) == "< 1e-300"
    assert p_value(float("nan")) == "–" and p_value(None) == "–"
    assert p_cell({"p": float("nan"), "no_spread": True}) == "– (no spread)"
    assert p_cell({"p": 0.0182}) == "0.0182"


def _simulated_power(effect: float, sd: float, n: int, sims: int = 40_000) -> float:
    """Fraction of simulated normal paired differences a two-sided t-test finds at 0.05."""
    rng = np.random.default_rng(1234)
    d = rng.normal(effect, sd, size=(sims, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    return float((2 * stats.t.sf(np.abs(t), n - 1) < 0.05).mean())


def test_difference_ci_and_perplexity_ci_match_scipy() -> None:
    r = paired_comparison(VARIANT, BASELINE)
    ci = stats.ttest_rel(VARIANT, BASELINE).confidence_interval(0.95)
    assert r["ci95"] == pytest.approx([ci.low, ci.high], rel=1e-12)
    assert r["ppl_ci95_pct"] == pytest.approx(
        [100 * (math.exp(ci.low) - 1), 100 * (math.exp(ci.high) - 1)], rel=1e-12
    )
    diffs = np.subtract(VARIANT, BASELINE)
    assert r["sd_diff"] == pytest.approx(float(np.std(diffs, ddof=1)))
    assert r["bootstrap_ci95"] is None  # five seeds: too few for a bootstrap interval


def test_bootstrap_ci_agrees_with_scipy_and_is_deterministic() -> None:
    rng = np.random.default_rng(7)
    b = rng.normal(1.8, 0.05, 12)
    v = b + rng.normal(-0.03, 0.01, 12)
    r = paired_comparison(v.tolist(), b.tolist())
    theirs = stats.bootstrap(
        (v - b,), np.mean, method="percentile", n_resamples=20_000, rng=np.random.default_rng(99)
    ).confidence_interval
    width = theirs.high - theirs.low
    assert r["bootstrap_ci95"] == pytest.approx([theirs.low, theirs.high], abs=0.05 * width)
    assert paired_comparison(v.tolist(), b.tolist())["bootstrap_ci95"] == r["bootstrap_ci95"]
    # eight seeds are the first with one
    assert paired_comparison(v[:8].tolist(), b[:8].tolist())["bootstrap_ci95"] is not None
    assert paired_comparison(v[:7].tolist(), b[:7].tolist())["bootstrap_ci95"] is None


@pytest.mark.parametrize("n", [2, 3, 8])
def test_detectable_effect_has_80_percent_power_by_simulation(n: int) -> None:
    from attnlab.studies.stats import detectable_effect, paired_power

    sd = 0.02
    mde = detectable_effect(sd, n)
    assert paired_power(mde, sd, n) == pytest.approx(0.8, abs=1e-6)
    assert _simulated_power(mde, sd, n) == pytest.approx(0.8, abs=0.01)
    # never below the normal approximation, which ignores that sd itself is estimated
    normal = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / math.sqrt(n)
    assert mde > normal


def test_detectable_effect_approaches_the_normal_formula_for_many_seeds() -> None:
    from attnlab.studies.stats import detectable_effect

    n, sd = 2000, 0.03
    normal = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / math.sqrt(n)
    assert detectable_effect(sd, n) == pytest.approx(normal, rel=2e-3)


def test_seeds_needed_is_the_first_count_with_80_percent_power() -> None:
    from attnlab.studies.stats import seeds_needed

    effect, sd = 0.01, 0.015
    n = seeds_needed(effect, sd)
    assert n is not None and n > 2
    assert _simulated_power(effect, sd, n) >= 0.8 - 0.01
    assert _simulated_power(effect, sd, n - 1) < 0.8 + 0.01
    assert seeds_needed(-effect, sd) == n  # two-sided: the sign does not matter
    assert seeds_needed(0.0, sd) is None and seeds_needed(effect, math.nan) is None
    assert seeds_needed(1e-9, 1.0) is None  # beyond any number of seeds worth reporting
    # the comparison quotes it for the claimed difference at the observed spread
    r = paired_comparison(VARIANT, BASELINE, claimed=-0.02)
    assert r["claimed_diff"] == -0.02
    assert r["seeds_for_claim"] == seeds_needed(0.02, r["sd_diff"])


def test_power_figures_at_the_edges() -> None:
    """Two seeds (df 1), no spread, and non-finite seeds left out."""
    two = paired_comparison([1.0, 1.2], [1.1, 1.25], claimed=-0.05)
    ci = stats.ttest_rel([1.0, 1.2], [1.1, 1.25]).confidence_interval()
    assert two["ci95"] == pytest.approx([ci.low, ci.high])
    assert math.isfinite(two["mde"]) and two["mde"] > abs(two["mean_diff"])
    assert two["bootstrap_ci95"] is None and two["seeds_for_claim"] >= 3
    flat = paired_comparison([1.0, 2.0, 3.0], [1.25, 2.25, 3.25], claimed=-0.1)
    assert flat["no_spread"] and all(math.isnan(x) for x in (*flat["ci95"], flat["mde"]))
    assert flat["seeds_for_claim"] is None and flat["bootstrap_ci95"] is None
    holes = paired_comparison([1.0, math.nan, 1.2, 0.9], [1.1, 1.1, 1.3, 1.05], claimed=-0.05)
    clean = paired_comparison([1.0, 1.2, 0.9], [1.1, 1.3, 1.05], claimed=-0.05)
    for key in ("ci95", "mde", "sd_diff", "seeds_for_claim", "ppl_ci95_pct"):
        assert holes[key] == clean[key], key
    assert math.isnan(paired_comparison([1.0], [1.1])["mde"])
