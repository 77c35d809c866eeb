"""Stage 1, "sign": article text → sketch (content hash, MinHash signature, shingle count)."""

from __future__ import annotations

from dataclasses import dataclass, field

import mmh3
import numpy as np

from ..errors import Error
from ._hashing import HashArray
from .anchors import NO_ANCHORS, Anchors, anchors_of
from .minhash import VerifierArray, estimate_jaccard, estimate_jaccard_verified
from .normalize import canonical_code_points, code_points, has_visible, normalize
from .params import DedupParams
from .shingle import shingle_hashes


class EmptyText(Error, ValueError):
    """Nothing is left of the text after normalization: there is nothing to compare."""


@dataclass(frozen=True, eq=False)
class Sketch:
    """One article's sketch: everything the index stage needs about its text, which is not kept
    (content hash, MinHash signature and verifier, distinct shingle count). "Fingerprint" is the
    passage measures' word (local_similarity/fingerprint.py, fuzzy.py): a text's set of chunk
    digests."""

    content_hash: bytes
    signature: HashArray
    shingle_count: int
    short: bool
    verifier: VerifierArray = field(default_factory=lambda: np.empty(0, dtype=np.uint8))
    # winnowed long shingles with their offsets: containment across sizes, and the shared passages
    anchors: Anchors = NO_ANCHORS

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Sketch)
            and self.content_hash == other.content_hash
            and self.shingle_count == other.shingle_count
            and self.short == other.short
            and bool(np.array_equal(self.signature, other.signature))
            and bool(np.array_equal(self.verifier, other.verifier))
            and self.anchors == other.anchors
        )

    def estimate_jaccard(self, other: Sketch) -> float:
        """From the finest sketches both carry: the verifiers when both have equal-length ones."""
        if self.verifier.size and self.verifier.size == other.verifier.size:
            return estimate_jaccard_verified(self.verifier, other.verifier)
        return estimate_jaccard(self.signature, other.signature)

    __hash__ = None  # type: ignore[assignment]


def sketch_of(text: str, params: DedupParams, max_points: int | None = None) -> Sketch:
    """Normalize, shingle, sign, and pick the anchors (character shingles, containment index on).
    Raises EmptyText when the canonical text has nothing to shingle: no character, under word
    shingles no word (whitespace the normalization keeps is none), or no character that shows
    (normalize.has_visible); and normalize.TooLong when normalisation takes it beyond `max_points`
    characters (None: no limit)."""
    if params.shingle.unit == "char":
        points = canonical_code_points(text, params.normalize, max_points)
        if points.size == 0:
            raise EmptyText("text is empty after normalization")
        if not has_visible(points):
            raise EmptyText("text has only invisible characters after normalization")
        units = points.size
        signature, verifier, distinct = params.hasher.sketches_of_units(
            points, params.shingle.k, params.verify_perm
        )
        anchors = anchors_of(points) if params.containment_index else NO_ANCHORS
    else:
        canonical = normalize(text, params.normalize, max_points)
        units = len(canonical.split())
        if not units:  # an empty set would match every other one with a Jaccard of 1
            raise EmptyText("text has no word after normalization")
        points = code_points(canonical)
        if not has_visible(points):
            raise EmptyText("text has only invisible characters after normalization")
        signature, verifier, distinct = params.hasher.sketches(
            shingle_hashes(canonical, params.shingle), params.verify_perm
        )
        anchors = NO_ANCHORS  # anchors are character spans: word shingles go without
    # the exact-duplicate key: 128-bit murmur3 of the canonical text's code points
    digest = mmh3.hash_bytes(points.tobytes())
    return Sketch(digest, signature, distinct, units < params.shingle.k, verifier, anchors)
