"""The `index` agent and the hand-off: signatures messages, in the shard's order → the decider →
verdicts (and the filtered feed, and dead letters) published, the index's writes sent to its
changelog, each chunk settled once the broker has all of them."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import faust
import orjson
from aiokafka import TopicPartition
from faust.types import TP

from ..config import Settings
from ..messages import dead_letter_dict
from ..pipeline.collector import CollectorPolicy
from ..pipeline.decider import Decider, DeciderFailed
from ..pipeline.publication import DELETES, REPLAYS, Feed, publication
from ..pipeline.shard import BatchOutcome, EntryOutcome
from ..pipeline.wire import runs_within
from .batches import SentBatch
from .delivery import Deliveries
from .gaps import OffsetGap, following_run, in_log_order
from .outputs import Letter, Outputs
from .progress import Failure, Progress
from .topics import changelog_topic
from .transactions import Fenced, ShardTransactions

log = logging.getLogger("neardup.stream")
SHARD_KEY = b"0"
# Bytes of signatures messages per decision request: a backlog batch (up to 100 messages, each a
# sign batch of up to ~390 KB) is decided in chunks of whole messages, so that deciding and
# publishing overlap. A chunk of several messages costs one request, one layer of writes held until
# they are committed and one join of the open transaction, where a chunk per message cost one each.
DECIDE_CHUNK_BYTES = 1024 * 1024
TAKE_WITHIN_S = 0.001  # as the sign agent's (sign_agent.py)
CLOSE_WAIT_S = 30.0  # for a decision in progress at shutdown
# Signatures messages waiting for their acknowledgement to be handed off (each up to a sign batch).
# A hand-off that falls this far behind is no quicker than the consumer, which delivers them anyway.
HANDOFF_QUEUE = 16
SettleChunk = Callable[[list[Any], Callable[[], None]], Awaitable[None]]  # a chunk's sends, what they mean
# Around each chunk's sends (given the chunk): the settle to hand them to (transactions.py under
# exactly-once)
Publishing = Callable[[list[tuple[int, bytes]]], contextlib.AbstractAsyncContextManager[SettleChunk]]


async def _nothing() -> None:
    """A batch settled: under exactly-once, its transaction's commit did what it means."""


class HandOff:
    """Signatures messages this worker sent, decided as soon as the broker acknowledges them.

    Through the consumer, a signatures message reaches the index agent one fetch round trip after
    its send: about as long again as the input's own fetch. The acknowledgement gives its offset, so while
    this worker owns the shard it can be decided at once, in the shard's order: only when it follows
    the last message decided (`gaps.following_run`); otherwise (another worker's messages first,
    the shard elsewhere, a failed send) the consumer brings it, as it brings every message anyway.

    The queue holds `maxsize` messages: when it is full, the message is not handed off (nor are
    those after it, which no longer follow the last one decided) and the consumer brings it. The
    hand-off only saves latency; making the sign stage wait for it instead would tie the input's
    pace to the decisions', which the consumer's path keeps apart."""

    def __init__(self, maxsize: int = HANDOFF_QUEUE) -> None:
        self._sent: asyncio.Queue[tuple[Any, bytes]] = asyncio.Queue(maxsize)
        self.dropped = 0  # messages left to the consumer because the queue was full

    def submit(self, sent: Any, pack: bytes) -> None:
        """`sent`: what Topic.send returned, awaitable for the message's metadata."""
        if asyncio.isfuture(sent):
            try:
                self._sent.put_nowait((sent, pack))
            except asyncio.QueueFull:
                self.dropped += 1

    async def run(self, decide: Callable[[list[tuple[int, bytes]]], Awaitable[None]]) -> None:
        """In send order; whatever is acknowledged meanwhile is decided together (one pipelined
        request to the decider, as a batch from the consumer would be)."""
        while True:
            waiting = [await self._sent.get()]
            while not self._sent.empty():
                waiting.append(self._sent.get_nowait())
            messages: list[tuple[int, bytes]] = []
            for sent, pack in waiting:
                try:
                    metadata = await sent
                except Exception:  # the send failed: the sign agent's own await reports it
                    break
                messages.append((metadata.offset, pack))
            if messages:
                await decide(messages)


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
        self.outputs = outputs
        self.progress = progress
        self.failure = failure
        self.deliveries = deliveries
        self.metrics = progress.metrics
        self.changelog = changelog_topic(settings)
        self.shard = TP(settings.signatures_topic, 0)  # the index shard: one partition
        self.feed_kinds = settings.feed_kinds()
        # raised whenever the index shard is (re)assigned: the index is restored or rebuilt first
        self.needs_open = True
        # One decision at a time, whether from the index agent or from a hand-off (`HandOff`)
        self.lock = asyncio.Lock()
        # The last signatures offset decided by a hand-off since the shard's assignment: the
        # consumer delivers those messages too, and the index agent lets them pass
        self.handed_off = -1
        # Whether the group assigned the shard to this worker (a standby catches up only while not)
        self.owner = False
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
            batch = [e for e in fetched if e.message.offset > self.handed_off]
            # under exactly-once each sign transaction leaves a commit marker: a gap that holds nothing
            level = logging.INFO if self.transactions is not None else logging.ERROR
            gaps = self.progress.check_gaps(batch, level) if batch else []
            if batch:
                await self.decide(decider, await self._in_log_order(batch, gaps))
        return gaps

    async def decide(self, decider: Decider, messages: list[tuple[int, bytes]]) -> None:
        """Decide signatures messages and publish what they cause: settled as the broker
        acknowledges each chunk (at least once), or as the transaction it joined commits with the
        signatures offsets consumed (exactly once)."""
        if self.transactions is None:
            await self.decide_and_publish(decider, messages)
            return
        await self.decide_and_publish(decider, messages, self._joined)

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

    async def _in_log_order(
        self, batch: list[faust.EventT], gaps: list[OffsetGap]
    ) -> list[tuple[int, bytes]]:
        """The batch's messages (offset, value), with those of `gaps` read back in their place."""
        messages = [(event.message.offset, cast(bytes, event.value)) for event in batch]
        if not gaps:
            return messages
        delivered = [(self.shard, offset, value) for offset, value in messages]
        fills = [
            (self.shard, found.offset, found.value)
            for _, found in await self.progress.read_gaps(gaps)
            if found.value is not None
        ]
        return [(offset, value) for _, offset, value in in_log_order(delivered, gaps, fills)]

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
                    async with publishing(next(decided)) as settle:
                        changelog = await self.outputs.send_batches(self.changelog, writes, partition=0)
                        sends, counted = await self.publish(outcome)
                        sends += [batch.sent for batch in changelog]
                        await settle(sends, self._applied(changelog, counted, chunk))
        except BaseException as exc:
            # Half a batch decided: the index holds writes that may never be committed. Restore it
            # before the next batch (the re-delivered batch then replays what the changelog has).
            self.needs_open = True
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
            last = self.progress.delivered.get(self.shard)
            if self.needs_open or last is None:
                return  # the shard is not (or not yet) this worker's: the consumer brings them
            run = following_run(last, messages)
            if not run:
                return  # another worker's messages come first, or these were decided already
            try:
                await self.decide(self.decider, run)
            except Fenced:
                return  # the worker is stopping (decide reported it)
            except Exception:
                log.exception("handoff_failed: the consumer delivers these messages again")
                return
            # what the index agent's gap check (offset_gaps) records for the batches it decides
            self.progress.delivered[self.shard] = self.handed_off = run[-1][0]
            self.metrics.handed_off.inc(len(run))

    async def publish(self, outcome: BatchOutcome) -> tuple[list[Any], Callable[[], None]]:
        """Send a chunk's verdicts, feed messages and dead letters; returns the sends and what
        counts them once they are acknowledged."""
        metrics = self.metrics
        verdicts: list[tuple[bytes | None, bytes | None]] = []
        letters: list[Letter] = []
        # counted per chunk, not per verdict: a labelled counter's increment costs the event loop
        counts: collections.Counter[tuple[Any, str | None]] = collections.Counter()
        latencies: list[float] = []
        feed: list[tuple[bytes | None, bytes | None]] = []  # (key, input message) for the filtered feed
        feed_headers: list[Any] = []
        expired = 0
        feed_kinds = self.feed_kinds if self.settings.unique_topic else None
        for entry in outcome.entries:
            what = publication(
                entry.status,
                entry.kind,
                deletion=entry.deletion,
                has_verdict=entry.verdict is not None and entry.article_id is not None,
                feed_kinds=feed_kinds,
                replays_republished=self.transactions is None,
            )
            if what.dead_letter:
                letters.append(self._index_error(entry))
                continue
            if entry.status in REPLAYS:
                counts[(metrics.replays, entry.status)] += 1
            if what.answered_before:
                continue
            expired += entry.expired
            if entry.article_id is None:
                continue
            key = entry.article_id.encode()
            if what.removal:
                if entry.status in DELETES:
                    counts[(metrics.deletes, entry.status)] += 1
                verdicts.append((key, None))
            elif what.verdict:
                if entry.status != "replayed":
                    counts[(metrics.verdicts, entry.kind)] += 1
                    if entry.latency_ms is not None:
                        latencies.append(entry.latency_ms / 1000.0)
                verdicts.append((key, entry.verdict))
            if what.feed is Feed.REMOVAL:
                feed.append((key, None))
                feed_headers.append(())
            elif what.feed is Feed.COPY and entry.original is not None:
                feed.append((key, entry.original))
                feed_headers.append(entry.headers)
        # Keyed by article id, so that every verdict of an article lands in the same partition.
        sends = await self.outputs.send(self.settings.verdicts_topic, verdicts)
        sends += await self.outputs.dead_letters(letters)
        if feed:
            sends += await self.outputs.send(self.settings.unique_topic, feed, headers=feed_headers)
        self.collector.after(outcome.handled)

        def counted() -> None:
            for (counter, label), count in counts.items():
                counter.labels(label).inc(count)
            for latency in latencies:
                metrics.latency.observe(latency)
            if expired:
                metrics.expired.inc(expired)
            self.outputs.count_dead_letters(letters)
            if feed:
                metrics.fed.inc(len(feed))
            metrics.indexed.set(outcome.indexed)
            metrics.clusters.set(outcome.clusters)
            metrics.buckets.set(outcome.buckets)
            metrics.largest_bucket.set(outcome.largest_bucket)
            metrics.anchor_postings.set(outcome.anchor_postings)
            metrics.boilerplate_anchors.set(outcome.boilerplate_anchors)
            if outcome.bytes_on_disk is not None:
                metrics.index_bytes.set(outcome.bytes_on_disk)
            if outcome.oldest_ms is not None:
                metrics.oldest.set(outcome.oldest_ms / 1000.0)
            if outcome.newest_ms is not None:
                metrics.newest.set(outcome.newest_ms / 1000.0)

        return sends, counted

    def _index_error(self, entry: EntryOutcome) -> Letter:
        """A record the index stage could not handle, as a dead letter: under the input message it
        came from when that is known (an isolated record's), else under the signatures message
        (they all come from the shard's one partition, under its key)."""
        topic, offset, key = self.settings.signatures_topic, entry.offset, SHARD_KEY
        partition: int | None = 0
        if entry.source is not None and entry.article_id is not None:
            topic, partition, offset = entry.source.topic, entry.source.partition, entry.source.offset
            key = entry.article_id.encode()
        log.error(
            "index_error reason=%s topic=%s partition=%s offset=%d error=%s",
            entry.reason,
            topic,
            partition,
            offset,
            entry.error,
        )
        assert entry.payload is not None and entry.error is not None
        record = dead_letter_dict(entry.reason, entry.error, entry.payload, topic, partition, offset, key)
        return entry.reason, orjson.dumps(record), key

    async def on_assigned(self, sender: Any, assigned: Any = None, **_: Any) -> None:
        # Faust starts every partition again from its committed offset: what was delivered before
        # says nothing about what comes next (the shard's is set again from the applied offset).
        self.progress.delivered.clear()
        self.handed_off = -1
        for tp in assigned or ():
            self.progress.took(tp.topic)  # no batch yet: none was due
        owner, self.owner = self.owner, self.shard in set(assigned or ())
        if self.owner and not owner:
            # No longer a standby from now on, not from the standby's next step: the owner may
            # decide a whole backlog before that step runs.
            self.metrics.standby.set(0)
            # when a takeover starts: the index opens at the shard's first batch, after this
            log.info("index_shard_assigned topic=%s partition=0", self.shard.topic)
        if any(tp.topic == self.settings.signatures_topic for tp in assigned or ()):
            self.needs_open = True

    async def on_revoked(self, sender: Any, revoked: Any = None, **_: Any) -> None:
        # No hand-off once the shard may be another worker's: it waits for the next assignment.
        self.progress.delivered.pop(self.shard, None)
        if self.shard in set(revoked or ()):
            self.owner = False

    async def close(self, sender: Any, **_: Any) -> None:
        """At shutdown, once the consumer has stopped: no batch comes from it any more, and no
        hand-off starts (the shard is no longer this worker's); one in progress ends first. The
        index is then closed, compacted when the changelog acknowledged everything it decided."""
        self.progress.delivered.pop(self.shard, None)
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
        if self.needs_open:
            await self.deliveries.drain()  # the changelog holds everything decided so far
            if self.transactions is not None:
                # a new producer epoch at each assignment: it fences whoever held the shard before
                await self.transactions.stop()
                await self.transactions.start()
            await self.decider.open()
            self.needs_open = False
            # The shard's next message follows the last one the index says was applied: a first
            # message beyond it is a gap too.
            self.progress.delivered[self.shard] = self.decider.applied_offset
        return self.decider
