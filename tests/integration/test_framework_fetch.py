"""The worker's fetch wait and minimum (framework.app_class) through the real broker. Faust builds
its consumer with a 1500 ms wait and a 1-byte minimum; the app's consumer must fetch with the
configured ones instead. With a minimum no fetch reaches, the broker answers each fetch once the
wait is over: a message then reaches the agent up to one wait after it was sent, and never later."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from neardup.stream import framework
from tests.support.broker import create_topic, raw_app

WAIT_MS = 300
MESSAGES = 12
SPACING_S = 0.13  # between two sends: several per fetch, at each point of its wait


async def _latencies(bootstrap: str, datadir: Path) -> list[float]:
    """How long each of MESSAGES messages, sent one after the other, took to reach the agent of an
    app whose fetches wait WAIT_MS for a minimum no fetch reaches."""
    topic = f"fetch-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    app, source = raw_app(framework.app_class(WAIT_MS, 10_000_000), topic, bootstrap, datadir)
    arrived: dict[int, float] = {}
    assigned = asyncio.Event()

    async def take(stream: Any) -> None:
        async for batch in stream.take_events(MESSAGES, 0):
            for event in batch:
                arrived[int(event.value)] = time.monotonic()
            await stream.acknowledge(batch)

    async def on_assigned(*args: Any, **kwargs: Any) -> None:
        assigned.set()

    app.agent(source, name="take")(take)
    app.on_partitions_assigned.connect(on_assigned)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    await app.start()
    try:
        await asyncio.wait_for(assigned.wait(), 60)
        await asyncio.sleep(1)  # the consumer fetching, the topic idle
        sent: dict[int, float] = {}
        for number in range(MESSAGES):
            # bounded: a broker gone under the test fails it rather than leave it retrying for minutes
            await asyncio.wait_for(producer.send_and_wait(topic, str(number).encode(), partition=0), 10)
            sent[number] = time.monotonic()
            await asyncio.sleep(SPACING_S)
        deadline = time.monotonic() + 30
        while len(arrived) < MESSAGES and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        # bounded: without a broker, Faust's stop can wait for it for minutes
        await asyncio.wait_for(app.stop(), 30)
        await producer.stop()
    assert sorted(arrived) == list(range(MESSAGES)), arrived
    return [arrived[number] - sent[number] for number in range(MESSAGES)]


def test_the_worker_consumer_fetches_with_the_configured_wait_and_minimum(kafka: str, tmp_path: Path) -> None:
    latencies = asyncio.run(_latencies(kafka, tmp_path))
    # the minimum: the broker held messages back for the wait (with Faust's 1 byte, each would come
    # at once, in a few ms)
    assert max(latencies) > WAIT_MS / 3 / 1000, latencies
    # the wait: none held for longer than it, with room for a loaded machine (Faust's 1500 ms would
    # hold the first messages of each fetch past 1 s)
    assert max(latencies) < 1.0, latencies
