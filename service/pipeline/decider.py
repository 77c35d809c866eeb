"""The index stage behind one async interface, in a child process (default) or in the worker.

In a child (`python -m neardup.pipeline.child neardup.pipeline.decider`, NEARDUP_INDEX_PROCESS=1)
the derived index, its record cache and every decision live beside the worker's event loop, which
keeps only Kafka work: the loop sends a batch of signatures messages and gets back the verdicts
(JSON) and the writes for the changelog, which it sends there. The child runs the same IndexShard
in the same order as the worker would (NEARDUP_INDEX_PROCESS=0), so verdicts are identical.

The records are held once on disk, in the index; the changelog is what rebuilds it. The index is
kept when it was closed cleanly where the changelog still ends; otherwise (a crash, a lost state
directory, a shard that another worker wrote to meanwhile) it is rebuilt from the changelog, read
from its start. A child that dies is replaced and rebuilds the same way, once the changelog has
every chunk it answered; the batch is then decided again, which re-delivery already makes safe
(records applied after the last checkpoint come back with their stored verdicts). When the child
was on the same record as it died or hung twice (RecordMarker), that record is left out of the
next try and dead-lettered: one message that breaks the decider costs two replacements, not the
worker.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import os
import struct
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    MutableMapping,
    Sequence,
)
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from ..core.params import DedupParams
from ..core.retention import NO_RETENTION, Retention
from ..errors import Error
from ..state.rocks import CompactedLog, RocksOptions, RocksState
from .collector import CollectorPolicy
from .pipes import (
    DEFAULT_TIMEOUT,
    CallTimeout,
    Child,
    ChildFailed,
    ChildTimedOut,
    read_frame,
    write_frame,
)
from .shard import (
    BatchOutcome,
    Culprit,
    IndexShard,
    RecordAt,
    SignedMessage,
    SizeGauge,
    decide_messages,
)
from .wire import signed_count

log = logging.getLogger("neardup.decider")

Write = tuple[bytes, bytes | None]  # (key, value) for the changelog; None, a tombstone
Entry = Write  # a changelog message as read back for a replay
QUEUED_CHUNKS = 2  # requests in the child's pipe: the one it decides and the next
CLOSE_TIMEOUT_S = 30.0
# Records a batch may lose to isolation (each two replacement children, and until the index restores
# without a rebuild, two rebuilds): more in one batch is no longer a bad message but a bad decider.
ISOLATED_PER_BATCH = 16
REMEMBERED_CULPRITS = 1024  # records left out again when their message comes back (re-delivery)
COMPACTION_AT_CLOSE_S = 15.0  # then the child is killed: its index stays as it was, reusable


Answer = tuple[BatchOutcome, list[Write]]  # a decided chunk: its outcome and its table writes


class DeciderFailed(Error, RuntimeError):
    """The decider child failed (died or hung) twice on the same batch: the worker cannot go on
    deciding."""


class Changelog(Protocol):
    """The changelog, as a rebuild reads it (topics.ChangelogReader)."""

    async def end(self) -> int: ...

    def read(self, end: int) -> AsyncIterator[list[Entry]]: ...


class _WriteCollector(MutableMapping[bytes, bytes]):
    """The changelog as the IndexShard writes it: the writes are collected and handed to the
    agent, which sends a whole chunk's writes to the changelog at once (app.py). The stage reads
    records back only to rebuild, and then from the changelog compacted on disk."""

    def __init__(self) -> None:
        self._pending: dict[bytes, bytes | None] = {}
        self.writes: list[Write] = []

    def drain(self) -> list[Write]:
        writes, self.writes, self._pending = self.writes, [], {}
        return writes

    def __getitem__(self, key: bytes) -> bytes:
        value = self._pending[key]
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.writes.append((key, value))
        self._pending[key] = value

    def __delitem__(self, key: bytes) -> None:
        """A tombstone in the changelog (deletes, expiry)."""
        self.writes.append((key, None))
        self._pending[key] = None

    def __iter__(self) -> Iterator[bytes]:
        return (key for key, value in self._pending.items() if value is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class RecordMarker:
    """The record the decider child is on, in a file both processes map: after the child died or
    hung, the worker reads which record it was deciding, and the retry leaves that record out
    (dead-lettered, processing_failed) instead of failing on it again. A store to shared memory
    per record: nothing the decisions would notice."""

    _LAYOUT = struct.Struct("<qqq")  # signatures offset (-1: none), record index, deciding

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, self._LAYOUT.size)
            self._map = mmap.mmap(fd, self._LAYOUT.size)
        finally:
            os.close(fd)

    def at(self, offset: int, index: int, *, deciding: bool) -> None:
        self._LAYOUT.pack_into(self._map, 0, offset, index, deciding)

    def clear(self) -> None:
        self._LAYOUT.pack_into(self._map, 0, -1, 0, 0)

    def read(self) -> tuple[RecordAt, bool] | None:
        """(where, whether in its decision), or None: between records."""
        offset, index, deciding = self._LAYOUT.unpack_from(self._map, 0)
        return None if offset < 0 else ((offset, index), bool(deciding))

    def close(self) -> None:
        self._map.close()


def _marker_path(index_path: Path) -> Path:
    return index_path.with_name(index_path.name + "-marker")


def _scratch(index_path: Path) -> Path:
    """Where a rebuild compacts the changelog before indexing it."""
    return index_path.with_name(index_path.name + "-rebuild")


class Decider:
    """The index stage of one shard. `in_process`: the stage runs in the calling process;
    otherwise in a child, started at the first `open`, that must answer each request within
    `timeout` (or be killed and replaced)."""

    def __init__(
        self,
        params: DedupParams,
        index_path: Path,
        options: RocksOptions,
        changelog: Changelog,
        *,
        in_process: bool,
        gc_freeze_every: int = 0,
        retention: Retention = NO_RETENTION,
        timeout: CallTimeout = DEFAULT_TIMEOUT,
    ) -> None:
        self.retention = retention
        self.timeout = timeout
        self.params = params
        self.index_path = index_path
        self.options = options
        self.changelog = changelog
        self.in_process = in_process
        self.gc_freeze_every = gc_freeze_every
        self.shard: IndexShard | None = None  # in_process only
        self._size = SizeGauge()
        self._collector = _WriteCollector()  # in_process only
        self._child: Child | None = None
        # awaited before a replacement child rebuilds: the changelog must hold every chunk answered
        self.before_rebuild: Callable[[], Awaitable[None]] | None = None
        self.opening = False
        # The last signatures offset applied, as the index says after `open`.
        self.applied_offset = -1
        # Where the changelog ends once the writes acknowledged so far are in it (`acknowledged`):
        # what the index holds when every chunk answered is acknowledged, as at a clean close.
        self.changelog_end = -1
        # Raised when a chunk's writes may never reach the changelog (`mark_ahead`): until the
        # next open, the index is not to be kept, however the worker closes.
        self.ahead_of_changelog = False
        # Records a child failed on, left out when their messages are decided again (in order of
        # isolation, the oldest forgotten first), and the marker that names them.
        self.culprits: dict[RecordAt, Culprit] = {}
        self._marker: RecordMarker | None = None
        # The writes of each chunk answered and not yet acknowledged in the changelog: a replacement
        # child rebuilds from the changelog and then these (under exactly-once, those of the open
        # transaction, which a reader of committed records does not see yet).
        self._unacknowledged: collections.deque[list[Write]] = collections.deque()

    @property
    def child_pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def acknowledged(self, end: int, chunks: int = 1) -> None:
        """The changelog holds every write up to offset `end` (excluded), the writes of the
        `chunks` oldest chunks answered and not acknowledged before among them."""
        self.changelog_end = max(self.changelog_end, end)
        for _ in range(min(chunks, len(self._unacknowledged))):
            self._unacknowledged.popleft()

    def mark_ahead(self) -> None:
        """A batch failed half-way: the index may hold writes that the changelog never gets, so a
        close must not mark it reusable (the next open rebuilds it from the changelog)."""
        self.ahead_of_changelog = True
        self._unacknowledged.clear()  # never to be acknowledged: the batch comes again

    async def open(self, *, replacing: bool = False) -> int | None:
        """At every assignment of the shard: reopen the derived index or rebuild it from the
        changelog. Returns the number of articles rebuilt, None when the index was kept.
        `replacing`: a replacement for a child that failed in a batch, rebuilt with the writes of
        the chunks it had answered too."""
        self.opening = True  # a rebuild takes as long as the changelog is large: not a stall
        if not replacing:
            self._unacknowledged.clear()
        try:
            end = await self.changelog.end()
            count, self.applied_offset = await self._open(str(end).encode(), end)
            self.changelog_end = end
            self.ahead_of_changelog = False
            return count
        finally:
            self.opening = False

    async def _open(self, position: bytes, end: int) -> tuple[int | None, int]:
        if self.in_process:
            if self.shard is None:
                state = RocksState(self.index_path, self.options)
                self.shard = IndexShard(state, self.params, self.retention, self._collector)
            self._collector.drain()  # a batch that failed half-way: the shard replays
            if self.shard.reopen(position):
                return None, self.shard.applied_offset
            with CompactedLog(_scratch(self.index_path)) as table:
                async for entries in self.changelog.read(end):
                    table.add(entries)
                for writes in self._unacknowledged:
                    table.add(writes)
                return self.shard.replay(table), self.shard.applied_offset
        if self._child is None:
            if self._marker is None:
                self._marker = RecordMarker(_marker_path(self.index_path))
            self._marker.clear()
            setup = (
                self.params,
                str(self.index_path),
                self.options,
                self.gc_freeze_every,
                self.retention,
                str(_marker_path(self.index_path)),
            )
            # this module, by the name the package was imported under
            self._child = await Child.start(__name__, setup)
        child, timeout = self._child, self.timeout
        applied = await child.call(("reopen", position), timeout.seconds())
        if applied is not None:
            return None, cast(int, applied)
        # The child compacts the changelog on disk as it comes, a chunk at a time: neither process
        # ever holds the whole table in memory.
        await child.call(("rebuild",), timeout.seconds())
        loaded = 0
        async for entries in self.changelog.read(end):
            await child.call(("load", entries), timeout.seconds(len(entries)))
            loaded += len(entries)
        for writes in self._unacknowledged:
            await child.call(("load", writes), timeout.seconds(len(writes)))
            loaded += len(writes)
        return cast(tuple[int, int], await child.call(("loaded",), timeout.seconds(loaded)))

    async def decide(self, messages: list[SignedMessage]) -> tuple[BatchOutcome, list[Write]]:
        """Decide one chunk of messages (see decide_chunks)."""
        async with contextlib.aclosing(self.decide_chunks([messages])) as answers:
            async for answer in answers:
                return answer
        raise AssertionError("decide_chunks answers every chunk")

    async def decide_chunks(self, chunks: Sequence[list[SignedMessage]]) -> AsyncGenerator[Answer, None]:
        """Decide chunks of messages in order, yielding each one's outcome and its writes for the
        changelog. The caller sends a chunk's writes before it asks for the next answer: a
        replaced decider rebuilds from the changelog, then decides again what was not answered.

        In a child, the next chunk is already queued while the caller handles an answer, so the
        child goes from one chunk to the next without waiting for the event loop (with one request
        at a time it would sit idle while the loop publishes). Close the iterator (contextlib.aclosing)
        when leaving early: a child with a request in flight is stopped, as its answer would be
        read as the next one's."""
        if self.in_process:
            assert self.shard is not None, "open() first"
            for messages in chunks:
                answer = decide_messages(self.shard, messages, self._size), self._collector.drain()
                self._unacknowledged.append(answer[1])
                yield answer
            return
        answered, failures, isolated = 0, 0, 0
        suspects: set[RecordAt] = set()  # records a child failed on once in this batch
        while True:
            queued = answered
            try:
                if self._child is None:
                    if self.before_rebuild is not None:
                        await self.before_rebuild()
                    await self.open(replacing=True)  # rebuilt from the changelog
                child = self._child
                assert child is not None
                while answered < len(chunks):
                    while queued < min(answered + QUEUED_CHUNKS, len(chunks)):
                        child.submit(("decide", chunks[queued], self._culprits_in(chunks[queued])))
                        queued += 1
                    articles = sum(signed_count(value) for _, value in chunks[answered])
                    answer = cast(Answer, await child.receive(self.timeout.seconds(articles)))
                    answered += 1
                    self._unacknowledged.append(answer[1])
                    yield answer
                return
            except ChildFailed as exc:
                blamed = await self._blame(exc, suspects)
                if blamed == "suspect" or (blamed == "culprit" and isolated < ISOLATED_PER_BATCH):
                    isolated += blamed == "culprit"  # then the retry leaves the record out
                    continue
                failures += 1
                log.error("decider_failed attempt=%d error=%r", failures, str(exc))
                if failures == 2:
                    break
            finally:
                if queued > answered:  # left early (closed, cancelled, or failed): stop it
                    self.kill()
        count = sum(len(chunk) for chunk in chunks[answered:])
        raise DeciderFailed(f"the decider failed twice on a batch of {count} messages")

    def _culprits_in(self, chunk: list[SignedMessage]) -> dict[RecordAt, Culprit]:
        if not self.culprits:
            return {}
        offsets = {offset for offset, _ in chunk}
        return {at: culprit for at, culprit in self.culprits.items() if at[0] in offsets}

    async def _blame(self, failure: ChildFailed, suspects: set[RecordAt]) -> str | None:
        """After the child failed: stop it, and read which record it was on. A record it fails on
        a second time is a culprit ("culprit": remembered, and left out from now on); the first
        time, a suspect ("suspect": tried again, since a child killed from outside was on some
        record too); None when it was between records (the batch fails on the second such
        failure)."""
        child, self._child = self._child, None
        if child is not None:
            await child.end()  # no marker moves after this
        found = None if self._marker is None else self._marker.read()
        if found is None or found[0] in self.culprits:
            return None
        at, deciding = found
        if at not in suspects:
            suspects.add(at)
            log.error("decider_failed offset=%d record=%d error=%r; trying it again", *at, str(failure))
            return "suspect"
        how = "hung" if isinstance(failure, ChildTimedOut) else "died"
        step = "deciding" if deciding else "decoding"
        detail = f"the index stage's process {how} {step} this record ({failure}); left out"
        self.culprits[at] = Culprit(deciding, detail)
        while len(self.culprits) > REMEMBERED_CULPRITS:
            del self.culprits[next(iter(self.culprits))]
        log.error("decider_isolated offset=%d record=%d step=%s error=%r", at[0], at[1], step, str(failure))
        return "culprit"

    async def close(self, *, clean: bool) -> None:
        """Close the derived index; `clean`: every chunk answered is acknowledged in the changelog,
        so that the index, marked with where the changelog ends, can be kept at the next open."""
        reusable = clean and self.changelog_end >= 0 and not self.ahead_of_changelog
        position = str(self.changelog_end).encode() if reusable else None
        if self.in_process:
            if self.shard is not None:
                self.shard.close(position)
                self.shard = None
            return
        if self._child is None:
            return
        child, self._child = self._child, None
        try:
            await child.call(("close", position), CLOSE_TIMEOUT_S)
            if await child.wait(COMPACTION_AT_CLOSE_S) is None:
                log.warning("decider_compaction_cut_short pid=%d", child.pid)
        except ChildFailed as exc:
            log.error("decider_close_failed error=%r", str(exc))
        finally:
            await child.end()  # exited by itself after "close", unless it timed out or failed

    def kill(self) -> None:
        """Stop the child now, without marking its index reusable (what a crash would leave)."""
        if self._child is not None:
            self._child.stop()
            self._child = None


def _streamed_entries(requests: BinaryIO, answers: BinaryIO) -> Iterator[list[Entry]]:
    """The changelog's messages as the worker streams them for a rebuild: ("load", entries)
    frames, each acknowledged once consumed, up to ("loaded",)."""
    while True:
        request = read_frame(requests)
        if request is None:
            raise EOFError("the worker went away during a rebuild")
        op, *args = cast(tuple, request)
        if op == "loaded":
            return
        if op != "load":
            raise ValueError(f"unexpected request {op!r} during a rebuild")
        yield args[0]
        write_frame(answers, None)


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The child's loop. First frame: (params, index path, RocksOptions, freeze interval,
    retention, marker path); then ("reopen", changelog position) → applied offset, or None:
    rebuild, with ("rebuild",) → "rebuilding", ("load", entries) → None for each chunk of the
    changelog, and ("loaded",) → (count, applied offset); ("decide", messages, culprits to leave
    out) → (outcome, writes);
    ("close", changelog position or None) → "closed", which ends it (as EOF does, without marking
    the index reusable)."""
    first = read_frame(requests)
    if first is None:
        return
    params, path, options, freeze_every, retention, marker_path = cast(
        tuple[DedupParams, str, RocksOptions, int, Retention, str], first
    )
    marker = RecordMarker(Path(marker_path))
    table = _WriteCollector()
    shard = IndexShard(RocksState(path, options), params, retention, table)
    size = SizeGauge()
    collector = CollectorPolicy(freeze_every)
    write_frame(answers, "ready")
    while (request := read_frame(requests)) is not None:
        op, *args = cast(tuple, request)
        if op == "decide":
            outcome = decide_messages(shard, args[0], size, marker, args[1])
            write_frame(answers, (outcome, table.drain()))
            collector.after(outcome.handled)
        elif op == "reopen":
            table.drain()
            write_frame(answers, shard.applied_offset if shard.reopen(args[0]) else None)
        elif op == "rebuild":
            write_frame(answers, "rebuilding")
            with CompactedLog(_scratch(Path(path))) as compacted:
                for entries in _streamed_entries(requests, answers):
                    compacted.add(entries)
                count = shard.replay(compacted)
            write_frame(answers, (count, shard.applied_offset))
        elif op == "close":
            reusable = shard.mark_reusable(args[0])
            write_frame(answers, "closed")
            if reusable:
                # The space of expired, deleted and overwritten entries is reclaimed while the
                # worker shuts down. Safe to cut short: the marker is on disk already, and a
                # RocksDB killed mid-compaction reopens as it was before it.
                shard.state.compact()
            shard.state.close()
            return
        else:
            raise ValueError(f"unknown request {op!r}")
    shard.state.close()  # the worker went away: no clean marker
