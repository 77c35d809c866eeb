"""Anchors: long shingles of the canonical text chosen by winnowing, with where they lie.

Jaccard misses an excerpt inside a long article (few shingles of the whole are in the part).
Winnowing (Schleimer et al., 2003) keeps, of every window of `window` consecutive k-shingles, the
one of least hash: a text holds every anchor of any window it shares with another, so an excerpt's
anchors are all anchors of its source, and any shared run of window + k - 1 characters yields at
least one. Positions make the shared passages visible, not only their share. Sampling by hash value
("hash ≡ 0 mod p") is kept beside it for the comparison the benchmarks make
(tests/benchmarks/bench_containment.py).

This is the numpy reference; _sketch.anchors computes the same anchors in one compiled pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import compiled
from ._hashing import U64, HashArray, fmix64, mix_scalar
from .shingle import _polynomial

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
AnchorPositions = npt.NDArray[np.uint32]


@dataclass(frozen=True)
class Anchors:
    """A text's anchors in position order, packed as records and signed records keep them: each
    one's hash (32 bits, big-endian: a posting key's suffix as it is), then each one's offset from
    the one before (the first's from 0) in a byte, a winnowing gap never being wider. Packed, they
    pass from the signing pass to the store and the compiled loops without a Python object per
    anchor; `hashes` and `positions` unpack them where numpy is wanted."""

    packed: bytes = b""

    @classmethod
    def of(cls, hashes: npt.ArrayLike, positions: npt.ArrayLike) -> Anchors:
        """Packed from the hashes and ascending positions; ValueError when two are more than 255
        characters apart (or out of order)."""
        hashes, positions = np.asarray(hashes, dtype=np.uint32), np.asarray(positions, dtype=np.int64)
        steps = np.diff(positions, prepend=0)
        if hashes.shape != positions.shape or (steps.size and (steps.min() < 0 or steps.max() > 255)):
            raise ValueError("anchors must be in position order, at most 255 characters apart")
        return cls(hashes.astype(">u4").tobytes() + steps.astype(np.uint8).tobytes())

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
    def positions(self) -> AnchorPositions:
        steps = np.frombuffer(self.packed, dtype=np.uint8, offset=4 * len(self))
        return np.cumsum(steps, dtype=np.uint32)

    @functools.cached_property
    def _distinct(self) -> AnchorHashes:
        return np.unique(self.hashes)

    def distinct(self) -> AnchorHashes:
        """The distinct hashes: the posting lists the text joins (a repeated passage joins once).
        Computed once: deciding and indexing an article ask for them several times."""
        return self._distinct

    @functools.cached_property
    def distinct_count(self) -> int:
        """How many distinct hashes, without unpacking them where the compiled loops are built."""
        loops = compiled.loops()
        if loops is not None:
            return len(loops.posting_keys(self.packed, b""))
        return len(set(self.hashes.tolist()))


NO_ANCHORS = Anchors()


def shingle_values(points: npt.NDArray[np.uint32], k: int = ANCHOR_K) -> HashArray:
    """The mixed hash of every k-character shingle, in text order (the polynomial hash of
    shingle.py, then fmix64 under the anchors' own seed: winnowing needs hashes that look random)."""
    values = _polynomial(points.astype(U64), k)
    values ^= U64(_ANCHOR_SEED)
    return fmix64(values)


def winnow(values: HashArray, window: int = ANCHOR_WINDOW) -> npt.NDArray[np.intp]:
    """The positions winnowing keeps, ascending: of each window of `window` consecutive values the
    least, the rightmost among equals (a run of equal values then yields one anchor per window, not
    one per position). Fewer values than a window: the least of them all."""
    if values.size == 0:
        return np.empty(0, dtype=np.intp)
    if values.size <= window:
        reversed_at = int(np.argmin(values[::-1]))
        return np.array([values.size - 1 - reversed_at], dtype=np.intp)
    windows = np.lib.stride_tricks.sliding_window_view(values, window)
    rightmost = window - 1 - np.argmin(windows[:, ::-1], axis=1)
    return np.unique(rightmost + np.arange(windows.shape[0]))


def sample_mod(values: HashArray, rate: int) -> npt.NDArray[np.intp]:
    """The positions whose value falls in the lowest 1/rate of the range: "hash ≡ 0 mod p"
    sampling (FracMinHash) with p = rate, for comparison with winnowing."""
    bound = U64((1 << 64) // rate)
    return np.flatnonzero(values < bound)


def _as_anchors(values: HashArray, positions: npt.NDArray[np.intp]) -> Anchors:
    # the low 32 bits: winnowing keeps small values, so their high bits are mostly zero
    hashes = (values[positions] & U64(0xFFFFFFFF)).astype(np.uint32)
    return Anchors.of(hashes, positions)


def anchors_of(points: npt.NDArray[np.uint32], k: int = ANCHOR_K, window: int = ANCHOR_WINDOW) -> Anchors:
    """The winnowed anchors of a canonical text's code points, its first MAX_ANCHORS (none for a
    text shorter than k): the compiled pass where built, this numpy reference otherwise."""
    if points.size < k:
        return NO_ANCHORS
    if compiled.loops():
        return anchors_compiled(points, k, window, MAX_ANCHORS)
    found = anchors_reference(points, k, window)
    if len(found) > MAX_ANCHORS:
        return Anchors.of(found.hashes[:MAX_ANCHORS], found.positions[:MAX_ANCHORS])
    return found


def anchors_reference(
    points: npt.NDArray[np.uint32], k: int = ANCHOR_K, window: int = ANCHOR_WINDOW
) -> Anchors:
    """anchors_of in numpy, the reference the compiled pass is tested against."""
    if points.size < k:
        return NO_ANCHORS
    values = shingle_values(points, k)
    return _as_anchors(values, winnow(values, window))


def anchors_compiled(
    points: npt.NDArray[np.uint32], k: int = ANCHOR_K, window: int = ANCHOR_WINDOW, most: int | None = None
) -> Anchors:
    """anchors_of in the compiled pass (_sketch.anchors: packed as it goes), the first `most`
    (None: all); the module must be built."""
    loops = compiled.loops()
    if loops is None:
        raise RuntimeError("the compiled loops are not built or are turned off")
    passed = np.ascontiguousarray(points, dtype=np.uint32)
    limit = passed.size if most is None else most
    return Anchors(loops.anchors(passed, k, window, _ANCHOR_SEED, limit))


# Anchors a passage may miss between two of its own (a substituted word breaks the shingles over
# it, and the windows that see them choose other anchors), and how far its two texts may shift
# against each other within it (words added or removed), in characters.
_PASSAGE_GAP = 2 * ANCHOR_WINDOW + ANCHOR_K
_PASSAGE_SHIFT = 48


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

    @property
    def length(self) -> int:
        return self.end - self.start


def containment(mine: Anchors, other: Anchors) -> tuple[int, float, float]:
    """Distinct anchors in common, and the shares of each text's distinct anchors the other holds
    (mine in other, other in mine): the containment estimates. An excerpt of at least
    ANCHOR_WINDOW + ANCHOR_K - 1 characters has only anchors of its source (every window of it is
    one of the source's), so its share is 1."""
    a, b = mine.distinct(), other.distinct()
    if not a.size or not b.size:
        return 0, 0.0, 0.0
    shared = int(np.intersect1d(a, b, assume_unique=True).size)
    return shared, shared / a.size, shared / b.size


def passages(mine: Anchors, other: Anchors, limit: int = 3, k: int = ANCHOR_K) -> list[Passage]:
    """The passages both texts hold (passages_reference): in one compiled pass over the packed
    anchors where built, the reference otherwise."""
    loops = compiled.loops()
    if loops is None:
        return passages_reference(mine, other, limit, k)
    found = loops.passages(mine.packed, other.packed, k, _PASSAGE_GAP, _PASSAGE_SHIFT, _REPEATS, limit)
    return [Passage(*spans) for spans in found]


def passages_reference(mine: Anchors, other: Anchors, limit: int = 3, k: int = ANCHOR_K) -> list[Passage]:
    """The passages both texts hold, longest first (then the earliest in `mine`), at most `limit`:
    anchors of equal hash chained in the order of `mine` while both texts advance together, with
    gaps of at most _PASSAGE_GAP and shifts of at most _PASSAGE_SHIFT characters. Linear in the
    anchors: a hash repeated in `other` is matched at its first _REPEATS places only, and a run is
    looked up by its diagonal (where the texts' offsets differ by the same amount)."""
    if not len(mine) or not len(other):
        return []
    order = np.argsort(other.hashes, kind="stable")
    sorted_hashes = other.hashes[order]
    lo = np.searchsorted(sorted_hashes, mine.hashes, side="left")
    hi = np.minimum(np.searchsorted(sorted_hashes, mine.hashes, side="right"), lo + _REPEATS)
    runs: list[list[int]] = []  # start, last, other start, other last, anchors
    latest: dict[int, int] = {}  # diagonal band → the latest run in it
    for i in np.flatnonzero(hi > lo).tolist():
        at = int(mine.positions[i])
        for j in order[lo[i] : hi[i]].tolist():
            other_at = int(other.positions[j])
            band = (other_at - at) // _PASSAGE_SHIFT
            run = _extendable(runs, latest, band, at, other_at)
            if run is None:
                runs.append([at, at, other_at, other_at, 1])
                run = len(runs) - 1
            else:
                runs[run][1], runs[run][3], runs[run][4] = at, other_at, runs[run][4] + 1
            latest[band] = run
    found = [Passage(r[0], r[1] + k, r[2], r[3] + k, r[4]) for r in runs]
    found.sort(key=lambda p: (-p.length, p.start))
    return found[:limit]


_REPEATS = 4


def _extendable(
    runs: list[list[int]], latest: dict[int, int], band: int, at: int, other_at: int
) -> int | None:
    """The run (its index) that an anchor at (at, other_at) continues, if any: the latest run of
    its diagonal band or of a neighbouring one."""
    for near in (band, band - 1, band + 1):
        index = latest.get(near)
        if index is None:
            continue
        run = runs[index]
        advance, other_advance = at - run[1], other_at - run[3]
        if (
            0 < advance <= _PASSAGE_GAP
            and other_advance > 0
            and abs(advance - other_advance) <= _PASSAGE_SHIFT
        ):
            return index
    return None
