"""The index's tables: one class per kind of thing it holds, each over the store port (KeyValue),
each owning its keys (index.py lists the layout), its reads, its writes into a Batch and the cache
of what it read. A table's cache is bounded and is brought up to date in one place, its
`written(batch)`, which IndexState calls after every batch it writes; a table opened anew (on
reload, after a clear) holds no cache. What one step hands the next (the decision's lookups, reused
when the article is indexed) is found again by value, never by the identity of an object."""

from __future__ import annotations

import collections
import itertools
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..core import compiled
from ..core.anchors import Anchors
from .port import Batch, Counts, KeyValue

BAND, POSTING = b"b", b"n"
SEQ = struct.Struct(">Q")
_SEQ_DTYPE = np.dtype(">u8")
# A posting entry: 5 bytes big-endian, the seq modulo 2**39 and a top bit set for an article of
# fewer than two distinct anchors. Not a bucket's 8 bytes: posting lists are most of the keys an
# article adds. The seq is whole again as the latest at or before the newest arrival with those
# low bits: an article held 2**39 arrivals (5.5 * 10**11) behind the newest would take a state of
# hundreds of terabytes.
POSTING_ENTRY = 5
FEW_ANCHORS = 1 << 39
POSTING_SEQS = FEW_ANCHORS - 1
# Bucket entries up to which merge_buckets merges them with a dict rather than numpy.
SMALL_MERGE = 256
_UNCACHED = b"?"  # a posting list is a whole number of entries: never this


def seq_key(seq: int) -> bytes:
    return SEQ.pack(seq)


class Buckets:
    """``b<band key>`` → the seqs of the bucket's latest members, at most `cap` of them.

    Caches the buckets its last lookup read: indexing the article just decided joins the same
    buckets, so its keys (equal, not necessarily the same list) find them without a second read
    while no bucket was written since."""

    def __init__(self, kv: KeyValue, counts: Counts, cap: int) -> None:
        self.kv, self.counts, self.cap = kv, counts, cap
        self._looked_up: tuple[Sequence[bytes], list[bytes | None]] | None = None

    def members(self, key: bytes) -> list[int]:
        """The seqs in one bucket, in the order they joined it."""
        return _members(self.kv.get_many([BAND + key])[0])

    def lookup(self, keys: Sequence[bytes], count: int) -> list[int]:
        """The distinct seqs of the buckets `keys`, in order of first appearance, at most `count`:
        one multi-get, merged by the compiled loop where built."""
        found = self.kv.get_many([BAND + key for key in keys])
        self._looked_up = (keys, found)
        loops = compiled.loops()
        return (loops.merge_buckets if loops else merge_buckets)(found, count)

    def _read(self, keys: Sequence[bytes], batch: Batch) -> list[bytes | None]:
        """The stored buckets of `keys`, as this batch leaves them."""
        last = self._looked_up
        if last is not None and not batch.buckets_written and last[0] == keys:
            return last[1]
        names = [BAND + key for key in keys]
        stored = self.kv.get_many([name for name in names if name not in batch.main])
        pending = iter(stored)
        return [batch.main[name] if name in batch.main else next(pending) for name in names]

    def join(self, batch: Batch, seq: int, keys: Sequence[bytes], *, if_absent: bool = False) -> None:
        """The article joins its buckets; each keeps its latest `cap` members. `if_absent`: not
        where it is a member already (an earlier holder of a content taking over again)."""
        entry = seq_key(seq)
        limit = self.cap * SEQ.size
        stored_buckets = self._read(keys, batch)
        batch.buckets_written = True
        for key, stored in zip(keys, stored_buckets, strict=True):
            if if_absent and seq in _members(stored):
                continue
            if stored is None:
                self.counts.buckets += 1
                self.counts.resized(0, 1)
                batch.put(BAND + key, entry)
            else:
                joined = (stored + entry)[-limit:]
                self.counts.resized(len(stored) // SEQ.size, len(joined) // SEQ.size)
                batch.put(BAND + key, joined)

    def leave(self, batch: Batch, seq: int, keys: Sequence[bytes]) -> None:
        stored_buckets = self._read(keys, batch)
        batch.buckets_written = True
        for key, stored in zip(keys, stored_buckets, strict=True):
            if not stored:
                continue
            members = _members(stored)
            if seq not in members:
                continue
            kept = b"".join(seq_key(other) for other in members if other != seq)
            self.counts.resized(len(members), len(members) - 1)
            if kept:
                batch.put(BAND + key, kept)
            else:
                self.counts.buckets -= 1
                batch.delete(BAND + key)

    def written(self, batch: Batch) -> None:
        if batch.buckets_written:
            self._looked_up = None


class Postings:
    """``n<anchor>`` → the seqs of the articles holding the anchor, in the order they joined, at
    most `cap`, each in POSTING_ENTRY bytes; a full list (boilerplate) proposes nobody.

    Caches the lists as the store holds them (None: absent), as last read or written, at most
    `cache_size`: a news text's anchors recur in later texts (quotes, boilerplate, rewrites), and a
    list held here spares a read of the store; emptied when it would grow past its size (cheaper
    than ordering it). Also the keys of the last text asked for and the lists its lookup read, found
    again by the text's packed anchors: deciding an article and indexing it both ask."""

    def __init__(self, kv: KeyValue, counts: Counts, cap: int, cache_size: int) -> None:
        self.kv, self.counts, self.cap, self.cache_size = kv, counts, cap, cache_size
        self._cache: dict[bytes, bytes | None] = {}
        self._names: tuple[bytes, list[bytes]] = (b"", [])
        self._looked_up: tuple[bytes, list[bytes | None]] | None = None

    def cached(self) -> int:
        """How many lists the cache holds."""
        return len(self._cache)

    def names(self, anchors: Anchors) -> list[bytes]:
        """The posting list keys of a text's distinct anchors, in the order of their first place."""
        packed, names = self._names
        if anchors.packed == packed:
            return names
        loops = compiled.loops()
        names = loops.posting_keys(anchors.packed, POSTING) if loops else posting_keys(anchors)
        self._names = (anchors.packed, names)
        return names

    def lookup(self, anchors: Anchors, newest: int, top: int) -> list[tuple[int, int]]:
        """The articles sharing anchors with `anchors` (two, or all of the fewer either side has),
        as (seq, anchors shared), the most shared first (then the earliest), at most `top`; `newest`:
        the latest seq held. One multi-get of the lists not cached; the full ones left out."""
        names = self.names(anchors)
        if not names:
            return []
        found = self._read_cached(names)
        self._looked_up = (anchors.packed, found)
        loops = compiled.loops()
        args = (found, POSTING_ENTRY, self.cap * POSTING_ENTRY, min(2, len(names)), top)
        ranked = loops.count_postings(*args) if loops else rank_postings(*args)
        return [(newest - ((newest - low) & POSTING_SEQS), count) for low, count in ranked]

    def _read(self, anchors: Anchors, names: list[bytes], batch: Batch) -> list[bytes | None]:
        """The posting lists `names` (of `anchors`) as this batch leaves them."""
        last = self._looked_up
        if not batch.postings_written:
            if last is not None and last[0] == anchors.packed:
                return last[1]
            return self._read_cached(names)
        written = batch.main
        absent = [name for name in names if name not in written]
        pending = iter(self._read_cached(absent) if absent else ())
        return [written[name] if name in written else next(pending) for name in names]

    def _read_cached(self, names: list[bytes]) -> list[bytes | None]:
        """The stored posting lists `names`: the cache's, the others in one multi-get (then cached)."""
        cache = self._cache
        found: list[bytes | None] = list(map(cache.get, names, itertools.repeat(_UNCACHED)))
        if _UNCACHED not in found:
            return found
        missing = [name for name, stored in zip(names, found, strict=True) if stored is _UNCACHED]
        read = self.kv.get_many(missing)
        if len(cache) + len(read) > self.cache_size:
            cache.clear()
        cache.update(zip(missing, read, strict=True))
        if len(missing) == len(names):  # new text: none cached
            return read
        fresh = iter(read)
        return [next(fresh) if stored is _UNCACHED else stored for stored in found]

    def join(self, batch: Batch, seq: int, anchors: Anchors) -> None:
        """The article joins the posting lists of its anchors but the full ones (boilerplate): a
        full list proposes nobody whoever its latest members are, so it is not rewritten (its
        members leave it as they go, and the next one fills it again)."""
        names = self.names(anchors)
        if not names:
            return
        low = seq & POSTING_SEQS
        entry = (low | (FEW_ANCHORS if len(names) < 2 else 0)).to_bytes(POSTING_ENTRY, "big")
        stored = self._read(anchors, names, batch)
        loops = compiled.loops()
        join = loops.join_postings if loops else join_postings
        created, filled = join(names, stored, entry, self.cap * POSTING_ENTRY, batch.main)
        self.counts.postings += created
        self.counts.boilerplate += filled
        batch.postings_written.append(names)

    def leave(self, batch: Batch, seq: int, anchors: Anchors) -> None:
        names = self.names(anchors)
        limit = self.cap * POSTING_ENTRY
        for name, stored in zip(names, self._read(anchors, names, batch), strict=True):
            if not stored:
                continue
            entries = posting_entries(stored)
            kept = (entries & np.uint64(POSTING_SEQS)) != seq & POSTING_SEQS
            if kept.all():
                continue  # pushed out by later members already
            if len(stored) >= limit:
                self.counts.boilerplate -= 1
            if kept.any():
                rows = np.frombuffer(stored, dtype=np.uint8).reshape(-1, POSTING_ENTRY)
                batch.put(name, rows[kept].tobytes())
            else:
                self.counts.postings -= 1
                batch.delete(name)
            batch.postings_written.append([name])

    def written(self, batch: Batch) -> None:
        """The lists the batch wrote, into the cache; the last lookup's no longer stands."""
        self._looked_up = None
        cache, main = self._cache, batch.main
        for names in batch.postings_written:
            cache.update({name: main[name] for name in names if name in main})
        if len(cache) > self.cache_size:
            cache.clear()


def merge_buckets(found: Sequence[bytes | None], count: int) -> list[int]:
    """The distinct seqs of stored buckets (None: absent), in order of first appearance, at most
    `count`: the reference of the compiled _sketch.merge_buckets."""
    stored = b"".join(data for data in found if data)
    seqs = np.frombuffer(stored, dtype=_SEQ_DTYPE)
    if seqs.size <= SMALL_MERGE:
        return list(dict.fromkeys(seqs.tolist()))[:count]
    distinct, first = np.unique(seqs, return_index=True)
    return cast(list[int], distinct[np.argsort(first, kind="stable")][:count].tolist())


def posting_keys(anchors: Anchors) -> list[bytes]:
    """The reference of the compiled _sketch.posting_keys: the packed hashes are the keys' suffixes."""
    raw = anchors.packed[: 4 * len(anchors)]
    return list(dict.fromkeys([POSTING + raw[at : at + 4] for at in range(0, len(raw), 4)]))


def join_postings(
    names: Sequence[bytes], found: Sequence[bytes | None], entry: bytes, full: int, into: dict[bytes, Any]
) -> tuple[int, int]:
    """`entry` appended to the posting lists `found` (None: absent) into `into` by their names,
    but to those of `full` bytes or more; returns how many lists it starts and how many it
    fills: the reference of the compiled _sketch.join_postings."""
    created = filled = 0
    for name, stored in zip(names, found, strict=True):
        if stored is None:
            created += 1
            into[name] = entry
        elif len(stored) < full:
            joined = stored + entry
            filled += len(joined) >= full
            into[name] = joined
    return created, filled


def rank_postings(
    found: Sequence[bytes | None], width: int, full: int, need: int, top: int
) -> list[tuple[int, int]]:
    """The entries of the posting lists `found` (None: absent; `full` bytes or more: boilerplate,
    left out) counted at least `need` times or flagged (an article of fewer than two anchors), as
    (seq, count), the most counted first, then the earliest, at most `top`: the reference of the
    compiled _sketch.count_postings."""
    if width != POSTING_ENTRY:
        raise ValueError(f"posting entries are {POSTING_ENTRY} bytes, not {width}")
    held = b"".join([stored for stored in found if stored and len(stored) < full])
    if not held:
        return []
    counts = collections.Counter(posting_entries(held).tolist())
    ranked = sorted(
        (-count, entry & POSTING_SEQS)
        for entry, count in counts.items()
        if count >= need or entry & FEW_ANCHORS
    )
    return [(seq, -count) for count, seq in ranked[:top]]


def posting_entries(stored: bytes) -> npt.NDArray[np.uint64]:
    """The entries of posting lists joined back to back (POSTING_ENTRY bytes each), as integers."""
    rows = np.frombuffer(stored, dtype=np.uint8).reshape(-1, POSTING_ENTRY)
    wide = np.zeros((rows.shape[0], SEQ.size), dtype=np.uint8)
    wide[:, SEQ.size - POSTING_ENTRY :] = rows
    return wide.view(_SEQ_DTYPE).ravel().astype(np.uint64)


def _members(stored: bytes | None) -> list[int]:
    """The seqs a stored bucket holds, in the order they joined it."""
    return np.frombuffer(stored, dtype=_SEQ_DTYPE).tolist() if stored else []
