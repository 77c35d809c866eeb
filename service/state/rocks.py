"""RocksDB state through rocksdict: the index (index.py) over one database of two column families.

The main family holds the small keys (buckets, ids, contents, clusters, times, metadata) that every
article looks up or writes, in an LSM tree of their own; the records, far larger, sit in a family of
their own keyed by arrival number, so that they are written in key order and do not slow the lookups.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from ..errors import Error
from .held import HOLD_KEY, HeldFamilies
from .index import (
    DEFAULT_BUCKET_CAP,
    DEFAULT_POSTING_CACHE,
    DEFAULT_PROBE_CACHE,
    DEFAULT_RECORD_CACHE,
    IndexState,
)
from .overlay import LayeredKV
from .port import Batch
from .tables import BAND, POSTING

HELD = (BAND, POSTING)  # the families a state created with hold_families holds in memory
_RECORDS = "records"  # the column family of the records, by arrival number


@dataclass(frozen=True)
class RocksOptions:
    """The RocksDB knobs worth exposing; the rest keep rocksdict's defaults."""

    # Memtable of the small keys (buckets, ids, contents), looked up and rewritten tens of times
    # per article: RocksDB's skiplist inserts cost more as it grows (cache misses), so it is kept
    # small.
    write_buffer_mb: int = 8
    # Memtable of the records (large, appended in key order): inserts stay cheap at any size.
    records_write_buffer_mb: int = 32
    compression: str = "lz4"
    # The small keys' last level, where nearly all of them end up (and all after the compaction at
    # close): zstd packs their seqs and shared key prefixes tighter than lz4; it costs CPU in the
    # compactions into that level only, and lookups read blocks from the cache uncompressed.
    bottommost_compression: str = "zstd"
    block_cache_mb: int = 64
    # Most band lookups of a new article find nothing: a bloom filter answers those without I/O.
    bloom_bits_per_key: int = 10
    # ...and most of them would otherwise search the memtable's skiplist key by key: a memtable
    # bloom filter answers those misses too, which matters because every new article asks for
    # all its band keys at once.
    memtable_bloom_ratio: float = 0.1
    # Latest members a bucket keeps (index.py): what one article reads and rewrites per bucket.
    bucket_cap: int = DEFAULT_BUCKET_CAP
    # Niceness added to this process's RocksDB flush and compaction threads (Linux; 0: unchanged).
    # On a busy machine a flush or compaction otherwise takes the core of the thread that decides,
    # and verdicts wait for it: the latency tail comes from those moments.
    background_nice: int = 0
    # Off only for state that can be rebuilt from elsewhere after a crash, or that keeps its own
    # checkpoint in the same writes (`neardup dedup`): without it, writes since the last flush are
    # lost to a SIGKILL, the two families' flushes made atomic so that both keep the same writes
    # (the worker's index records its changelog position in its writes, and keeps it on).
    write_ahead_log: bool = True
    # Band buckets and posting lists held in memory, logged a write at a time (held.py), in a
    # state created anew; a state keeps the layout it was created with.
    hold_families: bool = False
    # Decoded article records kept in memory, read again for exact copies, re-deliveries and
    # replays; a miss costs a read and a decode. Candidates are read as probes (below).
    record_cache: int = DEFAULT_RECORD_CACHE
    # Candidates' probes kept in memory (their size per entry: NEARDUP_PROBE_CACHE in
    # deploy/docs/configuration.md), the latest read back or restored: a multi-get of tens of them
    # from RocksDB costs more than scoring them.
    probe_cache: int = DEFAULT_PROBE_CACHE

    def block_cache(self) -> Cache:
        return Cache(self.block_cache_mb * 1024 * 1024)

    def build(self, cache: Cache | None = None, *, records: bool = False) -> Options:
        """Options of the default column family, or of the records family; `cache`: a block cache
        to share between them."""
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        table = BlockBasedOptions()
        # A record is read by a seq that a bucket, the id map or the time index holds: present
        # nearly always, so a filter would answer nothing and take space beside every record.
        if not records:
            table.set_bloom_filter(self.bloom_bits_per_key, False)
        table.set_block_cache(cache or self.block_cache())
        # Index and filter blocks stay with their table files (RocksDB's default), not in the block
        # cache: there, every lookup in a compacted file fetches its whole filter block from the
        # cache again, which costs more than the lookup itself.
        options.set_block_based_table_factory(table)
        memtable_mb = self.records_write_buffer_mb if records else self.write_buffer_mb
        options.set_write_buffer_size(memtable_mb * 1024 * 1024)
        if not self.write_ahead_log:
            options.set_atomic_flush(True)
        if self.memtable_bloom_ratio:
            options.set_memtable_prefix_bloom_ratio(self.memtable_bloom_ratio)
            options.set_memtable_whole_key_filtering(True)
        # Records are mostly hash values, which do not compress: their flushes and compactions skip
        # the compressor.
        if records:
            options.set_compression_type(DBCompressionType.none())
        else:
            options.set_compression_type(_compression(self.compression))
            options.set_bottommost_compression_type(_compression(self.bottommost_compression))
        return options


def _compression(name: str) -> DBCompressionType:
    """RocksDB's compression by name: none, lz4, zstd, ..."""
    kind = getattr(DBCompressionType, name, None)
    if kind is None or name.startswith("_"):
        raise ValueError(f"unknown compression {name!r}")
    return cast(DBCompressionType, kind())


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


class StateError(Error):
    """The state directory cannot be used (locked by another process, unreadable, ...)."""


class RocksKV:
    """The index's KeyValue store on RocksDB. `read_only`: beside a process that writes it (the
    stats of a running worker's index), without its lock."""

    def __init__(self, path: Path, options: RocksOptions, *, read_only: bool = False) -> None:
        self.path, self._options, self._read_only = path, options, read_only
        self._open()

    def _open(self) -> None:
        if not self._read_only:
            self.path.mkdir(parents=True, exist_ok=True)
        try:
            cache = self._options.block_cache()  # one block cache for both column families
            options = self._options.build(cache)
            # a state of an earlier format may hold other families: open them so that its header
            # can be read and the state refused with a clear message
            existing = Rdict.list_cf(str(self.path)) if (self.path / "CURRENT").exists() else []
            names = {_RECORDS, *existing} - {"default"}
            families = {name: self._options.build(cache, records=True) for name in names}
            access = AccessType.read_only() if self._read_only else AccessType.read_write()
            self._db = Rdict(str(self.path), options, column_families=families, access_type=access)
            self._records = self._db.get_column_family(_RECORDS)
            self._records_handle = self._db.get_column_family_handle(_RECORDS)
            self._main_removed = self._records_removed = 0  # keys deleted since the last compaction
            if not self._options.write_ahead_log:
                _without_write_ahead_log(self._db)
        except Exception as exc:  # rocksdict raises plain Exception for lock and IO errors
            raise StateError(f"cannot open state at {self.path}: {exc}") from exc
        if self._options.background_nice:
            lower_background_threads(self._options.background_nice)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return cast(list[bytes | None], self._db.get(keys))  # type: ignore[arg-type]

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        return cast(list[bytes | None], self._records.get(keys))  # type: ignore[arg-type]

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        read = ReadOptions()
        if trimmed := prefix.rstrip(b"\xff"):  # else every key from `prefix` on starts with it
            # the first key after every key that starts with `prefix`
            read.set_iterate_upper_bound(trimmed[:-1] + bytes([trimmed[-1] + 1]))
        for key, value in self._db.items(from_key=prefix, read_opt=read):
            yield cast(bytes, key), cast(bytes, value)

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        return _read_through(self._records)

    def write(self, batch: Batch) -> None:
        writes = WriteBatch(raw_mode=True)
        self._main_removed += _put_or_delete(writes, batch.main.items())
        self._records_removed += _put_or_delete(writes, batch.records.items(), self._records_handle)
        self._db.write(writes)

    def compact(self, overwritten: bool = True) -> None:
        """Each family rewritten without what it no longer holds, where it may hold some: the main
        family after some of its keys were removed, or may have been `overwritten` (a keyed index
        rewrites its buckets at every article); the records, only ever added otherwise, after
        removals alone. Compacting a family that holds nothing stale rewrites it for nothing."""
        if overwritten or self._main_removed:
            self._db.compact_range(None, None)
        if self._records_removed:
            self._records.compact_range(None, None)
        self._main_removed = self._records_removed = 0

    def close(self) -> None:
        self._db.close()
        del self._records, self._records_handle  # each keeps the database, and its lock, alive

    def clear(self) -> None:
        self.close()
        Rdict.destroy(str(self.path), self._options.build())
        self._open()

    def size_bytes(self) -> int:
        """Bytes under the state directory."""
        return sum(entry.stat().st_size for entry in self.path.rglob("*") if entry.is_file())


def _put_or_delete(
    batch: WriteBatch, entries: Iterable[tuple[bytes, bytes | None]], family: Any = None
) -> int:
    """Each entry into `batch` (in `family`, else the default one): a value None deletes its key.
    Returns how many it deletes."""
    deleted = 0
    for key, value in entries:
        if value is None:
            batch.delete(key, family)
            deleted += 1
        else:
            batch.put(key, value, family)
    return deleted


def _read_through(db: Rdict) -> Iterator[tuple[bytes, bytes]]:
    """Every entry of `db` (a database or a column family), in key order."""
    scan = ReadOptions()
    # a scan reads every entry once: keep the cache for the lookups (the stubs omit the argument)
    scan.fill_cache(False)  # type: ignore[call-arg]
    for key, value in db.items(read_opt=scan):
        yield cast(bytes, key), cast(bytes, value)


def _without_write_ahead_log(db: Rdict) -> None:
    """Writes to `db` skip the write-ahead log: what they hold is found again elsewhere after a
    crash (the changelog), so they need not survive one."""
    write = WriteOptions()
    write.disable_wal = True  # type: ignore[assignment,method-assign]  # a property; the stubs say method
    db.set_write_options(write)


class RocksState(IndexState):
    """The index on disk. One writer at a time: RocksDB's lock file enforces it. `layered`: writes
    are held in a write overlay (overlay.py) until committed, as the worker's derived index is."""

    def __init__(
        self,
        path: str | Path,
        options: RocksOptions = RocksOptions(),
        *,
        read_only: bool = False,
        layered: bool = False,
    ) -> None:
        self.rocks = RocksKV(Path(path), options, read_only=read_only)
        self.where = str(self.rocks.path)
        self.held = HeldFamilies(self.rocks, HELD) if _holds(self.rocks, options.hold_families) else None
        base = self.held or self.rocks
        super().__init__(
            LayeredKV(base) if layered else base,
            bucket_cap=options.bucket_cap,
            record_cache=options.record_cache,
            probe_cache=options.probe_cache,
            # held posting lists are read from memory: a copy of them would cost more than it spares
            posting_cache=0 if self.held is not None else DEFAULT_POSTING_CACHE,
        )

    def compact(self) -> None:
        if self.held is None:
            self.rocks.compact()
        else:  # a held state overwrites few keys of its own: its held log is what goes stale
            self.rocks.compact(overwritten=self.held.fold_if_stale())


def _holds(rocks: RocksKV, wanted: bool) -> bool:
    """Whether the state holds its buckets and posting lists in memory: when created so, or
    when wanted and none is stored as keys (an older state keeps its layout)."""
    if rocks.get_many([HOLD_KEY])[0] is not None:
        return True
    return wanted and all(next(rocks.scan(prefix), None) is None for prefix in HELD)


class CompactedLog:
    """A changelog's messages reduced to the last value per key, as a compacted topic's consumers
    see it (a value None, a tombstone, removes its key), on disk: a rebuild reads more records than
    memory should hold. Iterated in key order; the directory is removed at `close` (or at the end of
    a `with` block)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # what a rebuild holds in memory, however long the changelog
        options.set_write_buffer_size(16 * 1024 * 1024)
        self._options = options
        Rdict.destroy(str(path), options)  # left over by a rebuild that was interrupted
        self._db = Rdict(str(path), options)
        _without_write_ahead_log(self._db)  # scratch, read again from the topic after a crash

    def add(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        batch = WriteBatch(raw_mode=True)
        _put_or_delete(batch, entries)
        self._db.write(batch)

    def get(self, key: bytes) -> bytes | None:
        return cast(bytes | None, self._db.get(key))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return _read_through(self._db)

    def close(self) -> None:
        self._db.close()
        Rdict.destroy(str(self.path), self._options)

    def __enter__(self) -> CompactedLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
