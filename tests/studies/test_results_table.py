"""`attnlab results`: the Results table generated from results/ and results/claims.toml; the
published table equals what the command writes, its tests recompute, and bad inputs end in one
line with nothing on disk changed."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from conftest import ROOT
from scipy import stats

from attnlab.cli import main
from attnlab.studies import output, results_table
from attnlab.studies import verdict as v
from attnlab.studies.report import p_value

PUBLISHED = ROOT / "results"


def test_the_published_table_is_what_the_command_writes(capsys: pytest.CaptureFixture) -> None:
    assert main(["results", "--root", str(PUBLISHED), "--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def _row(rows: list[results_table.Row], start: str) -> results_table.Row:
    (row,) = [r for r in rows if r.claim["claim"].startswith(start)]
    return row


def _words(row: results_table.Row) -> list[str]:
    return [x.word for x in results_table.row_verdicts(row)]


def test_the_rows_the_audit_flagged_read_what_the_rule_gives() -> None:
    rows = results_table.build(PUBLISHED)
    # CI includes 0 and excludes the seed's -4.3 %: not "reproduced in size"
    assert _words(_row(rows, "K/V-bias, the seed's headline")) == [v.NOT_REPRODUCED]
    assert _words(_row(rows, "K/V-bias main table")) == [v.NOT_REPRODUCED]
    # detached on Gutenberg does not survive Holm
    assert _words(_row(rows, "K/V-bias, Gutenberg corpus (robustness row): detaching")) == [
        v.INCONCLUSIVE
    ]
    # "every control loses": one word per control, and not all of them reproduce
    controls = _words(_row(rows, "K/V-bias on shakespeare_char: every control"))
    assert controls == [v.SMALLER, v.NOT_REPRODUCED, v.NOT_REPRODUCED]
    # the names rows carry a Fisher test; the top-position rows stay descriptive
    for row in rows:
        if "canonical" in row.claim["claim"]:
            assert [t.kind for t in row.tests] == ["fisher"]
            assert v.REPRODUCED not in _words(row)
        if "gain concentrates" in row.claim["claim"]:
            assert _words(row) == [v.DESCRIPTIVE]
    # 450 iterations cannot rank trained models
    assert set(_words(_row(rows, "GBA Table 3: boosted"))) == {v.NO_VERDICT}
    # the seed's Table 5 gains are over M=2, not round to round
    later = _row(rows, "GBA Table 5: later rounds")
    assert [t.seed_value for t in later.tests] == [2.1, 2.6, 1.5]
    assert [t.label for t in later.tests] == ["M=3 − M=2", "M=4 − M=2", "M=5 − M=2"]


def test_the_names_test_is_fishers_on_the_recorded_counts() -> None:
    rows = results_table.build(PUBLISHED)
    row = _row(rows, "K/V-bias §8 on shakespeare_char: vanilla writes")
    names = json.loads((PUBLISHED / row.claim["study"] / output.STUDY_JSON).read_text())
    (base, var) = names["analyses"]["names"]["scores"]
    table = [
        [var["canonical_headers"], var["headers"] - var["canonical_headers"]],
        [base["canonical_headers"], base["headers"] - base["canonical_headers"]],
    ]
    (test,) = row.tests
    assert test.p == pytest.approx(stats.fisher_exact(table).pvalue, rel=1e-12)
    seed = math.log(0.716 / 0.284) - math.log(0.779 / 0.221)
    assert test.seed_value == pytest.approx(seed, rel=1e-12)


# --- a toy study: a (the mechanism) against b, and c, a control the claims file adds ---
SEEDS = [0, 1, 2, 3]
LOSS = {
    "b": [2.00, 2.01, 1.99, 2.00],
    "a": [1.90, 1.90, 1.90, 1.90],
    "c": [2.01, 1.99, 2.005, 1.995],
}
LOSS["a"] = [b - d for b, d in zip(LOSS["b"], [0.10, 0.11, 0.09, 0.10], strict=True)]
CLAIMS = """
[[row]]
claim = "a beats b"
seed_number = "-0.10"
study = "toy"
budget = "seed"
setting = "toy"
[[row.compare]]
variant = "a"
baseline = "b"

[[row]]
claim = "c beats b"
seed_number = "-0.05"
study = "toy"
budget = "seed"
setting = "toy"
[[row.compare]]
variant = "c"
baseline = "b"
seed_value = -0.05

[[row]]
claim = "a writes canonical names"
seed_number = "90 vs 80 %"
study = "toy"
budget = "seed"
setting = "toy"
[[row.compare]]
kind = "fisher"
seed_percent = [90.0, 80.0]

[[row]]
claim = "a trained short"
seed_number = "-0.10"
study = "toy"
budget = "short"
setting = "toy"
[[row.compare]]
variant = "a"
baseline = "b"
"""


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    study = root / "toy"
    study.mkdir(parents=True)
    with (study / output.RESULTS_CSV).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "seed", "val_loss", "status", "val_change_last20"])
        for arm, losses in LOSS.items():
            for s, x in zip(SEEDS, losses, strict=True):
                w.writerow([arm, s, x, "ok", -0.02 if s == 0 else -0.005])
    own = {"variant": "a", "baseline": "b", "claimed_diff": -0.10}
    (study / output.RESULTS_JSON).write_text(json.dumps({"runs": [], "comparisons": [own]}))
    names = {
        "runs": ["b", "a"],
        "seed": 0,
        "cast_size": 10,
        "scores": [
            {"headers": 100, "canonical_headers": 70},
            {"headers": 100, "canonical_headers": 88},
        ],
    }
    record = {"seeds": SEEDS, "analyses": {"names": names}}
    (study / output.STUDY_JSON).write_text(json.dumps(record))
    (root / results_table.CLAIMS).write_text(CLAIMS)
    return root


def test_a_toy_study_gets_the_rules_words_and_holm_over_its_family(toy: Path) -> None:
    rows = results_table.build(toy)
    words = [_words(r) for r in rows]
    assert words == [[v.REPRODUCED], [v.NOT_REPRODUCED], [v.REPRODUCED], [v.NO_VERDICT]]
    # the family: the study's own a - b, the added c - b and the Fisher test
    d_ab = [x - y for x, y in zip(LOSS["a"], LOSS["b"], strict=True)]
    p_ab = stats.ttest_rel(LOSS["a"], LOSS["b"]).pvalue
    p_cb = stats.ttest_rel(LOSS["c"], LOSS["b"]).pvalue
    p_f = stats.fisher_exact([[88, 12], [70, 30]]).pvalue
    assert rows[0].tests[0].p == pytest.approx(p_ab)
    assert rows[0].tests[0].diff == pytest.approx(sum(d_ab) / 4)
    assert rows[0].tests[0].p_holm == pytest.approx(3 * p_ab)
    assert rows[2].tests[0].p_holm == pytest.approx(min(1, max(3 * p_ab, 2 * p_f)))
    assert rows[1].tests[0].p_holm == pytest.approx(min(1, max(2 * p_f, p_cb)))
    # the table shows them, and says the 3 seed-0 runs of 12 still fell more than 1 %
    text = results_table.render(toy)
    assert f"Holm {p_value(3 * p_ab)} over 3" in text
    assert "3 of 12 runs fell more than 1 % over their last fifth" in text
    assert "**reproduced** (rests on 4 seeds; at this size;" in text


def _unchanged(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_write_then_check_then_drift(toy: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["results", "--root", str(toy)]) == 0
    assert (toy / "README.md").read_text().startswith(results_table.MARK)
    assert main(["results", "--root", str(toy), "--check"]) == 0
    readme = toy / "README.md"
    readme.write_text(readme.read_text().replace("reproduced", "reproduced in full"))
    before = _unchanged(toy)
    capsys.readouterr()
    assert main(["results", "--root", str(toy), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differs from what `attnlab results` writes" in err
    assert _unchanged(toy) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda root: (root / "README.md").write_text("# my notes\n"), "not written by"),
        (lambda root: (root / "claims.toml").write_text("[[row]\n"), "not valid TOML"),
        (
            lambda root: (root / "claims.toml").write_text(CLAIMS.replace('"short"', '"long"')),
            "budget 'long' is not one of",
        ),
        (
            lambda root: (root / "claims.toml").write_text(CLAIMS.replace('"toy"', '"nope"', 1)),
            "no published study 'nope'",
        ),
        (
            lambda root: (root / "claims.toml").write_text(CLAIMS.replace('"c"', '"d"')),
            "no finished runs of 'd'",
        ),
        (lambda root: (root / "claims.toml").unlink(), "cannot read"),
        (
            lambda root: (root / "claims.toml").write_text(CLAIMS.replace('variant = "c"', "")),
            "row 2: missing 'variant'",
        ),
    ],
)
def test_bad_inputs_end_in_one_line_and_change_nothing(
    toy: Path, capsys: pytest.CaptureFixture, change: object, message: str
) -> None:
    change(toy)  # type: ignore[operator]
    before = _unchanged(toy)
    assert main(["results", "--root", str(toy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert _unchanged(toy) == before


def test_the_published_claims_name_only_published_studies() -> None:
    claims = results_table.read_claims(PUBLISHED)
    assert {c["study"] for c in claims} <= {p.name for p in PUBLISHED.iterdir() if p.is_dir()}
