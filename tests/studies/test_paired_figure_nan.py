"""The paired-differences figure of a study whose only difference is NaN sets no identical x
limits (matplotlib warned on stderr)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path


def test_the_paired_figure_of_a_nan_difference_warns_of_nothing(tmp_path: Path) -> None:
    """One variant's final loss is NaN: the only difference is NaN, so the x range held 0 alone
    (set_xlim(0, 0) made matplotlib warn 'identical low and high xlims')."""
    from attnlab.studies.kinds.lm_report import plot_paired

    runs = [
        {"variant": "base", "seed": 0, "val_loss": 1.5, "status": "ok"},
        {"variant": "kv", "seed": 0, "val_loss": math.nan, "status": "ok"},
    ]
    comparison = {"variant": "kv", "baseline": "base", "seeds": [0], "n": 1,
                  "mean_diff": math.nan, "ci95": [math.nan, math.nan], "p": math.nan}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_paired({"runs": runs, "comparisons": [comparison]}, tmp_path / "p.png", "t")
    left, right = fig.axes[0].get_xlim()
    assert left < 0.0 < right and math.isfinite(left) and math.isfinite(right)
