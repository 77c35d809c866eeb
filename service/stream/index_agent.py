"""The `index` agent and the hand-off: signatures messages, in the shard's order → the decider →
verdicts (and the filtered feed, and dead letters) published, the index's writes sent to its
changelog, each chunk settled once the broker has all of them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import faust
from aiokafka import TopicPartition
from faust.types import TP

from ..config import Settings
from ..pipeline.collector import CollectorPolicy
from ..pipeline.decider import Decider, DeciderFailed
from ..pipeline.delivery import Deliveries
from ..pipeline.health import Failure
from ..pipeline.lifecycle import ShardLifecycle
from ..pipeline.order import OffsetGap
from ..pipeline.wire import runs_within
from .batches import SentBatch
from .outputs import IndexPublisher, Outputs
from .progress import Progress
from .topics import changelog_topic
from .transactions import Fenced, ShardTransactions

log = logging.getLogger("neardup.stream")
# Bytes of signatures messages per decision request: a backlog batch (up to 100 messages, each a
# sign batch of up to ~390 KB) is decided in chunks of whole messages, so that deciding and
# publishing overlap. A chunk of several messages costs one request, one layer of writes held until
# they are committed and one join of the open transaction, where a chunk per message cost one each.
DECIDE_CHUNK_BYTES = 1024 * 1024
TAKE_WITHIN_S = 0.001  # as the sign agent's (sign_agent.py)
CLOSE_WAIT_S = 30.0  # for a decision in progress at shutdown
SettleChunk = Callable[[list[Any], Callable[[], None]], Awaitable[None]]  # a chunk's sends, what they mean
# Around each chunk's sends (given the chunk): the settle to hand them to (transactions.py under
# exactly-once)
Publishing = Callable[[list[tuple[int, bytes]]], contextlib.AbstractAsyncContextManager[SettleChunk]]


async def _nothing() -> None:
    """A batch settled: under exactly-once, its transaction's commit did what it means."""


class CommitPoint:
    """Exactly once: where the index's commit point goes as the shard's transactions commit. A
    chunk's writes are committed to the index with where its changelog records end; the
    transaction's commit marker then follows its last record, so once it is committed the point
    moves past the marker too (`committed`, the writer's after_commit)."""

    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self._wrote_changelog = False  # in the transaction being committed
        self._last_applied = 0  # its last chunk

    def applied(self, end: int | None, chunk: int) -> None:
        """A chunk of the transaction being committed, whose changelog records end at `end`
        (None: it wrote none): its writes committed to the index."""
        self._wrote_changelog = self._wrote_changelog or end is not None
        self._last_applied = chunk
        self.decider.acknowledged(end, chunk)

    def committed(self) -> None:
        if self._wrote_changelog:
            self._wrote_changelog = False
            self.decider.acknowledged(self.decider.changelog_end + 1, self._last_applied)


def index_opened(metrics: Any, decider: Decider, count: int | None, seconds: float) -> None:
    """Every open of the index, at an assignment or by a replacement decider child: logged and
    counted."""
    metrics.index_opens.labels(decider.opened).inc()
    metrics.index_replayed.inc(decider.replayed)
    if count is None:
        log.info("index_restored records_replayed=%d seconds=%.2f", decider.replayed, seconds)
    else:
        log.info("index_rebuilt articles=%d seconds=%.2f", count, seconds)


class IndexAgent:
    """The `index` agent and the hand-off: signatures messages, in the shard's order → the decider →
    verdicts (and the filtered feed, and dead letters) published, the index's writes sent to its
    changelog, settled once the broker has all of them (`deliveries`)."""

    def __init__(
        self,
        settings: Settings,
        decider: Decider,
        collector: CollectorPolicy,
        outputs: Outputs,
        publisher: IndexPublisher,
        progress: Progress,
        failure: Failure,
        deliveries: Deliveries,
        transactions: ShardTransactions | None = None,
        commit_point: CommitPoint | None = None,
    ) -> None:
        self.settings = settings
        # exactly-once: each batch's writes and the signatures offsets it consumed in one transaction
        self.transactions = transactions
        self.decider = decider
        self.collector = collector
        self.outputs = outputs  # the changelog's
        self.publisher = publisher
        self.progress = progress
        self.failure = failure
        self.deliveries = deliveries
        self.metrics = progress.metrics
        self.changelog = changelog_topic(settings)
        self.shard = TP(settings.signatures_topic, 0)  # the index shard: one partition
        self.lifecycle = ShardLifecycle(self.shard, progress.delivered)
        # One decision at a time, whether from the index agent or from a hand-off (`HandOff`)
        self.lock = asyncio.Lock()
        # exactly once: the index's commit point past each transaction's commit marker (the
        # shard's writer calls its `committed`)
        self.commit_point = commit_point

    async def run(self, stream: Any) -> None:  # faust.Stream; StreamT does not declare take_events
        async for fetched in stream.take_events(100, within=TAKE_WITHIN_S):
            gaps = await self.handle(fetched)

            async def acknowledge(fetched: list[Any] = fetched, gaps: list[OffsetGap] = gaps) -> None:
                # after the settling of every chunk of the batch (and of the hand-offs before it)
                await self.progress.allow_commits_past(gaps)
                await stream.acknowledge(fetched)
                self.progress.record_lag(fetched)

            await self.deliveries.settle((), acknowledge)

    async def handle(self, fetched: list[faust.EventT]) -> list[OffsetGap]:
        """Decide a fetched batch and send what it causes; returns the gaps it filled, which its
        acknowledgement lets the commits go past."""
        self.progress.took(self.settings.signatures_topic)
        async with self.lock:
            decider = await self._open_decider()
            # decided already, as soon as this worker's send of them was acknowledged
            batch = [e for e in fetched if not self.lifecycle.handed_off_already(e.message.offset)]
            # under exactly-once each sign transaction leaves a commit marker: a gap that holds nothing;
            # a signatures message read back without a value carries no records
            level = logging.INFO if self.transactions is not None else logging.ERROR
            gaps, messages = await self.progress.in_log_order(
                batch, level, lambda event: cast(bytes, event.value), lambda _, found: found.value
            )
            if messages:
                await self.decide(decider, [(offset, value) for _, offset, value in messages])
        return gaps

    async def decide(self, decider: Decider, messages: list[tuple[int, bytes]]) -> None:
        """Decide signatures messages and publish what they cause: settled as the broker
        acknowledges each chunk (at least once), or as the transaction it joined commits with the
        signatures offsets consumed (exactly once)."""
        await self.decide_and_publish(decider, messages, None if self.transactions is None else self._joined)

    @contextlib.asynccontextmanager
    async def _joined(self, chunk: list[tuple[int, bytes]]) -> AsyncIterator[SettleChunk]:
        """Exactly once: a chunk's sends in the shard's open transaction, with the signatures
        offset after the chunk's last message; the index commits the chunk's writes, and its
        counters count, once that transaction is committed."""
        assert self.transactions is not None
        offsets = {TopicPartition(self.shard.topic, self.shard.partition): chunk[-1][0] + 1}
        async with self.transactions.joined(offsets) as transaction:

            async def settle(sends: list[Any], applied: Callable[[], None]) -> None:
                transaction.sends.extend(sends)
                transaction.on_commit.append(applied)

            yield settle
        await self.deliveries.settle([transaction.committed], _nothing)

    async def decide_and_publish(
        self,
        decider: Decider,
        messages: list[tuple[int, bytes]],
        publishing: Publishing | None = None,
    ) -> None:
        """Decide signatures messages (in the shard's order, following the last one decided), send
        each chunk's writes to the changelog and its verdicts within `publishing(chunk)`, and hand them
        to the settle it gives (the index stage's deliveries by default). The index holds a chunk's
        writes aside until they are durable (Decider.acknowledged): it never reflects what the
        changelog lacks."""
        publishing = publishing or self._settled
        chunks = runs_within(messages, lambda message: len(message[1]), DECIDE_CHUNK_BYTES)
        # Pipelined: the decider works on the next chunk while the loop publishes this one.
        try:
            async with contextlib.aclosing(decider.decide_chunks(chunks)) as answers:
                decided = iter(chunks)  # one answer per chunk, in their order
                async for outcome, writes in answers:
                    chunk = decider.answered
                    async with publishing(in_chunk := next(decided)) as settle:
                        changelog = await self.outputs.send_batches(self.changelog, writes, partition=0)
                        sends, counted = await self.publisher.publish(outcome, in_chunk)
                        self.collector.after(outcome.handled)
                        sends += [batch.sent for batch in changelog]
                        await settle(sends, self._applied(changelog, counted, chunk))
        except BaseException as exc:
            # Half a batch decided: the index holds writes that may never be committed. Restore it
            # before the next batch (the re-delivered batch then replays what the changelog has).
            self.lifecycle.needs_open = True
            if isinstance(exc, DeciderFailed):
                self.failure.fail(f"index_unavailable: {exc}; stopping the worker")
            raise

    @contextlib.asynccontextmanager
    async def _settled(self, chunk: list[tuple[int, bytes]]) -> AsyncIterator[SettleChunk]:
        """At least once: a chunk's sends settled by the stage's deliveries."""
        yield self.deliveries.settle

    def _applied(
        self, changelog: list[SentBatch], counted: Callable[[], None], chunk: int
    ) -> Callable[[], None]:
        """What a chunk's acknowledgement means: the changelog holds its writes, so the index
        commits them with where the changelog ends, and its counters count."""

        def apply() -> None:
            end = None
            if changelog:
                last = changelog[-1]  # one partition: the last batch holds the last write
                end = last.sent.result().offset + last.messages
            if self.commit_point is not None:
                self.commit_point.applied(end, chunk)
            else:
                self.decider.acknowledged(end, chunk)
            counted()

        return apply

    async def decide_handed_off(self, messages: list[tuple[int, bytes]]) -> None:
        """Signatures messages this worker sent, decided on their acknowledgement (`HandOff`)."""
        async with self.lock:
            run = self.lifecycle.to_hand_off(messages)
            if not run:
                return  # not this worker's to decide now: the consumer brings them
            try:
                await self.decide(self.decider, run)
            except Fenced:
                return  # the worker is stopping (decide reported it)
            except Exception:
                log.exception("handoff_failed: the consumer delivers these messages again")
                return
            self.lifecycle.handed(run[-1][0])
            self.metrics.handed_off.inc(len(run))

    async def on_assigned(self, sender: Any, assigned: Any = None, **_: Any) -> None:
        for tp in assigned or ():
            self.progress.took(tp.topic)  # no batch yet: none was due
        if self.lifecycle.assigned(set(assigned or ())):
            # No longer a standby from now on, not from the standby's next step: the owner may
            # decide a whole backlog before that step runs.
            self.metrics.standby.set(0)
            # when a takeover starts: the index opens at the shard's first batch, after this
            log.info("index_shard_assigned topic=%s partition=0", self.shard.topic)

    async def on_revoked(self, sender: Any, revoked: Any = None, **_: Any) -> None:
        self.lifecycle.revoked(set(revoked or ()))

    async def close(self, sender: Any, **_: Any) -> None:
        """At shutdown, once the consumer has stopped: no batch comes from it any more, and no
        hand-off starts (the shard is no longer this worker's); one in progress ends first. The
        index is then closed, compacted when the changelog acknowledged everything it decided."""
        self.lifecycle.stop_handing_off()
        clean = False
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self.lock.acquire()  # held to the end: nothing decides after this
            if not self.failure.failed:  # after a failure, what is unsettled stays so
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self.deliveries.drain()
                clean = not self.failure.failed
        except TimeoutError:
            log.error("index_close: a decision still runs after %.0f s; closing anyway", CLOSE_WAIT_S)
        await self.decider.close(clean=clean)
        await self.progress.log_reader.close()
        if self.transactions is not None:
            await self.transactions.stop(commit=clean)

    async def _open_decider(self) -> Decider:
        """The index stage: at every assignment of the shard, restored (the changelog after its
        committed offset applied) or rebuilt from the changelog."""
        if self.lifecycle.needs_open:
            await self.deliveries.drain()  # the changelog holds everything decided so far
            if self.transactions is not None:
                # a new producer epoch at each assignment: it fences whoever held the shard before
                await self.transactions.stop()
                await self.transactions.start()
            await self.decider.open()
            self.lifecycle.opened(self.decider.applied_offset)
        return self.decider
