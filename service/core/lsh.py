"""Banded LSH: choose (bands, rows) from the S-curve 1-(1-s^r)^b, and turn signatures into band keys."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._hashing import HashArray
from .compiled import _sketch

_GRID = 1001  # integration points on [0, 1]; the S-curve is smooth, the trapezoid rule is plenty


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Probability that a pair of this Jaccard similarity shares at least one band."""
    s = np.asarray(similarity, dtype=np.float64)
    return 1.0 - (1.0 - s**rows) ** bands


@dataclass(frozen=True)
class LshParams:
    """A banding of the first bands*rows signature slots, with the error areas it implies."""

    bands: int
    rows: int
    threshold: float
    false_positive_area: float
    false_negative_area: float

    @property
    def used_slots(self) -> int:
        return self.bands * self.rows


def error_areas(threshold: float, bands: int, rows: int) -> tuple[float, float]:
    """(∫₀ᵗ P(s) ds, ∫ₜ¹ 1-P(s) ds): the false-positive and false-negative areas under the S-curve
    P(s) = 1-(1-s^rows)^bands on either side of the threshold."""
    grids = _Grids(threshold)
    return grids.areas(grids.low**rows, grids.high**rows, bands)


class _Grids:
    """The integration points either side of a threshold, and their steps: the trapezoid rule
    (np.trapezoid's operations, in its order) over the S-curve's values there."""

    def __init__(self, threshold: float) -> None:
        self.low, self.high = np.linspace(0.0, threshold, _GRID), np.linspace(threshold, 1.0, _GRID)
        self.low_steps, self.high_steps = np.diff(self.low), np.diff(self.high)

    def areas(self, low_powered: np.ndarray, high_powered: np.ndarray, bands: int) -> tuple[float, float]:
        """error_areas from the grids' points raised to the rows (s**rows, as candidate_probability
        takes it), which every banding of those rows shares."""
        fp = 1.0 - (1.0 - low_powered) ** bands
        fn = 1.0 - (1.0 - (1.0 - high_powered) ** bands)
        return _trapezoid(fp, self.low_steps), _trapezoid(fn, self.high_steps)


def _trapezoid(values: np.ndarray, steps: np.ndarray) -> float:
    return float((steps * (values[1:] + values[:-1]) / 2.0).sum())


def explicit_params(threshold: float, bands: int, rows: int, num_perm: int) -> LshParams:
    """User-chosen banding, checked against the signature length."""
    if bands < 1 or rows < 1 or bands * rows > num_perm:
        raise ValueError(f"bands*rows must be in 1..num_perm={num_perm}, got {bands}*{rows}")
    fp, fn = error_areas(threshold, bands, rows)
    return LshParams(bands, rows, threshold, fp, fn)


def optimal_params(
    threshold: float, num_perm: int, fn_weight: float = 0.5, full_use_tolerance: float = 0.05
) -> LshParams:
    """(bands, rows) minimising w_fp·FP + w_fn·FN over b·r ≤ num_perm.

    Bandings that use every slot (b·r = num_perm) are preferred when their weighted error is within
    `full_use_tolerance` (relative) of the overall best: unused slots are signature work thrown away.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if not 0.0 <= fn_weight <= 1.0:
        raise ValueError(f"fn_weight must be in [0, 1], got {fn_weight}")
    grids = _Grids(threshold)
    scored: list[Scored] = []
    for rows in range(1, num_perm + 1):  # the points raised to the rows once for all their bandings
        low_powered, high_powered = grids.low**rows, grids.high**rows
        for bands in range(1, num_perm // rows + 1):
            fp, fn = grids.areas(low_powered, high_powered, bands)
            scored.append(((1.0 - fn_weight) * fp + fn_weight * fn, bands, rows, fp, fn))
    return chosen_banding(scored, threshold, num_perm, full_use_tolerance)


Scored = tuple[float, int, int, float, float]  # weighted error, bands, rows, its two areas


def chosen_banding(
    scored: list[Scored], threshold: float, num_perm: int, full_use_tolerance: float
) -> LshParams:
    """optimal_params' rule over every banding scored: the least weighted error, or the least of
    those using every slot when it is within `full_use_tolerance` of it."""
    best = min(scored)
    # never empty: one band of num_perm rows uses every slot
    best_full = min(s for s in scored if s[1] * s[2] == num_perm)
    full_is_close = best_full[0] <= best[0] * (1.0 + full_use_tolerance) + 1e-12
    _, bands, rows, fp, fn = best_full if full_is_close else best
    return LshParams(bands, rows, threshold, fp, fn)


BAND_KEY_BYTES = 2 + 8  # the band's index, then the first 8 bytes of its digest


def band_keys(signature: HashArray, bands: int, rows: int) -> list[bytes]:
    """One BAND_KEY_BYTES key per band: its 2-byte index (big-endian), then the first 8 bytes of
    MurmurHash3_x64_128 (seed 0) of its rows' bytes, as mmh3.hash_bytes gives them."""
    return _sketch.band_keys(np.ascontiguousarray(signature, dtype=np.uint64), bands, rows)
