"""A transactional producer's coordinator lookup whose connection breaks under it, through the
real broker: aiokafka's own producer can then only fail, the worker's
(`framework.coordinator_lookups_retried`) asks again and commits; a lookup refused for another
reason fails as before. The break is the one a node's death mid-request makes: the client's
connections to the node closed while the request waits for its answer."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from typing import Any, cast

import aiokafka.client
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.conn import AIOKafkaConnection
from aiokafka.errors import GroupAuthorizationFailedError, KafkaError, UnknownError

from neardup.stream.framework import coordinator_lookups_retried
from tests.support.broker import create_topic

FIND_COORDINATOR = 10  # the request's API key


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[AIOKafkaConnection]:
    """Every connection aiokafka's clients open during the test, through aiokafka's factory of
    connections (`create_conn`, which the client calls from its module): the test closes them as
    a node's death would, knowing no more of the client than its public methods."""
    create = aiokafka.client.create_conn
    connections: list[AIOKafkaConnection] = []

    async def recorded(*args: Any, **kwargs: Any) -> AIOKafkaConnection:
        connection = await create(*args, **kwargs)
        connections.append(connection)
        return connection

    monkeypatch.setattr(aiokafka.client, "create_conn", recorded)
    return connections


def _break_the_next_lookup(producer: AIOKafkaProducer, opened: list[AIOKafkaConnection]) -> list[int]:
    """Closes the producer's connections to the node its next FindCoordinator request goes to,
    once the request is sent: the node died under it. Returns the list that counts the lookups
    sent meanwhile."""
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
        node = client.cluster.broker_metadata(node_id)
        for connection in opened:
            if connection.connected() and (connection.host, connection.port) == (node.host, node.port):
                connection.close()
        return await answer

    client.send = breaking_send
    return sent


def _refuse_the_next_lookup(producer: AIOKafkaProducer, error: KafkaError, asked: list[str]) -> list[str]:
    """The producer's next coordinator lookup answered with `error`, as a broker refusing it would;
    later ones go to the broker. `asked`: the keys looked up meanwhile."""
    client: Any = producer.client
    lookup = client.coordinator_lookup

    async def refused(coordinator_type: int, coordinator_key: str) -> int:
        asked.append(coordinator_key)
        if len(asked) == 1:
            raise error
        return cast(int, await lookup(coordinator_type, coordinator_key))

    client.coordinator_lookup = refused
    return asked


async def _commit_offsets_through(
    bootstrap: str, topic: str, retried: bool, fault: Callable[[AIOKafkaProducer], list[Any]]
) -> list[Any]:
    """A transaction that sends a message and commits an offset for a group, whose group
    coordinator is first looked up through `fault`; what `fault` counted."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}-producer", enable_idempotence=True
    )
    if retried:
        coordinator_lookups_retried(producer)
    await producer.start()
    try:
        sent = fault(producer)
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


def test_a_lookup_whose_connection_breaks_is_asked_again_and_the_transaction_commits(
    kafka: str, opened: list[AIOKafkaConnection]
) -> None:
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    broken = functools.partial(_break_the_next_lookup, opened=opened)
    sent = asyncio.run(_commit_offsets_through(kafka, topic, True, broken))
    assert len(sent) == 2, sent  # the broken lookup, and the one asked again
    assert asyncio.run(_committed(kafka, topic)) == ([b"value"], 1)


def test_aiokafka_alone_fails_the_transaction_on_that_break(
    kafka: str, opened: list[AIOKafkaConnection]
) -> None:
    """What the wrapper is for: should an upgrade of aiokafka ask again by itself, this fails, and
    `coordinator_lookups_retried` can go."""
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    with pytest.raises(KafkaError):
        broken = functools.partial(_break_the_next_lookup, opened=opened)
        asyncio.run(_commit_offsets_through(kafka, topic, False, broken))
    assert asyncio.run(_committed(kafka, topic)) == ([], None)


@pytest.mark.parametrize("error", [UnknownError, GroupAuthorizationFailedError])
def test_a_lookup_refused_for_another_reason_is_not_asked_again(kafka: str, error: type[KafkaError]) -> None:
    """Only a broken connection is asked again: a refusal (an unknown error, the group not
    authorized) fails the transaction as it would without the wrapper."""
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    asked: list[str] = []
    refused = functools.partial(_refuse_the_next_lookup, error=error(), asked=asked)
    with pytest.raises(KafkaError):
        asyncio.run(_commit_offsets_through(kafka, topic, True, refused))
    assert asked == [f"{topic}-group"]  # once: not asked again
    assert asyncio.run(_committed(kafka, topic)) == ([], None)
