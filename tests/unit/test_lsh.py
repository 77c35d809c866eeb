"""Banded LSH: the S-curve, the choice of (bands, rows), and band keys."""

from __future__ import annotations

import numpy as np
import pytest

from neardup.core import params as params_module
from neardup.core.lsh import (
    band_keys,
    candidate_probability,
    error_areas,
    explicit_params,
    optimal_params,
)
from neardup.core.params import DedupParams
from tests.support import reference_lsh, reference_sketch


def reference_areas(threshold: float, bands: int, rows: int) -> tuple[float, float]:
    """Independent integration of the S-curve (midpoint rule on a fine grid, plain formula)."""
    n = 20000
    low = (np.arange(n) + 0.5) * (threshold / n)
    high = threshold + (np.arange(n) + 0.5) * ((1 - threshold) / n)
    fp = float(np.sum(1 - (1 - low**rows) ** bands) * threshold / n)
    fn = float(np.sum((1 - high**rows) ** bands) * (1 - threshold) / n)
    return fp, fn


@pytest.mark.parametrize(("s", "bands", "rows"), [(0.0, 20, 5), (0.3, 20, 5), (0.8, 25, 5), (1.0, 7, 3)])
def test_candidate_probability_formula(s: float, bands: int, rows: int) -> None:
    assert float(candidate_probability(s, bands, rows)) == pytest.approx(1 - (1 - s**rows) ** bands)


def test_candidate_probability_is_an_increasing_s_curve() -> None:
    s = np.linspace(0, 1, 101)
    p = candidate_probability(s, 20, 5)
    assert p[0] == 0.0 and p[-1] == 1.0
    assert np.all(np.diff(p) >= 0)
    assert p[20] < 0.01 and p[90] > 0.99


def test_error_areas_match_an_independent_integration() -> None:
    for threshold, bands, rows in [(0.8, 16, 8), (0.5, 25, 5), (0.3, 10, 2)]:
        fp, fn = error_areas(threshold, bands, rows)
        ref_fp, ref_fn = reference_areas(threshold, bands, rows)
        assert fp == pytest.approx(ref_fp, abs=1e-5)
        assert fn == pytest.approx(ref_fn, abs=1e-5)


@pytest.mark.parametrize("num_perm", [1, 16, 128, 200])
def test_the_choice_and_its_areas_equal_the_plain_computation(num_perm: int) -> None:
    """optimal_params raises the points to each row count once for all its bandings; its choice
    and areas are those of every banding integrated on its own (tests/support/reference_lsh.py),
    to the last bit: a state's header names the banding, so a different one would refuse it."""
    for threshold in (0.1, 0.55, 0.7, 0.72, 0.85, 0.99):
        for weight in (0.0, 0.3, 0.5, 1.0):
            assert optimal_params(threshold, num_perm, weight) == reference_lsh.optimal_params(
                threshold, num_perm, weight
            ), (threshold, weight)
        for bands, rows in ((1, 1), (9, 14), (16, 8), (num_perm, 1)):
            assert error_areas(threshold, bands, rows) == reference_lsh.error_areas(threshold, bands, rows)


@pytest.mark.parametrize("threshold", [0.5, 0.8])
def test_optimal_params_minimise_weighted_area_over_all_bandings(threshold: float) -> None:
    num_perm, weight, tolerance = 64, 0.5, 0.05
    chosen = optimal_params(threshold, num_perm, weight, full_use_tolerance=tolerance)
    scores = {
        (b, r): 0.5 * sum(reference_areas(threshold, b, r))
        for b in range(1, num_perm + 1)
        for r in range(1, num_perm // b + 1)
    }
    best = min(scores.values())
    best_full = min(v for (b, r), v in scores.items() if b * r == num_perm)
    got = scores[(chosen.bands, chosen.rows)]
    if chosen.used_slots == num_perm:
        assert got == pytest.approx(best_full, rel=1e-4)
        assert got <= best * (1 + tolerance) + 1e-6
    else:
        assert got == pytest.approx(best, rel=1e-4)
        assert best_full > best * (1 + tolerance) * (1 - 1e-4)
    assert (chosen.false_positive_area, chosen.false_negative_area) == pytest.approx(
        reference_areas(threshold, chosen.bands, chosen.rows), abs=1e-5
    )


@pytest.mark.parametrize("threshold", [0.5, 0.8])
def test_without_full_use_preference_the_choice_is_the_global_minimum(threshold: float) -> None:
    num_perm = 48
    chosen = optimal_params(threshold, num_perm, 0.3, full_use_tolerance=0.0)
    score = {
        (b, r): 0.7 * reference_areas(threshold, b, r)[0] + 0.3 * reference_areas(threshold, b, r)[1]
        for b in range(1, num_perm + 1)
        for r in range(1, num_perm // b + 1)
    }
    best = min(score.values())
    assert score[(chosen.bands, chosen.rows)] <= best * (1 + 1e-4) + 1e-9


def test_the_known_choices_are_the_search_s() -> None:
    """The banding of the default settings, known rather than searched for at every start, is
    the one the search picks, with the same areas to the last bit."""
    assert DedupParams().lsh == optimal_params(0.5, 128, 0.5)
    for (threshold, num_perm, fn_weight), _ in params_module.KNOWN_CHOICES.items():
        known = params_module._cached_optimal.__wrapped__(threshold, num_perm, fn_weight)
        assert known == optimal_params(threshold, num_perm, fn_weight)


def test_default_tuning_at_0_8() -> None:
    chosen = optimal_params(0.8, 128)
    assert 1 <= chosen.used_slots <= 128
    # the S-curve's steep part sits near the threshold
    assert 0.65 < (1 / chosen.bands) ** (1 / chosen.rows) < 0.9
    assert float(candidate_probability(0.95, chosen.bands, chosen.rows)) > 0.99


def test_the_false_negative_weight_moves_towards_more_candidates() -> None:
    light = optimal_params(0.7, 128, fn_weight=0.2)
    heavy = optimal_params(0.7, 128, fn_weight=0.8)
    assert (light.bands, light.rows) != (heavy.bands, heavy.rows)
    assert heavy.false_negative_area < light.false_negative_area
    assert heavy.false_positive_area > light.false_positive_area
    for s in (0.5, 0.6, 0.7):
        assert candidate_probability(s, heavy.bands, heavy.rows) > candidate_probability(
            s, light.bands, light.rows
        )


@pytest.mark.parametrize(
    ("threshold", "weight"), [(0.0, 0.5), (1.0, 0.5), (-0.1, 0.5), (0.5, -0.1), (0.5, 1.5)]
)
def test_optimal_params_rejects_bad_arguments(threshold: float, weight: float) -> None:
    with pytest.raises(ValueError):
        optimal_params(threshold, 32, weight)


def test_explicit_params() -> None:
    p = explicit_params(0.8, 16, 8, 128)
    assert (p.bands, p.rows, p.used_slots) == (16, 8, 128)
    assert (p.false_positive_area, p.false_negative_area) == error_areas(0.8, 16, 8)
    for bands, rows in [(0, 4), (4, 0), (17, 8)]:
        with pytest.raises(ValueError):
            explicit_params(0.8, bands, rows, 128)


def test_band_keys_are_ten_bytes_with_band_index() -> None:
    sig = np.random.default_rng(1).integers(0, 2**64, size=128, dtype=np.uint64)
    keys = band_keys(sig, 25, 5)
    assert len(keys) == 25
    assert all(len(k) == 10 for k in keys)
    assert [int.from_bytes(k[:2], "big") for k in keys] == list(range(25))
    assert band_keys(sig.copy(), 25, 5) == keys


def test_equal_bands_give_equal_keys_across_signatures() -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 2**64, size=128, dtype=np.uint64)
    b = a.copy()
    b[40:] = rng.integers(0, 2**64, size=88, dtype=np.uint64)
    ka, kb = band_keys(a, 16, 8), band_keys(b, 16, 8)
    assert ka[:5] == kb[:5]  # slots 0..39 are bands 0..4
    assert all(x != y for x, y in zip(ka[5:], kb[5:], strict=True))
    # the same slot values in another band give another key (the band index is part of the key)
    c = np.roll(a, 8)
    assert band_keys(c, 16, 8)[1] != ka[1] and band_keys(c, 16, 8)[1][2:] == ka[0][2:]


@pytest.mark.parametrize("slot", [0, 4, 5, 63, 124])
def test_one_differing_slot_changes_exactly_one_key(slot: int) -> None:
    sig = np.random.default_rng(3).integers(0, 2**64, size=128, dtype=np.uint64)
    changed = sig.copy()
    changed[slot] ^= np.uint64(1)
    before, after = band_keys(sig, 25, 5), band_keys(changed, 25, 5)
    differing = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
    assert differing == [slot // 5]


def test_slots_outside_the_bands_do_not_matter() -> None:
    sig = np.random.default_rng(4).integers(0, 2**64, size=128, dtype=np.uint64)
    changed = sig.copy()
    changed[125:] = 0  # 25 x 5 uses slots 0..124
    assert band_keys(sig, 25, 5) == band_keys(changed, 25, 5)


def test_compiled_band_keys_equal_the_mmh3_reference() -> None:
    rng = np.random.default_rng(5)
    for bands, rows in ((25, 5), (16, 8), (1, 1), (3, 2), (10, 3), (7, 4)):
        for _ in range(20):
            signature = rng.integers(0, 2**64, bands * rows + 3, dtype=np.uint64)
            assert band_keys(signature, bands, rows) == reference_sketch.band_keys(signature, bands, rows)
