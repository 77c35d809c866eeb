"""A transactional producer's coordinator lookup whose connection breaks under it, through the
real broker: aiokafka's own producer can then only fail, the worker's
(`framework.coordinator_lookups_retried`) asks again and commits. The break is the one a node's
death mid-request makes: the client's connection closed while the request waits for its answer."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import ConnectionGroup
from aiokafka.errors import KafkaError

from neardup.stream.framework import coordinator_lookups_retried
from tests.support.broker import create_topic

FIND_COORDINATOR = 10  # the request's API key


def _break_the_next_lookup(producer: AIOKafkaProducer) -> list[int]:
    """Closes the connection under the producer's next FindCoordinator request, once it is sent.
    Returns the list that counts the lookups sent meanwhile."""
    client: Any = producer.client
    send = client.send
    sent: list[int] = []

    async def breaking_send(node_id: int, request: Any, **kwargs: Any) -> Any:
        if request.API_KEY != FIND_COORDINATOR:
            return await send(node_id, request, **kwargs)
        sent.append(node_id)
        if len(sent) > 1:
            return await send(node_id, request, **kwargs)
        assert await client.ready(node_id)
        answer = asyncio.ensure_future(send(node_id, request, **kwargs))
        await asyncio.sleep(0)  # written to the socket, its answer awaited
        client._conns[(node_id, ConnectionGroup.DEFAULT)].close()
        return await answer

    client.send = breaking_send
    return sent


async def _commit_offsets_through_a_broken_lookup(bootstrap: str, topic: str, retried: bool) -> list[int]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}-producer", enable_idempotence=True
    )
    if retried:
        coordinator_lookups_retried(producer)
    await producer.start()
    try:
        sent = _break_the_next_lookup(producer)
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"value", key=b"key", partition=0)
        # the group's coordinator is looked up here, for the first time
        await producer.send_offsets_to_transaction({TopicPartition(topic, 0): 1}, f"{topic}-group")
        await producer.commit_transaction()
        return sent
    finally:
        await producer.stop()


async def _committed(bootstrap: str, topic: str) -> tuple[list[bytes], int | None]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=f"{topic}-group",
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records = await consumer.getmany(tp, timeout_ms=5000)
        values = [cast(bytes, r.value) for r in records.get(tp, [])]
        # a commit's markers reach the topic and the group's offsets each in their own time: once
        # the record is readable, its offset follows
        deadline = asyncio.get_running_loop().time() + (10 if values else 0)
        offset = await consumer.committed(tp)
        while offset is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
            offset = await consumer.committed(tp)
        return values, offset
    finally:
        await consumer.stop()


def test_a_lookup_whose_connection_breaks_is_asked_again_and_the_transaction_commits(kafka: str) -> None:
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    sent = asyncio.run(_commit_offsets_through_a_broken_lookup(kafka, topic, retried=True))
    assert len(sent) == 2, sent  # the broken lookup, and the one asked again
    assert asyncio.run(_committed(kafka, topic)) == ([b"value"], 1)


def test_aiokafka_alone_fails_the_transaction_on_that_break(kafka: str) -> None:
    """What the wrapper is for: should an upgrade of aiokafka ask again by itself, this fails, and
    `coordinator_lookups_retried` can go."""
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    with pytest.raises(KafkaError):
        asyncio.run(_commit_offsets_through_a_broken_lookup(kafka, topic, retried=False))
    assert asyncio.run(_committed(kafka, topic)) == ([], None)
