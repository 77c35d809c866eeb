"""The plain scoring of the bandings (service/core/lsh.py before its shared powers): each banding's
error areas integrated by np.trapezoid on its own, which the tests compare with lsh.error_areas and
lsh.optimal_params, value for value; the choice among them is lsh's own rule."""

from __future__ import annotations

import numpy as np

from neardup.core.lsh import _GRID, LshParams, Scored, candidate_probability, chosen_banding


def error_areas(threshold: float, bands: int, rows: int) -> tuple[float, float]:
    low, high = np.linspace(0.0, threshold, _GRID), np.linspace(threshold, 1.0, _GRID)
    fp = float(np.trapezoid(candidate_probability(low, bands, rows), low))
    fn = float(np.trapezoid(1.0 - candidate_probability(high, bands, rows), high))
    return fp, fn


def optimal_params(
    threshold: float, num_perm: int, fn_weight: float = 0.5, full_use_tolerance: float = 0.05
) -> LshParams:
    scored: list[Scored] = []
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            fp, fn = error_areas(threshold, bands, rows)
            scored.append(((1.0 - fn_weight) * fp + fn_weight * fn, bands, rows, fp, fn))
    return chosen_banding(scored, threshold, num_perm, full_use_tolerance)  # the rule itself is shared
