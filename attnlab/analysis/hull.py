"""Exact Euclidean distance from a point to the convex hull of a finite point set.

``dist(y, conv P)`` is the norm of the minimum-norm point of ``conv(Q)``, ``Q = P - y``. That
point is found exactly (finite active-set algorithm, no sampling or penalty weight) through
the Lawson–Hanson reduction of least-distance programming to NNLS: solve
``min_{u >= 0} ||[Q^T; 1^T] u - e_{d+1}||`` with scipy.optimize.nnls. Its optimality
conditions give ``||Q^T u||^2 = s (1 - s)`` with ``s = sum(u)``, which makes ``w = u / s`` the
convex weights of the minimum-norm point ``z = Q^T w`` (and 0 when y lies in the hull).

Every answer is certified: ``||z||`` is an upper bound (z is in the hull), and
``min_i q_i . z / ||z||`` is a lower bound (the hyperplane through z normal to z separates
the hull from the origin); the two must agree to a tight tolerance.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

# Allowed gap between the certified bounds, relative to the scale of the point set.
CERT_TOL = 1e-7


def hull_distance(points: np.ndarray, y: np.ndarray) -> float:
    """Euclidean distance from ``y`` [d] to the convex hull of ``points`` [n, d]."""
    points = np.asarray(points, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if points.ndim != 2 or points.shape[0] == 0 or y.shape != (points.shape[1],):
        raise ValueError(f"need points [n>0, d] and y [d]; got {points.shape} and {y.shape}")
    q = points - y
    # Rescale so the sum-to-one row and the coordinates have comparable magnitude.
    scale = float(np.abs(q).max())
    if scale == 0.0:
        return 0.0
    q /= scale
    system = np.vstack([q.T, np.ones(q.shape[0])])
    target = np.zeros(q.shape[1] + 1)
    target[-1] = 1.0
    u, _ = nnls(system, target, maxiter=50 * system.shape[1])
    z = q.T @ (u / u.sum())
    upper = float(np.linalg.norm(z))
    lower = max(0.0, float((q @ z).min()) / upper) if upper > 0 else 0.0
    if upper - lower > CERT_TOL:
        raise RuntimeError(f"hull distance not certified: bounds {lower:.3g}..{upper:.3g}")
    return upper * scale


def hull_distances(values: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Causal distances: output t [T, d] against the hull of values[: t + 1]."""
    values = np.asarray(values, dtype=np.float64)
    outputs = np.asarray(outputs, dtype=np.float64)
    if values.shape != outputs.shape or values.ndim != 2:
        raise ValueError(
            f"need values and outputs of one shape [T, d]; got {values.shape}, {outputs.shape}"
        )
    return np.array([hull_distance(values[: t + 1], outputs[t]) for t in range(len(values))])
