"""Shingle hashes → MinHash signature by one-permutation hashing with optimal densification.

One permutation (a seeded fmix64, which is a bijection on 64-bit values) is split into `num_perm`
bins by its top bits; each bin keeps its minimum. Bins left empty (short texts) borrow the minimum of
a bin chosen by a seeded probe sequence, which keeps the estimator unbiased (Shrivastava, 2017). The
classic k-permutation scheme is kept for comparison (`kperm_signature`): OPH hashes each shingle
once instead of num_perm times for the same accuracy, which `tests/benchmarks/bench_core.py` checks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from . import compiled
from ._hashing import U64, HashArray, fmix64, mix_scalar
from .shingle import shingle_hashes_of_units

ALGORITHM = "oph-optdens-fmix64-v2"  # v2: shingle hashes are the bare polynomial
EMPTY_SLOT = np.iinfo(np.uint64).max
VerifierArray = npt.NDArray[np.uint8]
EMPTY_VERIFIER_SLOT = 0xFF
VERIFIER_BITS = 8  # of each verifier slot (narrow_verifier); verdicts carry it for audit
# Two different minima, cut to 8 bits by narrow_verifier, agree by chance with this probability: the
# values 0-253 each have 1/256, 254 has 2/256 (a real 255 becomes 254).
CHANCE_AGREEMENT = (254 + 2 * 2) / 256**2
_PROBES = 32
_TOP16_LANE = 3 if sys.byteorder == "little" else 0
_BUCKET_SORT_SIZES = range(512, 1 << 22)  # where bucketing beats np.sort (see _sorted)


@dataclass(frozen=True)
class MinHasher:
    """A seeded MinHash scheme; equal (num_perm, seed) give equal signatures in every process."""

    num_perm: int = 128
    seed: int = 1

    def __post_init__(self) -> None:
        if not 2 <= self.num_perm <= 4096:
            raise ValueError(f"num_perm must be in 2..4096, got {self.num_perm}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in 0..2**63-1, got {self.seed}")

    def signature(self, hashes: HashArray) -> tuple[HashArray, int]:
        """Signature of a shingle-hash array (repeats allowed) and the number of distinct shingles."""
        return _oph_signature(hashes, self.num_perm, self.seed)

    def sketches(self, hashes: HashArray, verify_perm: int) -> tuple[HashArray, VerifierArray, int]:
        """The signature, a finer `verify_perm`-slot verifier of 8-bit slots, and the distinct count.

        Both come from the same sorted permutation (one sort); the verifier only serves to estimate
        Jaccard more tightly than `num_perm` slots can (LSH keeps using the signature). Its slots keep
        8 bits of each minimum (see narrow_verifier): an eighth of the storage of 64-bit slots."""
        if verify_perm == 0:
            signature, distinct = self.signature(hashes)
            return signature, np.empty(0, dtype=np.uint8), distinct
        if hashes.size == 0:
            empty = np.full(verify_perm, EMPTY_VERIFIER_SLOT, dtype=np.uint8)
            return np.full(self.num_perm, EMPTY_SLOT, dtype=np.uint64), empty, 0
        if verify_perm % self.num_perm:
            raise ValueError(f"verify_perm ({verify_perm}) must be a multiple of num_perm ({self.num_perm})")
        seed_key, probes = _tables(self.num_perm, self.seed)
        values, distinct = _permuted(hashes, seed_key)
        return self._finished(_bin_minima(values, verify_perm), probes, distinct)

    def sketches_of_units(
        self, units: HashArray | npt.NDArray[np.uint32], k: int, verify_perm: int
    ) -> tuple[HashArray, VerifierArray, int]:
        """sketches(shingle_hashes_of_units(units, k), verify_perm), the same values: where _sketch
        is built, shingling, permuting and binning are one compiled pass over the units (a dozen
        numpy passes and a sort otherwise, the bulk of what signing a news text costs)."""
        loops = compiled.loops()
        if loops is None or units.size < k:
            return self.sketches(shingle_hashes_of_units(units.astype(np.uint64, copy=False), k), verify_perm)
        if verify_perm % self.num_perm:
            raise ValueError(f"verify_perm ({verify_perm}) must be a multiple of num_perm ({self.num_perm})")
        seed_key, probes = _tables(self.num_perm, self.seed)
        minima = np.full(verify_perm or self.num_perm, EMPTY_SLOT, dtype=np.uint64)
        # code points as they come (uint32, widened in the pass), anything else as uint64
        passed: npt.NDArray[Any] = np.ascontiguousarray(
            units if units.dtype == np.uint32 else units.astype(np.uint64, copy=False)
        )
        distinct = loops.oph_minima(passed, k, seed_key, minima, passed.itemsize)
        if verify_perm == 0:
            return _densified(minima, probes), np.empty(0, dtype=np.uint8), distinct
        return self._finished(minima, probes, distinct)

    def _finished(
        self, wide: HashArray, probes: npt.NDArray[np.intp], distinct: int
    ) -> tuple[HashArray, VerifierArray, int]:
        """Signature and verifier from the verifier's bin minima."""
        loops = compiled.loops()
        if loops is not None:  # the same in one pass over the bins instead of numpy's eight
            signature = np.empty(self.num_perm, dtype=np.uint64)
            verifier = np.empty(wide.size, dtype=np.uint8)
            if loops.finish(wide, self.num_perm, EMPTY_SLOT, EMPTY_VERIFIER_SLOT, signature, verifier):
                _densify(signature, signature != EMPTY_SLOT, probes)
            return signature, verifier, distinct
        # num_perm bins are unions of consecutive verify_perm bins (the bin boundaries coincide), so
        # the signature is the minimum of each group: the same values a direct num_perm pass gives.
        signature = _densified(wide.reshape(self.num_perm, -1).min(axis=1), probes)
        return signature, narrow_verifier(wide, EMPTY_SLOT), distinct


def narrow_verifier(wide: npt.NDArray[np.unsignedinteger], empty: int) -> VerifierArray:
    """The low 8 bits of each slot of a wider verifier whose empty slots hold `empty`: b-bit minwise
    hashing (Li and König, 2010). Two different minima then agree by chance with probability
    CHANCE_AGREEMENT (~1/254) per slot, which the estimator takes out again (unbias); the variance
    grows by less than 1% at any Jaccard. The verifier is 512 bytes at 512 slots instead of 2 KB
    at 32 bits, and so is everything that carries it: the signatures topic, the index and its
    changelog, the decider's cache and comparisons.

    A real slot whose low bits read as EMPTY_VERIFIER_SLOT becomes EMPTY_VERIFIER_SLOT - 1, so that
    it is never taken for empty. Verifiers stored wider (32 or 16 bits, by older state formats)
    narrow to exactly what signing gives: all keep the low bits of the same minimum."""
    narrow = wide.astype(np.uint8)  # keeps the low 8 bits
    narrow[(narrow == EMPTY_VERIFIER_SLOT) & (wide != empty)] = EMPTY_VERIFIER_SLOT - 1
    return narrow


def unbias(agreement: float) -> float:
    """Jaccard from the share of agreeing usable slots of two 8-bit verifiers: the agreements beyond
    chance, (P - C) / (1 - C) with C = CHANCE_AGREEMENT, and 0 where chance explains them all."""
    return max(0.0, (agreement - CHANCE_AGREEMENT) / (1.0 - CHANCE_AGREEMENT))


@lru_cache(maxsize=16)
def _tables(num_perm: int, seed: int) -> tuple[int, npt.NDArray[np.intp]]:
    """The permutation's seed key and each bin's densification probe sequence."""
    seed_key = mix_scalar(seed ^ 0x6A09E667F3BCC908)
    grid = np.arange(num_perm * _PROBES, dtype=np.uint64) + U64(seed_key)
    probes = (fmix64(grid) % U64(num_perm)).astype(np.intp).reshape(num_perm, _PROBES)
    return seed_key, probes


def _permuted(hashes: HashArray, seed_key: int) -> tuple[HashArray, int]:
    """The permuted hashes in ascending order, and how many distinct ones there are."""
    values = _sorted(fmix64(hashes ^ U64(seed_key)))
    return values, 1 + int(np.count_nonzero(values[1:] != values[:-1]))


def _oph_signature(hashes: HashArray, num_perm: int, seed: int) -> tuple[HashArray, int]:
    seed_key, probes = _tables(num_perm, seed)
    if hashes.size == 0:
        return np.full(num_perm, EMPTY_SLOT, dtype=np.uint64), 0
    values, distinct = _permuted(hashes, seed_key)
    return _densified(_bin_minima(values, num_perm), probes), distinct


def _bin_minima(values: HashArray, num_bins: int) -> HashArray:
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


def _densified(minima: HashArray, probes: npt.NDArray[np.intp]) -> HashArray:
    """`minima` with its empty bins filled (in place); news-sized texts leave none empty."""
    filled = minima != EMPTY_SLOT
    if not filled.all():
        _densify(minima, filled, probes)
    return minima


def _sorted(values: HashArray) -> HashArray:
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


def _densify(signature: HashArray, filled: npt.NDArray[np.bool_], probes: npt.NDArray[np.intp]) -> None:
    """Fill empty bins from the first filled bin on each one's probe sequence; rotate as fallback."""
    empty = np.flatnonzero(~filled)
    candidates = probes[empty]
    hits = filled[candidates]
    found = hits.any(axis=1)
    choice = candidates[np.arange(empty.size), hits.argmax(axis=1)]
    source = signature.copy()
    signature[empty[found]] = source[choice[found]]
    if not found.all():
        filled_bins = np.flatnonzero(filled)
        for bin_index in empty[~found]:
            nxt = filled_bins[np.searchsorted(filled_bins, bin_index) % filled_bins.size]
            signature[bin_index] = source[nxt]


def kperm_signature(hashes: HashArray, num_perm: int = 128, seed: int = 1) -> HashArray:
    """Classic MinHash: num_perm independent universal hashes, min of each (the baseline scheme)."""
    rng = np.random.default_rng(seed)
    mult = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | U64(1)
    add = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    if hashes.size == 0:
        return np.full(num_perm, EMPTY_SLOT, dtype=np.uint64)
    mixed = fmix64(hashes[None, :] * mult[:, None] + add[:, None])
    return np.asarray(mixed.min(axis=1), dtype=np.uint64)


def estimate_jaccard(a: npt.NDArray[np.unsignedinteger], b: npt.NDArray[np.unsignedinteger]) -> float:
    """Share of equal slots: an unbiased estimate of the Jaccard index of the two shingle sets."""
    if a.shape != b.shape:
        raise ValueError(f"signatures differ in length: {a.size} vs {b.size}")
    return float(np.count_nonzero(a == b)) / a.size


def estimate_jaccard_verified(a: VerifierArray, b: VerifierArray) -> float:
    """Jaccard from two verifiers (OPH without densification): equal slots over the slots not empty
    in both, the estimator of Li, Owen and Zhang (2012), less the agreements by chance of 8-bit
    slots (unbias)."""
    if a.shape != b.shape:
        raise ValueError(f"verifiers differ in length: {a.size} vs {b.size}")
    equal = a == b
    matches = int(np.count_nonzero(equal))
    if matches == 0:
        return 0.0
    both_empty = int(np.count_nonzero(a[equal] == EMPTY_VERIFIER_SLOT))  # empty in both ⇒ equal
    usable = a.size - both_empty
    if usable == 0:
        return 1.0
    return unbias((matches - both_empty) / usable)


def estimate_jaccard_verified_many(
    query: VerifierArray, others: npt.NDArray[np.uint8]
) -> npt.NDArray[np.float64]:
    """estimate_jaccard_verified of `query` against each row of `others`, in a few array passes:
    a news cluster gives tens of candidates, and one numpy call per candidate costs more than the
    comparison itself. Bit-identical to the one-pair function."""
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


class _Sketched(Protocol):
    @property
    def verifier(self) -> VerifierArray | bytes: ...

    @property
    def shingle_count(self) -> int: ...


ScoreArrays = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]


def verified_scores(verifier: VerifierArray, size: int, others: Sequence[_Sketched]) -> ScoreArrays | None:
    """(jaccard, containment, contains) of a text's verifier and distinct count against each of
    `others` (Sketches, or candidates carrying both): estimate_jaccard_verified_many, then
    estimate_containment_many, in one compiled pass with the same figures, without stacking the
    verifiers or building arrays of their sizes (tens of candidates per article: numpy's per-call
    overhead outweighs comparisons that small). None where _sketch is not built or a verifier's length
    differs: the caller computes them itself."""
    loops = compiled.loops()
    if loops is None:
        return None
    try:
        jaccard, inside, contains = loops.scores(
            verifier, others, size, EMPTY_VERIFIER_SLOT, CHANCE_AGREEMENT
        )
    except ValueError:
        return None
    return tuple(np.frombuffer(data, dtype=np.float64) for data in (jaccard, inside, contains))  # type: ignore[return-value]


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


def estimate_containment(jaccard: float, size_a: int, size_b: int) -> tuple[float, float]:
    """(|A∩B|/|A|, |A∩B|/|B|) from a Jaccard estimate and the set sizes: |A∩B| = J(|A|+|B|)/(1+J)."""
    if size_a <= 0 or size_b <= 0:
        return 0.0, 0.0
    intersection = jaccard * (size_a + size_b) / (1.0 + jaccard)
    return min(1.0, intersection / size_a), min(1.0, intersection / size_b)
