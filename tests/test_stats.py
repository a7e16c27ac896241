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
