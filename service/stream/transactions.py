"""The stages' writes in Kafka transactions (NEARDUP_PROCESSING_GUARANTEE=exactly_once).

One transactional producer per index shard (`<app_id>-index-<shard>`) and one per input partition
(`<app_id>-sign-<topic>-<partition>`), each under an id stable across restarts and workers:
whichever worker starts it fences every earlier producer of that id (a previous owner paused or
cut off: its next write fails with ProducerFenced) and aborts what it left open. A batch's verdicts,
feed messages, dead letters and changelog records commit with the signatures offsets it consumed,
or not at all: the changelog and the group's offsets move together, and a consumer reading
committed records sees each verdict once. Batches commit in group (TransactionalWriter).

aiokafka's send_offsets_to_transaction carries no group generation (KIP-447), so fencing comes from
the transactional id, as in Kafka Streams' first exactly-once mode.

An abort is final for its writer (`Ended`): the batches decided or signed after the aborted ones
were built on top of them (the index's held writes, a partition's order), so no later transaction
of the writer may commit. The writer refuses every later transaction, and the stage is failed at
once (`failed`): the worker stops and its restart resumes from what was committed, as Kafka
Streams treats a producer error it cannot retry. The same when something run after a commit
raises (`post_commit_failed`): the commit stands, but what the stage holds beside it (the index's
commit point) may not follow it.

The index stage settles each decided chunk as its guarantee says (AtLeastOnce, or ExactlyOnce in
the shard's transactions), and under exactly-once the index's commit point follows the commits
(CommitPoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from ..config import Settings
from ..errors import Error
from ..pipeline.decider import Decider
from ..pipeline.delivery import Deliveries
from .framework import coordinator_lookups_retried
from .topics import max_request_bytes

log = logging.getLogger("neardup.stream")
# What fencing looks like from the fenced side: another producer took the id (ProducerFenced), or
# the broker has a newer epoch for it than the one this producer holds.
FENCED_ERRORS: tuple[type[BaseException], ...] = (ProducerFenced, InvalidProducerEpoch)
SettleChunk = Callable[[list[Any], Callable[[], None]], Awaitable[None]]  # a chunk's sends, what they mean


class Fenced(Error, RuntimeError):
    """Another producer took this shard's transactional id: this worker no longer owns the shard
    and must not write anything more (it stops, and exits non-zero)."""


class Ended(Error, RuntimeError):
    """A transaction of this writer aborted, or what runs after a commit failed: the writer commits
    nothing more, and the stage resumes from what was committed (the worker's restart)."""


@dataclass
class Transaction:
    """The open transaction, as each batch that joins it sees it: the producer to send through,
    and what the batch adds (`sends` to await before the commit, `on_commit` run in order once it
    is committed); `committed` resolves when it is committed, or fails with why it was not."""

    producer: AIOKafkaProducer
    committed: asyncio.Future[None]
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    sends: list[Any] = field(default_factory=list)
    on_commit: list[Callable[[], None]] = field(default_factory=list)


class TransactionalWriter:
    """One transactional producer: started when what it writes for is assigned (which fences any
    earlier owner), its batches committed in group (`joined`).

    A commit costs several round trips to the coordinators, and a producer has one transaction
    at a time: one per batch would bound the stage to a few dozen batches a second, whatever
    their size. So batches join the open transaction, and its commit waits only for those that
    joined before it was due (it is due as soon as the first one joins); those that come while it
    commits open the next. Light load commits each batch at once; under load each commit carries
    what arrived during the previous one, as a group commit does; `commit_interval` spaces the
    commits further, as Kafka Streams' commit.interval.ms does."""

    def __init__(
        self,
        settings: Settings,
        transactional_id: str | None = None,  # None: the index shard's
        fenced: Callable[[Fenced], None] | None = None,
        counted: Callable[[str], None] | None = None,
        failed: Callable[[str], None] | None = None,
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.transactional_id = transactional_id or f"{settings.app_id}-index-0"
        self.producer: AIOKafkaProducer | None = None
        # sends into the open transaction and its commit, one at a time, in the order they came
        self.lock = asyncio.Lock()
        self._open: Transaction | None = None
        self._commit_due: asyncio.Future[None] | None = None
        self._last_commit = float("-inf")  # when the last commit began (the event loop's clock)
        self._on_fenced = fenced or (lambda fence: None)  # told of a fence once, wherever it shows
        self.fenced: Fenced | None = None
        # told each transaction's outcome, "committed" or "aborted"
        self._counted = counted or (lambda outcome: None)
        # told why the writer ended (an abort, a failure after a commit)
        self._on_failed = failed or (lambda reason: None)
        self.ended: Ended | None = None
        # run under the lock after each commit, after the batches' own on_commit
        self.after_commit = after_commit or (lambda: None)

    async def start(self) -> AIOKafkaProducer:
        """The producer, started once: its start registers the transactional id with the
        coordinator, fencing every earlier producer of the id and aborting its open transaction."""
        if self.ended is not None:
            raise self.ended  # later batches were built on what aborted: none may commit
        if self.producer is None:
            producer = coordinator_lookups_retried(
                AIOKafkaProducer(
                    bootstrap_servers=self.settings.bootstrap_servers,
                    transactional_id=self.transactional_id,
                    transaction_timeout_ms=round(self.settings.transaction_timeout * 1000),
                    acks="all",
                    enable_idempotence=True,
                    request_timeout_ms=round(self.settings.delivery_timeout * 1000),
                    max_request_size=max_request_bytes(self.settings),
                    max_batch_size=512 * 1024,  # as the worker's other producer (app.py)
                    linger_ms=2,
                    **self.settings.client_security(),
                )
            )
            try:
                await producer.start()
            except FENCED_ERRORS as exc:
                await producer.stop()
                raise self._fence(exc) from exc
            self.producer = producer
            log.info("transactions_started transactional_id=%s", self.transactional_id)
        return self.producer

    @contextlib.asynccontextmanager
    async def joined(self, offsets: dict[TopicPartition, int]) -> AsyncIterator[Transaction]:
        """The open transaction (begun if none is), for the block to send a batch through; it
        commits with `offsets` (the next offset to consume, per partition, for the group) and
        what else joined it. A block that raises aborts the transaction, and with it the batches
        that joined it before (their `committed` fails too)."""
        async with self.lock:
            transaction = self._open or await self._begin()
            try:
                yield transaction
            except FENCED_ERRORS as exc:
                fenced = self._fence(exc)
                await self._end_aborted(transaction, fenced)
                raise fenced from exc
            except BaseException as exc:
                await self._end_aborted(transaction, exc)
                raise
            for tp, offset in offsets.items():
                transaction.offsets[tp] = max(offset, transaction.offsets.get(tp, offset))

    async def _begin(self) -> Transaction:
        if self.fenced is not None:
            raise self.fenced  # the producer is done for: nothing more is sent through it
        producer = await self.start()
        try:
            await producer.begin_transaction()
        except FENCED_ERRORS as exc:
            raise self._fence(exc) from exc
        self._open = Transaction(producer, asyncio.get_running_loop().create_future())
        # queued on the lock behind this batch and those already waiting: they join first
        self._commit_due = asyncio.ensure_future(self._commit_when_due())
        return self._open

    async def _commit_when_due(self) -> None:
        """At least `commit_interval` after the previous commit began: under load, the batches
        of that interval share one transaction (its round trips, and its marker in each partition
        it wrote, which the index stage reads past)."""
        wait = self._last_commit + self.settings.commit_interval - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)
        async with self.lock:
            await self._commit_open()

    async def _commit_open(self) -> None:
        """Commit the open transaction, if any (under the lock)."""
        transaction, self._open = self._open, None
        if transaction is None:
            return
        self._last_commit = asyncio.get_running_loop().time()
        try:
            await self._commit(transaction)
        except BaseException as exc:
            await self._end_aborted(transaction, exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._counted("committed")
        try:
            for then in [*transaction.on_commit, self.after_commit]:
                then()
        except Exception as exc:
            # Committed in Kafka; what the stage keeps beside it may not have followed
            log.exception("post_commit_failed transactional_id=%s", self.transactional_id)
            ended = self._end(f"post_commit_failed transactional_id={self.transactional_id} error={exc!r}")
            transaction.committed.set_exception(ended)
            transaction.committed.exception()  # whoever joined reports it; not unretrieved
            return
        transaction.committed.set_result(None)

    async def _commit(self, transaction: Transaction) -> None:
        """The offsets go to the group coordinator while the batches' sends are still being
        acknowledged (nothing of either is visible before the commit), and the commit follows
        both: a commit waits for the slower of the two, not for their sum."""
        producer = transaction.producer
        steps: list[Any] = list(transaction.sends)
        if transaction.offsets:
            steps.append(producer.send_offsets_to_transaction(transaction.offsets, self.settings.app_id))
        try:
            # every step ended before the transaction is aborted for the first that failed
            for outcome in await asyncio.gather(*steps, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
            await producer.commit_transaction()
        except FENCED_ERRORS as exc:
            raise self._fence(exc) from exc

    async def _end_aborted(self, transaction: Transaction, exc: BaseException) -> None:
        """Abort the transaction, unless the producer can no longer (fenced, or stopping): the
        coordinator then aborts it itself (on the next owner's start, or its timeout)."""
        if self._open is transaction:
            self._open = None
        if isinstance(exc, Exception) and not isinstance(exc, Fenced | Ended):
            self._end(f"transaction_aborted transactional_id={self.transactional_id} error={exc!r}")
        elif self.ended is None:
            # a stop (cancelled, fenced, or after a failure) ends the writer too, failing nothing
            self.ended = Ended(f"{self.transactional_id}: stopped with a transaction open ({exc!r})")
        if not isinstance(exc, Fenced):
            try:
                await transaction.producer.abort_transaction()
            except Exception as error:
                log.warning(
                    "transaction_abort_failed transactional_id=%s error=%r", self.transactional_id, error
                )
        self._counted("aborted")
        if not transaction.committed.done():
            failure = exc if isinstance(exc, Exception) else RuntimeError(f"transaction ended: {exc!r}")
            transaction.committed.set_exception(failure)
            transaction.committed.exception()  # whoever joined reports it; not unretrieved

    def _end(self, reason: str) -> Ended:
        """The writer commits nothing more, and the stage is failed (once, with the first reason)."""
        if self.ended is None:
            self.ended = Ended(reason)
            self._on_failed(reason)
        return self.ended

    def _fence(self, exc: BaseException) -> Fenced:
        if self.fenced is None:
            self.fenced = Fenced(f"{self.transactional_id}: {exc!r}")
            self._on_fenced(self.fenced)
        return self.fenced

    async def stop(self, commit: bool = True) -> None:
        """Commit what is open (abort it when not `commit`: after a failure, what is unsettled
        stays so), then stop the producer."""
        async with self.lock:
            if commit:
                with contextlib.suppress(Exception):
                    await self._commit_open()
            elif self._open is not None:
                await self._end_aborted(self._open, Ended("the worker stops after a failure"))
            if self.producer is not None:
                producer, self.producer = self.producer, None
                await producer.stop()


class ShardTransactions(TransactionalWriter):
    """The index shard's writer (the transactional id's default): its verdicts, feed, dead letters
    and changelog."""

    def started_producer(self) -> AIOKafkaProducer:
        """What Outputs sends through for the index stage: the shard's transactional producer."""
        assert self.producer is not None, "the shard's transactions start with its assignment"
        return self.producer


class InputTransactions:
    """The sign stage's writers, one per input partition (aiokafka's offsets carry no group
    generation, so a writer is fenced by the next owner of its partition only if the id is the
    partition's): a partition's signatures and dead letters commit with its input offsets."""

    def __init__(
        self, settings: Settings, fenced: Callable[[Fenced], None], failed: Callable[[str], None]
    ) -> None:
        self.settings = settings
        self.fenced = fenced
        self.failed = failed
        self.writers: dict[tuple[str, int], TransactionalWriter] = {}

    def writer(self, topic: str, partition: int) -> TransactionalWriter:
        if (topic, partition) not in self.writers:
            transactional_id = f"{self.settings.app_id}-sign-{topic}-{partition}"
            self.writers[topic, partition] = TransactionalWriter(
                self.settings, transactional_id, self.fenced, failed=self.failed
            )
        return self.writers[topic, partition]

    async def revoked(self, partitions: list[tuple[str, int]], commit: bool = True) -> None:
        """The partitions went to another worker (or will come back): what their writers hold
        open is committed, they stop, and a new one (a new epoch) starts at the next assignment."""
        for key in partitions:
            if (writer := self.writers.pop(key, None)) is not None:
                await writer.stop(commit)


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


class AtLeastOnce:
    """How the index stage's chunks are settled at least once: each chunk's sends by the stage's
    deliveries, as the broker acknowledges them. On a topic written without transactions, a gap in
    the shard's offsets is messages the consumer went past."""

    gap_level = logging.ERROR

    def __init__(self, deliveries: Deliveries) -> None:
        self.deliveries = deliveries

    @contextlib.asynccontextmanager
    async def chunk(self, messages: list[tuple[int, bytes]]) -> AsyncIterator[SettleChunk]:
        """Around a chunk's sends: the settle to hand them to."""
        yield self.deliveries.settle

    async def restart(self) -> None:
        """At each assignment of the shard, before the index opens: nothing to fence."""

    async def stop(self, commit: bool) -> None:
        """At shutdown: nothing is held open."""


class ExactlyOnce(AtLeastOnce):
    """Exactly once: each chunk's sends in the shard's open transaction (`transactions`), with the
    signatures offset after the chunk's last message; the index commits the chunk's writes, and
    its counters count, once that transaction is committed. Each sign transaction leaves a commit
    marker in the shard: a gap that holds nothing."""

    gap_level = logging.INFO

    def __init__(self, transactions: ShardTransactions, deliveries: Deliveries, shard: Any) -> None:
        super().__init__(deliveries)
        self.transactions = transactions
        self.shard = TopicPartition(shard.topic, shard.partition)

    @contextlib.asynccontextmanager
    async def chunk(self, messages: list[tuple[int, bytes]]) -> AsyncIterator[SettleChunk]:
        async with self.transactions.joined({self.shard: messages[-1][0] + 1}) as transaction:

            async def settle(sends: list[Any], applied: Callable[[], None]) -> None:
                transaction.sends.extend(sends)
                transaction.on_commit.append(applied)

            yield settle
        # the batch's acknowledgement waits, in the stage's order, for the commit
        await self.deliveries.settle([transaction.committed], _committed)

    async def restart(self) -> None:
        """A new producer epoch at each assignment: it fences whoever held the shard before."""
        await self.transactions.stop()
        await self.transactions.start()

    async def stop(self, commit: bool) -> None:
        await self.transactions.stop(commit=commit)


async def _committed() -> None:
    """A chunk settled: its transaction's commit did what it means."""
