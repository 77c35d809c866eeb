"""The LSH index over an ordered key-value store: one implementation, two stores (memory, RocksDB).

Key layout (one-byte prefixes in the main family; seqs, the arrival numbers, are 8 bytes big-endian
so that keys sort in arrival order):

- ``a<id>`` → seq of the article's current version
- ``b<band key>`` → the seqs of the bucket's latest members, at most ``bucket_cap`` of them: a
  bucket never grows past a small fixed size, so adding a member rewrites at most that many bytes
  and a lookup reads at most that many, however large the story's cluster
- ``c<content hash>`` → seq of the article that stands for this content (its holder, in the buckets)
- ``x<content hash><seq>`` → exact copies of a held content: out of the buckets (the holder stands
  for them), kept so that the next one takes over when the holder goes
- ``k<cluster seq><seq>``: the members of a cluster but its first article (implied by the cluster
  seq), in arrival order: most articles are alone in their cluster and write none
- ``h<cluster seq>`` → seq and id of the cluster's earliest surviving member, once its first is gone
- ``t<time><seq>`` → the arrivals by event time: expiry walks them from the oldest
- ``d<id>`` → a deleted id's marker: its last version and the deletion's time (encode_marker), so
  that a re-added id continues its versions; removed when the id is added again
- ``e<time><id>``: the markers by deletion time, so that expiry removes them incrementally too
- ``n<anchor>`` → the seqs of articles holding the anchor (32 bits of a winnowed 24-character
  shingle, core/anchors.py), in the order they joined, at most ``anchor_cap``, each in 5 bytes
  (POSTING_ENTRY: the seq's low 39 bits), its top bit set for an article of fewer than two
  distinct anchors: a posting list that fills its cap is boilerplate (a phrase of many articles),
  proposes no candidate and takes no member until one of its own leaves; a duplicate joins none
  (its match holds the same text)
- ``m<name>`` → metadata (header, next seq, counters, offsets)

and the records, one per article version, in a family of their own keyed by seq (records.py).
Every change is one write batch: a crash leaves all of it or none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any, TypeVar, cast

import orjson

from ..core.anchors import Anchors
from ..core.compiled import _sketch
from ..core.dedup import IndexedArticle, IndexUpdate, Prospect
from ..core.params import IncompatibleState, check_header
from .port import Batch, Counts, IndexStats, KeyValue
from .records import CorruptRecord, decode_probe, decode_record, encode_record
from .tables import (
    BAND,
    POSTING_ENTRY,
    SEQ,
    ArticleVersions,
    Buckets,
    Clusters,
    Contents,
    Marker,
    Markers,
    Postings,
    TimeOrder,
    encode_marker,
    first_key,
    seq_key,
)

META = b"m"
HEADER_KEY, SEQ_KEY, COUNTS_KEY = META + b"header", META + b"seq", META + b"counts"
DEFAULT_BUCKET_CAP = 64
DEFAULT_RECORD_CACHE = 20_000
DEFAULT_PROBE_CACHE = 100_000
DEFAULT_POSTING_CACHE = 50_000
LOAD_CHUNK = 5_000  # records per pass of bulk_load
EXPIRY_PASS = 10_000  # articles an expiry pass removes at most (the next pass goes on)
T = TypeVar("T")
# A row of the compiled run (add_fresh): article id, content hash, band keys, verifier, signature
# (uint64s, or their bytes little-endian), distinct shingles, short, packed anchors, time, cutoff
# (None: none), latency (ms, None). A signed record's first eight fields (pipeline/wire.py).
FreshRow = tuple[str, bytes, tuple[bytes, ...], Any, Any, int, bool, bytes, int, int | None, float | None]
S = TypeVar("S")


class IndexState:
    """The state port (StateStore) over a KeyValue store. One writer at a time."""

    anchor_cap = 32  # entries a posting list holds at most: a full one is boilerplate
    where = "memory"  # the state as messages name it (a RocksDB state: its directory)

    def __init__(
        self,
        kv: KeyValue,
        *,
        bucket_cap: int = DEFAULT_BUCKET_CAP,
        record_cache: int = DEFAULT_RECORD_CACHE,
        probe_cache: int = DEFAULT_PROBE_CACHE,
        posting_cache: int = DEFAULT_POSTING_CACHE,
    ) -> None:
        if bucket_cap < 1:
            raise ValueError(f"bucket_cap must be at least 1, got {bucket_cap}")
        self.kv, self.bucket_cap = kv, bucket_cap
        self._record_cache, self._probe_cache, self._posting_cache = record_cache, probe_cache, posting_cache
        self.reload()

    def reload(self) -> None:
        """Read the counters again from the store and forget what was cached: writes the store
        no longer holds (layers discarded, state/overlay.py) must not be seen."""
        seq, counts = self.kv.get_many([SEQ_KEY, COUNTS_KEY])
        self._seq = int(seq) if seq is not None else 0
        self.counts = Counts.decode(counts)
        if self.counts.bucket_sizes is None:
            self.counts.bucket_sizes = [0]
            for _, members in self.kv.scan(BAND):
                self.counts.resized(0, len(members) // SEQ.size)
        self.versions = ArticleVersions(self.kv, self._record_cache, self._probe_cache)
        self.buckets = Buckets(self.kv, self.counts, self.bucket_cap)
        self.postings = Postings(self.kv, self.counts, self.anchor_cap, self._posting_cache)
        self.contents = Contents(self.kv)
        self.clusters = Clusters(self.kv, self.counts)
        self.times = TimeOrder(self.kv)
        self.markers = Markers(self.kv)

    # -- reading -------------------------------------------------------------------------------

    def open_header(self, expected: dict[str, Any]) -> None:
        """Write the header on empty state; otherwise refuse a state of another format or other
        parameters, saying how to rebuild it."""
        (stored,) = self.kv.get_many([HEADER_KEY])
        if stored is None:
            if next(self.kv.scan_records(), None) is not None:
                raise IncompatibleState(
                    f"{self.where} holds articles but no header: it was not written by neardup"
                )
            self.kv.write(Batch(main={HEADER_KEY: orjson.dumps(expected)}))
            return
        header = orjson.loads(stored)
        if header.get("format") != expected.get("format"):
            raise IncompatibleState(
                f"state at {self.where} has format {header.get('format')!r}; this version reads "
                f"format {expected.get('format')!r} only. Rebuild it: run over the input again with a "
                "new state directory (`neardup dedup --state`, `neardup.open`). A worker needs "
                "nothing done: it rebuilds its index from the changelog by itself"
            )
        check_header(header, expected, self.where)

    def get(self, article_id: str) -> IndexedArticle | None:
        # the marker read beside the id map: deciding the article asks for it next
        seq, marker = self.kv.get_many([ArticleVersions.key(article_id), self.markers.key(article_id)])
        self.markers.seen(article_id, marker)
        if seq is None:
            return None
        found = self.versions.arrivals([SEQ.unpack(seq)[0]])[0]
        if found is None:
            raise CorruptRecord(f"state record of {article_id!r} is missing")
        return found

    def deleted_version(self, article_id: str) -> int | None:
        marker = self.markers.marker(article_id)
        return None if marker is None else marker.version

    def deletion_marker(self, article_id: str) -> bytes | None:
        """The id's deletion marker as stored (encode_marker), None when it has none."""
        return self.markers.stored(article_id)

    def holder_of(self, content_hash: bytes) -> IndexedArticle | None:
        seq = self.contents.holder(content_hash)
        return None if seq is None else self.versions.arrivals([SEQ.unpack(seq)[0]])[0]

    def head_of(self, cluster: int) -> str | None:
        return self.clusters.head_of(cluster)

    def candidates(self, keys: Sequence[bytes], exclude: str, limit: int) -> list[Prospect]:
        """The articles in the buckets `keys`, but `exclude`, in order of first appearance, at most
        `limit`, as probes: one multi-get, merged by the compiled loop where built."""
        # one more than the limit: one of them may be the excluded article
        in_order = self.buckets.lookup(keys, limit + 1)
        prospects = [
            p for p in self.versions.prospects(in_order) if p is not None and p.article_id != exclude
        ]
        return cast(list[Prospect], prospects[:limit])

    def anchor_candidates(self, anchors: Anchors, exclude: str, limit: int) -> list[tuple[Prospect, int]]:
        """The articles sharing anchors with `anchors` (two, or all of the fewer either side has),
        the most shared first (then the earliest), but `exclude`, at most `limit`: one multi-get of
        the posting lists, the full ones (boilerplate) left out."""
        # one more than the limit: one may be the excluded article
        ranked = self.postings.lookup(anchors, self._seq - 1, limit + 1)
        prospects = [
            (p, count)
            for p, (_, count) in zip(self.versions.prospects([seq for seq, _ in ranked]), ranked, strict=True)
            if p is not None and p.article_id != exclude
        ]
        return cast(list[tuple[Prospect, int]], prospects[:limit])

    def next_seq(self) -> int:
        return self._seq

    def articles(self) -> Iterator[IndexedArticle]:
        """All indexed articles in arrival order, read lazily."""
        return self.versions.scan()

    def get_meta(self, key: bytes) -> bytes | None:
        return self.kv.get_many([META + key])[0]

    def set_meta(self, values: dict[bytes, bytes]) -> None:
        self.kv.write(Batch(main={META + key: value for key, value in values.items()}))

    def oldest_ms(self) -> int | None:
        return self.times.oldest_ms()

    def stats(self) -> IndexStats:
        """Counts kept with the index, and its size on disk."""
        return IndexStats(
            articles=self.counts.articles,
            clusters=self.counts.clusters,
            buckets=self.counts.buckets,
            largest_bucket=self.counts.largest_bucket,
            anchor_postings=self.counts.postings,
            boilerplate_anchors=self.counts.boilerplate,
            oldest_ms=self.oldest_ms(),
            newest_ms=self.counts.newest_ms,
            expired=self.counts.expired,
            deleted=self.counts.deleted,
            bytes_on_disk=self.kv.size_bytes(),
            bucket_cap=self.bucket_cap,
            anchor_cap=self.anchor_cap,
        )

    # -- writing -------------------------------------------------------------------------------

    def apply(self, update: IndexUpdate, record: bytes | None = None) -> None:
        """Index one article version (replacing its earlier one), atomically. `record`:
        encode_record(update.article), when the caller has it already."""
        article = update.article
        batch = Batch()
        if update.replaced is not None:
            self._remove(batch, update.replaced, keep_id=True)
        if update.revived:
            self.markers.drop(batch, article.article_id)
        stored = record or encode_record(article)
        self._add(batch, article, stored)
        batch.put(SEQ_KEY, str(self._seq).encode())
        self._write(batch)
        # its probe, which candidates read, not its whole record: an exact copy or re-delivery
        # decodes that once when it comes (ArticleVersions.arrivals)
        self.versions.keep_probe(decode_probe(stored))

    def add_fresh(
        self,
        rows: list[FreshRow],
        decision: tuple[float | int | bool, ...],
        audit: bytes,
        before: Callable[[int], None] | None = None,
        first: int = 0,
    ) -> list[tuple[bytes, bytes, str, bool]]:
        """Decide and index a run of articles in order, as the reference decision
        (tests/support/reference_decide.py) and apply would one at a time, in one compiled call
        (_sketch.decide_fresh: its comment says which articles it takes and what a row holds),
        their writes in one batch; returns (record, verdict, kind, revived) of each it took, the
        first ones of `rows`. `decision`: the rule's figures (dedup.fresh_settings); `audit`: the
        parameters as a verdict gives them; `before(first + n)`: called as row n starts. Raises
        what the call raises, nothing of the run then written (the counts and caches read again
        from the store)."""
        # the run writes buckets into `main` as it goes: no earlier lookup of them stands
        batch = Batch(buckets_written=True)
        settings = (self.bucket_cap * SEQ.size, self.anchor_cap * POSTING_ENTRY, *decision)
        readers = (self.kv.get_many, self.postings.stored, self.versions.prospects, decode_probe)
        removals = (partial(first_key, self.kv, batch), CorruptRecord)
        # the bucket sizes counted in place: a replaced version's removal counts its own
        sizes = self.counts.bucket_sizes
        writes = (
            batch.main,
            batch.records,
            batch.times_written,
            batch.postings_written,
            batch.scanned,
            sizes,
        )
        try:
            context = (*readers, *removals, *writes, before, first, audit, settings)
            results, done, added = _sketch.decide_fresh(rows, self._seq, context)
        except Exception:  # counts moved and probes kept for writes never made
            self.reload()
            raise
        if done:
            counts = self.counts
            buckets, postings, boilerplate, clusters, articles, newest, self._seq = added
            counts.buckets, counts.postings = counts.buckets + buckets, counts.postings + postings
            counts.boilerplate, counts.clusters = counts.boilerplate + boilerplate, counts.clusters + clusters
            counts.articles += articles
            assert newest is not None  # an article was added
            counts.newest_ms = newest if counts.newest_ms is None else max(counts.newest_ms, newest)
            batch.put(SEQ_KEY, str(self._seq).encode())
            self._write(batch)
        return results

    def _add(self, batch: Batch, article: IndexedArticle, record: bytes | None) -> None:
        """Into the content map and the buckets (an exact copy: beside its content's holder),
        its cluster, the time index and the id map, the next seq past it; `record`: its record,
        when not stored yet."""
        seq = seq_key(article.seq)
        if self.contents.add(batch, article.sketch.content_hash, seq, exact=article.decision.exact):
            self.buckets.join(batch, article.seq, article.keys)
        if article.in_postings:
            self.postings.join(batch, article.seq, article.anchors)
        self.clusters.add(batch, article.seq, article.cluster)
        self.times.add(batch, article.time_ms, article.seq)
        self.versions.put(batch, article, record)
        self.counts.articles += 1
        if self.counts.newest_ms is None or article.time_ms > self.counts.newest_ms:
            self.counts.newest_ms = article.time_ms
        self._seq = max(self._seq, article.seq + 1)

    def _write(self, batch: Batch) -> None:
        batch.put(COUNTS_KEY, self.counts.encode())
        self._commit(batch)

    def _commit(self, batch: Batch) -> None:
        """Write the batch, then tell every table what it wrote (where each keeps its cache true)."""
        self.kv.write(batch)
        for table in (self.versions, self.buckets, self.postings, self.contents, self.markers, self.times):
            table.written(batch)

    def _remove(self, batch: Batch, old: IndexedArticle, *, keep_id: bool = False) -> None:
        """Take one article version out of every structure; `keep_id`: its id gets a new version
        in the same batch."""
        self.buckets.leave(batch, old.seq, old.keys)
        if old.in_postings:
            self.postings.leave(batch, old.seq, old.anchors)
        heir = self.contents.remove(batch, old.sketch.content_hash, seq_key(old.seq))
        if heir is not None:  # same keys
            self.buckets.join(batch, SEQ.unpack(heir)[0], old.keys, if_absent=True)
        self.clusters.leave(batch, old.seq, old.cluster, partial(self._head_entry, batch=batch))
        self.times.remove(batch, old.time_ms, old.seq)
        self.versions.remove(batch, old, keep_id=keep_id)
        self.counts.articles -= 1

    def _version_at(self, seq: bytes, batch: Batch) -> IndexedArticle:
        """The article version of arrival `seq`, from `batch`'s records or the store's."""
        record = batch.records.get(seq)
        article = decode_record(record) if record else self.versions.arrivals([SEQ.unpack(seq)[0]])[0]
        if article is None:
            raise CorruptRecord(f"state record of arrival {SEQ.unpack(seq)[0]} is missing")
        return article

    def _head_entry(self, seq: bytes, batch: Batch) -> bytes:
        """What a cluster's head key holds: the head's seq and id (read once here, not per member)."""
        return seq + self._version_at(seq, batch).article_id.encode()

    def delete(self, article_id: str) -> IndexedArticle | None:
        """Delete an article (all of it: its current version), leaving its marker (its last
        version, and the deletion's time: the newest event time held); None when it is not held."""
        old = self.get(article_id)
        if old is None:
            return None
        batch = Batch()
        self._remove(batch, old)
        deleted_ms = max(old.time_ms, self.counts.newest_ms or old.time_ms)
        self.markers.put(batch, article_id, encode_marker(Marker(old.version, deleted_ms)))
        self.counts.deleted += 1
        self._write(batch)
        return old

    def expire(self, cutoff_ms: int, limit: int = EXPIRY_PASS) -> list[IndexedArticle]:
        """Remove the articles whose time is before `cutoff_ms`, the oldest first, at most
        `limit` in one pass; returns them."""
        due = self.times.before(cutoff_ms, limit)
        removed = [article for article in self.versions.arrivals(due) if article is not None]
        for article in removed:
            batch = Batch()
            self._remove(batch, article)
            self.counts.expired += 1
            self._write(batch)
        if len(due) < limit:
            self.counts.expired_before_ms = cutoff_ms
            self._write(Batch())
        return removed

    def expire_markers(self, cutoff_ms: int, limit: int = EXPIRY_PASS) -> list[str]:
        """Remove the deletion markers whose time is before `cutoff_ms`, the oldest first, at most
        `limit` in one pass (the next pass goes on); returns their ids."""
        batch = Batch()
        gone = self.markers.expire(batch, cutoff_ms, limit)
        if gone:
            self._write(batch)
        return gone

    # -- a changelog's records applied one by one (a restore: the records after a known point) --

    def put_record(self, record: bytes) -> bool:
        """Hold the stored article version `record` as apply() left it, in place of the id's
        current version (its deletion marker gone); False when it is held already."""
        article = decode_record(record)
        current = self.get(article.article_id)
        if current is not None and current.seq == article.seq:
            return False
        # revived: a marker the id may have goes, as the record's version replaces it
        self.apply(IndexUpdate(article, current, revived=True), record)
        return True

    def drop_article(self, article_id: str) -> bool:
        """Take the id's current version out of every structure, leaving no marker (a marker
        comes as a record of its own); False when it is not held."""
        current = self.get(article_id)
        if current is None:
            return False
        batch = Batch()
        self._remove(batch, current)
        self._write(batch)
        return True

    def put_marker(self, article_id: str, stored: bytes | None) -> None:
        """Set the id's deletion marker (encode_marker) to `stored`, None removing it; a held id
        keeps none."""
        batch = Batch()
        self.markers.drop(batch, article_id)
        if stored is not None and not self.versions.held([article_id])[0]:
            self.markers.put(batch, article_id, stored)
        self._write(batch)

    def set_removed(self, expired: int, deleted: int) -> None:
        """The removal counts as counted where the records come from."""
        self.counts.expired, self.counts.deleted = expired, deleted
        self._write(Batch())

    def clear(self) -> None:
        """Drop everything (header included): the index is about to be rebuilt."""
        self.kv.clear()
        self.reload()

    def bulk_load(
        self,
        records: Iterable[tuple[str, bytes]],
        chunk: int = LOAD_CHUNK,
        *,
        removed: tuple[int, int] = (0, 0),
        markers: Iterable[tuple[str, bytes]] = (),
    ) -> int:
        """Index many stored records (article id, record) into an empty state, in memory bounded
        by `chunk` records: pass one stores them by seq; pass two reads them back in arrival order
        and adds them to the content map, the buckets and their clusters as apply() would have;
        a last pass hands on each cluster whose first article is gone. `removed`: the articles
        expired and deleted before, as counted where the records come from; `markers`: the deleted
        ids' markers (id, encode_marker), but those of ids held again."""
        if next(self.kv.scan_records(), None) is not None:
            raise ValueError(f"bulk_load needs an empty state; {self.where} holds articles (clear() it)")
        count = 0
        for run in runs_of(records, chunk):
            batch = Batch()
            for _, record in run:
                probe = decode_probe(record)
                batch.records[seq_key(probe.seq)] = record
                self._seq = max(self._seq, probe.seq + 1)
            self.kv.write(batch)
            count += len(run)
        for stored in runs_of(self.kv.scan_records(), chunk):
            # in arrival order, after every one indexed so far: into every structure
            batch = Batch()
            for article in [decode_record(record) for _, record in stored]:
                self._add(batch, article, None)  # its record is stored already
            self._commit(batch)
        # clusters whose first article is gone get their earliest surviving member as head
        batch = Batch()
        for cluster, earliest in self.clusters.earliest_members():
            if self.kv.records([cluster])[0] is None:
                self.clusters.hand_on(batch, cluster, self._head_entry(earliest, batch))
        self._commit(batch)
        # the deletion markers, with their time index, but those of ids held again
        for run in runs_of(markers, chunk):
            held = self.versions.held([article_id for article_id, _ in run])
            batch = Batch()
            for (article_id, marker), is_held in zip(run, held, strict=True):
                if not is_held:
                    self.markers.put(batch, article_id, marker)
            self._commit(batch)
        self.counts.expired, self.counts.deleted = removed
        self.kv.write(Batch(main={SEQ_KEY: str(self._seq).encode(), COUNTS_KEY: self.counts.encode()}))
        return count

    def compact(self) -> None:
        """Reclaim the space of removed and overwritten entries (at close of a run)."""

    def close(self) -> None:
        self.versions = ArticleVersions(self.kv, self._record_cache, self._probe_cache)  # caches freed
        self.kv.close()


def runs_of(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive runs of at most `size` items, read lazily (itertools.batched from Python 3.12)."""
    remaining = iter(items)
    while run := list(islice(remaining, size)):
        yield run


def started_ahead(
    items: Iterable[T], start: Callable[[T], S], last: Callable[[S], bool] = lambda _: False
) -> Iterator[S]:
    """What `start` began for each item, each handed on only once the next item is started, so
    that its work goes on while the caller finishes the one before; no item is started after one
    that `last` says ends them (it is handed on too)."""
    under_way: list[S] = []  # the one started and not handed on yet
    for item in items:
        started = start(item)
        yield from under_way
        under_way = [started]
        if last(started):
            break
    yield from under_way
