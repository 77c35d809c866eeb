"""What both agents send besides their own topic, through aiokafka's producer in batches built
here (batches.py): verdicts, the filtered feed, the index's changelog, and dead letters, counted once
the broker has them."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from ..config import Settings
from ..messages import dead_letter_dict
from ..pipeline.publication import Undecided, batch_publication
from ..pipeline.shard import BatchOutcome, Decided, SignedMessage
from .batches import KeyedValue, SentBatch, send_in_batches
from .metrics import Metrics

log = logging.getLogger("neardup.stream")
Letter = tuple[str, bytes, bytes | None]  # (reason, dead-letter record, key)
SHARD_KEY = b"0"  # the key of every signatures message: the index shard is one partition
Published = tuple[list[Any], Callable[[], None]]  # a chunk's sends, and what counts them once acknowledged
# the index's sizes after a chunk, each a gauge of Metrics named as the BatchOutcome field it shows
SIZE_GAUGES = ["indexed", "clusters", "buckets", "largest_bucket", "anchor_postings", "boilerplate_anchors"]


@dataclass(eq=False)
class Outputs:
    """What the agents send through, and how they send it (batches.py)."""

    metrics: Metrics
    dead_letter_topic: str
    # what to send through, asked at each send: aiokafka's producer under Faust's
    # (framework.aiokafka_producer), or under exactly-once a transaction's (transactions.py)
    producer: Callable[[], AIOKafkaProducer]

    async def send_batches(
        self, topic: str, messages: Sequence[KeyedValue], **options: Any
    ) -> list[SentBatch]:
        """The batches sent, each with a future resolving once the broker acknowledges it. Nothing
        to send asks for no producer (under exactly-once, a transaction's)."""
        if not messages:
            return []
        return await send_in_batches(self.producer(), topic, messages, **options)

    async def send(self, topic: str, messages: Sequence[KeyedValue], **options: Any) -> list[Any]:
        """The sends' futures, each resolving once the broker acknowledges its batch."""
        return [batch.sent for batch in await self.send_batches(topic, messages, **options)]

    async def dead_letters(self, letters: list[Letter]) -> list[Any]:
        return await self.send(self.dead_letter_topic, [(key, record) for _, record, key in letters])

    def count_dead_letters(self, letters: list[Letter]) -> None:
        for reason, count in collections.Counter(reason for reason, _, _ in letters).items():
            self.metrics.dead_letters.labels(reason).inc(count)


class ChangelogSends:
    """The index's writes, sent to its changelog (one partition) as each chunk is decided. The index
    holds a chunk's writes aside until they are durable: once the chunk's sends are acknowledged (or
    committed), it commits them with where the changelog then ends (`acknowledged`:
    Decider.acknowledged, or under exactly-once the commit point's), never reflecting what the
    changelog lacks."""

    def __init__(self, outputs: Outputs, topic: str, acknowledged: Callable[[int | None, int], None]) -> None:
        self.outputs = outputs
        self.topic = topic
        self.acknowledged = acknowledged

    async def send(self, writes: Sequence[KeyedValue]) -> list[SentBatch]:
        return await self.outputs.send_batches(self.topic, writes, partition=0)

    def applied(self, changelog: list[SentBatch], chunk: int, then: Callable[[], None]) -> Callable[[], None]:
        """What the acknowledgement of chunk number `chunk`, which sent `changelog`, means: its writes
        committed to the index; then `then` (its counters)."""

        def apply() -> None:
            # one partition: the last batch holds the last write
            end = changelog[-1].sent.result().offset + changelog[-1].messages if changelog else None
            self.acknowledged(end, chunk)
            then()

        return apply


class IndexPublisher:
    """What the index stage's decisions publish (pipeline/publication.py says what), rendered as
    Kafka records: verdicts and removals keyed by article id, the filtered feed, dead letters; and
    their metrics, counted once the broker has them."""

    def __init__(self, settings: Settings, outputs: Outputs) -> None:
        self.settings = settings
        self.outputs = outputs
        self.feed_kinds = settings.feed_kinds() if settings.unique_topic else None  # None: no feed

    async def publish(self, outcome: BatchOutcome, messages: Sequence[SignedMessage]) -> Published:
        """Send a chunk's verdicts, feed messages (read from its signatures `messages`, (offset, value))
        and dead letters; returns the sends and what counts them once they are acknowledged."""
        metrics = self.outputs.metrics
        out = batch_publication(
            outcome.entries,
            messages,
            feed_kinds=self.feed_kinds,
            replays_republished=not self.settings.exactly_once,
        )
        letters = [self._index_error(entry, letter) for entry, letter in out.errors]
        # Keyed by article id, so that every verdict of an article lands in the same partition.
        sends = await self.outputs.send(self.settings.verdicts_topic, out.verdicts)
        sends += await self.outputs.dead_letters(letters)
        sends += await self.outputs.send(self.settings.unique_topic, out.feed, headers=out.feed_headers)

        def counted() -> None:
            # counted per chunk, not per verdict: a labelled counter's increment costs the event loop
            for (counter, label), count in out.counts.items():  # each named as its metric
                getattr(metrics, counter).labels(label).inc(count)
            for latency in out.latencies_s:
                metrics.latency.observe(latency)
            metrics.expired.inc(out.expired)
            self.outputs.count_dead_letters(letters)
            metrics.fed.inc(len(out.feed))
            for gauge in SIZE_GAUGES:
                getattr(metrics, gauge).set(getattr(outcome, gauge))
            if outcome.bytes_on_disk is not None:
                metrics.index_bytes.set(outcome.bytes_on_disk)
            if outcome.oldest_ms is not None:
                metrics.oldest.set(outcome.oldest_ms / 1000.0)
            if outcome.newest_ms is not None:
                metrics.newest.set(outcome.newest_ms / 1000.0)

        return sends, counted

    def _index_error(self, entry: Decided, letter: Undecided) -> Letter:
        """A record the index stage could not handle, as a dead letter: under the input message it
        came from when that is known (an isolated record's), else under the signatures message
        (they all come from the shard's one partition, under its key)."""
        topic, offset, key = self.settings.signatures_topic, entry.offset, SHARD_KEY
        partition: int | None = 0
        if letter.source is not None and entry.article_id is not None:
            topic, partition, offset = letter.source.topic, letter.source.partition, letter.source.offset
            key = entry.article_id.encode()
        failed = "index_error reason=%s topic=%s partition=%s offset=%d error=%s"
        log.error(failed, entry.reason, topic, partition, offset, entry.error)
        assert entry.error is not None
        record = dead_letter_dict(entry.reason, entry.error, letter.payload, topic, partition, offset, key)
        return entry.reason, orjson.dumps(record), key
