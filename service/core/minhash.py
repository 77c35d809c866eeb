"""Shingle hashes → MinHash signature by one-permutation hashing with optimal densification.

One permutation (a seeded fmix64, which is a bijection on 64-bit values) is split into `num_perm`
bins by its top bits; each bin keeps its minimum. Bins left empty (short texts) borrow the minimum of
a bin chosen by a seeded probe sequence, which keeps the estimator unbiased (Shrivastava, 2017). OPH
hashes each shingle once where the classic k-permutation scheme (tests/support/scoring.py:
kperm_signature) hashes it num_perm times, for the same accuracy, which
`tests/benchmarks/bench_core.py` checks.
The per-shingle and per-slot loops run compiled (_sketch.c); tests/support/reference_sketch.py is
their numpy reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ._hashing import U64, HashArray, fmix64, mix_scalar
from .compiled import _sketch
from .shingle import shingle_hashes_of_units

ALGORITHM = "oph-optdens-fmix64-v2"  # v2: shingle hashes are the bare polynomial
EMPTY_SLOT = np.iinfo(np.uint64).max
VerifierArray = npt.NDArray[np.uint8]
EMPTY_VERIFIER_SLOT = 0xFF
VERIFIER_BITS = 8  # of each verifier slot (see sketches); verdicts carry it for audit
# Two different minima, cut to 8 bits, agree by chance with this probability: the values 0-253
# each have 1/256, 254 has 2/256 (a real 255 becomes 254).
CHANCE_AGREEMENT = (254 + 2 * 2) / 256**2
_PROBES = 32
# a text's row of _sketch.sign_batch: its code points, its signature and verifier, whether its
# anchors are wanted
BatchRow = tuple[npt.NDArray[np.uint32], HashArray, VerifierArray, bool]


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
        signature, _, distinct = self.sketches(hashes, 0)
        return signature, distinct

    def sketches(self, hashes: HashArray, verify_perm: int) -> tuple[HashArray, VerifierArray, int]:
        """The signature, a finer `verify_perm`-slot verifier of 8-bit slots, and the distinct count.

        Both come from the same permutation and binning (one pass); the verifier only serves to
        estimate Jaccard more tightly than `num_perm` slots can (LSH keeps using the signature). Its
        slots keep the low 8 bits of each bin's minimum, b-bit minwise hashing (Li and König, 2010):
        two different minima then agree by chance with probability CHANCE_AGREEMENT (~1/254) per
        slot, which the estimator takes out again (unbias); the variance grows by less than 1% at
        any Jaccard. The verifier is 512 bytes at 512 slots instead of 2 KB at 32 bits, and so is
        everything that carries it: the signatures topic, the index and its changelog, the
        decider's cache and comparisons. A real slot whose low bits read as EMPTY_VERIFIER_SLOT
        becomes EMPTY_VERIFIER_SLOT - 1, so that it is never taken for empty."""
        if hashes.size == 0:
            empty = np.full(verify_perm, EMPTY_VERIFIER_SLOT, dtype=np.uint8)
            return np.full(self.num_perm, EMPTY_SLOT, dtype=np.uint64), empty, 0
        return self._sketched(np.ascontiguousarray(hashes, dtype=np.uint64), 1, verify_perm)

    def sketches_of_units(
        self, units: HashArray | npt.NDArray[np.uint32], k: int, verify_perm: int
    ) -> tuple[HashArray, VerifierArray, int]:
        """sketches(shingle_hashes_of_units(units, k), verify_perm), the same values, without
        the shingle hashes: shingling, permuting and binning are one compiled pass over the units."""
        if units.size < k:
            return self.sketches(shingle_hashes_of_units(units.astype(np.uint64, copy=False), k), verify_perm)
        # code points as they come (uint32, widened in the pass), anything else as uint64
        passed: npt.NDArray[Any] = np.ascontiguousarray(
            units if units.dtype == np.uint32 else units.astype(np.uint64, copy=False)
        )
        return self._sketched(passed, k, verify_perm)

    def _sketched(
        self, units: npt.NDArray[Any], k: int, verify_perm: int
    ) -> tuple[HashArray, VerifierArray, int]:
        """The sketches of the k-unit shingles of `units` (at least k of them; k = 1: of shingle
        hashes), from their bin minima (_sketch.oph_minima)."""
        if verify_perm % self.num_perm:
            raise ValueError(f"verify_perm ({verify_perm}) must be a multiple of num_perm ({self.num_perm})")
        seed_key, probes = _tables(self.num_perm, self.seed)
        minima = np.full(verify_perm or self.num_perm, EMPTY_SLOT, dtype=np.uint64)
        distinct = _sketch.oph_minima(units, k, seed_key, minima, units.itemsize)
        if verify_perm == 0:
            return _densified(minima, probes), np.empty(0, dtype=np.uint8), distinct
        return self._finished(minima, probes, distinct)

    def batch_buffers(self, verify_perm: int) -> tuple[HashArray, VerifierArray]:
        """What start_batch's passes write one text's sketches into: its signature and verifier."""
        return np.empty(self.num_perm, dtype=np.uint64), np.empty(verify_perm, dtype=np.uint8)

    def start_batch(self, rows: Sequence[BatchRow], k: int, winnowing: tuple[int, ...]) -> _sketch.SignBatch:
        """_sketch.sign_batch over `rows` (their k-shingles, and anchors by `winnowing`) under way."""
        seed_key = _tables(self.num_perm, self.seed)[0]
        return _sketch.sign_batch(
            rows, k, seed_key, self.num_perm, EMPTY_SLOT, EMPTY_VERIFIER_SLOT, *winnowing
        )

    def densified(self, signature: HashArray, unfilled: int) -> HashArray:
        """A signature a batch finished with `unfilled` empty slots, filled as _finished fills them."""
        if unfilled:
            _densify(signature, signature != EMPTY_SLOT, _tables(self.num_perm, self.seed)[1])
        return signature

    def _finished(
        self, wide: HashArray, probes: npt.NDArray[np.intp], distinct: int
    ) -> tuple[HashArray, VerifierArray, int]:
        """Signature and verifier from the verifier's bin minima: num_perm bins are unions of
        consecutive verify_perm bins (the bin boundaries coincide), so each signature slot is the
        least of its group, the same value a direct num_perm pass gives (_sketch.finish)."""
        signature = np.empty(self.num_perm, dtype=np.uint64)
        verifier = np.empty(wide.size, dtype=np.uint8)
        if _sketch.finish(wide, self.num_perm, EMPTY_SLOT, EMPTY_VERIFIER_SLOT, signature, verifier):
            _densify(signature, signature != EMPTY_SLOT, probes)
        return signature, verifier, distinct


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


def _densified(minima: HashArray, probes: npt.NDArray[np.intp]) -> HashArray:
    """`minima` with its empty bins filled (in place); news-sized texts leave none empty."""
    filled = minima != EMPTY_SLOT
    if not filled.all():
        _densify(minima, filled, probes)
    return minima


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


class _Sketched(Protocol):
    @property
    def verifier(self) -> VerifierArray | bytes: ...

    @property
    def shingle_count(self) -> int: ...


ScoreArrays = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]


def verified_scores(verifier: VerifierArray, size: int, others: Sequence[_Sketched]) -> ScoreArrays | None:
    """(jaccard, containment, contains) of a text's verifier and distinct count against each of
    `others` (Sketches, or candidates carrying both): estimate_jaccard_verified, then
    estimate_containment, for each in one compiled pass with the same figures (tens of candidates
    per article: numpy's per-call overhead outweighs comparisons that small). None where there is
    no verifier (verify_perm=0: 0 slots would score every pair 0) or a verifier's length differs
    (state written with other settings): the caller scores those pair by pair, from the signatures."""
    if not len(verifier):
        return None
    try:
        scored = _sketch.scores(verifier, others, size, EMPTY_VERIFIER_SLOT, CHANCE_AGREEMENT)
    except ValueError:
        return None
    return tuple(np.frombuffer(data, dtype=np.float64) for data in scored)  # type: ignore[return-value]


def estimate_containment(jaccard: float, size_a: int, size_b: int) -> tuple[float, float]:
    """(|A∩B|/|A|, |A∩B|/|B|) from a Jaccard estimate and the set sizes: |A∩B| = J(|A|+|B|)/(1+J)."""
    if size_a <= 0 or size_b <= 0:
        return 0.0, 0.0
    intersection = jaccard * (size_a + size_b) / (1.0 + jaccard)
    return min(1.0, intersection / size_a), min(1.0, intersection / size_b)
