"""A transactional producer's coordinator lookup whose connection breaks under it, through the
real broker: aiokafka's own producer can then only fail, the worker's
(`framework.coordinator_lookups_retried`) asks again and commits; a lookup refused for another
reason fails as before. The break is the one a node's death mid-request makes: the request's
connection closed while the request waits for its answer."""

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


class Lookups:
    """The coordinator lookups that aiokafka's clients send during a test, on connections made by
    aiokafka's factory of them (`create_conn`, which the client calls from its module): once
    armed, the connection of the next lookup closes as soon as the request is written, as a node
    that dies while it is asked closes it. Public methods only: the client's own table of
    connections is not touched."""

    def __init__(self) -> None:
        self.armed = False
        self.sent: list[str] = []  # the hosts the lookups went to since the arming

    def arm(self, producer: AIOKafkaProducer) -> list[str]:
        self.armed = True
        return self.sent

    def breaking(self, connection: AIOKafkaConnection) -> AIOKafkaConnection:
        send = connection.send

        def send_then_break(request: Any, expect_response: bool = True) -> Any:
            answer = send(request, expect_response)  # written; the answer awaited by the caller
            if self.armed and request.API_KEY == FIND_COORDINATOR:
                self.sent.append(connection.host)
                if len(self.sent) == 1:
                    connection.close()  # its answer fails as under a node's death
            return answer

        cast(Any, connection).send = send_then_break
        return connection


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> Lookups:
    made = Lookups()
    create = aiokafka.client.create_conn

    async def create_breaking(*args: Any, **kwargs: Any) -> AIOKafkaConnection:
        return made.breaking(await create(*args, **kwargs))

    monkeypatch.setattr(aiokafka.client, "create_conn", create_breaking)
    return made


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
    coordinator is first looked up through `fault`; what `fault` counted by then."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"{topic}-producer", enable_idempotence=True
    )
    if retried:
        coordinator_lookups_retried(producer)
    await producer.start()
    try:
        counted = fault(producer)
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"value", key=b"key", partition=0)
        # the group's coordinator is looked up here, for the first time
        await producer.send_offsets_to_transaction({TopicPartition(topic, 0): 1}, f"{topic}-group")
        await producer.commit_transaction()
        return list(counted)  # the lookups of the transaction, not those of later clients
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
    kafka: str, lookups: Lookups
) -> None:
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    sent = asyncio.run(_commit_offsets_through(kafka, topic, True, lookups.arm))
    # the broken lookup, and the one asked again (and more where a broker that has just started
    # answers that the group's coordinator is not available yet, which aiokafka asks again itself)
    assert len(sent) >= 2, sent
    assert asyncio.run(_committed(kafka, topic)) == ([b"value"], 1)


def test_aiokafka_alone_fails_the_transaction_on_that_break(kafka: str, lookups: Lookups) -> None:
    """What the wrapper is for: should an upgrade of aiokafka ask again by itself, this fails, and
    `coordinator_lookups_retried` can go."""
    topic = f"lookup-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka, topic))
    with pytest.raises(KafkaError):
        asyncio.run(_commit_offsets_through(kafka, topic, False, lookups.arm))
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
