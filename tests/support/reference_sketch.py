"""The numpy reference of the compiled loops of signing and scoring (service/core/_sketch.c): the
same arithmetic in array passes, which the tests compare with the compiled results, bit for bit.

    signature, sketches, finished   MinHasher.signature, .sketches, ._finished (_sketch.oph_minima
                                    and finish)
    estimate_jaccard_verified_many, estimate_containment_many, scores
                                    minhash.verified_scores (_sketch.scores), and the figures
                                    reference_decide.rank ranks (_sketch.rank)
    band_keys                       lsh.band_keys (_sketch.band_keys)
    collapse_spaces                 normalize.canonical_code_points' whitespace collapsing
                                    (_sketch.collapse_spaces)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import mmh3
import numpy as np
import numpy.typing as npt

from neardup.core._hashing import U64, HashArray, fmix64
from neardup.core.minhash import (
    CHANCE_AGREEMENT,
    EMPTY_SLOT,
    EMPTY_VERIFIER_SLOT,
    MinHasher,
    VerifierArray,
    _densified,
    _tables,
)
from neardup.core.normalize import _IS_SPACE, CodePoints

_TOP16_LANE = 3 if sys.byteorder == "little" else 0
_BUCKET_SORT_SIZES = range(512, 1 << 22)  # where bucketing beats np.sort (see sorted_values)


def signature(hasher: MinHasher, hashes: HashArray) -> tuple[HashArray, int]:
    """MinHasher.signature: the signature of a shingle-hash array and the distinct count."""
    seed_key, probes = _tables(hasher.num_perm, hasher.seed)
    if hashes.size == 0:
        return np.full(hasher.num_perm, EMPTY_SLOT, dtype=np.uint64), 0
    values, distinct = permuted(hashes, seed_key)
    return _densified(bin_minima(values, hasher.num_perm), probes), distinct


def sketches(hasher: MinHasher, hashes: HashArray, verify_perm: int) -> tuple[HashArray, VerifierArray, int]:
    """MinHasher.sketches: signature and verifier from the same sorted permutation (one sort)."""
    if verify_perm == 0:
        found, distinct = signature(hasher, hashes)
        return found, np.empty(0, dtype=np.uint8), distinct
    if hashes.size == 0:
        empty = np.full(verify_perm, EMPTY_VERIFIER_SLOT, dtype=np.uint8)
        return np.full(hasher.num_perm, EMPTY_SLOT, dtype=np.uint64), empty, 0
    if verify_perm % hasher.num_perm:
        raise ValueError(f"verify_perm ({verify_perm}) must be a multiple of num_perm ({hasher.num_perm})")
    seed_key, probes = _tables(hasher.num_perm, hasher.seed)
    values, distinct = permuted(hashes, seed_key)
    return finished(hasher, bin_minima(values, verify_perm), probes, distinct)


def finished(
    hasher: MinHasher, wide: HashArray, probes: npt.NDArray[np.intp], distinct: int
) -> tuple[HashArray, VerifierArray, int]:
    """MinHasher._finished: num_perm bins are unions of consecutive verify_perm bins (the bin
    boundaries coincide), so the signature is the minimum of each group: the same values a direct
    num_perm pass gives."""
    found = _densified(wide.reshape(hasher.num_perm, -1).min(axis=1), probes)
    return found, narrow_verifier(wide, EMPTY_SLOT), distinct


def narrow_verifier(wide: npt.NDArray[np.unsignedinteger], empty: int) -> VerifierArray:
    """The low 8 bits of each slot of a wider verifier whose empty slots hold `empty` (b-bit minwise
    hashing): a real slot whose low bits read as EMPTY_VERIFIER_SLOT becomes
    EMPTY_VERIFIER_SLOT - 1, so that it is never taken for empty. Verifiers stored wider (32 or 16
    bits, by older state formats) narrow to exactly what signing gives: all keep the low bits of
    the same minimum."""
    narrow = wide.astype(np.uint8)  # keeps the low 8 bits
    narrow[(narrow == EMPTY_VERIFIER_SLOT) & (wide != empty)] = EMPTY_VERIFIER_SLOT - 1
    return narrow


def permuted(hashes: HashArray, seed_key: int) -> tuple[HashArray, int]:
    """The permuted hashes in ascending order, and how many distinct ones there are."""
    values = sorted_values(fmix64(hashes ^ U64(seed_key)))
    return values, 1 + int(np.count_nonzero(values[1:] != values[:-1]))


def bin_minima(values: HashArray, num_bins: int) -> HashArray:
    """Minimum of each bin of sorted values (EMPTY_SLOT where a bin has none), bin(v) =
    ((v >> 32) * num_bins) >> 32, which is monotonic in v: the first value of each run of equal
    bin numbers."""
    bins = ((values >> U64(32)) * U64(num_bins)) >> U64(32)
    run_start = np.empty(values.size, dtype=bool)
    run_start[0] = True
    np.not_equal(bins[1:], bins[:-1], out=run_start[1:])
    first = np.flatnonzero(run_start)
    minima = np.full(num_bins, EMPTY_SLOT, dtype=np.uint64)
    minima[bins[first]] = values[first]
    return minima


def sorted_values(values: HashArray) -> HashArray:
    """`values` (a fresh array) in ascending order. A radix argsort on the top 16 bits leaves short
    unsorted runs that timsort finishes in near-linear time, which beats np.sort on news-sized
    inputs; np.sort wins on very short and very long arrays (hence _BUCKET_SORT_SIZES). The
    bucketing key only affects speed: the final sort is complete whatever order the buckets leave."""
    if values.size not in _BUCKET_SORT_SIZES:
        values.sort()
        return values
    top16 = values.view(np.uint16)[_TOP16_LANE::4]  # the high 16 bits, without a copy
    bucketed = values[np.argsort(top16, kind="stable")]
    bucketed.sort(kind="stable")
    return bucketed


def estimate_jaccard_verified_many(
    query: VerifierArray, others: npt.NDArray[np.uint8]
) -> npt.NDArray[np.float64]:
    """estimate_jaccard_verified of `query` against each row of `others`, in a few array passes;
    bit-identical to the one-pair function."""
    if others.ndim != 2 or others.shape[1] != query.size:
        raise ValueError(f"verifiers differ in length: {query.size} vs {others.shape}")
    equal = others == query
    matches = np.count_nonzero(equal, axis=1)
    empty = query == EMPTY_VERIFIER_SLOT
    if not empty.any():  # a text that fills every slot: every slot usable
        return _unbias_many(matches / query.size)
    # Slots empty in both count as equal and are left out. A news-sized text leaves one or two of
    # 512 slots empty (e^-6 each for 3,000 shingles), so only those columns are looked at.
    return _estimates(matches, np.count_nonzero(equal[:, empty], axis=1), query.size)


def _estimates(
    matches: npt.NDArray[np.int64], both_empty: npt.NDArray[np.int64], size: int
) -> npt.NDArray[np.float64]:
    """Jaccard estimates from each verifier's equal slots and, of those, slots empty in both."""
    usable = size - both_empty
    agreement = np.divide(matches - both_empty, usable, out=np.ones(len(matches)), where=usable != 0)
    estimates = _unbias_many(agreement)  # 1.0 stays 1.0
    estimates[matches == 0] = 0.0
    return estimates


def _unbias_many(agreement: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """unbias for an array, with the same floating-point operations."""
    return np.maximum(0.0, (agreement - CHANCE_AGREEMENT) / (1.0 - CHANCE_AGREEMENT))


def estimate_containment_many(
    jaccard: npt.NDArray[np.float64], size_a: int, sizes_b: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """estimate_containment for many (jaccard, size_b) at once; the same floating-point operations in
    the same order, so the figures are identical."""
    if size_a <= 0:
        return np.zeros_like(jaccard), np.zeros_like(jaccard)
    intersection = jaccard * (size_a + sizes_b) / (1.0 + jaccard)
    usable = sizes_b > 0
    if usable.all():  # the usual case, without the masking
        return np.minimum(1.0, intersection / size_a), np.minimum(1.0, intersection / sizes_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = np.where(usable, np.minimum(1.0, intersection / size_a), 0.0)
        contains = np.where(usable, np.minimum(1.0, intersection / sizes_b), 0.0)
    return inside, contains


def scores(
    verifier: VerifierArray, size: int, others: Sequence[Any]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """minhash.verified_scores: (jaccard, containment, contains) of a verifier and distinct count
    against each of `others` (objects with a `verifier` of the same length and a `shingle_count`),
    the verifiers stacked."""
    stacked = np.array([np.frombuffer(other.verifier, dtype=np.uint8) for other in others], dtype=np.uint8)
    jaccard = estimate_jaccard_verified_many(verifier, stacked.reshape(len(others), verifier.size))
    sizes = np.fromiter((other.shingle_count for other in others), dtype=np.int64, count=len(others))
    return (jaccard, *estimate_containment_many(jaccard, size, sizes))


def band_keys(signature: HashArray, bands: int, rows: int) -> list[bytes]:
    """lsh.band_keys: 2-byte band index + the first 8 bytes of the band's murmur3 digest."""
    raw = np.ascontiguousarray(signature[: bands * rows]).tobytes()
    width = rows * 8
    return [
        band.to_bytes(2, "big") + mmh3.hash_bytes(raw[band * width : (band + 1) * width])[:8]
        for band in range(bands)
    ]


def collapse_spaces(points: CodePoints) -> CodePoints:
    """canonical_code_points' last step: every run of spaces (str.isspace) made one U+0020, and
    none at either end."""
    if points.size == 0:
        return points.astype(np.uint32)
    space = _IS_SPACE[points]
    after_space = np.empty_like(space)
    after_space[0] = True  # drops leading whitespace
    after_space[1:] = space[:-1]
    collapsed = np.where(space, np.uint32(32), points)[~(space & after_space)]
    if collapsed.size and collapsed[-1] == 32:
        collapsed = collapsed[:-1]
    return collapsed.astype(np.uint32, copy=False)
