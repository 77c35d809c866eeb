"""Idle is healthy: a worker that has decided everything it was given reports itself alive for as
long as nothing comes, whatever its guarantee and however its input was written. Commit markers
(of its own transactions under exactly-once, or of a transactional producer upstream) take offsets
that no agent is ever delivered; they must not count as input waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.support.broker import TopicReader, produce_articles
from tests.support.deployment import Deployment, health, stream_of, verdicts_by_id

STALL_TIMEOUT_S = 3.0


async def _produce_in_transaction(bootstrap: str, topic: str, articles: list[dict[str, Any]]) -> None:
    """As an upstream service writing exactly once would: its articles in one transaction, which
    leaves a commit marker after them in the input partition."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-upstream")
    await producer.start()
    try:
        async with producer.transaction():
            for article in articles:
                await producer.send(topic, orjson.dumps(article), key=article["id"].encode())
    finally:
        await producer.stop()


@pytest.mark.budget(30)  # three stall timeouts of idleness after the worker's start and a stream
@pytest.mark.parametrize(
    ("guarantee", "upstream"),
    [
        ("exactly_once", "plain"),
        ("exactly_once", "transactional"),
        ("at_least_once", "transactional"),
    ],
)
def test_an_idle_worker_stays_healthy_for_three_stall_timeouts(
    deployment: Deployment, guarantee: str, upstream: str
) -> None:
    deployment.extra_env.update(
        {"NEARDUP_PROCESSING_GUARANTEE": guarantee, "NEARDUP_STALL_TIMEOUT": str(STALL_TIMEOUT_S)}
    )
    worker = deployment.start_worker()
    articles = stream_of(5)
    if upstream == "transactional":
        asyncio.run(_produce_in_transaction(deployment.bootstrap, deployment.topics["input"], articles))
    else:
        produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], isolation)
    reader.reach(lambda r: len(verdicts_by_id(r)) >= len(articles), 60, deployment.logs)
    answers = []
    deadline = time.monotonic() + 3 * STALL_TIMEOUT_S + 2  # /health is refreshed every second
    while time.monotonic() < deadline:
        answers.append(health(deployment.health_url(0)))
        time.sleep(0.25)
    unhealthy = [answer for answer in answers if answer is None or answer[0] != 200]
    assert unhealthy == [], f"{unhealthy[:3]}\n{deployment.logs()}"
    assert worker.poll() is None, deployment.logs()
