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
    low, high = np.linspace(0.0, threshold, _GRID), np.linspace(threshold, 1.0, _GRID)
    fp = float(np.trapezoid(candidate_probability(low, bands, rows), low))
    fn = float(np.trapezoid(1.0 - candidate_probability(high, bands, rows), high))
    return fp, fn


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
    scored: list[tuple[float, int, int, float, float]] = []
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            fp, fn = error_areas(threshold, bands, rows)
            scored.append(((1.0 - fn_weight) * fp + fn_weight * fn, bands, rows, fp, fn))
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
