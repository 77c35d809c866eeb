"""The index stage behind one async interface, in a child process (default) or in the worker.

In a child (`python -m neardup.pipeline.child neardup.pipeline.decider`, NEARDUP_INDEX_PROCESS=1)
the derived index, its record cache and every decision live beside the worker's event loop, which
keeps only Kafka work: the loop sends a batch of signatures messages and gets back the verdicts
(JSON) and the writes for the changelog, which it sends there. With NEARDUP_INDEX_PROCESS=0 the
same requests are answered by the same ShardServer in the worker's process, so verdicts, restores
and rebuilds are identical; only what a separate process allows (a timeout, a replacement, leaving
out the record it failed on) is the child's alone.

The records are held once on disk, in the index; the changelog is what rebuilds it. A chunk's
writes reach the index only once the changelog has the chunk's records (`acknowledged`), with the
changelog offset they reflect, on a write-ahead log: whatever stops the worker, the index is at a
committed point. At every open the index is restored: the changelog after that point is applied to
it. It is rebuilt from the changelog's start only when it has no point (a lost or new state
directory), its format is refused, or its point is older than the time the changelog keeps a
tombstone. A child that dies is replaced and restores the same way, once the changelog has every chunk it
answered (under exactly-once, the chunks of the open transaction are held again as they were);
the batch is then decided again, which re-delivery already makes safe (records applied after the
last checkpoint come back with their stored verdicts). When the child was on the same record as it
died or hung twice (RecordMarker), that record is left out of the next try and dead-lettered: one
message that breaks the decider costs two replacements, not the worker.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from ..core.compiled import _sketch
from ..core.params import DedupParams
from ..core.retention import NO_RETENTION, Retention
from ..errors import Error
from ..state.rocks import CompactedLog, RocksOptions, RocksState
from .collector import CollectorPolicy
from .pipes import DEFAULT_TIMEOUT, CallTimeout, Child, ChildFailed, ChildTimedOut, read_frame, write_frame
from .shard import BatchOutcome, Culprit, IndexShard, RecordAt, SignedMessage, SizeGauge, decide_messages
from .shard import Entry as Write  # (key, value) for the changelog; None, a tombstone
from .wire import signed_count

log = logging.getLogger("neardup.decider")

QUEUED_CHUNKS = 2  # requests in the child's pipe: the one it decides and the next
CLOSE_TIMEOUT_S = 30.0
COMPACTION_AT_CLOSE_S = 15.0  # then the child is killed: its index stays as it was, reusable
# Records a batch may lose to isolation (each two replacement children): more in one batch is no
# longer a bad message but a bad decider.
ISOLATED_PER_BATCH = 16
REMEMBERED_CULPRITS = 1024  # records left out again when their message comes back (re-delivery)


Answer = tuple[BatchOutcome, list[Write]]  # a decided chunk: its outcome and its table writes
ServerSetup = tuple[DedupParams, Path, RocksOptions, Retention]  # what a ShardServer is made of


class DeciderFailed(Error, RuntimeError):
    """The decider child failed (died or hung) twice on the same batch: the worker cannot go on
    deciding."""


class Changelog(Protocol):
    """The changelog, as a rebuild reads it (topics.ChangelogReader)."""

    async def end(self) -> int: ...

    def read_after(self, start: int | None, end: int) -> AsyncIterator[tuple[list[Write], int]]:
        """Its messages from `start` (None: its start) up to `end` (excluded), in chunks, each with
        the offset after its last message (`end` for the last chunk)."""

    async def tombstones_kept_ms(self) -> int | None:
        """How long compaction keeps a tombstone (None: nothing is compacted away)."""


class RecordMarker:
    """The record the decider child is on, in a file both processes map: after the child died or
    hung, the worker reads which record it was deciding, and the retry leaves that record out
    (dead-lettered, processing_failed) instead of failing on it again. A store to shared memory
    per record: nothing the decisions would notice."""

    _SIZE = 24  # signatures offset (-1: none), record index, deciding (_sketch.mark's layout)

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(0o600)
        os.truncate(path, self._SIZE)
        with path.open("r+b") as file:
            self.memory = mmap.mmap(file.fileno(), self._SIZE)

    def at(self, offset: int, index: int, *, deciding: bool) -> None:
        _sketch.mark(self.memory, offset, index, deciding)

    def clear(self) -> None:
        _sketch.mark(self.memory, -1, 0, False)

    def read(self) -> tuple[RecordAt, bool] | None:
        """(where, whether in its decision), or None: between records."""
        offset, index, deciding = _sketch.marked(self.memory)
        return None if offset < 0 else ((offset, index), deciding)


UNANSWERED = frozenset({"commit"})  # requests no answer comes back for


class ShardServer:
    """The index stage's requests (serve's docstring lists them) answered against one IndexShard,
    wherever the shard lives: the decider child's loop feeds it from its pipe, InProcessChild from
    the worker's own calls, so both modes restore, rebuild, hold, decide, commit and close through
    the same code. `marker` and `freeze_every` serve a child only, and a child (the one with a
    marker) compacts the index at a clean close: the worker reads the marker after a child died,
    collects its own garbage, and could not cut a compaction short in its own process."""

    def __init__(self, setup: ServerSetup, marker: RecordMarker | None = None, freeze_every: int = 0) -> None:
        params, index_path, options, retention = setup
        self.index_path = index_path
        # the changelog's writes, handed to the agent a chunk at a time (stream/index_agent.py),
        # which sends them at once; the stage reads records back only to rebuild, and then from
        # the changelog compacted on disk
        self.writes: list[Write] = []
        self.shard = IndexShard(RocksState(index_path, options, layered=True), params, retention, self.writes)
        self.marker = marker
        self._size = SizeGauge()
        self._collector = CollectorPolicy(freeze_every)
        self._since_ms: int | None = None  # the position's time where the restore under way started
        self._compacted: CompactedLog | None = None  # the changelog of the rebuild under way

    def answer(self, request: tuple) -> object:
        """The answer to one request; None for those in UNANSWERED."""
        shard = self.shard
        match request:
            case ("decide", messages, chunk, culprits):
                shard.begin(chunk)
                return decide_messages(shard, messages, self._size, self.marker, culprits), self._drained()
            case ("commit", chunk, changelog_end):
                shard.commit(chunk, changelog_end)
            case ("hold", chunk, writes):
                shard.hold(chunk, writes)
            case ("reopen", end, read_at, retention):
                self._drop_rebuild()  # one the worker gave up, its changelog read failing
                self._drained()  # a batch that failed half-way: the shard replays
                point, why = shard.restore_point(end, read_at, retention)
                self._since_ms = None if point is None else point.since_ms
                if point is not None:
                    return point.offset
                log.info("index_rebuild reason=%s", why)
                # A rebuild: the changelog is compacted on disk as it comes, a chunk at a time: no
                # process ever holds the whole table in memory; beside the index, in its scratch
                # directory.
                self._compacted = CompactedLog(self.index_path.with_name(self.index_path.name + "-rebuild"))
            case ("tail", entries, after):
                assert self._since_ms is not None, "reopen first"
                shard.restore(entries, after, self._since_ms)
            case ("restored", end, read_at):
                shard.mark_position(end, read_at)
                return shard.applied_offset
            case ("load", entries):
                assert self._compacted is not None, "reopen first, to a rebuild"
                self._compacted.add(entries)
            case ("loaded", end, read_at):
                compacted, self._compacted = self._compacted, None
                assert compacted is not None, "reopen first, to a rebuild"
                with compacted:
                    count = shard.replay(compacted)
                shard.mark_position(end, read_at)
                return count, shard.applied_offset
            case ("close", _):
                return "closed"  # closed once the answer is on its way (after)
            case _:
                raise ValueError(f"unknown request {request[0]!r}")
        return None

    def _drained(self) -> list[Write]:
        """The changelog's writes since the last call."""
        writes, self.writes[:] = self.writes[:], []
        return writes

    def after(self, request: tuple, answer: object) -> None:
        """What waits until the `answer` to `request` is on its way: the collector after a
        decision, the compaction and the close after a close."""
        if request[0] == "decide":
            self._collector.after(cast(Answer, answer)[0].handled)
        elif request[0] == "close":
            self.close(request[1])

    def close(self, clean: bool) -> None:
        self._drop_rebuild()
        if clean and self.marker is not None:  # only a child has a marker: see the class docstring
            # The space of expired, deleted and overwritten entries is reclaimed while the
            # worker shuts down. Safe to cut short: everything is committed, and a RocksDB
            # killed mid-compaction reopens as it was before it.
            self.shard.state.compact()
        self.shard.state.close()

    def _drop_rebuild(self) -> None:
        if self._compacted is not None:
            self._compacted.close()
            self._compacted = None


class InProcessChild:
    """A ShardServer in the worker's process behind a child's interface: the same requests and
    answers, handed over as they are, never pickled. As from a child, answers come in request
    order when asked for (`receive`): a chunk queued ahead is decided only once the caller asks for
    its answer, after it handled the ones before. A commit, never answered, is handled at once: it
    only concerns chunks already answered. Nothing times out or is replaced in process: a failure
    raises to the caller; `stop` drops the requests not answered yet, as a stopped child would."""

    def __init__(self, server: ShardServer) -> None:
        self.server = server
        self.pid = os.getpid()  # the worker's own
        self._queued: collections.deque[tuple] = collections.deque()

    def submit(self, request: tuple) -> None:
        if request[0] in UNANSWERED:
            self.server.answer(request)
        else:
            self._queued.append(request)

    async def receive(self, timeout: float | None = None) -> object:
        request = self._queued.popleft()
        answer = self.server.answer(request)
        self.server.after(request, answer)
        return answer

    async def call(self, request: tuple, timeout: float | None = None) -> object:
        self.submit(request)
        return await self.receive(timeout)

    async def wait(self, timeout: float) -> int | None:
        return 0  # closed by the close it answered

    def stop(self) -> None:
        self._queued.clear()

    async def end(self, timeout: float = 10.0) -> None:
        self.stop()


class Decider:
    """The index stage of one shard, a ShardServer reached through its link. `in_process`: the
    server runs in the calling process (InProcessChild); otherwise in a child, started at the first
    `open`, that must answer each request within `timeout` (or be killed and replaced)."""

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
        before_rebuild: Callable[[], Awaitable[None]] | None = None,
        on_opened: Callable[[int | None, float], None] = lambda count, seconds: None,
    ) -> None:
        self.timeout = timeout
        # what the ShardServer is made of, in process or in the child
        self._server_args: ServerSetup = (params, index_path, options, retention)
        self.index_path = index_path
        self.changelog = changelog
        self.in_process = in_process
        self.gc_freeze_every = gc_freeze_every
        self.shard: IndexShard | None = None  # in_process only: the server's, while open
        self._link: Child | InProcessChild | None = None
        # awaited before a replacement child rebuilds: the changelog must hold every chunk answered
        self.before_rebuild = before_rebuild
        self.opening = False
        # The last signatures offset applied, as the index says after `open`.
        self.applied_offset = -1
        # Where the changelog ends once the writes acknowledged so far are in it (`acknowledged`):
        # what the index holds when every chunk answered is acknowledged, as at a clean close.
        self.changelog_end = -1
        # Chunks are numbered as they are submitted; `answered`: the number of the last answered.
        self.chunks = self.answered = 0
        # How the last open went ("restored", "rebuilt"), the changelog records it replayed, and
        # what is told of each open (the adapter's log and metrics), a replacement child's too.
        self.opened = ""
        self.replayed = 0
        # How far behind the changelog's end the index stood when the last open or catch-up
        # started (changelog end - its stored position; the whole changelog for a rebuild).
        self.behind = 0
        self.on_opened = on_opened
        # Records a child failed on, left out when their messages are decided again (in order of
        # isolation, the oldest forgotten first), and the marker that names them.
        self.culprits: dict[RecordAt, Culprit] = {}
        self._marker: RecordMarker | None = None
        # The writes of each chunk answered and not yet acknowledged, by chunk number: a
        # replacement child holds them again after its restore (under exactly-once, those of the
        # open transaction, which a reader of committed records does not see yet).
        self._unacknowledged: dict[int, list[Write]] = {}

    def acknowledged(self, end: int | None, chunk: int | None = None) -> None:
        """The changelog holds every write of the chunks up to number `chunk` (None: every chunk
        answered), and so every write up to offset `end` (excluded; None: no further than
        before): their writes are committed to the index. Called once the records are durable,
        whatever makes them so (the broker's acknowledgement; a transaction's commit)."""
        if end is not None:
            self.changelog_end = max(self.changelog_end, end)
        chunk = self.answered if chunk is None else chunk
        self._unacknowledged = {n: writes for n, writes in self._unacknowledged.items() if n > chunk}
        if self._link is None:
            return
        try:
            self._link.submit(("commit", chunk, self.changelog_end))  # not answered
        except ChildFailed as exc:
            # The changelog holds these writes: the child's replacement restores them, at the
            # next batch (decide_chunks), as it does for a child that dies in a batch.
            log.error("decider_failed at a commit error=%r; replaced at the next batch", str(exc))
            self.kill()

    async def open(self, *, replacing: bool = False) -> int | None:
        """At every assignment of the shard: restore the derived index (the changelog after its
        committed point applied to it) or rebuild it from the changelog. Returns the number of
        articles rebuilt, None when it was restored (`replayed`: the records applied).
        `replacing`: for a child that failed in a batch; the chunks it answered that are not
        acknowledged yet are held again."""
        self.opening = True  # a rebuild takes as long as the changelog is large: not a stall
        try:
            started = time.monotonic()
            count = await self.catch_up(replacing)
            self.opened = "rebuilt" if count is not None else "restored"
            self.on_opened(count, time.monotonic() - started)
            return count
        finally:
            self.opening = False

    async def catch_up(self, replacing: bool = False) -> int | None:
        """The index restored (None) or rebuilt (the articles rebuilt) from the changelog as it
        ends now, then, `replacing` a child, the chunks it answered and not acknowledged yet held
        again (forgotten otherwise). `open`'s restore, and alone a standby's step, on a worker that
        does not own the shard: neither an open of the shard (`on_opened` is not told) nor a stall
        (`opening` stays unset, so readiness does not flap); `behind` says how far the index was
        from the changelog's end."""
        if not replacing:
            self._unacknowledged.clear()
        # no record at or after `end` was written before this moment
        read_at = round(time.time() * 1000)
        end = await self.changelog.end()
        retention = await self.changelog.tombstones_kept_ms()
        self.replayed = 0
        link, timeout = await self._start(), self.timeout
        start = await link.call(("reopen", end, read_at, retention), timeout.seconds())
        self.behind = end - (0 if start is None else cast(int, start))
        count: int | None = None
        if start is not None:
            async for entries, after in self.changelog.read_after(cast(int, start), end):
                await link.call(("tail", entries, after), timeout.seconds(len(entries)))
                self.replayed += len(entries)
            self.applied_offset = cast(int, await link.call(("restored", end, read_at), timeout.seconds()))
        else:
            loaded = 0
            async for entries, _ in self.changelog.read_after(None, end):
                await link.call(("load", entries), timeout.seconds(len(entries)))
                loaded += len(entries)
            answer = await link.call(("loaded", end, read_at), timeout.seconds(loaded))
            count, self.applied_offset = cast(tuple[int, int], answer)
        for number, writes in sorted(self._unacknowledged.items()):
            await link.call(("hold", number, writes), timeout.seconds(len(writes)))
        self.changelog_end = end
        return count

    async def _start(self) -> Child | InProcessChild:
        """The link to the server, started at the first open (a failed child's replacement too)."""
        if self._link is not None:
            return self._link
        if self.in_process:
            server = ShardServer(self._server_args)
            self.shard = server.shard
            self._link = InProcessChild(server)
        else:
            marker_path = self.index_path.with_name(self.index_path.name + "-marker")
            if self._marker is None:
                self._marker = RecordMarker(marker_path)
            self._marker.clear()
            # this module, by the name the package was imported under
            self._link = await Child.start(__name__, (self._server_args, self.gc_freeze_every, marker_path))
        return self._link

    async def decide_chunks(self, chunks: Sequence[list[SignedMessage]]) -> AsyncGenerator[Answer, None]:
        """Decide chunks of messages in order, yielding each one's outcome and its writes for the
        changelog. The caller sends a chunk's writes before it asks for the next answer: a
        replaced decider rebuilds from the changelog, then decides again what was not answered.

        In a child, the next chunk is already queued while the caller handles an answer, so the
        child goes from one chunk to the next without waiting for the event loop (with one request
        at a time it would sit idle while the loop publishes). Close the iterator (contextlib.aclosing)
        when leaving early: a child with a request in flight is stopped, as its answer would be
        read as the next one's."""
        answered, failures, isolated = 0, 0, 0
        suspects: set[RecordAt] = set()  # records a child failed on once in this batch
        while True:
            queued = answered
            numbers: list[int] = []  # of the chunks submitted and not answered
            try:
                link = await self._replaced()
                while answered < len(chunks):
                    while queued < min(answered + QUEUED_CHUNKS, len(chunks)):
                        self.chunks += 1
                        offsets = {offset for offset, _ in chunks[queued]}
                        culprits = {at: self.culprits[at] for at in self.culprits if at[0] in offsets}
                        link.submit(("decide", chunks[queued], self.chunks, culprits))
                        numbers.append(self.chunks)
                        queued += 1
                    articles = sum(signed_count(value) for _, value in chunks[answered])
                    answer = cast(Answer, await link.receive(self.timeout.seconds(articles)))
                    answered += 1
                    self.answered = numbers.pop(0)
                    self._unacknowledged[self.answered] = answer[1]
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

    async def _replaced(self) -> Child | InProcessChild:
        """The link to decide through: a child that failed is replaced first, restored with the
        chunks it answered that are not acknowledged yet held again."""
        if self._link is None:
            assert not self.in_process, "open() first"
            if self.before_rebuild is not None:
                await self.before_rebuild()
            await self.open(replacing=True)
        assert self._link is not None
        return self._link

    async def _blame(self, failure: ChildFailed, suspects: set[RecordAt]) -> str | None:
        """After the child failed: stop it, and read which record it was on. A record it fails on
        a second time is a culprit ("culprit": remembered, and left out from now on); the first
        time, a suspect ("suspect": tried again, since a child killed from outside was on some
        record too); None when it was between records (the batch fails on the second such
        failure)."""
        link, self._link = self._link, None
        if link is not None:
            await link.end()  # no marker moves after this
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
        """Close the derived index (what is not committed is lost, as in a crash); `clean`: every
        chunk answered is committed, and a child compacts the index on the way out."""
        link, self._link, self.shard = self._link, None, None
        if link is None:
            return
        try:
            await link.call(("close", clean), CLOSE_TIMEOUT_S)
            if await link.wait(COMPACTION_AT_CLOSE_S) is None:
                log.warning("decider_compaction_cut_short pid=%d", link.pid)
        except ChildFailed as exc:
            log.error("decider_close_failed error=%r", str(exc))
        finally:
            await link.end()  # exited by itself after "close", unless it timed out or failed

    def kill(self) -> None:
        """Stop the child now, without marking its index reusable (what a crash would leave). In
        process the index stays open, as after any failure there: only the requests not answered
        yet are dropped."""
        if self._link is not None:
            self._link.stop()
            if not self.in_process:
                self._link = None


def serve(setup: object, requests: BinaryIO, answers: BinaryIO) -> None:
    """The child's loop, a ShardServer's over the pipes. `setup`, the first frame: ((params, index
    path, RocksOptions, retention), freeze interval, marker path); then ("reopen", changelog end, read
    time, how long tombstones are kept) → the offset to restore from, with ("tail", entries,
    offset after them) → None for each chunk of the changelog after it and ("restored", end, read
    time) → applied offset; or None: a rebuild, with ("load", entries) → None for each chunk of
    the changelog, and ("loaded", end, read time) → (count, applied offset); ("hold", chunk
    number, writes) → None; ("decide", messages, chunk number, culprits to leave out) →
    (outcome, writes); ("commit", chunk number, changelog end), not answered; ("close", clean) →
    "closed", which ends it (as EOF does)."""
    server_setup, freeze_every, marker_path = cast(tuple[ServerSetup, int, Path], setup)
    server = ShardServer(server_setup, RecordMarker(marker_path), freeze_every)
    write_frame(answers, "ready")
    while (message := read_frame(requests)) is not None:
        request = cast(tuple, message)
        answer = server.answer(request)
        if request[0] not in UNANSWERED:
            write_frame(answers, answer)
        server.after(request, answer)
        if request[0] == "close":
            return
    server.close(False)  # the worker went away
