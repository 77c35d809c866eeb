"""The `index` agent and the hand-off: signatures messages, in the shard's order → the decider →
verdicts (and the filtered feed, and dead letters) published, the index's writes sent to its
changelog, each chunk settled once the broker has all of them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any, cast

import faust
from faust.types import TP

from ..config import Settings
from ..pipeline.collector import CollectorPolicy
from ..pipeline.decider import Decider, DeciderFailed
from ..pipeline.delivery import Deliveries
from ..pipeline.health import Failure
from ..pipeline.lifecycle import ShardLifecycle
from ..pipeline.order import OffsetGap
from ..pipeline.wire import runs_within
from .outputs import ChangelogSends, IndexPublisher, Outputs
from .progress import Progress
from .topics import changelog_topic
from .transactions import AtLeastOnce, CommitPoint, ExactlyOnce, Fenced, ShardTransactions

log = logging.getLogger("neardup.stream")
# Bytes of signatures messages per decision request: a backlog batch (up to 100 messages, each a
# sign batch of up to ~390 KB) is decided in chunks of whole messages, so that deciding and
# publishing overlap. A chunk of several messages costs one request, one layer of writes held until
# they are committed and one join of the open transaction, where a chunk per message cost one each.
DECIDE_CHUNK_BYTES = 1024 * 1024
CLOSE_WAIT_S = 30.0  # for a decision in progress at shutdown


def index_opened(metrics: Any, decider: Decider, count: int | None, seconds: float) -> None:
    """Every open of the index, at an assignment or by a replacement decider child: logged and
    counted."""
    metrics.index_opens.labels(decider.opened).inc()
    metrics.index_replayed.inc(decider.replayed)
    if count is None:
        log.info("index_restored records_replayed=%d seconds=%.2f", decider.replayed, seconds)
    else:
        log.info("index_rebuilt articles=%d seconds=%.2f", count, seconds)


@dataclass(eq=False, repr=False)  # compared and shown as itself, not by what it holds
class IndexAgent:
    """The `index` agent and the hand-off: signatures messages, in the shard's order → the decider →
    verdicts (and the filtered feed, and dead letters) published, the index's writes sent to its
    changelog, settled once the broker has all of them (`deliveries`)."""

    settings: Settings
    decider: Decider
    outputs: Outputs
    progress: Progress
    failure: Failure
    deliveries: Deliveries
    # exactly-once: each chunk's sends and the signatures offsets it consumed in one transaction,
    # and the index's commit point past each transaction's commit marker (the writer's after_commit)
    transactions: ShardTransactions | None = None
    commit_point: CommitPoint | None = None

    def __post_init__(self) -> None:
        self.collector = CollectorPolicy(self.settings.gc_freeze_every)
        self.publisher = IndexPublisher(self.settings, self.outputs)
        self.metrics = self.progress.metrics
        self.shard = TP(self.settings.signatures_topic, 0)  # the index shard: one partition
        self.lifecycle = ShardLifecycle(self.shard, self.progress.delivered)
        # One decision at a time, whether from the index agent or from a hand-off (`HandOff`)
        self.lock = asyncio.Lock()
        self.guarantee = AtLeastOnce(self.deliveries)
        if self.transactions is not None:
            self.guarantee = ExactlyOnce(self.transactions, self.deliveries, self.shard)
        acknowledged = self.decider.acknowledged if self.commit_point is None else self.commit_point.applied
        self.changelog = ChangelogSends(self.outputs, changelog_topic(self.settings), acknowledged)

    async def run(self, stream: Any) -> None:  # faust.Stream; StreamT does not declare take_events
        async for fetched in stream.take_events(100):
            await self.progress.hold_if_failed()
            gaps = await self.handle(fetched)
            # acknowledged after the settling of every chunk of the batch (and of the hand-offs before it)
            acknowledge = functools.partial(self.progress.acknowledge, stream, fetched, gaps)
            await self.deliveries.settle((), acknowledge)

    async def handle(self, fetched: list[faust.EventT]) -> list[OffsetGap]:
        """Decide a fetched batch and send what it causes; returns the gaps it filled, which its
        acknowledgement lets the commits go past."""
        self.progress.took(self.settings.signatures_topic)
        async with self.lock:
            # at every assignment of the shard, the index restored (the changelog after its
            # committed offset applied) or rebuilt from the changelog
            if self.lifecycle.needs_open:
                await self.deliveries.drain()  # the changelog holds everything decided so far
                await self.guarantee.restart()
                await self.decider.open()
                self.lifecycle.opened(self.decider.applied_offset)
            # decided already, as soon as this worker's send of them was acknowledged
            batch = [e for e in fetched if e.message.offset > self.lifecycle.handed_off]
            # a signatures message read back without a value carries no records
            gaps, messages = await self.progress.in_log_order(
                batch, self.guarantee.gap_level, lambda e: cast(bytes, e.value), lambda _, m: m.value
            )
            if messages:
                await self.decide([(offset, value) for _, offset, value in messages])
        return gaps

    async def decide(self, messages: list[tuple[int, bytes]]) -> None:
        """Decide signatures messages (in the shard's order, following the last one decided) and
        send what each chunk causes, its writes to the changelog first, settled as the guarantee
        says (transactions.py: AtLeastOnce, ExactlyOnce)."""
        chunks = runs_within(messages, lambda message: len(message[1]), DECIDE_CHUNK_BYTES)
        # Pipelined: the decider works on the next chunk while the loop publishes this one.
        try:
            async with contextlib.aclosing(self.decider.decide_chunks(chunks)) as answers:
                decided = iter(chunks)  # one answer per chunk, in their order
                async for outcome, writes in answers:
                    chunk = self.decider.answered
                    async with self.guarantee.chunk(in_chunk := next(decided)) as settle:
                        changelog = await self.changelog.send(writes)
                        sends, counted = await self.publisher.publish(outcome, in_chunk)
                        self.collector.after(outcome.handled)
                        sends += [batch.sent for batch in changelog]
                        await settle(sends, self.changelog.applied(changelog, chunk, counted))
        except BaseException as exc:
            # Half a batch decided: the index holds writes that may never be committed. Restore it
            # before the next batch (the re-delivered batch then replays what the changelog has).
            self.lifecycle.needs_open = True
            if isinstance(exc, DeciderFailed):
                self.failure.fail(f"index_unavailable: {exc}; stopping the worker")
            raise

    async def decide_handed_off(self, messages: list[tuple[int, bytes]]) -> None:
        """Signatures messages this worker sent, decided on their acknowledgement (`HandOff`)."""
        async with self.lock:
            if not (run := self.lifecycle.to_hand_off(messages)):
                return  # not this worker's to decide now: the consumer brings them
            try:
                await self.decide(run)
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
        await self.guarantee.stop(commit=clean)
