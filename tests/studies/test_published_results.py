"""The published studies under results/: every paired t and p recomputes from the per-seed
losses in their results.csv (scipy, and the t by hand), and Holm from those p-values."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from conftest import ROOT
from scipy import stats

from attnlab.studies import output

# the studies that trained runs (retrieval and overhead studies write a results.csv of none)
TRAINED = sorted(
    p.parent
    for p in (ROOT / "results").glob(f"*/{output.RESULTS_CSV}")
    if len(p.read_text().splitlines()) > 1
)


def _losses(folder: Path) -> dict[tuple[str, int], float]:
    with (folder / output.RESULTS_CSV).open() as f:
        return {
            (r["variant"], int(r["seed"])): float(r["val_loss"])
            for r in csv.DictReader(f)
            if r["status"] == "ok" and r["val_loss"]
        }


def test_the_lm_studies_are_published() -> None:
    assert {p.name for p in TRAINED} >= {"kv-bias", "gba-lm", "qkve"}


@pytest.mark.parametrize("folder", TRAINED, ids=lambda p: p.name)
def test_every_t_and_p_recomputes_from_results_csv(folder: Path) -> None:
    loss = _losses(folder)
    comparisons = json.loads((folder / output.RESULTS_JSON).read_text())["comparisons"]
    assert comparisons
    for c in comparisons:
        seeds = sorted(s for (v, s) in loss if v == c["variant"] and (c["baseline"], s) in loss)
        v = [loss[c["variant"], s] for s in seeds]
        b = [loss[c["baseline"], s] for s in seeds]
        d = [x - y for x, y in zip(v, b, strict=True)]
        n = len(d)
        assert c["n"] == n, c
        if n < 2 or c.get("no_spread"):  # no test: written as null
            assert c["t"] is None and c["p"] is None and c["p_holm"] is None, c
            continue
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        res = stats.ttest_rel(v, b)
        assert c["df"] == n - 1, c
        assert c["t"] == pytest.approx(mean / (sd / math.sqrt(n)), rel=1e-9)
        assert c["t"] == pytest.approx(res.statistic, rel=1e-9)
        assert c["p"] == pytest.approx(res.pvalue, rel=1e-9)
        assert c["mean_diff"] == pytest.approx(mean, rel=1e-9)
        if "ci95" in c:  # reported by this attnlab's statistics
            ci = res.confidence_interval()
            assert c["ci95"] == pytest.approx([ci.low, ci.high], rel=1e-9)
            assert c["sd_diff"] == pytest.approx(sd, rel=1e-9)
    # Holm by hand over the study's comparisons (one without a test counts as p = 1)
    p = [1.0 if c["p"] is None else c["p"] for c in comparisons]
    running = 0.0
    for rank, i in enumerate(sorted(range(len(p)), key=lambda i: p[i])):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        if comparisons[i]["p"] is not None:
            assert comparisons[i]["p_holm"] == pytest.approx(running, rel=1e-9)
