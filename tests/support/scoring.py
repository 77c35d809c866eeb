"""Scoring beside the engine's: what the tests compare its figures with.

score_many       dedup.score against many candidates at once, their verifiers compared in
                 one compiled pass (minhash.verified_scores), as the decision's ranking does
kperm_signature  classic MinHash, num_perm independent hashes: the baseline that
                 one-permutation hashing (core/minhash.py) is measured against
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neardup.core._hashing import U64, HashArray, fmix64
from neardup.core.dedup import Candidate, score
from neardup.core.minhash import EMPTY_SLOT, verified_scores
from neardup.core.signing import Sketch


def score_many(sketch: Sketch, others: Sequence[tuple[str, Sketch]]) -> list[Candidate]:
    """`score` against many candidates, their verifiers compared in one compiled pass when all have
    sketch's length; otherwise (or without verifiers) pair by pair. The figures are identical
    either way."""
    scored = verified_scores(sketch.verifier, sketch.shingle_count, [other for _, other in others])
    if scored is None:
        return [score(sketch, other, other_id) for other_id, other in others]
    jaccard, inside, contains = (figures.tolist() for figures in scored)
    return [
        Candidate(other_id, j, a, b)
        for (other_id, _), j, a, b in zip(others, jaccard, inside, contains, strict=True)
    ]


def kperm_signature(hashes: HashArray, num_perm: int = 128, seed: int = 1) -> HashArray:
    """Classic MinHash: num_perm independent universal hashes, min of each (the baseline scheme)."""
    rng = np.random.default_rng(seed)
    mult = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | U64(1)
    add = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    if hashes.size == 0:
        return np.full(num_perm, EMPTY_SLOT, dtype=np.uint64)
    mixed = fmix64(hashes[None, :] * mult[:, None] + add[:, None])
    return np.asarray(mixed.min(axis=1), dtype=np.uint64)
