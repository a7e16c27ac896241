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
    assert r["wins"] == "4/5" and r["wins_n"] == 4


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


def test_holm_caps_at_one_and_passes_nan() -> None:
    out = holm([0.5, float("nan"), 0.4])
    # Two valid p-values: 0.4 * 2 = 0.8, then max(0.8, 0.5 * 1) = 0.8.
    assert out[0] == pytest.approx(0.8) and out[2] == pytest.approx(0.8)
    assert math.isnan(out[1])
    assert holm([0.9, 0.8]) == [1.0, 1.0]
    assert holm([]) == []
