"""The index stage behind one async interface, in a child process (default) or in the worker.

In a child (`python -m neardup.stream.decider`, NEARDUP_INDEX_PROCESS=1) the derived index, its
record cache and every decision live beside the worker's event loop, which keeps only Faust and Kafka
work: the loop sends a batch of signatures messages and gets back the verdicts (JSON) and the writes
for the record table, which it applies to the changelogged Faust table itself. The child runs the same
IndexStage in the same order as the worker would (NEARDUP_INDEX_PROCESS=0), so verdicts are identical.

The record table stays the durable truth. The child sees it only through `_WriteCollector` over the
applied offset and, for a rebuild, the records the worker streams to it. A child that dies is
replaced; the new one rebuilds from the table and the batch is decided again, which re-delivery
already makes safe (records applied after the last checkpoint come back with their stored verdicts).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import BinaryIO, cast

from ..core.params import DedupParams
from ..core.retention import NO_RETENTION, Retention
from ..state.index import runs_of
from ..state.rocks import RocksOptions, RocksState
from .collector import CollectorPolicy
from .pipes import (
    DEFAULT_TIMEOUT,
    CallTimeout,
    Child,
    ChildFailed,
    HelperFault,
    child_main,
    read_frame,
    write_frame,
)
from .stages import INPUTS_KEY, OFFSET_KEY, BatchOutcome, IndexStage, table_articles
from .wire import signed_count

log = logging.getLogger("neardup.decider")

Message = tuple[int, bytes]  # (offset, value) of one signatures message
Write = tuple[bytes, bytes | None]  # (key, value) for the record table; None deletes the key
Answer = tuple[BatchOutcome, list[Write]]  # a decided chunk: its outcome and its table writes
QUEUED_CHUNKS = 2  # requests in the child's pipe: the one it decides and the next
LOAD_CHUNK = 2000  # records per frame while streaming the table for a rebuild: a few MB
CLOSE_TIMEOUT_S = 30.0
_CHECKPOINTS = (OFFSET_KEY, INPUTS_KEY)  # the table's keys the child reads: what was applied


class DeciderFailed(RuntimeError):
    """The decider child failed (died or hung) twice on the same batch: the worker cannot go on
    deciding."""


class _WriteCollector(MutableMapping[bytes, bytes]):
    """The record table as the IndexStage sees it: reads go to `table`, writes are collected and
    handed to the agent, which applies a whole chunk's writes at once (app.py). In the worker
    `table` is the Faust table; in the child, a dict holding only the applied offset the worker
    sent (a rebuild reads the records as the worker streams them)."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self.table = table
        self._pending: dict[bytes, bytes | None] = {}
        self.writes: list[Write] = []

    def drain(self) -> list[Write]:
        writes, self.writes, self._pending = self.writes, [], {}
        return writes

    def __getitem__(self, key: bytes) -> bytes:
        if key in self._pending:
            value = self._pending[key]
            if value is None:
                raise KeyError(key)
            return value
        return self.table[key]

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.writes.append((key, value))
        self._pending[key] = value

    def __delitem__(self, key: bytes) -> None:
        """Deleted in the table's store, a tombstone in its changelog (deletes, expiry)."""
        self.writes.append((key, None))
        self._pending[key] = None

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.table)  # rebuilds happen at assignment, with no writes pending

    def __len__(self) -> int:
        return len(self.table)


class Decider:
    """The index stage of one shard. `in_process`: the stage runs in the calling process on the
    real table; otherwise in a child, started at the first `open`, that must answer each request
    within `timeout` (or be killed and replaced)."""

    def __init__(
        self,
        params: DedupParams,
        index_path: Path,
        options: RocksOptions,
        records: MutableMapping[bytes, bytes],
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
        self.records = records
        self.in_process = in_process
        self.gc_freeze_every = gc_freeze_every
        self.stage: IndexStage | None = None  # in_process only
        self._collector = _WriteCollector(records)  # in_process only
        self._child: Child | None = None
        # awaited before a replacement child rebuilds: the table must hold every chunk answered
        self.before_rebuild: Callable[[], Awaitable[None]] | None = None
        self.opening = False

    @property
    def child_pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    async def open(self) -> int | None:
        """At every assignment of the shard: reopen the derived index or rebuild it from the record
        table. Returns the number of articles rebuilt, None when the index was kept."""
        self.opening = True  # a rebuild takes as long as the table is large: not a stall
        try:
            return await self._open()
        finally:
            self.opening = False

    async def _open(self) -> int | None:
        if self.in_process:
            if self.stage is None:
                self.stage = IndexStage(
                    self.params, RocksState(self.index_path, self.options), self._collector, self.retention
                )
            self._collector.drain()  # a batch that failed half-way: the stage rebuilds from the table
            return self.stage.open()
        if self._child is None:
            setup = (self.params, str(self.index_path), self.options, self.gc_freeze_every, self.retention)
            # this module, by the name the package was imported under
            self._child = await Child.start(__name__, setup)
        child, timeout = self._child, self.timeout
        reopen = ("reopen", self.records.get(OFFSET_KEY), self.records.get(INPUTS_KEY))
        if await child.call(reopen, timeout.seconds()):
            return None
        # The child indexes the records as they come, a chunk at a time: neither process ever
        # holds the whole table.
        await child.call(("rebuild",), timeout.seconds())
        loaded = 0
        for chunk in runs_of(table_articles(self.records), LOAD_CHUNK):
            await child.call(("load", chunk), timeout.seconds(len(chunk)))
            loaded += len(chunk)
        return cast(int, await child.call(("loaded",), timeout.seconds(loaded)))

    async def decide(self, messages: list[Message]) -> tuple[BatchOutcome, list[Write]]:
        """Decide one chunk of messages (see decide_chunks)."""
        async with contextlib.aclosing(self.decide_chunks([messages])) as answers:
            async for answer in answers:
                return answer
        raise AssertionError("decide_chunks answers every chunk")

    async def decide_chunks(self, chunks: Sequence[list[Message]]) -> AsyncGenerator[Answer, None]:
        """Decide chunks of messages in order, yielding each one's outcome and its writes for the
        record table. The caller applies a chunk's writes before it asks for the next answer: a
        replaced decider rebuilds from the table, then decides again what was not answered.

        In a child, the next chunk is already queued while the caller handles an answer, so the
        child goes from one chunk to the next without waiting for the event loop (with one request
        at a time it would sit idle while the loop publishes). Close the iterator (contextlib.aclosing)
        when leaving early: a child with a request in flight is stopped, as its answer would be
        read as the next one's."""
        if self.in_process:
            assert self.stage is not None, "open() first"
            for messages in chunks:
                yield self.stage.handle_messages(messages), self._collector.drain()
            return
        answered = 0
        for attempt in (1, 2):
            queued = answered
            try:
                if self._child is None:
                    if self.before_rebuild is not None:
                        await self.before_rebuild()
                    await self.open()  # a replacement: rebuilt from the record table
                child = self._child
                assert child is not None
                while answered < len(chunks):
                    while queued < min(answered + QUEUED_CHUNKS, len(chunks)):
                        child.submit(("decide", chunks[queued]))
                        queued += 1
                    articles = sum(signed_count(value) for _, value in chunks[answered])
                    answer = cast(Answer, await child.receive(self.timeout.seconds(articles)))
                    answered += 1
                    yield answer
                return
            except ChildFailed as exc:
                log.error("decider_failed attempt=%d error=%r", attempt, str(exc))
                self.kill()
            finally:
                if queued > answered:  # left early (closed, cancelled, or failed): stop it
                    self.kill()
        count = sum(len(chunk) for chunk in chunks[answered:])
        raise DeciderFailed(f"the decider failed twice on a batch of {count} messages")

    async def close(self) -> None:
        """Close the derived index (marked reusable when everything applied is checkpointed)."""
        if self.in_process:
            if self.stage is not None:
                self.stage.close()
                self.stage = None
            return
        if self._child is None:
            return
        child, self._child = self._child, None
        try:
            await child.call(("close",), CLOSE_TIMEOUT_S)
            if await child.wait(CLOSE_TIMEOUT_S) is None:
                log.error("decider_close_timeout pid=%d", child.pid)
        except ChildFailed as exc:
            log.error("decider_close_failed error=%r", str(exc))
        finally:
            await child.end()  # exited by itself after "close", unless it timed out or failed

    def kill(self) -> None:
        """Stop the child now, without marking its index reusable (what a crash would leave)."""
        if self._child is not None:
            self._child.stop()
            self._child = None


def _streamed_records(requests: BinaryIO, answers: BinaryIO) -> Iterator[tuple[bytes, bytes]]:
    """The record table's article records as the worker streams them for a rebuild: ("load",
    records) frames, each acknowledged once consumed, up to ("loaded",)."""
    while True:
        request = read_frame(requests)
        if request is None:
            raise EOFError("the worker went away during a rebuild")
        op, *args = cast(tuple, request)
        if op == "loaded":
            return
        if op != "load":
            raise ValueError(f"unexpected request {op!r} during a rebuild")
        yield from args[0]
        write_frame(answers, None)


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The child's loop. First frame: (params, index path, RocksOptions, freeze interval,
    retention); then ("reopen", applied offset, applied inputs) → bool; ("rebuild",) →
    "rebuilding", then ("load", records) → None for each chunk of the table, then ("loaded",) →
    count;
    ("decide", messages) → (outcome, writes), ("close",) → "closed", which ends it (as EOF does,
    without marking the index reusable)."""
    first = read_frame(requests)
    if first is None:
        return
    params, path, options, freeze_every, retention = cast(
        tuple[DedupParams, str, RocksOptions, int, Retention], first
    )
    applied: dict[bytes, bytes] = {}  # the record table, as far as the child reads it
    table = _WriteCollector(applied)
    stage = IndexStage(params, RocksState(path, options), table, retention)
    collector = CollectorPolicy(freeze_every)
    write_frame(answers, "ready")
    fault = HelperFault("decider")
    while (request := read_frame(requests)) is not None:
        op, *args = cast(tuple, request)
        if op == "decide":
            fault.next_batch()
            outcome = stage.handle_messages(args[0])
            writes = table.drain()
            # as the worker's table will have it; the records themselves are not read back
            applied.update((key, value) for key, value in writes if key in _CHECKPOINTS and value is not None)
            write_frame(answers, (outcome, writes))
            collector.after(outcome.handled)
        elif op == "reopen":
            applied.clear()
            for key, value in zip(_CHECKPOINTS, args, strict=True):
                if value is not None:
                    applied[key] = value
            table.drain()
            write_frame(answers, stage.reopen())
        elif op == "rebuild":
            write_frame(answers, "rebuilding")
            write_frame(answers, stage.rebuild(_streamed_records(requests, answers)))
        elif op == "close":
            stage.close()
            write_frame(answers, "closed")
            return
        else:
            raise ValueError(f"unknown request {op!r}")
    stage.index.close()  # the worker went away: no clean marker


if __name__ == "__main__":
    child_main(serve)
