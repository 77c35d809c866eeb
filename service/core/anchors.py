"""Anchors: long shingles of the canonical text chosen by winnowing, with where they lie.

Jaccard misses an excerpt inside a long article (few shingles of the whole are in the part).
Winnowing (Schleimer et al., 2003) keeps, of every window of `window` consecutive k-shingles, the
one of least hash: a text holds every anchor of any window it shares with another, so an excerpt's
anchors are all anchors of its source, and any shared run of window + k - 1 characters yields at
least one. Positions make the shared passages visible, not only their share.

Winnowing and the passages run compiled (_sketch.anchors, _sketch.passages);
tests/support/reference_anchors.py is their numpy reference, with sampling by hash value ("hash ≡ 0
mod p"), which tests/benchmarks/bench_anchors.py compares with winnowing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._hashing import mix_scalar
from .compiled import _sketch

ANCHOR_K = 24  # characters a shingle of an anchor spans
# shingles a winnowing window spans: a gap between anchors never exceeds it (at most 255, so that
# each anchor's offset from the one before packs in a byte); tests/benchmarks/RESULTS.md: the
# widest that keeps the excerpt and revision targets, for the fewest posting lists
ANCHOR_WINDOW = 240
# Anchors a text keeps at most, its first ones (~100 KB of prose): a record and a signed record
# stay bounded whatever the text, and so do the posting lists one article writes.
MAX_ANCHORS = 1024
ANCHOR_BYTES = 5  # a packed anchor: its 32-bit hash, and its one-byte offset from the one before
_ANCHOR_SEED = mix_scalar(0x414E43484F52)  # apart from the MinHash seeds: other hashes, not a subset
AnchorHashes = npt.NDArray[np.uint32]


@dataclass(frozen=True)
class Anchors:
    """A text's anchors in position order, packed as records and signed records keep them: each
    one's hash (32 bits, big-endian: a posting key's suffix as it is), then each one's offset from
    the one before (the first's from 0) in a byte, a winnowing gap never being wider. Packed, they
    pass from the signing pass to the store and the compiled loops without a Python object per
    anchor; `hashes` unpacks them where numpy is wanted (their positions: the offsets added up, as
    tests/support/reference_anchors.py's positions_of does)."""

    packed: bytes = b""

    @classmethod
    def unpack_from(cls, data: bytes, count: int, position: int = 0) -> Anchors:
        """The `count` packed anchors of `data` from `position` (a record, a signed record)."""
        if not count:
            return NO_ANCHORS
        end = position + ANCHOR_BYTES * count
        if end > len(data):
            raise ValueError("anchors are truncated")
        return cls(data[position:end])

    def __len__(self) -> int:
        return len(self.packed) // ANCHOR_BYTES

    @functools.cached_property
    def hashes(self) -> AnchorHashes:
        return np.frombuffer(self.packed, dtype=">u4", count=len(self)).astype(np.uint32)

    @functools.cached_property
    def distinct(self) -> AnchorHashes:
        """The distinct hashes: the posting lists the text joins (a repeated passage joins once).
        Computed once: deciding and indexing an article ask for them several times."""
        return np.unique(self.hashes)

    @functools.cached_property
    def distinct_count(self) -> int:
        """How many distinct hashes, without unpacking them."""
        return len(_sketch.posting_keys(self.packed, b""))


NO_ANCHORS = Anchors()


def anchors_of(
    points: npt.NDArray[np.uint32], k: int = ANCHOR_K, window: int = ANCHOR_WINDOW, most: int = MAX_ANCHORS
) -> Anchors:
    """The winnowed anchors of a canonical text's code points, its first `most` (none for a text
    shorter than k), in one compiled pass (_sketch.anchors: packed as it goes)."""
    if points.size < k:
        return NO_ANCHORS
    passed = np.ascontiguousarray(points, dtype=np.uint32)
    return Anchors(_sketch.anchors(passed, k, window, _ANCHOR_SEED, most))


# _sketch.anchors' arguments after the points, which _sketch.sign_batch takes too
WINNOWING = (ANCHOR_K, ANCHOR_WINDOW, _ANCHOR_SEED, MAX_ANCHORS)


# Anchors a passage may miss between two of its own (a substituted word breaks the shingles over
# it, and the windows that see them choose other anchors), and how far its two texts may shift
# against each other within it (words added or removed), in characters.
_PASSAGE_GAP = 2 * ANCHOR_WINDOW + ANCHOR_K
_PASSAGE_SHIFT = 48
_REPEATS = 4  # places of `other` a hash of `mine` is matched at, at most
# _sketch.passages' arguments after the two texts' anchors, bar the limit (decide_fresh takes them too)
PASSAGE_SETTINGS = (ANCHOR_K, _PASSAGE_GAP, _PASSAGE_SHIFT, _REPEATS)


@dataclass(frozen=True)
class Passage:
    """A passage two texts share, at the anchors' resolution: [start, end) in the first text's
    canonical form and [other_start, other_end) in the second's, from its first anchor to the end
    of its last; `anchors`: how many anchors it spans."""

    start: int
    end: int
    other_start: int
    other_end: int
    anchors: int


def containment(mine: Anchors, other: Anchors) -> tuple[int, float, float]:
    """Distinct anchors in common, and the shares of each text's distinct anchors the other holds
    (mine in other, other in mine): the containment estimates. An excerpt of at least
    ANCHOR_WINDOW + ANCHOR_K - 1 characters has only anchors of its source (every window of it is
    one of the source's), so its share is 1."""
    a, b = mine.distinct, other.distinct
    if not a.size or not b.size:
        return 0, 0.0, 0.0
    shared = int(np.intersect1d(a, b, assume_unique=True).size)
    return shared, shared / a.size, shared / b.size


def passages(mine: Anchors, other: Anchors, limit: int = 3, k: int = ANCHOR_K) -> list[Passage]:
    """The passages both texts hold, longest first (then the earliest in `mine`), at most `limit`,
    in one compiled pass over the packed anchors (_sketch.passages): anchors of equal hash chained
    in the order of `mine` while both texts advance together, with gaps of at most _PASSAGE_GAP and
    shifts of at most _PASSAGE_SHIFT characters. Linear in the anchors: a hash repeated in `other`
    is matched at its first _REPEATS places only, and a run is looked up by its diagonal (where the
    texts' offsets differ by the same amount)."""
    found = _sketch.passages(mine.packed, other.packed, k, _PASSAGE_GAP, _PASSAGE_SHIFT, _REPEATS, limit)
    return [Passage(*spans) for spans in found]
