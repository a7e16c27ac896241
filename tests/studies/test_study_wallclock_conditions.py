"""A wall-clock arm's step ratio under the study's own conditions: timed as many at once as the
study runs runs, and the runs' own logged ratio reported beside it where the two differ."""

from __future__ import annotations

from attnlab.studies.kinds.lm import middle_timing
from attnlab.studies.kinds.lm_report import _wallclock_lines

BUDGET = {
    "baseline": "vanilla",
    "mechanism": "kv",
    "baseline_sec_per_step": 0.2,
    "mechanism_sec_per_step": 0.21,
    "ratio": 1.047,
    "ratio_iqr": [1.03, 1.06],
    "reps": 30,
    "threads": 1,
    "iters": 3141,
}


def _record(logged_ratio: float, **budget: object) -> dict:
    return {
        "wallclock": {"vanilla-wallclock": {**BUDGET, **budget}},
        "variants": {
            "vanilla": {"sec_per_step": 0.1},
            "kv": {"sec_per_step": 0.1 * logged_ratio},
        },
        "configs": {"kv": {"train": {"max_iters": 3000}}},
    }


def test_the_logged_ratio_outside_the_timed_iqr_is_reported_with_its_budget() -> None:
    text = " ".join(_wallclock_lines(_record(1.122)))
    assert "The runs' own logged step times give 1.122x" in text
    assert "**The two ratios differ**" in text
    assert f"`vanilla-wallclock` would train {round(3000 * 1.122)} iterations" in text


def test_a_logged_ratio_inside_the_timed_iqr_adds_nothing() -> None:
    text = " ".join(_wallclock_lines(_record(1.05)))
    assert "The runs' own logged step times give 1.050x" in text
    assert "differ" not in text


def test_timings_made_at_once_are_named_and_the_median_one_kept() -> None:
    timed = [{**BUDGET, "ratio": r} for r in (1.2, 1.0, 1.1, 1.3)]
    assert middle_timing(timed)["ratio"] == 1.1  # the lower middle of four
    assert middle_timing(timed[:3])["ratio"] == 1.1
    text = " ".join(_wallclock_lines(_record(1.05, concurrent=4)))
    assert "4 timings at once as the study ran 4 runs at a time" in text
    assert "timings at once" not in " ".join(_wallclock_lines(_record(1.05)))
