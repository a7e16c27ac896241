"""The verdict rule (attnlab/studies/verdict.py): one test per word, its boundaries, its sign
conventions and what it refuses."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from attnlab.errors import ConfigError
from attnlab.studies import verdict as v
from attnlab.studies.stats import ALPHA, holm


def word(ci: tuple[float, float], seed: float | None, **kw: object) -> str:
    diff = (ci[0] + ci[1]) / 2
    return v.verdict(diff, ci, seed, n=kw.pop("n", 8), **kw).word  # type: ignore[arg-type]


# a seed claiming a decrease of 0.04 (a loss difference, variant - baseline)
SEED = -0.04


def test_reproduced_when_the_interval_excludes_0_on_the_seeds_side_and_holds_its_value() -> None:
    assert word((-0.05, -0.03), SEED) == v.REPRODUCED


def test_smaller_when_the_interval_lies_between_0_and_the_seeds_value() -> None:
    assert word((-0.03, -0.01), SEED) == v.SMALLER


def test_larger_when_the_interval_lies_beyond_the_seeds_value() -> None:
    assert word((-0.09, -0.05), SEED) == v.LARGER


def test_not_reproduced_when_the_interval_holds_0_and_excludes_the_seeds_value() -> None:
    assert word((-0.02, 0.01), SEED) == v.NOT_REPRODUCED
    # past 0 on the other side but not excluding it: still not reproduced, not opposite
    assert word((-0.001, 0.03), SEED) == v.NOT_REPRODUCED


def test_opposite_when_the_interval_excludes_0_against_the_seeds_direction() -> None:
    assert word((0.01, 0.03), SEED) == v.OPPOSITE


def test_inconclusive_when_the_interval_holds_both_0_and_the_seeds_value() -> None:
    assert word((-0.06, 0.02), SEED) == v.INCONCLUSIVE


@pytest.mark.parametrize(
    ("ci", "expected"),
    [((-0.03, -0.01), v.LOWER), ((0.01, 0.02), v.HIGHER), ((-0.01, 0.02), v.NO_DIFFERENCE)],
)
def test_without_a_seed_value_the_interval_alone_gives_the_direction(
    ci: tuple[float, float], expected: str
) -> None:
    assert word(ci, None) == expected


def test_no_verdict_when_not_converged() -> None:
    out = v.verdict(-0.04, (-0.05, -0.03), SEED, n=8, converged=False)
    assert out.word == v.NO_VERDICT and v.NOT_CONVERGED in out.qualifiers


def test_no_verdict_at_the_edge_of_the_lr_grid_even_when_everything_else_agrees() -> None:
    out = v.verdict(-0.04, (-0.05, -0.03), SEED, n=8, edge_of_grid=True, converged=False)
    assert out.word == v.NO_VERDICT and out.qualifiers[0] == v.UNTUNED


def test_descriptive_claims_are_descriptive_never_reproduced() -> None:
    out = v.verdict(math.nan, (math.nan, math.nan), None, n=1, kind="descriptive")
    assert out.word == v.DESCRIPTIVE
    # numbers that would reproduce under a test do not make a descriptive claim reproduced
    assert v.verdict(-0.04, (-0.05, -0.03), SEED, n=8, kind="descriptive").word == v.DESCRIPTIVE


def test_a_fisher_comparison_follows_the_same_rule() -> None:
    assert v.verdict(-0.4, (-0.6, -0.2), -0.3, n=1, kind="fisher").word == v.REPRODUCED


@pytest.mark.parametrize("scale", [1.0, -1.0])
def test_the_rule_is_symmetric_in_sign(scale: float) -> None:
    """Mirroring the interval and the seed's value around 0 gives the same word: nothing in
    the rule assumes lower is better."""
    cases = [((-0.05, -0.03), v.REPRODUCED), ((-0.03, -0.01), v.SMALLER)]
    cases += [((-0.09, -0.05), v.LARGER), ((-0.02, 0.01), v.NOT_REPRODUCED)]
    cases += [((0.01, 0.03), v.OPPOSITE), ((-0.06, 0.02), v.INCONCLUSIVE)]
    for (low, high), expected in cases:
        ci = tuple(sorted((scale * low, scale * high)))
        assert word(ci, scale * SEED) == expected, (ci, scale)
    lower, higher = (v.LOWER, v.HIGHER) if scale > 0 else (v.HIGHER, v.LOWER)
    assert word(tuple(sorted((scale * -0.03, scale * -0.01))), None) == lower
    assert word(tuple(sorted((scale * 0.01, scale * 0.03))), None) == higher


def test_boundaries_are_closed_intervals() -> None:
    # an end exactly at 0 does not exclude 0
    assert word((-0.05, 0.0), SEED) == v.INCONCLUSIVE
    assert word((0.0, 0.02), SEED) == v.NOT_REPRODUCED
    assert word((0.0, 0.02), None) == v.NO_DIFFERENCE
    # an end exactly at the seed's value contains it
    assert word((-0.04, -0.01), SEED) == v.REPRODUCED
    assert word((-0.07, -0.04), SEED) == v.REPRODUCED
    # just past it, on either side
    assert word((-0.0399, -0.01), SEED) == v.SMALLER
    assert word((-0.07, -0.0401), SEED) == v.LARGER


def test_qualifiers_name_few_seeds_and_one_size() -> None:
    few = v.verdict(-0.04, (-0.05, -0.03), SEED, n=3)
    assert few.qualifiers == ("rests on 3 seeds", "at this size")
    assert str(few) == "reproduced (rests on 3 seeds; at this size)"
    assert v.verdict(-0.04, (-0.05, -0.03), SEED, n=1).qualifiers[0] == "rests on 1 seed"
    assert v.verdict(-0.04, (-0.05, -0.03), SEED, n=v.FEW_SEEDS, sizes=2).qualifiers == ()
    assert str(v.verdict(-0.04, (-0.05, -0.03), SEED, n=5, sizes=2)) == "reproduced"


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        ((-0.04, (-0.03, -0.05), SEED), {}, "not a finite interval"),
        ((-0.04, (-0.05, math.inf), SEED), {}, "not a finite interval"),
        ((0.1, (-0.05, -0.03), SEED), {}, "outside its interval"),
        ((-0.04, (-0.05, -0.03), 0.0), {}, "non-zero"),
        ((-0.04, (-0.05, -0.03), math.nan), {}, "non-zero"),
        ((-0.04, (-0.05, -0.03), SEED), {"kind": "bayes"}, "not one of"),
        ((-0.04, (-0.05, -0.03), SEED), {"n": 0}, "n >= 1"),
    ],
)
def test_bad_inputs_are_refused_in_one_line(args: tuple, kw: dict, message: str) -> None:
    kw = {"n": 8, **kw}
    with pytest.raises(ConfigError, match=message) as e:
        v.verdict(*args, **kw)
    assert "\n" not in str(e.value)


def test_the_holm_level_excludes_0_exactly_when_holm_p_is_below_alpha() -> None:
    """A t interval at confidence 1 - holm_alpha(p, p_holm) excludes 0 iff p_holm < ALPHA."""
    n, sd = 4, 1.0
    se = sd / math.sqrt(n)
    means = [0.9, 1.4, 2.0, 3.5]  # t = 1.8 .. 7: some pass Holm, some only uncorrected
    p = [2 * stats.t.sf(m / se, n - 1) for m in means]
    p_holm = holm(p)
    passed = []
    for m, pi, ph in zip(means, p, p_holm, strict=True):
        half = stats.t.ppf(1 - v.holm_alpha(pi, ph) / 2, n - 1) * se
        assert (m - half > 0) == (ph < ALPHA)
        passed.append(ph < ALPHA)
    assert set(passed) == {True, False}  # both sides of the boundary were exercised
    assert v.holm_alpha(0.01, 0.01) == ALPHA  # nothing corrected: the plain 95 % interval
    with pytest.raises(ConfigError):
        v.holm_alpha(0.02, 0.01)
