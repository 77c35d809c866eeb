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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar, cast

import numpy as np

from ..core.anchors import Anchors
from ..core.compiled import _sketch
from ..core.dedup import IndexedArticle
from .port import Batch, Counts, KeyValue
from .records import CorruptRecord, Probe, decode_probe, decode_record

ARTICLE, BAND, POSTING, CONTENT, COPY, MEMBER, HEAD, TIME = b"a", b"b", b"n", b"c", b"x", b"k", b"h", b"t"
MARKER, MARKER_TIME = b"d", b"e"
SEQ = struct.Struct(">Q")
_MARKER = struct.Struct(">QQ")  # version, biased deletion time
_TIME_BIAS = 1 << 63  # event times may be negative (before 1970): biased so they sort as unsigned
_SEQ_DTYPE = np.dtype(">u8")
# A posting entry: 5 bytes big-endian, the seq modulo 2**39 and a top bit set for an article of
# fewer than two distinct anchors. Not a bucket's 8 bytes: posting lists are most of the keys an
# article adds. The seq is whole again as the latest at or before the newest arrival with those
# low bits: an article held 2**39 arrivals (5.5 * 10**11) behind the newest would take a state of
# hundreds of terabytes.
POSTING_ENTRY = 5
FEW_ANCHORS = 1 << 39
POSTING_SEQS = FEW_ANCHORS - 1
_UNCACHED = b"?"  # a posting list is a whole number of entries: never this
_UNREAD = object()  # a cache not filled yet
T = TypeVar("T")


def seq_key(seq: int) -> bytes:
    return SEQ.pack(seq)


def time_key(time_ms: int, seq: int) -> bytes:
    return TIME + SEQ.pack(time_ms + _TIME_BIAS) + SEQ.pack(seq)


def marker_time_key(time_ms: int, article_id: str) -> bytes:
    return MARKER_TIME + SEQ.pack(time_ms + _TIME_BIAS) + article_id.encode()


class Marker(NamedTuple):
    """What a deletion leaves of an id: its last version, and when (event time) it was deleted."""

    version: int
    time_ms: int


def encode_marker(marker: Marker) -> bytes:
    return _MARKER.pack(marker.version, marker.time_ms + _TIME_BIAS)


def decode_marker(data: bytes, article_id: str = "?") -> Marker:
    if len(data) != _MARKER.size:
        raise CorruptRecord(f"deletion marker of {article_id!r} has {len(data)} bytes, not {_MARKER.size}")
    version, biased = _MARKER.unpack(data)
    return Marker(version, biased - _TIME_BIAS)


def as_left(
    written: dict[bytes, bytes | None], names: list[bytes], read: Callable[[list[bytes]], list[bytes | None]]
) -> list[bytes | None]:
    """The values of `names` as a batch's writes `written` leave them: the others `read` in one call."""
    pending = iter(read([name for name in names if name not in written]))
    return [written[name] if name in written else next(pending) for name in names]


def keys_before(kv: KeyValue, prefix: bytes, bound: bytes, limit: int) -> list[bytes]:
    """The first keys under `prefix`, in order, before `bound`, at most `limit`."""
    before = itertools.takewhile(lambda entry: entry[0] < bound, kv.scan(prefix))
    return [key for key, _ in itertools.islice(before, limit)]


def first_key(kv: KeyValue, batch: Batch, prefix: bytes, skip: bytes) -> bytes | None:
    """The first key under `prefix` (its last 8 bytes a seq other than `skip`) as the batch leaves
    them: not one it deletes, and the ones it added that `batch.scanned` lists."""
    added = [
        key
        for key in batch.scanned
        if key.startswith(prefix) and key[-SEQ.size :] != skip and batch.main.get(key) is not None
    ]
    for key, _ in kv.scan(prefix):
        if key[-SEQ.size :] != skip and batch.main.get(key, b"") is not None:
            return min([key, *added])
    return min(added, default=None)


class ArticleVersions:
    """``a<id>`` → the seq of the id's current version; the records family: seq → the record of
    an article version (records.py).

    Caches decoded records, the latest read first out last (`record_cache` of them):
    exact copies, re-deliveries and replays read them again; and candidates' probes, the first
    read (or restored) first out (`probe_cache`): a multi-get of tens of records costs more than
    scoring them. A record the store no longer holds leaves both (`written`)."""

    def __init__(self, kv: KeyValue, record_cache: int, probe_cache: int) -> None:
        self.kv, self.record_cache, self.probe_cache = kv, record_cache, probe_cache
        self._recent: collections.OrderedDict[int, IndexedArticle] = collections.OrderedDict()
        self._probes: collections.OrderedDict[int, Probe] = collections.OrderedDict()

    @staticmethod
    def key(article_id: str) -> bytes:
        return ARTICLE + article_id.encode()

    def held(self, article_ids: Sequence[str]) -> list[bool]:
        """Whether each id has a version held, in one multi-get."""
        return [seq is not None for seq in self.kv.get_many([self.key(i) for i in article_ids])]

    def arrivals(self, seqs: Sequence[int]) -> list[IndexedArticle | None]:
        """The article versions with these seqs, from the cache or one multi-get (None: gone)."""
        for seq in seqs:
            if seq in self._recent:
                self._recent.move_to_end(seq)
        return self._cached(seqs, self._recent, lambda data, key: self.remember(decode_record(data, key)))

    def prospects(self, seqs: Sequence[int]) -> list[Probe | None]:
        """The probes of these seqs, from the cache or one multi-get of their records."""
        return self._cached(seqs, self._probes, lambda data, key: self.keep_probe(decode_probe(data, key)))

    def _cached(
        self, seqs: Sequence[int], cache: Mapping[int, T], decode: Callable[[bytes, str], T]
    ) -> list[T | None]:
        """The values of `seqs` in `cache`, the others decoded from the records the store holds
        (one multi-get; None: gone)."""
        found = [cache.get(seq) for seq in seqs]
        missing = [seq for seq, value in zip(seqs, found, strict=True) if value is None]
        if not missing:
            return found
        stored = zip(missing, self.kv.records([seq_key(seq) for seq in missing]), strict=True)
        loaded = {seq: decode(data, str(seq)) for seq, data in stored if data is not None}
        return [value or loaded.get(seq) for seq, value in zip(seqs, found, strict=True)]

    def remember(self, article: IndexedArticle) -> IndexedArticle:
        """An article version as its record gives it back, into the record cache."""
        self._recent[article.seq] = article
        self._recent.move_to_end(article.seq)
        if len(self._recent) > self.record_cache:
            self._recent.popitem(last=False)
        return article

    def keep_probe(self, probe: Probe) -> Probe:
        self._probes[probe.seq] = probe
        if len(self._probes) > self.probe_cache:
            self._probes.popitem(last=False)
        return probe

    def put(self, batch: Batch, article: IndexedArticle, record: bytes | None) -> None:
        """The id's current version is `article`; `record`: its record, when not stored yet."""
        seq = seq_key(article.seq)
        batch.put(self.key(article.article_id), seq)
        if record is not None:
            batch.records[seq] = record

    def remove(self, batch: Batch, article: IndexedArticle, *, keep_id: bool) -> None:
        """The version's record goes, and its id unless it gets a new version in the batch."""
        if not keep_id:
            batch.delete(self.key(article.article_id))
        batch.records[seq_key(article.seq)] = None

    def scan(self) -> Iterator[IndexedArticle]:
        """Every article version held, in arrival order, read lazily."""
        return (decode_record(record, str(SEQ.unpack(key)[0])) for key, record in self.kv.scan_records())

    def written(self, batch: Batch) -> None:
        for key, record in batch.records.items():
            if record is None:
                seq = SEQ.unpack(key)[0]
                self._recent.pop(seq, None)
                self._probes.pop(seq, None)


class Contents:
    """``c<content hash>`` → seq of the article that stands for the content (its holder, in the
    buckets); ``x<content hash><seq>``: its exact copies, out of the buckets, kept so that the next
    one takes over when the holder goes.

    Caches the holder its last lookup read: deciding an article asks for its content's holder, and
    indexing it asks again."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._looked_up: tuple[bytes, bytes | None] = (b"", None)

    def holder(self, content_hash: bytes, batch: Batch | None = None) -> bytes | None:
        """The holder's seq (8 bytes), as the batch leaves it; None: the content is not held."""
        key = CONTENT + content_hash
        if batch is not None and key in batch.main:
            return batch.main[key]
        last_hash, last_seq = self._looked_up
        if content_hash != last_hash:
            (last_seq,) = self.kv.get_many([key])
            self._looked_up = (content_hash, last_seq)
        return last_seq

    def add(self, batch: Batch, content_hash: bytes, seq: bytes, *, exact: bool) -> bool:
        """The article of `seq` holds the content, or is an exact copy beside its holder; True
        when it stands for the content (and belongs in the buckets)."""
        holder = self.holder(content_hash, batch)
        if exact and holder is not None:
            batch.put(COPY + content_hash + seq, b"")
            return False
        # Not an exact copy, yet its content is held: the holder had expired when it was decided.
        # The newer one stands for the content from now on.
        if holder is not None:
            batch.put(COPY + content_hash + holder, b"")
        batch.put(CONTENT + content_hash, seq)
        return True

    def remove(self, batch: Batch, content_hash: bytes, seq: bytes) -> bytes | None:
        """The article of `seq` goes; returns the seq of the copy that takes over as holder (it
        joins the buckets in the holder's place), None when none does."""
        if self.holder(content_hash, batch) != seq:
            batch.delete(COPY + content_hash + seq)
            return None
        heir = first_key(self.kv, batch, COPY + content_hash, seq)
        if heir is None:
            batch.delete(CONTENT + content_hash)
            return None
        batch.put(CONTENT + content_hash, heir[-SEQ.size :])
        batch.delete(heir)
        return heir[-SEQ.size :]

    def written(self, batch: Batch) -> None:
        self._looked_up = (b"", None)


class Clusters:
    """``k<cluster seq><seq>``: the members of a cluster but its first article (implied by the
    cluster seq), in arrival order; ``h<cluster seq>`` → seq and id of the cluster's earliest
    surviving member, once its first is gone. `counts.clusters` counts them."""

    def __init__(self, kv: KeyValue, counts: Counts) -> None:
        self.kv, self.counts = kv, counts

    def head_of(self, cluster: int) -> str | None:
        """The id of the member the cluster was handed on to; None while its first is held."""
        (head,) = self.kv.get_many([HEAD + seq_key(cluster)])
        return None if head is None else head[SEQ.size :].decode()

    def add(self, batch: Batch, seq: int, cluster: int) -> None:
        if cluster == seq:
            self.counts.clusters += 1
        else:
            batch.put(MEMBER + seq_key(cluster) + seq_key(seq), b"")

    def leave(self, batch: Batch, seq: int, cluster: int, head_entry: Callable[[bytes], bytes]) -> None:
        """Out of its cluster; when it was the cluster's head (its first article, or the one the
        cluster was handed on to), the earliest surviving member becomes the head. `head_entry`:
        what a head key holds for a member's seq (its seq and id)."""
        cluster_key = seq_key(cluster)
        if cluster != seq:
            batch.delete(MEMBER + cluster_key + seq_key(seq))
        head_key = HEAD + cluster_key
        head = batch.main[head_key] if head_key in batch.main else self.kv.get_many([head_key])[0]
        head_seq = cluster if head is None else SEQ.unpack_from(head)[0]
        if head_seq != seq:
            return
        # the first article has no member key: it is never the successor, being the earliest
        successor = first_key(self.kv, batch, MEMBER + cluster_key, seq_key(seq))
        if successor is None:
            batch.delete(head_key)
            self.counts.clusters -= 1
        else:
            batch.put(head_key, head_entry(successor[-SEQ.size :]))

    def earliest_members(self) -> Iterator[tuple[bytes, bytes]]:
        """Each cluster with members (its seq, 8 bytes) and its earliest member's seq."""
        members = (key for key, _ in self.kv.scan(MEMBER))
        for cluster, keys in itertools.groupby(members, key=lambda key: key[1 : 1 + SEQ.size]):
            yield cluster, next(keys)[-SEQ.size :]

    def hand_on(self, batch: Batch, cluster: bytes, entry: bytes) -> None:
        """A cluster whose first article is gone, handed on to the member of `entry`."""
        self.counts.clusters += 1
        batch.put(HEAD + cluster, entry)


class TimeOrder:
    """``t<time><seq>``: the arrivals by event time, so that expiry walks them from the oldest.

    Caches the oldest key (every batch of the worker reports it), moved by the keys a written
    batch adds before it, read again once it is removed: a scan under held writes sorts them."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._oldest: bytes | object | None = _UNREAD  # None: no arrival held

    def add(self, batch: Batch, time_ms: int, seq: int) -> None:
        key = time_key(time_ms, seq)
        batch.put(key, b"")
        batch.times_written.append(key)

    def remove(self, batch: Batch, time_ms: int, seq: int) -> None:
        key = time_key(time_ms, seq)
        batch.delete(key)
        batch.times_written.append(key)

    def before(self, cutoff_ms: int, limit: int) -> list[int]:
        """The seqs of the arrivals before `cutoff_ms`, the oldest first, at most `limit`."""
        due = keys_before(self.kv, TIME, time_key(cutoff_ms, 0), limit)
        return [SEQ.unpack_from(key, 1 + SEQ.size)[0] for key in due]

    def oldest_ms(self) -> int | None:
        if self._oldest is _UNREAD:
            self._oldest = next((key for key, _ in self.kv.scan(TIME)), None)
        oldest = cast(bytes | None, self._oldest)
        return None if oldest is None else SEQ.unpack_from(oldest, 1)[0] - _TIME_BIAS

    def written(self, batch: Batch) -> None:
        for key in batch.times_written:
            if batch.main.get(key) is None:  # removed
                if key == self._oldest:
                    self._oldest = _UNREAD
            elif self._oldest is None or (isinstance(self._oldest, bytes) and key < self._oldest):
                self._oldest = key


class Markers:
    """``d<id>`` → a deleted id's marker (encode_marker: its last version and the deletion's time),
    so that a re-added id continues its versions; ``e<time><id>``: the markers by deletion time,
    so that expiry removes them incrementally.

    Caches the marker last seen of one id: the article lookup reads it beside the id map (one
    multi-get), and deciding the article asks for it next."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._seen: tuple[str | None, bytes | None] = (None, None)

    @staticmethod
    def key(article_id: str) -> bytes:
        return MARKER + article_id.encode()

    def seen(self, article_id: str, stored: bytes | None) -> None:
        """The id's marker as read with the id map's entry (None: it has none)."""
        self._seen = (article_id, stored)

    def stored(self, article_id: str) -> bytes | None:
        """The id's marker as stored, None when it has none."""
        seen_id, stored = self._seen
        if seen_id != article_id:
            (stored,) = self.kv.get_many([self.key(article_id)])
        return stored

    def marker(self, article_id: str) -> Marker | None:
        stored = self.stored(article_id)
        return None if stored is None else decode_marker(stored, article_id)

    def put(self, batch: Batch, article_id: str, stored: bytes) -> None:
        batch.put(self.key(article_id), stored)
        batch.put(marker_time_key(decode_marker(stored, article_id).time_ms, article_id), b"")

    def drop(self, batch: Batch, article_id: str) -> None:
        """The id is held again: its marker goes, with its place in the time index."""
        marker = self.marker(article_id)
        if marker is not None:
            batch.delete(self.key(article_id))
            batch.delete(marker_time_key(marker.time_ms, article_id))

    def expire(self, batch: Batch, cutoff_ms: int, limit: int) -> list[str]:
        """The markers whose time is before `cutoff_ms` out, the oldest first, at most `limit`;
        returns their ids."""
        gone: list[str] = []
        for key in keys_before(self.kv, MARKER_TIME, marker_time_key(cutoff_ms, ""), limit):
            article_id = key[1 + SEQ.size :].decode()
            batch.delete(key)
            batch.delete(self.key(article_id))
            gone.append(article_id)
        return gone

    def written(self, batch: Batch) -> None:
        self._seen = (None, None)


class Buckets:
    """``b<band key>`` → the seqs of the bucket's latest members, at most `cap` of them.

    Caches the buckets its last lookup read: indexing the article just decided joins the same
    buckets, so its keys (equal, not necessarily the same list) find them without a second read
    while no bucket was written since."""

    def __init__(self, kv: KeyValue, counts: Counts, cap: int) -> None:
        self.kv, self.counts, self.cap = kv, counts, cap
        self._looked_up: tuple[Sequence[bytes], list[bytes], list[bytes | None]] | None = None

    def lookup(self, keys: Sequence[bytes], count: int) -> list[int]:
        """The distinct seqs of the buckets `keys`, in order of first appearance, at most `count`:
        one multi-get, merged in one compiled pass (_sketch.merge_buckets)."""
        names = [BAND + key for key in keys]
        found = self.kv.get_many(names)
        self._looked_up = (keys, names, found)
        return _sketch.merge_buckets(found, count)

    def _read(self, keys: Sequence[bytes], batch: Batch) -> tuple[list[bytes], list[bytes | None]]:
        """The names of the buckets `keys`, and the buckets as this batch leaves them."""
        last = self._looked_up
        if last is not None and not batch.buckets_written and last[0] == keys:
            return last[1], last[2]
        names = [BAND + key for key in keys]
        return names, as_left(batch.main, names, self.kv.get_many)

    def join(self, batch: Batch, seq: int, keys: Sequence[bytes], *, if_absent: bool = False) -> None:
        """The article joins its buckets; each keeps its latest `cap` members. `if_absent`: not
        where it is a member already (an earlier holder of a content taking over again)."""
        names, stored = self._read(keys, batch)
        if if_absent:
            kept = [i for i, found in enumerate(stored) if seq not in _members(found)]
            names, stored = [names[i] for i in kept], [stored[i] for i in kept]
        sizes = cast(list[int], self.counts.bucket_sizes)
        self.counts.buckets += _sketch.join_buckets(
            names, stored, seq_key(seq), self.cap * SEQ.size, batch.main, sizes
        )
        batch.buckets_written = True

    def leave(self, batch: Batch, seq: int, keys: Sequence[bytes]) -> None:
        """The article leaves its buckets, each counted by its new size (in one compiled pass,
        _sketch.leave_entries)."""
        names, stored = self._read(keys, batch)
        sizes = self.counts.bucket_sizes
        emptied, _, changed = _sketch.leave_entries(names, stored, seq_key(seq), False, 0, batch.main, sizes)
        self.counts.buckets -= emptied
        batch.buckets_written = batch.buckets_written or bool(changed)

    def written(self, batch: Batch) -> None:
        if batch.buckets_written:
            self._looked_up = None


class Postings:
    """``n<anchor>`` → the seqs of the articles holding the anchor, in the order they joined, at
    most `cap`, each in POSTING_ENTRY bytes; a full list (boilerplate) proposes nobody.

    Caches the lists as the store holds them (None: absent), as last read or written, at most
    `cache_size`: a news text's anchors recur in later texts (quotes, boilerplate, rewrites), and a
    list held here spares a read of the store; emptied when it would grow past its size (cheaper
    than ordering it). A `cache_size` of 0 caches nothing: where the store holds the lists in
    memory (state/held.py), its own lookup costs less than keeping a copy true. Also the keys of
    the last text asked for and the lists its lookup read, found again by the text's packed
    anchors: deciding an article and indexing it both ask."""

    def __init__(self, kv: KeyValue, counts: Counts, cap: int, cache_size: int) -> None:
        self.kv, self.counts, self.cap, self.cache_size = kv, counts, cap, cache_size
        self._cache: dict[bytes, bytes | None] = {}
        self._names: tuple[bytes, list[bytes]] = (b"", [])
        self._looked_up: tuple[bytes, list[bytes | None]] | None = None

    def names(self, anchors: Anchors) -> list[bytes]:
        """The posting list keys of a text's distinct anchors, in the order of their first place."""
        packed, names = self._names
        if anchors.packed == packed:
            return names
        names = _sketch.posting_keys(anchors.packed, POSTING)
        self._names = (anchors.packed, names)
        return names

    def lookup(self, anchors: Anchors, newest: int, top: int) -> list[tuple[int, int]]:
        """The articles sharing anchors with `anchors` (two, or all of the fewer either side has),
        as (seq, anchors shared), the most shared first (then the earliest), at most `top`; `newest`:
        the latest seq held. One multi-get of the lists not cached; the full ones left out."""
        names = self.names(anchors)
        if not names:
            return []
        found = self.stored(names)
        self._looked_up = (anchors.packed, found)
        args = (found, POSTING_ENTRY, self.cap * POSTING_ENTRY, min(2, len(names)), top)
        ranked = _sketch.count_postings(*args)
        return [(newest - ((newest - low) & POSTING_SEQS), count) for low, count in ranked]

    def _read(self, anchors: Anchors, names: list[bytes], batch: Batch) -> list[bytes | None]:
        """The posting lists `names` (of `anchors`) as this batch leaves them."""
        last = self._looked_up
        if not batch.postings_written:
            if last is not None and last[0] == anchors.packed:
                return last[1]
            return self.stored(names)
        return as_left(batch.main, names, self.stored)

    def stored(self, names: list[bytes]) -> list[bytes | None]:
        """The stored posting lists `names`: the cache's, the others in one multi-get (then cached).
        The compiled run of new articles reads them here too (IndexState.add_fresh)."""
        if not self.cache_size:
            return self.kv.get_many(names)
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
        created, filled = _sketch.join_postings(names, stored, entry, self.cap * POSTING_ENTRY, batch.main)
        self.counts.postings += created
        self.counts.boilerplate += filled
        batch.postings_written.append(names)

    def leave(self, batch: Batch, seq: int, anchors: Anchors) -> None:
        """The article leaves the posting lists of its anchors (its entry found by the seq's low
        bits, whatever its flag), in one compiled pass (_sketch.leave_entries); a full list it
        leaves is no longer boilerplate."""
        names = self.names(anchors)
        entry = (seq & POSTING_SEQS).to_bytes(POSTING_ENTRY, "big")
        stored = self._read(anchors, names, batch)
        limit = self.cap * POSTING_ENTRY
        emptied, unfilled, changed = _sketch.leave_entries(
            names, stored, entry, True, limit, batch.main, None
        )
        self.counts.postings -= emptied
        self.counts.boilerplate -= unfilled
        if changed:
            batch.postings_written.append(changed)

    def written(self, batch: Batch) -> None:
        """The lists the batch wrote, into the cache; the last lookup's no longer stands."""
        self._looked_up = None
        if not self.cache_size:
            return
        cache, main = self._cache, batch.main
        for names in batch.postings_written:
            cache.update({name: main[name] for name in names if name in main})
        if len(cache) > self.cache_size:
            cache.clear()


def _members(stored: bytes | None) -> list[int]:
    """The seqs a stored bucket holds, in the order they joined it."""
    return np.frombuffer(stored, dtype=_SEQ_DTYPE).tolist() if stored else []
