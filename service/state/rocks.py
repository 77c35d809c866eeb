"""RocksDB state through rocksdict: articles, band buckets, content map and header in one database.

Key layout (one keyspace, one-byte prefixes): ``a<id>`` → article record, ``b<band key>`` → orjson
list of article ids, ``c<content hash>`` → first article id, ``m<name>`` → metadata (header, sequence,
consumed offsets). Every update is one WriteBatch, so a crash leaves either all of it or none.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson
from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from ..core.dedup import IndexedArticle, IndexUpdate
from ..core.lsh import band_keys
from ..core.params import check_header
from .port import content_heir
from .records import decode_article, encode_article

_ARTICLE, _BAND, _CONTENT, _META = b"a", b"b", b"c", b"m"
_HEADER, _SEQ = _META + b"header", _META + b"seq"
LOAD_CHUNK = 5_000  # records per pass of bulk_load (~20 MB of records and their buckets)
T = TypeVar("T")


@dataclass(frozen=True)
class RocksOptions:
    """The RocksDB knobs worth exposing; the rest keep rocksdict's defaults."""

    write_buffer_mb: int = 32
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
    # Decoded article records kept in memory (~3.5 KB each): news clusters are matched again and
    # again, and a miss costs a read and a decode (~25 µs) per candidate.
    record_cache: int = 20_000

    def build(self) -> Options:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_block_cache(Cache(self.block_cache_mb * 1024 * 1024))
        table.set_cache_index_and_filter_blocks(True)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(self.write_buffer_mb * 1024 * 1024)
        if self.memtable_bloom_ratio:
            options.set_memtable_prefix_bloom_ratio(self.memtable_bloom_ratio)
            options.set_memtable_whole_key_filtering(True)
        options.set_compression_type(
            DBCompressionType.lz4() if self.compression == "lz4" else DBCompressionType.none()
        )
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
            self._db = Rdict(str(self.path), self._options.build())
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
        self._recent: OrderedDict[str, IndexedArticle] = OrderedDict()
        # the buckets of the last multi-get, decoded and as stored: decide() reads them and apply()
        # updates the same ones
        self._looked_up: dict[bytes, Sequence[str]] = {}
        self._looked_up_raw: dict[bytes, bytes | None] = {}
        self._content_looked_up: tuple[bytes, bytes | None] = (b"", None)  # the last content lookup

    def clear(self) -> None:
        """Drop everything (header included): the derived index is about to be rebuilt."""
        self._db.close()
        Rdict.destroy(str(self.path), self._options.build())
        self._open()

    def bulk_load(
        self, records: Iterable[tuple[str, bytes]], bands: int, rows: int, chunk: int = LOAD_CHUNK
    ) -> int:
        """Index many stored records (article id, record bytes) at once, in memory bounded by
        `chunk` records whatever their number: a rebuild after a crash must fit beside the worker.

        Records may come in any order (a table yields them by key). Pass one stores them and notes
        each one's arrival (seq); pass two reads them back in arrival order, `chunk` at a time, and
        appends them to their buckets and the content map, which thus end as incremental apply()
        would have left them."""
        self._looked_up, self._looked_up_raw, self._content_looked_up = {}, {}, (b"", None)
        arrivals: list[tuple[int, str]] = []
        for run in runs_of(records, chunk):
            batch = WriteBatch(raw_mode=True)
            for article_id, record in run:
                arrivals.append((decode_article(record, article_id).seq, article_id))
                batch.put(_ARTICLE + article_id.encode(), record)
            self._db.write(batch)
        arrivals.sort()
        for in_order in runs_of(arrivals, chunk):
            self._index_stored([article_id for _, article_id in in_order], bands, rows)
        if arrivals:
            self._seq = max(self._seq, arrivals[-1][0] + 1)
        self._db.put(_SEQ, str(self._seq).encode())
        return len(arrivals)

    def _index_stored(self, article_ids: list[str], bands: int, rows: int) -> None:
        """Add stored articles, given in arrival order after every article indexed so far, to their
        buckets and to the content map."""
        stored = cast(
            list[bytes], self._db.get([_ARTICLE + article_id.encode() for article_id in article_ids])
        )
        buckets: dict[bytes, list[str]] = {}
        content: dict[bytes, str] = {}
        for article_id, record in zip(article_ids, stored, strict=True):
            article = decode_article(record, article_id)
            for key in band_keys(article.fingerprint.signature, bands, rows):
                buckets.setdefault(key, []).append(article_id)
            content.setdefault(article.fingerprint.content_hash, article_id)
        bucket_keys, digests = list(buckets), list(content)
        earlier = cast(list[bytes | None], self._db.get([_BAND + key for key in bucket_keys]))
        first = cast(list[bytes | None], self._db.get([_CONTENT + digest for digest in digests]))
        batch = WriteBatch(raw_mode=True)
        for key, before in zip(bucket_keys, earlier, strict=True):
            members = buckets[key] if before is None else [*orjson.loads(before), *buckets[key]]
            batch.put(_BAND + key, orjson.dumps(members))
        for digest, holder in zip(digests, first, strict=True):
            if holder is None:
                batch.put(_CONTENT + digest, content[digest].encode())
        self._db.write(batch)

    def open_header(self, expected: dict[str, Any]) -> None:
        stored = self._db.get(_HEADER)
        if stored is None:
            self._db.put(_HEADER, orjson.dumps(expected))
        else:
            check_header(orjson.loads(stored), expected, str(self.path))

    def get(self, article_id: str) -> IndexedArticle | None:
        cached = self._recent.get(article_id)
        if cached is not None:
            self._recent.move_to_end(article_id)
            return cached
        data = self._db.get(_ARTICLE + article_id.encode())
        if data is None:
            return None
        article = decode_article(data, article_id)
        self._remember(article)
        return article

    def _remember(self, article: IndexedArticle) -> None:
        """Keep recently read or written records decoded: clusters are matched again and again."""
        self._recent[article.article_id] = article
        self._recent.move_to_end(article.article_id)
        if len(self._recent) > self._options.record_cache:
            self._recent.popitem(last=False)

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
        data = self._db.get(_BAND + key)
        return () if data is None else orjson.loads(data)

    def buckets(self, keys: Sequence[bytes]) -> list[Sequence[str]]:
        """band_members of many keys in one multi-get."""
        found = cast(list[bytes | None], self._db.get([_BAND + key for key in keys]))
        lists = [() if data is None else orjson.loads(data) for data in found]
        self._looked_up = dict(zip(keys, lists, strict=True))
        self._looked_up_raw = dict(zip(keys, found, strict=True))
        return lists

    def _look_up(self, keys: Sequence[bytes]) -> None:
        """Make sure the last lookup covers `keys` (apply() without decide() before it)."""
        missing = [key for key in keys if key not in self._looked_up]
        if missing:
            known, known_raw = self._looked_up, self._looked_up_raw
            self.buckets(missing)
            self._looked_up = {**known, **self._looked_up}
            self._looked_up_raw = {**known_raw, **self._looked_up_raw}

    def next_seq(self) -> int:
        return self._seq

    def apply(
        self, update: IndexUpdate, extra: dict[bytes, bytes] | None = None, record: bytes | None = None
    ) -> None:
        """`record`: encode_article(update.article), when the caller has encoded it already."""
        article = update.article
        batch = WriteBatch(raw_mode=True)
        if update.replaced is None:
            self._join_buckets(batch, article.article_id, update.keys)
        else:
            self._move_between_buckets(batch, update, update.replaced)
        self._looked_up, self._looked_up_raw = {}, {}
        content_hash = article.fingerprint.content_hash
        if self._content_id(content_hash) is None:
            batch.put(_CONTENT + content_hash, article.article_id.encode())
        self._content_looked_up = (b"", None)  # the write changes it
        batch.put(_ARTICLE + article.article_id.encode(), record or encode_article(article))
        seq = max(self._seq, article.seq + 1)
        batch.put(_SEQ, str(seq).encode())
        for key, value in (extra or {}).items():
            batch.put(_META + key, value)
        self._db.write(batch)
        self._seq = seq
        self._remember(article)

    def _join_buckets(self, batch: WriteBatch, article_id: str, keys: Sequence[bytes]) -> None:
        """A new article joins its buckets. Each stored list grows by one id, written by appending
        its JSON to the stored bytes (what orjson.dumps of the longer list gives) rather than by
        decoding and encoding the list again: 25 buckets per article."""
        self._look_up(keys)
        encoded = orjson.dumps(article_id)
        for key in keys:
            members, stored = self._looked_up[key], self._looked_up_raw[key]
            if article_id in members:
                continue
            batch.put(_BAND + key, stored[:-1] + b"," + encoded + b"]" if stored else b"[" + encoded + b"]")

    def _move_between_buckets(self, batch: WriteBatch, update: IndexUpdate, old: IndexedArticle) -> None:
        """A new version of an article: out of its old buckets, into its new ones."""
        article = update.article
        touched = list(dict.fromkeys((*update.replaced_keys, *update.keys)))
        self._look_up(touched)
        buckets = {key: list(self._looked_up[key]) for key in touched}
        for key in update.replaced_keys:
            members = buckets[key]
            if old.article_id in members:
                members.remove(old.article_id)
        if self.id_for_content(old.fingerprint.content_hash) == old.article_id:
            # exact copies share every band, so the first bucket holds any heir of the content
            members = buckets[update.replaced_keys[0]] if update.replaced_keys else []
            heir = content_heir(old, map(self.get, members))
            if heir is None:
                batch.delete(_CONTENT + old.fingerprint.content_hash)
            else:
                batch.put(_CONTENT + old.fingerprint.content_hash, heir.encode())
            self._content_looked_up = (b"", None)
        for key in update.keys:
            members = buckets[key]
            if article.article_id not in members:
                members.append(article.article_id)
        for key, members in buckets.items():
            if members:
                batch.put(_BAND + key, orjson.dumps(members))
            else:
                batch.delete(_BAND + key)

    def _article_items(self) -> Iterator[tuple[bytes, bytes]]:
        """(key, record) of every article, in key order (raw mode: keys and values are bytes)."""
        for key, value in self._db.items(from_key=_ARTICLE):
            raw_key, raw_value = cast(bytes, key), cast(bytes, value)
            if not raw_key.startswith(_ARTICLE):
                return
            yield raw_key, raw_value

    def articles(self) -> Iterator[IndexedArticle]:
        """All indexed articles in arrival order (loads them all: for tools and tests)."""
        found = [decode_article(value, key[1:].decode()) for key, value in self._article_items()]
        return iter(sorted(found, key=lambda a: a.seq))

    def count(self) -> int:
        return sum(1 for _ in self._article_items())

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
        self._db.close()
