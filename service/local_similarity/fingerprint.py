"""Chunk-identity fingerprints (the paper's MD5 baseline): n-word chunk digests and shared passages.

A text's fingerprint is the set of 64-bit digests of its sliding n-word chunks; two texts are
locally similar in proportion to the chunks they share, and shared chunks on one alignment merge
into maximal passages reported as character spans of the original texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import mmh3
import numpy as np
import numpy.typing as npt

from ..core._hashing import fmix64
from .terms import Tokens

U64 = npt.NDArray[np.uint64]
DEFAULT_CHUNK_WORDS = 5
WORD_SEED = 0x6E64_6C6F  # fixed so fingerprints are comparable across processes and releases
# A chunk repeated more often than this within one text (ruler lines, list boilerplate) would pair
# with every copy on the other side, quadratically; such chunks are aligned by occurrence instead.
MAX_REPEATS = 64

# Chunk digest = fmix64(sum_j wordhash[i+j] * M^(n-1-j) mod 2^64). Hashing each distinct word
# once with MurmurHash3 and combining in numpy is cheaper than hashing every joined chunk string
# (with mmh3, MD5 or BLAKE2b), whose words overlap n-fold, and keeps the same 64-bit collision
# behaviour for distinct chunks: M is odd, so a difference in any one word can never cancel, and
# the finalizer (a bijection) spreads the linear mix over all bits.
_M = np.uint64(0x9E37_79B9_7F4A_7C15)


class VerbatimPassage(NamedTuple):
    """A maximal passage both texts hold word for word: [a_start, a_end) in text A equals
    [b_start, b_end) in text B, spans of the original strings, every word in it matched (after
    normalization). The engine's `core.anchors.Passage` is another thing: approximate, at the
    anchors' resolution, in the canonical form, with gaps and shifts allowed.

    A named tuple (immutable, unpacks as the 4-tuple of spans) rather than a dataclass, because
    callers mostly want the bare spans.
    """

    a_start: int
    a_end: int
    b_start: int
    b_end: int


def word_hashes(seq: Sequence[str]) -> U64:
    """One 64-bit MurmurHash3 per word; each distinct word is hashed once."""
    table = {w: mmh3.hash64(w, WORD_SEED, signed=False)[0] for w in set(seq)}
    return np.fromiter(map(table.__getitem__, seq), dtype=np.uint64, count=len(seq))


def combine(wh: U64, n: int) -> U64:
    """Digest of every window of n consecutive word hashes (one window if fewer than n, none if
    there are no words: the slice below is then empty)."""
    width = min(n, wh.size)
    m = wh.size - width + 1
    with np.errstate(over="ignore"):
        h = wh[:m].copy()
        for j in range(1, width):
            h *= _M
            h += wh[j : j + m]
        return fmix64(h)


def chunk_hashes(seq: Sequence[str], n: int = DEFAULT_CHUNK_WORDS) -> U64:
    """Digest of every sliding n-word chunk, position i covering words [i, i+n).

    A text shorter than n words (but not empty) gives one chunk of all its words, so the chunks
    always cover the document, as the paper requires of fingerprints for similarity analysis.
    """
    if n < 1:
        raise ValueError(f"chunk size n must be >= 1 words, got {n}")
    return combine(word_hashes(seq), n)


def fingerprint_of_words(seq: Sequence[str], n: int = DEFAULT_CHUNK_WORDS) -> U64:
    """The fingerprint h(d): the sorted set of chunk digests."""
    return np.unique(chunk_hashes(seq, n))


def _join(ka: U64, kb: U64) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """All (i, j) with ka[i] == kb[j], vectorized through a sort of kb."""
    order = np.argsort(kb, kind="stable")
    sorted_b = kb[order]
    lo = np.searchsorted(sorted_b, ka, side="left")
    counts = np.searchsorted(sorted_b, ka, side="right") - lo
    i = np.repeat(np.arange(ka.size, dtype=np.int64), counts)
    # offsets 0..counts-1 within each run of equal keys, added to that run's first sorted position
    run_start = np.repeat(np.cumsum(counts) - counts, counts)
    j = order[np.arange(i.size) - run_start + np.repeat(lo, counts)].astype(np.int64)
    return i, j


def _occurrences(values: U64, of: U64) -> npt.NDArray[np.int64]:
    """How often each element of `of` occurs in `values`."""
    ordered = np.sort(values)
    return np.searchsorted(ordered, of, side="right") - np.searchsorted(ordered, of, side="left")


def _occurrence_rank(values: U64) -> npt.NDArray[np.int64]:
    """0 for the first occurrence of a value, 1 for its second, ... (in position order)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    rank = np.empty(values.size, dtype=np.int64)
    # a sorted position less the first sorted position of its value
    rank[order] = np.arange(values.size) - np.searchsorted(ordered, ordered)
    return rank


def _matched_pairs(ha: U64, hb: U64) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Positions (i, j) of equal chunks in A and B.

    Every occurrence pairs with every other, except for chunks repeated more than MAX_REPEATS
    times in either text (ruler lines, boilerplate), whose k-th occurrence in A pairs only with
    the k-th in B: that keeps the work linear and still aligns identical or shifted copies.
    """
    heavy_a = (_occurrences(ha, ha) > MAX_REPEATS) | (_occurrences(hb, ha) > MAX_REPEATS)
    heavy_b = (_occurrences(hb, hb) > MAX_REPEATS) | (_occurrences(ha, hb) > MAX_REPEATS)
    pos_a, pos_b = np.nonzero(~heavy_a)[0], np.nonzero(~heavy_b)[0]
    i, j = _join(ha[pos_a], hb[pos_b])
    i, j = pos_a[i], pos_b[j]
    if heavy_a.any() and heavy_b.any():
        hpa, hpb = np.nonzero(heavy_a)[0], np.nonzero(heavy_b)[0]
        with np.errstate(over="ignore"):
            ka = fmix64(ha[hpa] ^ (_occurrence_rank(ha)[hpa].astype(np.uint64) * _M))
            kb = fmix64(hb[hpb] ^ (_occurrence_rank(hb)[hpb].astype(np.uint64) * _M))
        hi, hj = _join(ka, kb)
        i, j = np.concatenate((i, hpa[hi])), np.concatenate((j, hpb[hj]))
    return i, j


def word_passages(ha: U64, hb: U64, n: int) -> list[tuple[int, int, int, int]]:
    """Maximal shared word ranges [ia, ia_end) / [jb, jb_end) from two chunk-hash sequences.

    Matched chunks on one diagonal (i - j constant) that overlap or touch merge, since every word
    between them is then matched on that alignment. Passages contained in a longer one (repeated
    phrases matched on several alignments) are dropped.
    """
    i, j = _matched_pairs(ha, hb)
    if i.size == 0:
        return []
    d = i - j
    order = np.lexsort((i, d))
    i, d = i[order], d[order]
    new_run = np.concatenate(([True], (d[1:] != d[:-1]) | (i[1:] > i[:-1] + n)))
    starts = np.flatnonzero(new_run)
    ends = np.append(starts[1:], i.size) - 1
    runs = np.stack([i[starts], i[ends] + n, i[starts] - d[starts], i[ends] - d[ends] + n], axis=1)
    return sorted((int(a0), int(a1), int(b0), int(b1)) for a0, a1, b0, b1 in runs[~_contained(runs)])


def _contained(runs: npt.NDArray[np.int64], block: int = 512) -> npt.NDArray[np.bool_]:
    """Which runs lie inside another run on both sides (only periodic text produces these)."""
    out = np.zeros(len(runs), dtype=bool)
    a0, a1, b0, b1 = (runs[:, c][None, :] for c in range(4))
    for lo in range(0, len(runs), block):
        x = runs[lo : lo + block]
        inside = (a0 <= x[:, 0:1]) & (x[:, 1:2] <= a1) & (b0 <= x[:, 2:3]) & (x[:, 3:4] <= b1)
        inside[np.arange(len(x)), lo + np.arange(len(x))] = False  # not inside itself
        out[lo : lo + block] = inside.any(axis=1)
    return out


def passages_of_tokens(ta: Tokens, tb: Tokens, n: int = DEFAULT_CHUNK_WORDS) -> list[VerbatimPassage]:
    """Shared passages as character spans, from tokenized texts (reuse tokens across calls)."""
    ha, hb = chunk_hashes(ta.words, n), chunk_hashes(tb.words, n)  # checks n first, whatever the texts
    width = min(n, len(ta))
    if width == 0 or width != min(n, len(tb)):
        # Digests of chunks of different widths never coincide: a text shorter than n words only
        # matches an equally short, identical text, exactly as its fingerprint does.
        return []
    return [
        VerbatimPassage(int(ta.starts[a0]), int(ta.ends[a1 - 1]), int(tb.starts[b0]), int(tb.ends[b1 - 1]))
        for a0, a1, b0, b1 in word_passages(ha, hb, width)
    ]
