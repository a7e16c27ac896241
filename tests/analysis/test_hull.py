"""Exact convex-hull distance against closed-form cases and a brute-force check."""

import itertools

import numpy as np
import pytest
from scipy.spatial import ConvexHull

from attnlab.analysis.hull import hull_distance

SQUARE = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def hull_distances(values: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Causal distances: output t [T, d] against the hull of values[: t + 1]."""
    return np.array([hull_distance(values[: t + 1], outputs[t]) for t in range(len(values))])


def test_convex_combination_has_distance_zero() -> None:
    rng = np.random.default_rng(0)
    points = rng.normal(size=(40, 16))
    w = rng.dirichlet(np.ones(40))
    assert hull_distance(points, w @ points) <= 1e-8


def test_vertex_itself_has_distance_zero() -> None:
    assert hull_distance(SQUARE, SQUARE[3]) <= 1e-12


def test_point_facing_an_edge() -> None:
    assert hull_distance(SQUARE, np.array([2.0, 0.5])) == pytest.approx(1.0, abs=1e-10)


def test_point_beyond_a_vertex() -> None:
    y = np.array([2.0, 3.0])
    assert hull_distance(SQUARE, y) == pytest.approx(np.hypot(1.0, 2.0), abs=1e-10)


def test_scale_and_translation() -> None:
    shift = np.array([1e3, -5e2])
    assert hull_distance(1e3 * SQUARE + shift, 1e3 * np.array([2.0, 0.5]) + shift) == (
        pytest.approx(1e3, rel=1e-9)
    )


def _brute_force_2d(points: np.ndarray, y: np.ndarray) -> float:
    """0 inside (facet inequalities of scipy's hull), else the nearest point over all segments.

    Outside a 2D polygon the nearest point lies on an edge, i.e. on one of the segments.
    """
    hull = ConvexHull(points)
    if (hull.equations @ np.append(y, 1.0) <= 0).all():
        return 0.0
    return min(
        float(
            np.linalg.norm(a + np.clip((y - a) @ (b - a) / ((b - a) @ (b - a)), 0, 1) * (b - a) - y)
        )
        for a, b in itertools.combinations(points, 2)
    )


@pytest.mark.parametrize("seed", range(8))
def test_matches_brute_force_in_2d(seed: int) -> None:
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(12, 2))
    y = rng.normal(size=2) * 2
    assert hull_distance(points, y) == pytest.approx(_brute_force_2d(points, y), abs=1e-9)


def test_high_dimension_is_certified_and_bounded() -> None:
    rng = np.random.default_rng(1)
    points = rng.normal(size=(256, 64))
    y = rng.normal(size=64) * 3
    dist = hull_distance(points, y)
    # Never farther than the nearest point, never negative.
    assert 0 < dist <= np.linalg.norm(points - y, axis=1).min() + 1e-12


def test_causal_batch() -> None:
    values = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    outputs = np.array([[0.0, 1.0], [1.0, 1.0], [0.5, 0.5]])
    np.testing.assert_allclose(hull_distances(values, outputs), [1.0, 1.0, 0.0], atol=1e-10)


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError):
        hull_distance(np.zeros((0, 3)), np.zeros(3))
    with pytest.raises(ValueError):
        hull_distance(np.zeros((4, 3)), np.zeros(2))
