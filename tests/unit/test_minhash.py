"""MinHash (one-permutation hashing with densification): stability, unbiasedness, edge cases."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from neardup.core import compiled, minhash
from neardup.core import normalize as normalize_module
from neardup.core.minhash import (
    CHANCE_AGREEMENT,
    EMPTY_SLOT,
    EMPTY_VERIFIER_SLOT,
    VERIFIER_BITS,
    MinHasher,
    estimate_containment,
    estimate_jaccard,
    estimate_jaccard_verified,
    unbias,
    verified_scores,
)
from neardup.core.normalize import NormalizeOptions, canonical_code_points, normalize
from neardup.core.params import DedupParams
from neardup.core.shingle import shingle_hashes, shingle_hashes_of_units
from neardup.core.signing import sketch_of
from neardup.core.similarity import exact_jaccard
from tests.support import reference_sketch as reference
from tests.support.reference_sketch import (
    estimate_containment_many,
    estimate_jaccard_verified_many,
    narrow_verifier,
)
from tests.support.scoring import kperm_signature

PINNED_TEXT = "The quick brown fox jumps over the lazy dog."


def synthetic_pairs(
    count: int, min_union: int, max_union: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Pairs of random hash sets with exact Jaccard spread over (0.05, 0.95)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        union = int(rng.integers(min_union, max_union))
        common = max(1, round(rng.uniform(0.05, 0.95) * union))
        values = rng.integers(0, 2**64, size=union, dtype=np.uint64)
        rest = union - common
        a = values[: common + rest // 2]
        b = np.concatenate([values[:common], values[common + rest // 2 :]])
        pairs.append((a, b, exact_jaccard(np.unique(a), np.unique(b))))
    return pairs


def estimates(pairs: list[tuple[np.ndarray, np.ndarray, float]], hasher: MinHasher) -> np.ndarray:
    return np.array([estimate_jaccard(hasher.signature(a)[0], hasher.signature(b)[0]) for a, b, _ in pairs])


def test_signature_is_pinned_across_versions() -> None:
    """Stored state holds signatures and band keys computed from them; a signature that changes for
    the same (text, num_perm, seed) makes every stored record silently unmatchable. If this test fails
    the change must bump minhash.ALGORITHM (so old state is refused), never just update the pins."""
    # the pins below belong to this algorithm version (v2: shingle hashes without a final fmix64)
    assert minhash.ALGORITHM == "oph-optdens-fmix64-v2"
    sketch = sketch_of(PINNED_TEXT, DedupParams(num_perm=128, seed=1))
    assert [int(x) for x in sketch.signature[:4]] == [
        0x3E9FFA5A04F7C9AC,
        0x74B15A3C8717B048,
        0xBE3679FD4AE64244,
        0x0DAE04B7F84E6804,
    ]
    assert sketch.shingle_count == 40  # fewer shingles than slots: densification is pinned too
    digest = hashlib.sha256(sketch.signature.astype("<u8").tobytes()).hexdigest()[:16]
    assert digest == "71cc4b3b137a2e29"
    # content hash over UTF-32 code points since state format 2 (params.STATE_FORMAT_VERSION)
    assert sketch.content_hash.hex() == "8da45b8159bda49316dd7e6480262df2"


def test_signature_of_a_news_sized_text_is_pinned(prose: tuple[str, ...]) -> None:
    """The same guard for a text with more shingles than slots (no densification, and the bucketed
    sort that inputs of 512+ hashes take); pinned before that sort was introduced."""
    hashes = shingle_hashes(normalize(prose[0]))
    assert hashes.size == 1776
    signature, distinct = MinHasher(128, 1).signature(hashes)
    assert distinct == 1475
    assert minhash.ALGORITHM == "oph-optdens-fmix64-v2"
    assert [int(x) for x in signature[:4]] == [
        0x0005D3CB25D47E34,
        0x0200FCEC6EA6EC42,
        0x042440F7AE7C4762,
        0x0624CEAA0A194345,
    ]
    assert hashlib.sha256(signature.astype("<u8").tobytes()).hexdigest()[:16] == "caf70e8462729ee1"


@pytest.mark.parametrize("size", [0, 1, 2, 511, 512, 513, 3000, 70_000])
def test_sorting_shortcut_is_a_complete_sort(size: int) -> None:
    rng = np.random.default_rng(size)
    for values in (
        rng.integers(0, 2**64, size=size, dtype=np.uint64),
        rng.integers(0, 40, size=size, dtype=np.uint64) << np.uint64(58),  # few, equal top bits
    ):
        assert np.array_equal(reference.sorted_values(values.copy()), np.sort(values))


def test_same_inputs_same_signature_and_seeds_differ(prose: tuple[str, ...]) -> None:
    hashes = shingle_hashes(normalize(prose[0]))
    sig, distinct = MinHasher(128, 1).signature(hashes)
    again, _ = MinHasher(128, 1).signature(hashes.copy())
    assert np.array_equal(sig, again)
    assert distinct == np.unique(hashes).size
    other, _ = MinHasher(128, 2).signature(hashes)
    assert estimate_jaccard(sig, other) < 0.1
    # order and repeats of the shingle hashes do not matter
    shuffled = np.random.default_rng(3).permutation(np.concatenate([hashes, hashes[:100]]))
    assert np.array_equal(MinHasher(128, 1).signature(shuffled)[0], sig)


def test_input_array_is_not_modified(prose: tuple[str, ...]) -> None:
    hashes = shingle_hashes(normalize(prose[1]))
    before = hashes.copy()
    MinHasher().signature(hashes)
    kperm_signature(hashes)
    assert np.array_equal(hashes, before)


def test_estimate_is_unbiased_with_theoretical_error() -> None:
    m = 128
    pairs = synthetic_pairs(200, 300, 3000, seed=11)
    exact = np.array([j for _, _, j in pairs])
    est = estimates(pairs, MinHasher(m, 1))
    assert abs(np.mean(est - exact)) < 0.01
    rmse = float(np.sqrt(np.mean((est - exact) ** 2)))
    theory = float(np.sqrt(np.mean(exact * (1 - exact) / m)))
    assert 0.75 * theory < rmse < 1.25 * theory


def test_kperm_baseline_is_unbiased_too() -> None:
    pairs = synthetic_pairs(100, 300, 1500, seed=12)
    exact = np.array([j for _, _, j in pairs])
    est = np.array([estimate_jaccard(kperm_signature(a), kperm_signature(b)) for a, b, _ in pairs])
    assert abs(np.mean(est - exact)) < 0.015
    theory = float(np.sqrt(np.mean(exact * (1 - exact) / 128)))
    assert float(np.sqrt(np.mean((est - exact) ** 2))) < 1.3 * theory


def test_densification_keeps_short_sets_comparable() -> None:
    """5-40 shingles in 128 bins: most bins are empty and borrowed, the estimate stays unbiased."""
    m = 128
    pairs = synthetic_pairs(300, 5, 40, seed=13)
    exact = np.array([j for _, _, j in pairs])
    est = estimates(pairs, MinHasher(m, 1))
    assert abs(np.mean(est - exact)) < 0.02
    theory = float(np.sqrt(np.mean(exact * (1 - exact) / m)))
    assert float(np.sqrt(np.mean((est - exact) ** 2))) < 1.5 * theory


def test_densified_slots_hold_values_of_the_set() -> None:
    hashes = shingle_hashes(normalize("Short headline, few shingles"))
    sig, distinct = MinHasher().signature(hashes)
    assert distinct == np.unique(hashes).size < 128
    assert not np.any(sig == EMPTY_SLOT)
    assert np.unique(sig).size <= distinct
    one, count = MinHasher().signature(np.array([12345], dtype=np.uint64))
    assert count == 1 and np.unique(one).size == 1 and one[0] != EMPTY_SLOT


def test_short_real_texts_estimate_close_to_exact() -> None:
    pairs = [
        ("cowboys quarterback tony romo marries candace crawford", "tony romo marries candace crawford"),
        ("memorial day: the start of summer", "memorial day marks the start of summer"),
        ("congress declared memorial day a holiday in 1971", "in 1971 congress declared memorial day"),
    ]
    hasher = MinHasher()
    for a, b in pairs:
        ha, hb = shingle_hashes(a), shingle_hashes(b)
        exact = exact_jaccard(np.unique(ha), np.unique(hb))
        assert 0.2 < exact < 0.9
        assert estimate_jaccard(hasher.signature(ha)[0], hasher.signature(hb)[0]) == pytest.approx(
            exact, abs=0.2
        )


def test_empty_input_gives_empty_slots() -> None:
    empty = np.empty(0, dtype=np.uint64)
    sig, distinct = MinHasher(64, 9).signature(empty)
    assert distinct == 0
    assert sig.shape == (64,) and np.all(sig == EMPTY_SLOT)
    assert np.all(kperm_signature(empty, 32) == EMPTY_SLOT)


@pytest.mark.parametrize("num_perm", [2, 100, 256])
def test_other_signature_lengths(num_perm: int, prose: tuple[str, ...]) -> None:
    a = shingle_hashes(normalize(prose[0]))
    b = shingle_hashes(normalize(prose[0][:-300]))
    sa, _ = MinHasher(num_perm).signature(a)
    assert sa.shape == (num_perm,) and not np.any(sa == EMPTY_SLOT)
    if num_perm >= 100:
        exact = exact_jaccard(np.unique(a), np.unique(b))
        est = estimate_jaccard(sa, MinHasher(num_perm).signature(b)[0])
        assert est == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / num_perm))


@pytest.mark.parametrize(("num_perm", "seed"), [(1, 1), (4097, 1), (128, -1), (128, 2**63)])
def test_invalid_hasher(num_perm: int, seed: int) -> None:
    with pytest.raises(ValueError):
        MinHasher(num_perm, seed)


def test_estimate_rejects_different_lengths() -> None:
    with pytest.raises(ValueError):
        estimate_jaccard(np.zeros(4, dtype=np.uint64), np.zeros(5, dtype=np.uint64))


@pytest.mark.parametrize(
    ("common", "size_a", "size_b"), [(30, 30, 100), (40, 45, 45), (10, 55, 55), (0, 10, 20), (50, 50, 50)]
)
def test_containment_from_exact_jaccard_is_exact(common: int, size_a: int, size_b: int) -> None:
    jaccard = common / (size_a + size_b - common)
    inside, contains = estimate_containment(jaccard, size_a, size_b)
    assert inside == pytest.approx(common / size_a)
    assert contains == pytest.approx(common / size_b)


def test_containment_edge_cases() -> None:
    assert estimate_containment(0.5, 0, 10) == (0.0, 0.0)
    assert estimate_containment(0.5, 10, 0) == (0.0, 0.0)
    # an over-estimated Jaccard never yields a share above 1
    inside, contains = estimate_containment(0.9, 10, 100)
    assert inside == 1.0 and contains <= 1.0


def test_containment_of_a_truncated_copy_from_signatures(prose: tuple[str, ...]) -> None:
    params = DedupParams()
    full = sketch_of(prose[0], params)
    head = sketch_of(prose[0][: len(prose[0]) * 6 // 10], params)
    jaccard = estimate_jaccard(head.signature, full.signature)
    inside, contains = estimate_containment(jaccard, head.shingle_count, full.shingle_count)
    assert inside > 0.85
    assert contains == pytest.approx(0.6, abs=0.1)


def test_verified_many_is_bit_identical_to_the_one_pair_estimate_on_edge_rows() -> None:
    rng = np.random.default_rng(5)
    empty = np.uint8(EMPTY_VERIFIER_SLOT)
    query = rng.integers(0, EMPTY_VERIFIER_SLOT, 64, dtype=np.uint8)
    query[[3, 17, 40]] = empty
    rows = [
        query.copy(),  # identical, empties included
        (query + np.uint8(1)) % np.uint8(EMPTY_VERIFIER_SLOT),  # nothing in common
        np.where(rng.random(64) < 0.5, query, rng.integers(0, EMPTY_VERIFIER_SLOT, 64, dtype=np.uint8)),
        np.full(64, empty, dtype=np.uint8),  # equal to the query only where it is empty
        np.where(np.arange(64) == 5, query, (query + np.uint8(1)) % np.uint8(EMPTY_VERIFIER_SLOT)),  # one
    ]
    rows[1][[3, 17, 40]] = 7
    rows[4][[3, 17, 40]] = 7
    all_empty = np.full(64, empty, dtype=np.uint8)
    for q in (query, all_empty, rows[2].astype(np.uint8)):
        others = np.array(rows, dtype=np.uint8)
        many = estimate_jaccard_verified_many(q, others).tolist()
        assert many == [estimate_jaccard_verified(q, row) for row in others]
    estimates = estimate_jaccard_verified_many(query, np.array(rows, dtype=np.uint8)).tolist()
    assert estimates[:2] == [1.0, 0.0]
    # one agreement in 64 usable slots, less what chance explains
    assert estimates[4] == pytest.approx((1 / 64 - CHANCE_AGREEMENT) / (1 - CHANCE_AGREEMENT))


def test_narrow_verifier_keeps_the_low_8_bits_and_never_reads_a_real_slot_as_empty() -> None:
    wide32 = np.array([0xFFFFFFFF, 0x1234FFFF, 0xABCD12FF, 0x00000034, 0xFFFF0000], dtype=np.uint32)
    assert narrow_verifier(wide32, 0xFFFFFFFF).tolist() == [0xFF, 0xFE, 0xFE, 0x34, 0]
    wide64 = np.array([EMPTY_SLOT, 0x0123456789ABCDFF, 0xFFFFFFFF, 0x0123456789AB0042], dtype=np.uint64)
    narrow = narrow_verifier(wide64, int(EMPTY_SLOT))
    assert narrow.dtype == np.uint8 and narrow.tolist() == [0xFF, 0xFE, 0xFE, 0x42]


def test_unbias_takes_out_the_chance_agreements() -> None:
    assert pytest.approx(1 / 254, rel=0.01) == CHANCE_AGREEMENT
    assert unbias(1.0) == 1.0
    assert unbias(CHANCE_AGREEMENT) == 0.0 and unbias(0.0) == 0.0
    assert unbias(0.5) == pytest.approx((0.5 - CHANCE_AGREEMENT) / (1 - CHANCE_AGREEMENT))


def wide_minima(hashes: np.ndarray, verify_perm: int, num_perm: int = 128, seed: int = 1) -> np.ndarray:
    """The 64-bit bin minima the verifier is cut from, by the reference's steps."""
    seed_key, _ = minhash._tables(num_perm, seed)
    values, _ = reference.permuted(hashes, seed_key)
    return reference.bin_minima(values, verify_perm)


def test_verifier_slots_are_the_low_8_bits_of_the_bin_minima(prose: tuple[str, ...]) -> None:
    for text in (*prose, "Short text."):
        hashes = shingle_hashes(normalize(text))
        _, verifier, _ = MinHasher().sketches(hashes, 512)
        wide = wide_minima(hashes, 512)
        assert verifier.dtype == np.uint8 and verifier.size == 512
        assert np.array_equal(verifier, narrow_verifier(wide, int(EMPTY_SLOT)))
        assert np.array_equal(verifier == EMPTY_VERIFIER_SLOT, wide == EMPTY_SLOT)


def test_8_bit_verifier_estimates_are_unbiased_with_the_error_of_full_slots() -> None:
    """Against exact Jaccard on 400 pairs (J 0.05-0.95): the 8-bit estimate, chance agreements taken
    out, is as close as the same estimator on 32-bit slots (whose chance agreements are negligible).
    Taking bits that depend on the bin (the high ones), or not taking the chance out, fails this."""

    def estimate_32(a: np.ndarray, b: np.ndarray) -> float:
        both_empty = (a == b) & (a == np.iinfo(np.uint32).max)
        return float(np.count_nonzero((a == b) & ~both_empty) / (a.size - np.count_nonzero(both_empty)))

    errors_8, errors_32 = [], []
    for a, b, exact in synthetic_pairs(400, 2_000, 6_000, seed=11):
        wide_a, wide_b = wide_minima(a, 512), wide_minima(b, 512)
        narrow = [narrow_verifier(w, int(EMPTY_SLOT)) for w in (wide_a, wide_b)]
        errors_8.append(estimate_jaccard_verified(*narrow) - exact)
        errors_32.append(estimate_32(wide_a.astype(np.uint32), wide_b.astype(np.uint32)) - exact)
    rmse_8, rmse_32 = (float(np.sqrt(np.mean(np.square(e)))) for e in (errors_8, errors_32))
    assert abs(float(np.mean(errors_8))) < 0.003
    assert rmse_8 < 1.1 * rmse_32


def test_verdicts_name_the_verifier_bits_but_stored_state_does_not_depend_on_them(
    prose: tuple[str, ...],
) -> None:
    params = DedupParams()
    assert params.audit()["verify_bits"] == VERIFIER_BITS
    # the signing really keeps that many bits: no slot above 2**bits - 1
    verifier = sketch_of(" ".join(prose), params).verifier
    assert verifier.dtype.itemsize * 8 == VERIFIER_BITS and int(verifier.max()) < 2**VERIFIER_BITS
    # state written with wider slots is narrowed when read, so the header must not refuse it
    assert "verify_bits" not in params.header()


def _unit_arrays(prose: tuple[str, ...]) -> list[np.ndarray]:
    """Code points of real texts and edge cases, and random 64-bit units (word hashes)."""
    rng = np.random.default_rng(7)
    texts = [*prose, "abcde", "aaaaaaaaaaaaaaaa", "ab ab ab ab ab ab", "héllo wörld ✓ 日本語のテキスト" * 20]
    arrays = [canonical_code_points(text).astype(np.uint64) for text in texts]
    arrays += [rng.integers(0, 2**64, size, dtype=np.uint64) for size in (5, 6, 40, 3000)]
    arrays.append(
        np.array([0, 0, 0, 0, 0, 0, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1], dtype=np.uint64)
    )
    arrays.append(np.empty(0, dtype=np.uint64))
    return arrays


@pytest.mark.parametrize(
    ("num_perm", "verify_perm", "k"),
    # bins of a power of two (a shift finds the bin) and not (a multiply does)
    [(128, 512, 5), (128, 0, 5), (64, 256, 3), (16, 16, 9), (128, 384, 5), (48, 0, 4), (2, 0, 2)],
)
def test_compiled_sketches_equal_the_numpy_reference(
    prose: tuple[str, ...], num_perm: int, verify_perm: int, k: int
) -> None:
    """Signing a text's units, or its shingle hashes (word shingles, texts shorter than k), and
    the signature alone, against the numpy reference."""
    hasher = MinHasher(num_perm, seed=3)
    for units in _unit_arrays(prose):
        hashes = shingle_hashes_of_units(units, k)
        expected = reference.sketches(hasher, hashes, verify_perm)
        for got in (hasher.sketches_of_units(units, k, verify_perm), hasher.sketches(hashes, verify_perm)):
            assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
            assert got[2] == expected[2]
        assert got[1].dtype == expected[1].dtype == np.uint8 and got[1].size == verify_perm
        signature, distinct = hasher.signature(hashes)
        reference_signature, reference_distinct = reference.signature(hasher, hashes)
        assert np.array_equal(signature, reference_signature) and distinct == reference_distinct
        if int(units.max(initial=0)) <= 0x10FFFF:  # code points: also as the uint32 signing passes
            as_points = hasher.sketches_of_units(units.astype(np.uint32), k, verify_perm)
            assert np.array_equal(as_points[0], expected[0]) and np.array_equal(as_points[1], expected[1])
            assert as_points[2] == expected[2]


@pytest.mark.parametrize(("num_perm", "verify_perm"), [(128, 512), (64, 256), (16, 16)])
def test_compiled_finish_equals_the_numpy_reference(num_perm: int, verify_perm: int) -> None:
    """_sketch.finish (signature and 8-bit verifier from the bin minima) against the numpy code it
    replaces: bins left empty (a short text: the signature densified, here up to nearly every bin),
    minima whose low 8 bits read as the empty verifier slot."""
    hasher = MinHasher(num_perm, seed=5)
    _, probes = minhash._tables(num_perm, 5)
    rng = np.random.default_rng(21)
    cases = []
    for empty_share in (0.0, 0.01, 0.3, 0.9, 0.97):
        wide = rng.integers(0, 2**64 - 1, verify_perm, dtype=np.uint64)
        wide[rng.random(verify_perm) < 0.05] |= np.uint64(0xFF)  # low bits as the empty slot's
        wide[rng.random(verify_perm) < empty_share] = EMPTY_SLOT
        wide[0] = 12_345  # a text has one shingle at least: some bin is filled
        cases.append(wide)
    for wide in cases:
        got = hasher._finished(wide.copy(), probes, 7)
        expected = reference.finished(hasher, wide.copy(), probes, 7)
        assert got[0].dtype == expected[0].dtype and got[1].dtype == expected[1].dtype
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
        assert got[2] == expected[2] == 7
    assert int(np.count_nonzero(cases[0] == EMPTY_SLOT)) == 0
    assert int(np.count_nonzero(cases[-1].reshape(num_perm, -1).min(axis=1) == EMPTY_SLOT)) > 0


def test_compiled_scores_equal_the_numpy_estimates() -> None:
    rng = np.random.default_rng(11)
    query = rng.integers(0, EMPTY_VERIFIER_SLOT, 512, dtype=np.uint8)
    query[[4, 90, 300]] = EMPTY_VERIFIER_SLOT
    rows = [
        np.where(rng.random(512) < share, query, rng.integers(0, 256, 512, dtype=np.uint8)).astype(np.uint8)
        for share in np.linspace(0, 1, 25)
    ]
    rows += [np.full(512, EMPTY_VERIFIER_SLOT, dtype=np.uint8), (query + np.uint8(1)) % np.uint8(255)]
    sizes = [int(n) for n in rng.integers(0, 6000, len(rows))]
    sizes[3] = 0  # a candidate with no shingles: no containment
    others = [SimpleNamespace(verifier=row, shingle_count=n) for row, n in zip(rows, sizes, strict=True)]
    no_empty = np.where(query == EMPTY_VERIFIER_SLOT, 0, query).astype(np.uint8)
    for q, size in ((query, 3000), (no_empty, 17), (rows[-2], 2500), (query, 0)):
        jaccard = estimate_jaccard_verified_many(q, np.array(rows))
        expected = (jaccard, *estimate_containment_many(jaccard, size, np.array(sizes, dtype=np.int64)))
        got = verified_scores(q, size, others)
        assert got is not None
        for have, want in zip(got, expected, strict=True):
            assert have.tolist() == want.tolist()
    assert (
        verified_scores(query, 10, [*others, SimpleNamespace(verifier=query[:100], shingle_count=5)]) is None
    )


def test_compiled_space_collapsing_equals_the_numpy_reference(prose: tuple[str, ...]) -> None:
    """canonical_code_points (_sketch.collapse_spaces) against reference_sketch.collapse_spaces:
    on texts, then on random code points thick with spaces of every kind (runs, at both ends, a
    text of spaces alone)."""
    texts = [
        *prose,
        "  leading and trailing  ",
        "\t\n tabs\u00a0and\u3000ideographic\u2028separators \r\n",
        " ",
        "x",
        "a  b",
        "  ",
        "no_space_at_all",
        "\ud800 lone surrogate  ",
    ]
    uncollapsed = NormalizeOptions(collapse_whitespace=False)
    for text in texts:
        got = canonical_code_points(text)
        assert got.dtype == np.uint32
        assert got.tolist() == reference.collapse_spaces(canonical_code_points(text, uncollapsed)).tolist()
    spaces = [c for c in range(0x3001) if chr(c).isspace()]
    pool = np.array([*spaces, 97, 98, 0x2FFF, 0x3001, 0xD800, 0x10FFFF], dtype=np.uint32)
    rng = np.random.default_rng(11)
    for size in [1, 2, 3, *rng.integers(4, 400, 200).tolist()]:
        points = pool[rng.integers(0, len(spaces) if rng.random() < 0.1 else pool.size, size)]
        out = np.empty(size, dtype=np.uint32)
        length = compiled._sketch.collapse_spaces(points, normalize_module._IS_SPACE, out)
        assert out[:length].tolist() == reference.collapse_spaces(points).tolist(), points.tolist()
