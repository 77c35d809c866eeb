"""What both agents send besides their own topic, through aiokafka's producer in batches built
here (batches.py): verdicts, the filtered feed, the changelog, and dead letters, counted once the
broker has them."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import faust

from . import framework
from .batches import SentBatch, send_in_batches
from .metrics import Metrics

Letter = tuple[str, bytes, bytes | None]  # (reason, dead-letter record, key)


class Outputs:
    """`producer`: what to send through (the index stage's transactional producer under
    exactly-once, transactions.py); by default aiokafka's producer under Faust's."""

    def __init__(
        self,
        app: faust.App,
        metrics: Metrics,
        dead_letter_topic: str,
        producer: Callable[[], Any] | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.dead_letter_topic = dead_letter_topic
        self._producer = producer

    def through(self, producer: Any) -> Outputs:
        """The same outputs sent through `producer` (a transaction's)."""
        return Outputs(self.app, self.metrics, self.dead_letter_topic, lambda: producer)

    def producer(self) -> Any:
        if self._producer is not None:
            return self._producer()
        return framework.aiokafka_producer(self.app)

    async def send_batches(
        self, topic: str, messages: Sequence[tuple[bytes | None, bytes | None]], **options: Any
    ) -> list[SentBatch]:
        """The batches sent, each with a future resolving once the broker acknowledges it."""
        return await send_in_batches(self.producer(), topic, messages, **options)

    async def send(
        self, topic: str, messages: list[tuple[bytes | None, bytes | None]], **options: Any
    ) -> list[Any]:
        """The sends' futures, each resolving once the broker acknowledges its batch."""
        return [batch.sent for batch in await self.send_batches(topic, messages, **options)]

    async def dead_letters(self, letters: list[Letter]) -> list[Any]:
        if not letters:
            return []
        return await self.send(self.dead_letter_topic, [(key, record) for _, record, key in letters])

    def count_dead_letters(self, letters: list[Letter]) -> None:
        for reason, count in collections.Counter(reason for reason, _, _ in letters).items():
            self.metrics.dead_letters.labels(reason).inc(count)
