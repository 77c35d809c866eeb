"""RocksDB state through rocksdict: articles, band buckets, content map and header in one database.

Key layout: the records, ~2 KB each, in their own column family ("records": arrival number (seq) →
the record of that article version), so that the small keys the decision looks up many times per
article live in a small LSM tree of their own. Beside them, "probes" (seq → what scoring a candidate
reads: distinct shingles, id, canonical id, verifier; ~0.6 KB and no JSON), so that verifying tens of
candidates per article reads no whole records (a news stream's clusters reach back past any cache).
In the default column family, one-byte prefixes:
``a<id>`` → the seq of its current version, ``b<band key>`` → the seqs of the articles in the bucket,
``c<content hash>`` → first article id, ``m<name>`` → metadata (header, sequence, consumed offsets).
Seqs are 8 bytes big-endian: records sort in arrival order, and a bucket grows by appending 8 bytes
(ids as an orjson list cost ~2x the bytes and a decode per lookup). Every update is one WriteBatch
over all three families, so a crash leaves either all of it or none.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import orjson
from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from ..core import compiled
from ..core.dedup import IndexedArticle, IndexUpdate, Prospect
from ..core.lsh import band_keys
from ..core.params import check_header
from ..core.signing import Fingerprint
from .port import content_heir
from .records import CorruptRecord, decode_article, encode_article

_ARTICLE, _BAND, _CONTENT, _META = b"a", b"b", b"c", b"m"
_RECORDS = "records"  # the column family of the records, by arrival number
_PROBES = "probes"  # the column family of the candidates' probes, by arrival number
_PROBE_HEAD = struct.Struct(">III")  # distinct shingles, id bytes, canonical id bytes
_SEQ_KEY = struct.Struct(">Q")
_SEQ_DTYPE = np.dtype(">u8")
_HEADER, _SEQ = _META + b"header", _META + b"seq"
LOAD_CHUNK = 5_000  # records per pass of bulk_load (~20 MB of records and their buckets)
# Bucket entries up to which candidates() merges them with a dict rather than numpy: a typical
# article's buckets hold tens of entries, where dict.fromkeys took 2-4 µs and np.unique with its
# argsort 7-9; numpy wins from ~500 entries (a large cluster's).
SMALL_MERGE = 256
T = TypeVar("T")


@dataclass(frozen=True)
class RocksOptions:
    """The RocksDB knobs worth exposing; the rest keep rocksdict's defaults."""

    # Memtable of the small keys (buckets, ids, contents), looked up and rewritten ~30 times per
    # article: RocksDB's skiplist insert costs grow with its size (cache misses), ~2 us per key at
    # 32 MB against ~0.7 at 8 MB on the development machine.
    write_buffer_mb: int = 8
    # Memtable of the records (~2 KB each, appended in key order): inserts stay cheap at any size.
    records_write_buffer_mb: int = 32
    compression: str = "lz4"
    block_cache_mb: int = 64
    # Most band lookups of a new article find nothing: a bloom filter answers those without I/O.
    bloom_bits_per_key: int = 10
    # ...and most of them would otherwise search the memtable's skiplist key by key: a memtable
    # bloom filter took the 25-key multi-get of a new article from ~66 to ~24 µs at 25,000 indexed
    # articles (a one-off timing of RocksState.buckets, not one of tests/benchmarks).
    memtable_bloom_ratio: float = 0.1
    # Niceness added to this process's RocksDB flush and compaction threads (Linux; 0: unchanged).
    # On a busy machine a flush or compaction otherwise takes the core of the thread that decides:
    # at 500 articles/s after 50,000, verdicts waited 0.1-0.4 s whenever one ran.
    background_nice: int = 0
    # Off only for state that is rebuilt from elsewhere after a crash (the stream's derived index).
    write_ahead_log: bool = True
    # Decoded article records kept in memory, read again for exact copies, re-deliveries and
    # replays; a miss costs a read and a decode (~25 µs). Candidates are read as probes (below).
    record_cache: int = 20_000
    # Candidates' probes kept in memory (~0.8 KB each with their objects), the latest stored or read
    # back: a multi-get of tens of them from RocksDB costs more than scoring them.
    probe_cache: int = 100_000

    def block_cache(self) -> Cache:
        return Cache(self.block_cache_mb * 1024 * 1024)

    def build(self, cache: Cache | None = None, *, records: bool = False) -> Options:
        """Options of the default column family, or of the records family; `cache`: a block cache
        to share between them."""
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        table = BlockBasedOptions()
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_block_cache(cache or self.block_cache())
        # Index and filter blocks stay with their table files (RocksDB's default, ~1.3 bytes per key),
        # not in the block cache: there, every lookup in a compacted file fetched its whole filter
        # block from the cache again, and a multi-get of 25 band keys took ~100 µs instead of 5-22.
        options.set_block_based_table_factory(table)
        memtable_mb = self.records_write_buffer_mb if records else self.write_buffer_mb
        options.set_write_buffer_size(memtable_mb * 1024 * 1024)
        if self.memtable_bloom_ratio:
            options.set_memtable_prefix_bloom_ratio(self.memtable_bloom_ratio)
            options.set_memtable_whole_key_filtering(True)
        # Records are mostly hash values, which do not compress (lz4 left 20,000 of them at 67.8 MB
        # of 67.9): their flushes and compactions skip the compressor.
        compress = self.compression == "lz4" and not records
        options.set_compression_type(DBCompressionType.lz4() if compress else DBCompressionType.none())
        return options


def runs_of(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive runs of at most `size` items, read lazily (itertools.batched from Python 3.12)."""
    run: list[T] = []
    for item in items:
        run.append(item)
        if len(run) >= size:
            yield run
            run = []
    if run:
        yield run


def lower_background_threads(nice: int) -> int:
    """Make this process's RocksDB background threads (named rocksdb:low and rocksdb:high, shared by
    every database it opens) `nice` nicer than the calling thread, at most 19. Idempotent; Linux
    only (elsewhere nothing changes). Returns the number of threads at that niceness."""
    tasks = Path("/proc/self/task")
    if not hasattr(os, "setpriority") or not tasks.is_dir():
        return 0
    target = min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + nice)
    lowered = 0
    for task in tasks.iterdir():
        try:
            if not (task / "comm").read_text().startswith("rocksdb:"):
                continue
            thread_id = int(task.name)
            if os.getpriority(os.PRIO_PROCESS, thread_id) < target:
                os.setpriority(os.PRIO_PROCESS, thread_id, target)
            lowered += 1
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
    return lowered


class StateError(Exception):
    """The state directory cannot be used (locked by another process, unreadable, ...)."""


class RocksState:
    """StateStore on disk. One writer at a time: RocksDB's lock file enforces it."""

    def __init__(self, path: str | Path, options: RocksOptions = RocksOptions()) -> None:
        self.path = Path(path)
        self._options = options
        self._open()

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            cache = self._options.block_cache()  # one block cache for both column families
            options = self._options.build(cache)
            records = self._options.build(cache, records=True)
            probes = self._options.build(cache, records=True)  # verifiers do not compress either
            families = {_RECORDS: records, _PROBES: probes}
            self._db = Rdict(str(self.path), options, column_families=families)
            self._records = self._db.get_column_family(_RECORDS)
            self._records_handle = self._db.get_column_family_handle(_RECORDS)
            self._probes = self._db.get_column_family(_PROBES)
            self._probes_handle = self._db.get_column_family_handle(_PROBES)
            if not self._options.write_ahead_log:
                write = WriteOptions()
                write.disable_wal = True  # type: ignore[assignment,method-assign]  # a property; the stubs say method
                self._db.set_write_options(write)
        except Exception as exc:  # rocksdict raises plain Exception for lock and IO errors
            raise StateError(f"cannot open state at {self.path}: {exc}") from exc
        if self._options.background_nice:
            lower_background_threads(self._options.background_nice)
        seq = self._db.get(_SEQ)
        self._seq = int(seq) if seq is not None else 0
        self._recent: OrderedDict[int, IndexedArticle] = OrderedDict()  # by arrival number
        # by arrival number; the first stored or read back is the first out (see _prospects)
        self._probe_cache: OrderedDict[int, StoredProbe] = OrderedDict()
        # the buckets of the last multi-get as stored: decide() reads them, apply() extends them
        self._looked_up: _LookedUp | None = None
        self._content_looked_up: tuple[bytes, bytes | None] = (b"", None)  # the last content lookup

    def clear(self) -> None:
        """Drop everything (header included): the derived index is about to be rebuilt."""
        self.close()
        Rdict.destroy(str(self.path), self._options.build())
        self._open()

    def bulk_load(
        self, records: Iterable[tuple[str, bytes]], bands: int, rows: int, chunk: int = LOAD_CHUNK
    ) -> int:
        """Index many stored records (article id, record bytes) at once, in memory bounded by
        `chunk` records whatever their number: a rebuild after a crash must fit beside the worker.

        Records may come in any order (a table yields them by key). Pass one stores them under
        their arrival numbers; pass two reads them back in that order (the keys sort by it),
        `chunk` at a time, and appends them to their buckets and the content map, which thus end
        as incremental apply() would have left them. Into an empty state only."""
        if next(self._record_items(), None) is not None:
            raise ValueError(f"bulk_load needs an empty state; {self.path} holds articles (clear() it)")
        self._looked_up, self._content_looked_up = None, (b"", None)
        count = 0
        for run in runs_of(records, chunk):
            batch = WriteBatch(raw_mode=True)
            for article_id, record in run:
                arrival = decode_article(record, article_id).seq
                seq = _SEQ_KEY.pack(arrival)
                batch.put(_ARTICLE + article_id.encode(), seq)
                batch.put(seq, record, self._records_handle)
                self._seq = max(self._seq, arrival + 1)
            self._db.write(batch)
            count += len(run)
        for stored in runs_of(self._record_items(), chunk):
            self._index_stored(stored, bands, rows)
        self._db.put(_SEQ, str(self._seq).encode())
        return count

    def _index_stored(self, stored: list[tuple[bytes, bytes]], bands: int, rows: int) -> None:
        """Add stored records ((arrival number, record), in arrival order, after every article
        indexed so far) to their buckets and to the content map."""
        buckets: dict[bytes, list[bytes]] = {}
        content: dict[bytes, str] = {}
        probes: list[tuple[bytes, bytes]] = []
        for seq, record in stored:
            article = decode_article(record)
            for key in band_keys(article.fingerprint.signature, bands, rows):
                buckets.setdefault(key, []).append(seq)
            content.setdefault(article.fingerprint.content_hash, article.article_id)
            probes.append((seq, StoredProbe.of(article, self).encode()))
        bucket_keys, digests = list(buckets), list(content)
        earlier = cast(list[bytes | None], self._db.get([_BAND + key for key in bucket_keys]))
        first = cast(list[bytes | None], self._db.get([_CONTENT + digest for digest in digests]))
        batch = WriteBatch(raw_mode=True)
        for key, before in zip(bucket_keys, earlier, strict=True):
            batch.put(_BAND + key, (before or b"") + b"".join(buckets[key]))
        for digest, holder in zip(digests, first, strict=True):
            if holder is None:
                batch.put(_CONTENT + digest, content[digest].encode())
        for seq, probe in probes:
            batch.put(seq, probe, self._probes_handle)
        self._db.write(batch)

    def open_header(self, expected: dict[str, Any]) -> None:
        stored = self._db.get(_HEADER)
        if stored is None:
            self._db.put(_HEADER, orjson.dumps(expected))
        else:
            check_header(orjson.loads(stored), expected, str(self.path))

    def get(self, article_id: str) -> IndexedArticle | None:
        seq = self._db.get(_ARTICLE + article_id.encode())
        if seq is None:
            return None
        found = self._arrived(_SEQ_KEY.unpack(seq)[0])
        if found is None:
            raise CorruptRecord(f"state record of {article_id!r} is missing")
        return found

    def _arrived(self, seq: int) -> IndexedArticle | None:
        """The article version with this arrival number (None: replaced since)."""
        return self._arrivals([seq])[0]

    def _arrivals(self, seqs: Sequence[int]) -> list[IndexedArticle | None]:
        """The article versions with these arrival numbers, from the cache or one multi-get."""
        found, missing = _from_cache(self._recent, seqs)
        if missing:
            stored = cast(list[bytes | None], self._records.get([_SEQ_KEY.pack(seq) for seq in missing]))
            loaded = {
                seq: self._remember(decode_article(data))
                for seq, data in zip(missing, stored, strict=True)
                if data is not None
            }
            found = [article or loaded.get(seq) for seq, article in zip(seqs, found, strict=True)]
        return found

    def _remember(self, article: IndexedArticle) -> IndexedArticle:
        """Keep recently read or written records decoded: clusters are matched again and again."""
        self._recent[article.seq] = article
        self._recent.move_to_end(article.seq)
        if len(self._recent) > self._options.record_cache:
            self._recent.popitem(last=False)
        return article

    def id_for_content(self, content_hash: bytes) -> str | None:
        data = self._content_id(content_hash)
        return None if data is None else data.decode()

    def _content_id(self, content_hash: bytes) -> bytes | None:
        """The stored first id of a content; decide() asks for the content apply() then writes."""
        last_hash, last_id = self._content_looked_up
        if content_hash != last_hash:
            last_id = self._db.get(_CONTENT + content_hash)
            self._content_looked_up = (content_hash, last_id)
        return last_id

    def band_members(self, key: bytes) -> Sequence[str]:
        return [a.article_id for a in self._arrivals(_members(self._db.get(_BAND + key))) if a is not None]

    def candidates(self, keys: Sequence[bytes], exclude: str, limit: int) -> list[Prospect]:
        """The articles in the buckets `keys`, but `exclude`, in order of first appearance, at most
        `limit`, as probes: one multi-get; the bucket contents merged by the compiled loop, else by
        merge_buckets."""
        buckets = [_BAND + key for key in keys]
        found = cast(list[bytes | None], self._db.get(cast(list[Any], buckets)))
        self._looked_up = _LookedUp(keys, buckets, found)
        loops = compiled.loops()
        # one more than the limit: one of them may be the excluded article
        in_order = (loops.merge_buckets if loops else merge_buckets)(found, limit + 1)
        if not in_order:
            return []
        prospects = [p for p in self._prospects(in_order) if p is not None and p.article_id != exclude]
        return prospects[:limit]

    def _prospects(self, seqs: Sequence[int]) -> list[Prospect | None]:
        """The probes of these arrival numbers, from the cache or one multi-get (None: replaced
        since). An article indexed before probes were stored is read whole: it is its own probe."""
        # The cache is not reordered by hits: it drops what was stored or read back longest ago. A
        # news cluster's candidates are recent arrivals anyway, and moving each hit to the end cost
        # ~6% of the decider's time (tests/benchmarks/RESULTS.md).
        cache = self._probe_cache
        found: list[Prospect | None] = [cache.get(seq) for seq in seqs]
        missing = [seq for seq, probe in zip(seqs, found, strict=True) if probe is None]
        if not missing:
            return found
        stored = cast(list[bytes | None], self._probes.get([_SEQ_KEY.pack(seq) for seq in missing]))
        loaded: dict[int, Prospect | None] = {}
        unprobed: list[int] = []
        for seq, data in zip(missing, stored, strict=True):
            if data is None:
                unprobed.append(seq)
            else:
                loaded[seq] = self._keep_probe(StoredProbe.decode(seq, data, self))
        loaded.update(zip(unprobed, self._arrivals(unprobed), strict=True))
        return [probe or loaded.get(seq) for seq, probe in zip(seqs, found, strict=True)]

    def _keep_probe(self, probe: StoredProbe) -> StoredProbe:
        self._probe_cache[probe.seq] = probe
        if len(self._probe_cache) > self._options.probe_cache:
            self._probe_cache.popitem(last=False)
        return probe

    def fingerprint_of(self, seq: int) -> Fingerprint:
        """The fingerprint of the article version with this arrival number, from its record."""
        article = self._arrived(seq)
        if article is None:
            raise CorruptRecord(f"state record of arrival {seq} is missing")
        return article.fingerprint

    def _look_up(self, keys: Sequence[bytes]) -> dict[bytes, bytes | None]:
        """The stored buckets of `keys`, from the last lookup where it covers them (apply() without
        decide() before it, or a new version's old buckets, read here)."""
        last = self._looked_up
        known = {} if last is None else dict(zip(last.keys, last.found, strict=True))
        missing = [key for key in dict.fromkeys(keys) if key not in known]
        if missing:
            found = cast(list[bytes | None], self._db.get([_BAND + key for key in missing]))
            known.update(zip(missing, found, strict=True))
        return {key: known[key] for key in keys}

    def next_seq(self) -> int:
        return self._seq

    def apply(
        self, update: IndexUpdate, extra: dict[bytes, bytes] | None = None, record: bytes | None = None
    ) -> None:
        """`record`: encode_article(update.article), when the caller has encoded it already."""
        article = update.article
        seq = _SEQ_KEY.pack(article.seq)
        batch = WriteBatch(raw_mode=True)
        if update.replaced is None:
            self._join_buckets(batch, seq, update.keys)
        else:
            self._move_between_buckets(batch, update, update.replaced)
            batch.delete(_SEQ_KEY.pack(update.replaced.seq), self._records_handle)
            batch.delete(_SEQ_KEY.pack(update.replaced.seq), self._probes_handle)
            self._probe_cache.pop(update.replaced.seq, None)
        self._looked_up = None
        content_hash = article.fingerprint.content_hash
        if self._content_id(content_hash) is None:
            batch.put(_CONTENT + content_hash, article.article_id.encode())
        self._content_looked_up = (b"", None)  # the write changes it
        batch.put(_ARTICLE + article.article_id.encode(), seq)
        batch.put(seq, record or encode_article(article), self._records_handle)
        probe = StoredProbe.of(article, self)  # cached below: news clusters want it soon
        batch.put(seq, probe.encode(), self._probes_handle)
        next_seq = max(self._seq, article.seq + 1)
        batch.put(_SEQ, str(next_seq).encode())
        for key, value in (extra or {}).items():
            batch.put(_META + key, value)
        self._db.write(batch)
        self._seq = next_seq
        self._remember(article)
        self._keep_probe(probe)

    def _join_buckets(self, batch: WriteBatch, seq: bytes, keys: Sequence[bytes]) -> None:
        """A new article joins its buckets: its arrival number appended to each stored one (a new
        number is in no bucket yet)."""
        last = self._looked_up
        if last is not None and last.keys is keys:  # as decide() read them just before (the stream)
            for bucket, stored in zip(last.buckets, last.found, strict=True):
                batch.put(bucket, (stored or b"") + seq)
            return
        for key, stored in self._look_up(keys).items():
            batch.put(_BAND + key, (stored or b"") + seq)

    def _move_between_buckets(self, batch: WriteBatch, update: IndexUpdate, old: IndexedArticle) -> None:
        """A new version of an article: out of its old buckets, into its new ones."""
        touched = list(dict.fromkeys((*update.replaced_keys, *update.keys)))
        buckets = {key: _members(stored) for key, stored in self._look_up(touched).items()}
        for key in update.replaced_keys:
            buckets[key] = [seq for seq in buckets[key] if seq != old.seq]
        if self.id_for_content(old.fingerprint.content_hash) == old.article_id:
            # exact copies share every band, so the first bucket holds any heir of the content
            members = buckets[update.replaced_keys[0]] if update.replaced_keys else []
            heir = content_heir(old, self._arrivals(members))
            if heir is None:
                batch.delete(_CONTENT + old.fingerprint.content_hash)
            else:
                batch.put(_CONTENT + old.fingerprint.content_hash, heir.encode())
            self._content_looked_up = (b"", None)
        for key in update.keys:
            if update.article.seq not in buckets[key]:
                buckets[key].append(update.article.seq)
        for key, members in buckets.items():
            if members:
                batch.put(_BAND + key, np.array(members, dtype=_SEQ_DTYPE).tobytes())
            else:
                batch.delete(_BAND + key)

    def _record_items(self) -> Iterator[tuple[bytes, bytes]]:
        """(arrival number as stored, record) of every current article version, in arrival order."""
        scan = ReadOptions()
        # a scan reads every record once: keep the cache for the lookups (the stubs omit the argument)
        scan.fill_cache(False)  # type: ignore[call-arg]
        for key, value in self._records.items(read_opt=scan):
            yield cast(bytes, key), cast(bytes, value)

    def articles(self) -> Iterator[IndexedArticle]:
        """All indexed articles in arrival order, read lazily."""
        return (decode_article(record) for _, record in self._record_items())

    def count(self) -> int:
        return sum(1 for _ in self._record_items())

    def get_meta(self, key: bytes) -> bytes | None:
        return self._db.get(_META + key)

    def set_meta(self, values: dict[bytes, bytes], *, durable: bool = False) -> None:
        """`durable`: on disk when this returns, even without a write-ahead log (flushes)."""
        batch = WriteBatch(raw_mode=True)
        for key, value in values.items():
            batch.put(_META + key, value)
        self._db.write(batch)
        if durable:
            self._db.flush()

    def close(self) -> None:
        self._probe_cache.clear()  # each probe refers to this state
        self._db.close()
        # each keeps the database, and its lock, alive
        del self._records, self._records_handle, self._probes, self._probes_handle


def _from_cache(cache: OrderedDict[int, T], seqs: Sequence[int]) -> tuple[list[T | None], list[int]]:
    """What `cache` holds of `seqs`, in their order (None where it holds nothing; each hit made the
    most recently used), and the seqs it does not hold."""
    found: list[T | None] = []
    missing: list[int] = []
    for seq in seqs:
        entry = cache.get(seq)
        if entry is None:
            missing.append(seq)
        else:
            cache.move_to_end(seq)
        found.append(entry)
    return found, missing


class _LookedUp(NamedTuple):
    """One multi-get of LSH buckets: the band keys, the bucket keys as stored, what was found."""

    keys: Sequence[bytes]
    buckets: list[bytes]
    found: list[bytes | None]


def merge_buckets(found: Sequence[bytes | None], count: int) -> list[int]:
    """The distinct arrival numbers of stored buckets (None: absent), in order of first appearance,
    at most `count`: by dict for the tens of entries of a typical article's buckets, by numpy for a
    large cluster's. The reference of the compiled _sketch.merge_buckets, which takes both places."""
    stored = b"".join(data for data in found if data)
    seqs = np.frombuffer(stored, dtype=_SEQ_DTYPE)
    if seqs.size <= SMALL_MERGE:
        return list(dict.fromkeys(seqs.tolist()))[:count]
    distinct, first = np.unique(seqs, return_index=True)
    return cast(list[int], distinct[np.argsort(first, kind="stable")][:count].tolist())


def _members(stored: bytes | None) -> list[int]:
    """The arrival numbers a stored bucket holds, in the order they joined it."""
    return np.frombuffer(stored, dtype=_SEQ_DTYPE).tolist() if stored else []


@dataclass(slots=True, eq=False)
class StoredProbe:
    """A candidate as the probes family holds it (a Prospect); its fingerprint is read from its
    record only when asked (where verifiers cannot be compared)."""

    article_id: str
    seq: int
    shingle_count: int
    verifier: bytes
    canonical_id: str
    state: RocksState = field(repr=False)

    @classmethod
    def of(cls, article: IndexedArticle, state: RocksState) -> StoredProbe:
        """The probe of an article being indexed (or rebuilt)."""
        fp = article.fingerprint
        verifier = np.ascontiguousarray(fp.verifier, dtype=np.uint8).tobytes()
        return cls(
            article.article_id, article.seq, fp.shingle_count, verifier, article.decision.canonical_id, state
        )

    def encode(self) -> bytes:
        """What scoring the article as a candidate reads, without JSON: distinct shingles, the
        lengths of its id and canonical id, both, then its verifier (one byte a slot)."""
        article_id, canonical = self.article_id.encode(), self.canonical_id.encode()
        head = _PROBE_HEAD.pack(self.shingle_count, len(article_id), len(canonical))
        return head + article_id + canonical + self.verifier

    @classmethod
    def decode(cls, seq: int, data: bytes, state: RocksState) -> StoredProbe:
        """Inverse of encode, for the article with arrival number `seq`."""
        try:
            count, id_bytes, canonical_bytes = _PROBE_HEAD.unpack_from(data)
            start = _PROBE_HEAD.size
            middle = start + id_bytes
            end = middle + canonical_bytes
            article_id, canonical = data[start:middle].decode(), data[middle:end].decode()
        except (struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecord(f"probe of arrival {seq} cannot be decoded: {exc}") from exc
        return cls(article_id, seq, count, data[end:], canonical, state)

    @property
    def fingerprint(self) -> Fingerprint:
        return self.state.fingerprint_of(self.seq)
