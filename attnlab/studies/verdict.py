"""The verdict words of the Results table, derived from a comparison's numbers by one rule.

Every difference is ``variant - baseline`` in the comparison's own units (a loss in nats, an
accuracy in points, a log odds ratio), and so is the seed's value; the interval is the one the
verdict weighs (after Holm within the study: ``holm_interval``). docs/verdicts.md gives the rule
as a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.errors import ConfigError
from attnlab.studies.stats import ALPHA

REPRODUCED = "reproduced"
SMALLER = "reproduced in direction, smaller"
LARGER = "reproduced in direction, larger"
NOT_REPRODUCED = "not reproduced"
OPPOSITE = "opposite"
INCONCLUSIVE = "inconclusive"
LOWER = "lower"
HIGHER = "higher"
NO_DIFFERENCE = "no difference detected"
NO_VERDICT = "no verdict"
DESCRIPTIVE = "descriptive"
WORDS = (
    REPRODUCED,
    SMALLER,
    LARGER,
    NOT_REPRODUCED,
    OPPOSITE,
    INCONCLUSIVE,
    LOWER,
    HIGHER,
    NO_DIFFERENCE,
    NO_VERDICT,
    DESCRIPTIVE,
)

# what a comparison is: a paired per-seed test, another test suited to the claim (Fisher's exact
# test of two proportions), or numbers without a test
KINDS = ("paired", "fisher", "descriptive")
FEW_SEEDS = 5  # a verdict resting on fewer seeds says so
UNTUNED = "untuned: best LR at the grid edge"
NOT_CONVERGED = "not converged"


@dataclass(frozen=True)
class Verdict:
    """A verdict word and the qualifiers that bound it ("rests on 3 seeds", "at this size")."""

    word: str
    qualifiers: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.word + (f" ({'; '.join(self.qualifiers)})" if self.qualifiers else "")


def _side(low: float, high: float) -> int:
    """+1 when the interval lies above 0, -1 below, 0 when it contains 0 (ends included)."""
    return 1 if low > 0 else -1 if high < 0 else 0


def _word(ci: tuple[float, float], seed_value: float | None) -> str:
    low, high = ci
    side = _side(low, high)
    if seed_value is None:  # nothing to reproduce: the direction found, if any
        return {1: HIGHER, -1: LOWER, 0: NO_DIFFERENCE}[side]
    direction = 1 if seed_value > 0 else -1
    contains_seed = low <= seed_value <= high
    if side == -direction:
        return OPPOSITE
    if side == direction:
        if contains_seed:
            return REPRODUCED
        # the interval excludes both 0 and the seed's value: it lies on one side of the latter
        return SMALLER if abs(high if direction > 0 else low) < abs(seed_value) else LARGER
    return INCONCLUSIVE if contains_seed else NOT_REPRODUCED


def verdict(
    diff: float,
    ci: tuple[float, float],
    seed_value: float | None,
    *,
    n: int,
    converged: bool = True,
    edge_of_grid: bool = False,
    sizes: int = 1,
    kind: str = "paired",
) -> Verdict:
    """The verdict on a comparison whose difference ``diff`` has the interval ``ci``, against
    the seed's value in the same units (None: the seed gives no number).

    ``n`` is the number of seeds (models per arm for a Fisher test); ``converged`` is False
    when the runs stopped short of the budget the claim is about; ``edge_of_grid`` when an
    arm's best learning rate lies at an edge of its grid; ``sizes`` the model sizes compared.
    """
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    if n < 1 or sizes < 1:
        raise ConfigError(f"a verdict needs n >= 1 and sizes >= 1, got n={n}, sizes={sizes}")
    qualifiers = [f"rests on {n} seed{'s' * (n != 1)}"] if n < FEW_SEEDS else []
    if sizes == 1:
        qualifiers.append("at this size")
    if edge_of_grid:
        return Verdict(NO_VERDICT, (UNTUNED, *qualifiers))
    if not converged:
        return Verdict(NO_VERDICT, (NOT_CONVERGED, *qualifiers))
    if kind == "descriptive":
        return Verdict(DESCRIPTIVE, tuple(qualifiers))
    low, high = ci
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ConfigError(f"interval ({low}, {high}) is not a finite interval low <= high")
    if not low <= diff <= high:
        raise ConfigError(f"difference {diff} lies outside its interval ({low}, {high})")
    if seed_value is not None and not (math.isfinite(seed_value) and seed_value != 0):
        raise ConfigError(
            f"seed value {seed_value} must be a finite, non-zero difference (None: no number)"
        )
    return Verdict(_word((low, high), seed_value), tuple(qualifiers))


def holm_alpha(p: float, p_holm: float) -> float:
    """The level Holm's correction spent on a comparison, ALPHA * p / p_holm: an interval at
    confidence 1 - holm_alpha excludes the null exactly when ``p_holm`` < ALPHA (for a t-test;
    ALPHA itself when nothing was corrected)."""
    if not 0 < p <= p_holm <= 1:
        raise ConfigError(f"need 0 < p <= p_holm <= 1, got p={p}, p_holm={p_holm}")
    return ALPHA * p / p_holm
