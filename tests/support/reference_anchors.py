"""The numpy reference of the anchors' compiled loops (service/core/_sketch.c): winnowing
(anchors.anchors_of, _sketch.anchors), the shared passages (anchors.passages, _sketch.passages) and
the distinct count (Anchors.distinct_count), which the tests compare with the compiled results; and
sampling by hash value ("hash ≡ 0 mod p"), which tests/benchmarks/bench_anchors.py compares with
winnowing."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from neardup.core._hashing import U64, HashArray, fmix64
from neardup.core.anchors import (
    _ANCHOR_SEED,
    _PASSAGE_GAP,
    _PASSAGE_SHIFT,
    _REPEATS,
    ANCHOR_K,
    ANCHOR_WINDOW,
    NO_ANCHORS,
    Anchors,
    Passage,
)
from neardup.core.shingle import _polynomial


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


def packed_anchors(hashes: npt.ArrayLike, positions: npt.ArrayLike) -> Anchors:
    """Anchors packed from their hashes and ascending positions, as the compiled pass packs them;
    ValueError when two are more than 255 characters apart (or out of order)."""
    hashes, positions = np.asarray(hashes, dtype=np.uint32), np.asarray(positions, dtype=np.int64)
    steps = np.diff(positions, prepend=0)
    if hashes.shape != positions.shape or (steps.size and (steps.min() < 0 or steps.max() > 255)):
        raise ValueError("anchors must be in position order, at most 255 characters apart")
    return Anchors(hashes.astype(">u4").tobytes() + steps.astype(np.uint8).tobytes())


def positions_of(anchors: Anchors) -> npt.NDArray[np.uint32]:
    """Where each anchor lies in its text: the packed offsets, each from the one before, added up."""
    steps = np.frombuffer(anchors.packed, dtype=np.uint8, offset=4 * len(anchors))
    return np.cumsum(steps, dtype=np.uint32)


def anchors_of(points: npt.NDArray[np.uint32], k: int = ANCHOR_K, window: int = ANCHOR_WINDOW) -> Anchors:
    """anchors.anchors_of, all of them (most=len(points) there)."""
    if points.size < k:
        return NO_ANCHORS
    values = shingle_values(points, k)
    positions = winnow(values, window)
    # the low 32 bits: winnowing keeps small values, so their high bits are mostly zero
    hashes = (values[positions] & U64(0xFFFFFFFF)).astype(np.uint32)
    return packed_anchors(hashes, positions)


def distinct_count(anchors: Anchors) -> int:
    """Anchors.distinct_count."""
    return len(set(anchors.hashes.tolist()))


def passages(mine: Anchors, other: Anchors, limit: int = 3, k: int = ANCHOR_K) -> list[Passage]:
    """anchors.passages: the passages both texts hold, longest first (then the earliest in `mine`),
    at most `limit`: anchors of equal hash chained in the order of `mine` while both texts advance
    together, with gaps of at most _PASSAGE_GAP and shifts of at most _PASSAGE_SHIFT characters. A
    hash repeated in `other` is matched at its first _REPEATS places only, and a run is looked up
    by its diagonal (where the texts' offsets differ by the same amount)."""
    if not len(mine) or not len(other):
        return []
    order = np.argsort(other.hashes, kind="stable")
    sorted_hashes = other.hashes[order]
    lo = np.searchsorted(sorted_hashes, mine.hashes, side="left")
    hi = np.minimum(np.searchsorted(sorted_hashes, mine.hashes, side="right"), lo + _REPEATS)
    mine_places, other_places = positions_of(mine), positions_of(other)
    runs: list[list[int]] = []  # start, last, other start, other last, anchors
    latest: dict[int, int] = {}  # diagonal band → the latest run in it
    for i in np.flatnonzero(hi > lo).tolist():
        at = int(mine_places[i])
        for j in order[lo[i] : hi[i]].tolist():
            other_at = int(other_places[j])
            band = (other_at - at) // _PASSAGE_SHIFT
            run = _extendable(runs, latest, band, at, other_at)
            if run is None:
                runs.append([at, at, other_at, other_at, 1])
                run = len(runs) - 1
            else:
                runs[run][1], runs[run][3], runs[run][4] = at, other_at, runs[run][4] + 1
            latest[band] = run
    found = [Passage(r[0], r[1] + k, r[2], r[3] + k, r[4]) for r in runs]
    found.sort(key=lambda p: (p.start - p.end, p.start))
    return found[:limit]


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
