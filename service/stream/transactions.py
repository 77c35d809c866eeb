"""The index stage's writes in Kafka transactions (NEARDUP_PROCESSING_GUARANTEE=exactly_once).

One transactional producer per index shard, under an id stable across restarts and workers
(`<app_id>-index-<shard>`): whichever worker starts it for the shard fences every earlier producer
of that id (a previous owner paused or cut off: its next write fails with ProducerFenced) and
aborts what it left open. A batch's verdicts, feed messages, dead letters and changelog records
commit with the signatures offsets it consumed, or not at all: the changelog and the group's
offsets move together, and a consumer reading committed records sees each verdict once.

aiokafka's send_offsets_to_transaction carries no group generation (KIP-447), so fencing comes from
the transactional id, one per shard, as in Kafka Streams' first exactly-once mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import InvalidProducerEpoch, ProducerFenced

from ..config import Settings
from ..errors import Error
from .topics import max_request_bytes

log = logging.getLogger("neardup.stream")
# What fencing looks like from the fenced side: another producer took the id (ProducerFenced), or
# the broker has a newer epoch for it than the one this producer holds.
FENCED_ERRORS: tuple[type[BaseException], ...] = (ProducerFenced, InvalidProducerEpoch)


class Fenced(Error, RuntimeError):
    """Another producer took this shard's transactional id: this worker no longer owns the shard
    and must not write anything more (it stops, and exits non-zero)."""


def transactional_id(settings: Settings, shard: int = 0) -> str:
    return f"{settings.app_id}-index-{shard}"


def input_transactional_id(settings: Settings, topic: str, partition: int) -> str:
    return f"{settings.app_id}-sign-{topic}-{partition}"


class TransactionalWriter:
    """One transactional producer: started when what it writes for is assigned (which fences any
    earlier owner), one transaction at a time (`transaction`)."""

    def __init__(self, settings: Settings, transactional_id: str) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.producer: AIOKafkaProducer | None = None
        self.lock = asyncio.Lock()  # one open transaction at a time

    async def start(self) -> AIOKafkaProducer:
        """The producer, started once: its start registers the transactional id with the
        coordinator, fencing every earlier producer of the id and aborting its open transaction."""
        if self.producer is None:
            settings = self.settings
            producer = AIOKafkaProducer(
                bootstrap_servers=settings.bootstrap_servers,
                transactional_id=self.transactional_id,
                transaction_timeout_ms=round(settings.transaction_timeout * 1000),
                acks="all",
                enable_idempotence=True,
                request_timeout_ms=round(settings.delivery_timeout * 1000),
                max_request_size=max_request_bytes(settings),
                max_batch_size=512 * 1024,  # as the worker's other producer (app.py)
                linger_ms=2,
                **settings.client_security(),
            )
            try:
                await producer.start()
            except FENCED_ERRORS as exc:
                await producer.stop()
                raise Fenced(f"{self.transactional_id}: {exc!r}") from exc
            self.producer = producer
            log.info("transactions_started transactional_id=%s", self.transactional_id)
        return self.producer

    @contextlib.asynccontextmanager
    async def transaction(
        self, offsets: Callable[[], dict[TopicPartition, int]]
    ) -> AsyncIterator[AIOKafkaProducer]:
        """A transaction around what the block sends through the producer it yields; committed
        with `offsets()` (the next offset to consume, per partition, for the group) when the block
        ends, aborted when it raises. A fence, wherever it shows, raises Fenced."""
        async with self.lock, self._transaction(offsets) as producer:
            yield producer

    @contextlib.asynccontextmanager
    async def _transaction(
        self, offsets: Callable[[], dict[TopicPartition, int]]
    ) -> AsyncIterator[AIOKafkaProducer]:
        producer = await self.start()
        try:
            await producer.begin_transaction()
            try:
                yield producer
            except BaseException:
                await self._abort(producer)
                raise
            await producer.send_offsets_to_transaction(offsets(), self.settings.app_id)
            await producer.commit_transaction()
        except FENCED_ERRORS as exc:
            raise Fenced(f"{self.transactional_id}: {exc!r}") from exc

    async def _abort(self, producer: AIOKafkaProducer) -> None:
        """Abort the open transaction, unless the producer can no longer (fenced, or stopping):
        the coordinator then aborts it itself (on the next owner's start, or its timeout)."""
        try:
            await producer.abort_transaction()
        except Exception as exc:
            log.warning("transaction_abort_failed transactional_id=%s error=%r", self.transactional_id, exc)

    async def stop(self) -> None:
        if self.producer is not None:
            producer, self.producer = self.producer, None
            await producer.stop()


class ShardTransactions(TransactionalWriter):
    """The index shard's writer: its verdicts, feed, dead letters and changelog."""

    def __init__(self, settings: Settings, shard: int = 0) -> None:
        super().__init__(settings, transactional_id(settings, shard))


class InputTransactions:
    """The sign stage's writers, one per input partition (aiokafka's offsets carry no group
    generation, so a writer is fenced by the next owner of its partition only if the id is the
    partition's): a partition's signatures and dead letters commit with its input offsets."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.writers: dict[tuple[str, int], TransactionalWriter] = {}

    def writer(self, topic: str, partition: int) -> TransactionalWriter:
        key = (topic, partition)
        if key not in self.writers:
            self.writers[key] = TransactionalWriter(
                self.settings, input_transactional_id(self.settings, topic, partition)
            )
        return self.writers[key]

    async def revoked(self, partitions: list[tuple[str, int]]) -> None:
        """The partitions went to another worker (or will come back): their writers stop, and a
        new one (a new epoch) starts at the next assignment."""
        for key in partitions:
            writer = self.writers.pop(key, None)
            if writer is not None:
                async with writer.lock:
                    await writer.stop()

    async def stop(self) -> None:
        await self.revoked(list(self.writers))


def producer_of(transactions: TransactionalWriter) -> Callable[[], Any]:
    """What Outputs sends through for the index stage: the shard's transactional producer."""

    def producer() -> Any:
        assert transactions.producer is not None, "the shard's transactions start with its assignment"
        return transactions.producer

    return producer
