"""The band buckets and posting lists held in memory, their changes logged in one value a write.

An article reads and rewrites a bucket per band and a posting list per anchor: about fifty keys,
each a read and a write of RocksDB, which cost more than everything else the index does for it.
Held in a dict instead, they cost a dict's lookups; what makes them durable is the log of their
changes, one value a write batch (``j<number>``) in the same batch as the rest of the article's
writes, so that a crash leaves both or neither. The log is folded into a snapshot (``s<number>``
chunks) when it outgrows the snapshot, and at `compact`; opening reads the snapshot's chunks, then
the log, each in the order of their numbers. A fold goes a range of hashes a write (`_FOLD_STEP`
entries or so; more for a write of a large batch: `_fold_steps`), not in one pause: its chunks,
numbered after the snapshot's, hold their entries as they are when written, and the log since the
fold began holds every change made meanwhile, so the old chunks, the new and the whole log read in
that order give the table whether the fold finished or a crash cut it short; its last step drops
the old chunks and the log from before it began.
The price is memory: the families' entries live in the process, in a compiled table (_sketch.HeldTable,
an allocation an entry with its key and value, where a dict would add two bytes objects and its
own slots; BATCH.md measures it), which is why past HELD_ENTRIES they go back to being keys. They
go a step at a time (`DRAIN_STEP` entries a write, or twice the write's own changes where that is
more), not in one pause: while the state drains (`DRAIN_KEY`), a family's key lives in exactly one
place, the table or RocksDB, a read looks in the table then in RocksDB, and a key the table no
longer has is written as a key of its own. Each step moves its entries and logs their removal from
the table in one write batch, so that a crash leaves every entry in one place; the last one drops
the log, the snapshot and the marks, and the state goes on keyed. As a write moves at least twice
the changes it makes, the state has drained once its writes have changed half as many keys as it
held, whatever their size, and the log it adds meanwhile (not folded: its end drops it) holds at
most one and a half changes an entry it held, and one write's changes (the last step's may move
fewer entries than its step).
"""

from __future__ import annotations

import heapq
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ..core.compiled import _sketch
from .port import Batch, KeyValue

LOG, SNAPSHOT = b"j", b"s"
# present in a state whose held families live in the log, not as keys; since its first fold, the
# entries its snapshot holds (8 bytes), which opening sizes the table by
HOLD_KEY = b"mheld"
DRAIN_KEY = b"mdrain"  # present while the held entries go back to being keys, a step a write
_NUMBER = struct.Struct(">Q")
_COUNT = struct.Struct(">I")  # the entries a packed value holds, its first bytes
_SNAPSHOT_FLOOR = 64 * 1024 * 1024  # the log is folded no sooner than at this size
_CHUNK = 4 * 1024 * 1024  # bytes of entries a snapshot value holds at most
_FOLD_STEP = 65_536  # entries a write folds, about: ~10 ms of packing and writing
# Entries held at most (~100 bytes each in memory, ~1 GB): past them the families go back to
# being keys of their own (draining), so that a long input never runs out of memory.
HELD_ENTRIES = 10_000_000
# Entries a write moves back to keys while the state drains, at least: at ~1.5 µs a key, a few ms a
# write beside the write's own, so that no verdict waits for the whole table to go.
DRAIN_STEP = 4096


class HeldFamilies:
    """A KeyValue over `inner` that holds the main family's keys under `prefixes` in memory."""

    def __init__(self, inner: KeyValue, prefixes: tuple[bytes, ...]) -> None:
        self.inner, self.prefixes = inner, bytes(prefix[0] for prefix in prefixes)
        self._load()

    def _load(self) -> None:
        """The snapshot's chunks, then the log, each in the order of their numbers."""
        self.held = _sketch.HeldTable()
        marks = self.inner.get_many([HOLD_KEY, DRAIN_KEY])
        self._marked, self._draining = (mark is not None for mark in marks)
        self._cursor = 0  # the slot the next drain step starts from
        self._folding: _Fold | None = None  # a fold begun and not finished (none after a reopening)
        self._stored_entries = 0  # in the snapshot and the log: fold_if_stale
        # a fold writes its chunks a range of hashes at a time: slots for all of them first, as
        # many as the last fold's end recorded in the mark
        if len(mark := marks[0] or b"") != _NUMBER.size:  # no count recorded
            mark = _NUMBER.pack(sum(_COUNT.unpack_from(chunk)[0] for _, chunk in self.inner.scan(SNAPSHOT)))
        self.held.reserve(_NUMBER.unpack(mark)[0])
        self._chunks, self._snapshot_bytes = self._read_numbered(SNAPSHOT)
        self._logs, self._log_bytes = self._read_numbered(LOG)

    def _read_numbered(self, family: bytes) -> tuple[range, int]:
        """The values of `family` applied to the table; the range of their numbers and their bytes."""
        first, after, size = None, 0, 0
        for key, changes in self.inner.scan(family):
            self._stored_entries += self.held.apply(changes)
            size += len(changes)
            number = _NUMBER.unpack_from(key, 1)[0]
            first, after = number if first is None else first, number + 1
        return range(after if first is None else first, after), size

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The keys of one call are of one family, as every table reads only its own."""
        if not keys or keys[0][0] not in self.prefixes:
            return self.inner.get_many(keys)
        found = self.held.get_many(keys)
        if not self._draining:
            return found
        if missed := [key for key, value in zip(keys, found, strict=True) if value is None]:
            stored = iter(self.inner.get_many(missed))
            found = [next(stored) if value is None else value for value in found]
        return found

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        return self.inner.records(keys)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Held entries sorted on demand: only a count's repair and tests scan them."""
        if prefix and prefix[0] not in self.prefixes:
            return self.inner.scan(prefix)
        entries, _ = self.held.items(0, len(self.held))
        held = sorted(entry for entry in entries if entry[0].startswith(prefix))
        # while draining, a family's keys are in one place or the other, never both
        return heapq.merge(self.inner.scan(prefix), held) if not prefix or self._draining else iter(held)

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        return self.inner.scan_records()

    def write(self, batch: Batch) -> None:
        """The held keys' changes into one log value, written with the rest, then into memory."""
        if self._draining:
            main, logged = self._drain_step(batch.main)
        else:
            logged, main = _sketch.split_changes(batch.main, self.prefixes)
        if logged is not None:
            main[LOG + _NUMBER.pack(self._logs.stop)] = logged
            if not self._marked:
                main[HOLD_KEY], self._marked = b"1", True
        self.inner.write(Batch(main=main, records=batch.records))
        if logged is not None:
            self._logs = range(self._logs.start, self._logs.stop + 1)
            self._log_bytes += len(logged)
            self._stored_entries += self.held.apply(logged)
        if self._draining:  # the log is not folded: it goes with the snapshot and the marks at the end
            if not len(self.held):
                marks: dict[bytes, bytes | None] = {HOLD_KEY: None, DRAIN_KEY: None}
                self.inner.write(Batch(main={**self._dropped(self._chunks.stop, self._logs.stop), **marks}))
                self.held, self.prefixes, self._marked = _sketch.HeldTable(), b"", False
                self._draining, self._stored_entries = False, 0
                self._chunks = self._logs = range(0, 0)
                self._snapshot_bytes = self._log_bytes = 0
        elif len(self.held) > HELD_ENTRIES:
            self._start_draining()
        elif self._folding is not None or self._log_bytes > max(_SNAPSHOT_FLOOR, self._snapshot_bytes):
            self._fold_steps(len(logged or b""))

    def fold(self) -> None:
        """The held entries as a snapshot, in place of the snapshot and log before: the fold begun,
        or a new one, to its end now."""
        if self._folding is None:
            if not len(self._logs):
                return
            self._begin_fold()
        while self._folding is not None:
            self._fold_step()

    def _fold_steps(self, logged: int) -> None:
        """The steps of a fold (begun if none is) that a write of `logged` bytes of log takes: one,
        or as many as end the fold before the log grows by half the snapshot. A write of a large
        batch (a backlog decided) logs more than a fold's step folds, and a fold at one step a
        write would end with a log as large as the snapshot, read again at every open."""
        fold = self._folding or self._begin_fold()
        half = max(_SNAPSHOT_FLOOR, self._snapshot_bytes) / 2
        for _ in range(max(1, math.ceil(fold.steps * logged / half))):
            if self._folding is not None:  # not ended by an earlier step
                self._fold_step()

    def _begin_fold(self) -> _Fold:
        steps = 1 << max(0, (len(self.held) - 1) // _FOLD_STEP).bit_length()
        self._folding = _Fold(
            steps, self._chunks.stop, self._logs.stop, self._log_bytes, self._stored_entries
        )
        return self._folding

    def _fold_step(self) -> None:
        """The next range of hashes written as chunks; after the last, the chunks and the log from
        before the fold began go."""
        fold = self._folding
        assert fold is not None
        chunks = self.held.pack_range(fold.step, fold.steps, _CHUNK)
        main: dict[bytes, bytes | None] = {
            SNAPSHOT + _NUMBER.pack(number): chunk for number, chunk in enumerate(chunks, self._chunks.stop)
        }
        last = fold.step == fold.steps - 1
        fold.chunk_bytes += sum(map(len, chunks))
        fold.chunk_entries += sum(_COUNT.unpack_from(chunk)[0] for chunk in chunks)
        if last:  # the old chunks and log go; the mark keeps the new snapshot's entries for `_load`
            main.update(self._dropped(fold.first_chunk, fold.first_log))
            main[HOLD_KEY] = _NUMBER.pack(fold.chunk_entries)
        self.inner.write(Batch(main=main))
        self._chunks = range(self._chunks.start, self._chunks.stop + len(chunks))
        fold.step += 1
        if last:
            self._chunks, self._logs = (
                range(fold.first_chunk, self._chunks.stop),
                range(fold.first_log, self._logs.stop),
            )
            self._snapshot_bytes, self._log_bytes = fold.chunk_bytes, self._log_bytes - fold.log_bytes
            self._stored_entries = fold.chunk_entries + self._stored_entries - fold.stored_entries
            self._folding = None

    def fold_if_stale(self) -> bool:
        """Fold when the snapshot and the log hold a quarter more entries than the table (changes
        since overwritten or removed, which a fold drops); a log of mostly new entries is left as
        it is, as it holds little more than a snapshot would. Returns whether it folded."""
        if self._stored_entries * 4 <= len(self.held) * 5:
            return False
        self.fold()
        return True

    def _start_draining(self) -> None:
        """Mark the state as draining. Keys of the held families already in RocksDB can only be
        left by a spill that an earlier version began and a crash interrupted: the table holds
        what they should, so they go."""
        stale = [key for prefix in self.prefixes for key, _ in self.inner.scan(bytes([prefix]))]
        self.inner.write(Batch(main={**dict.fromkeys(stale), DRAIN_KEY: b"1"}))
        self._draining, self._cursor, self._folding = True, 0, None

    def _drain_step(
        self, changes: dict[bytes, bytes | None]
    ) -> tuple[dict[bytes, bytes | None], bytes | None]:
        """What a write writes while draining: `changes` to keys the table holds logged, the rest
        as keys, and DRAIN_STEP entries or twice `changes` moved to keys (with the write's change
        where it has one), their removal from the table logged too. The entries come from the cursor
        on, round the slots: a removal may shift an entry back past the cursor, and the next round
        finds it."""
        main: dict[bytes, bytes | None] = {}
        kept: dict[bytes, bytes | None] = {}
        for key, value in changes.items():
            (kept if key[0] in self.prefixes else main)[key] = value
        for key, value in zip(list(kept), self.held.get_many(list(kept)), strict=True):
            if value is None:  # moved to a key already, or new: a key
                main[key] = kept.pop(key)
        step = max(DRAIN_STEP, 2 * len(changes))
        entries, cursor = self.held.items(self._cursor, step)
        if len(entries) < step and self._cursor:
            more, cursor = self.held.items(0, step - len(entries))
            entries += more  # a table smaller than a step may give an entry twice: one dict key
        self._cursor = cursor
        moved = dict(entries)
        main.update((key, kept.pop(key, value)) for key, value in moved.items())
        return main, _sketch.split_changes({**kept, **dict.fromkeys(moved)}, self.prefixes)[0]

    def _dropped(self, chunks_before: int, logs_before: int) -> dict[bytes, bytes | None]:
        """Deletions of the snapshot's chunks and the log's values numbered before these."""
        dropped: dict[bytes, bytes | None] = {
            SNAPSHOT + _NUMBER.pack(number): None for number in range(self._chunks.start, chunks_before)
        }
        dropped.update((LOG + _NUMBER.pack(number), None) for number in range(self._logs.start, logs_before))
        return dropped

    def close(self) -> None:
        self.inner.close()

    def clear(self) -> None:
        self.inner.clear()
        self._load()

    def size_bytes(self) -> int:
        return self.inner.size_bytes()


@dataclass
class _Fold:
    """A fold under way: `steps` ranges of hashes, the next one `step`; the first chunk it writes
    and the first log value it keeps; the log's bytes and the entries stored when it began; what
    its chunks hold so far."""

    steps: int
    first_chunk: int
    first_log: int
    log_bytes: int
    stored_entries: int
    step: int = 0
    chunk_bytes: int = 0
    chunk_entries: int = 0
