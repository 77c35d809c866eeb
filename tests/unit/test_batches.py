"""send_in_batches: messages grouped per partition in order, batches split where they fill."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.protocol.metadata import MetadataResponse_v0

from neardup.stream import batches, framework
from neardup.stream.batches import send_in_batches
from neardup.stream.framework import default_partitions


class FakeProducer:
    """aiokafka's producer as send_in_batches uses it: batches hold `capacity` messages; submitted
    batches are recorded in order. Which partition a key goes to is default_partitions' to say
    (tested below against aiokafka's partitioner)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.submitted: list[tuple[str, int, list[tuple[bytes | None, bytes]]]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def create_batch(self) -> Any:
        items: list[tuple[bytes | None, bytes]] = []

        def append(*, key: bytes | None, value: bytes, timestamp: None) -> Any:
            if len(items) >= self.capacity:
                return None
            items.append((key, value))
            return SimpleNamespace(size=len(value))

        return SimpleNamespace(append=append, items=items)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.submitted.append((topic, partition, list(batch.items)))
        sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        sent.set_result(SimpleNamespace(offset=0))
        return sent


@pytest.fixture
def by_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys go to partition len(key) % 3."""
    monkeypatch.setattr(
        batches, "default_partitions", lambda producer, topic, keys: [len(k) % 3 for k in keys]
    )


@pytest.mark.usefixtures("by_length")
async def test_messages_keep_their_order_within_each_partition() -> None:
    producer = FakeProducer(capacity=2)
    messages = [(b"k" * (i % 4 + 1), f"v{i}".encode()) for i in range(11)]
    sent = await send_in_batches(producer, "verdicts", messages)
    assert [batch.messages for batch in sent] == [len(items) for _, _, items in producer.submitted]
    assert all(len(items) <= 2 for _, _, items in producer.submitted)
    for partition in range(3):
        got = [m for _, p, items in producer.submitted if p == partition for m in items]
        assert got == [m for m in messages if len(m[0]) % 3 == partition]
    assert sum(batch.messages for batch in sent) == len(messages)


async def test_a_fixed_partition_and_nothing_to_send() -> None:
    producer = FakeProducer(capacity=100)
    messages = [(b"a", b"1"), (b"bb", b"2"), (None, b"3")]
    sent = await send_in_batches(producer, "changelog", messages, partition=0)
    assert producer.submitted == [("changelog", 0, messages)] and sent[0].messages == 3
    assert await send_in_batches(producer, "changelog", []) == []


@pytest.mark.usefixtures("by_length")
async def test_a_message_larger_than_a_batch_is_an_error() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        await send_in_batches(FakeProducer(capacity=0), "verdicts", [(b"k", b"v")])


@pytest.mark.skipif(framework._kafka_hash is None, reason="_kafka_hash is not built")
def test_compiled_murmur2_equals_aiokafkas() -> None:
    assert framework._kafka_hash is not None
    rng = random.Random(3)
    samples = [bytes(rng.randrange(256) for _ in range(n)) for n in range(0, 41) for _ in range(20)]
    samples += [f"article-{i}".encode() for i in range(200)] + ["dépêche-ü-日本".encode()]
    for data in samples:
        assert framework._kafka_hash.murmur2(data) == murmur2(data), data


@pytest.mark.skipif(framework._kafka_hash is None, reason="_kafka_hash is not built")
def test_compiled_hash_checks_its_inputs() -> None:
    hashing = framework._kafka_hash
    assert hashing is not None
    for view in (bytearray(b"article-7"), memoryview(b"xarticle-7")[1:]):
        assert hashing.murmur2(view) == murmur2(b"article-7")
    assert hashing.partitions((b"a", b"bc", b""), 1) == [0, 0, 0]
    assert hashing.partitions([], 3) == []
    with pytest.raises(ValueError, match="at least one partition"):
        hashing.partitions([b"a"], 0)
    with pytest.raises(TypeError, match="every key must be bytes"):
        hashing.partitions([b"a", b"b", "c", b"d"], 3)  # a list filled halfway is released
    with pytest.raises(TypeError, match="keys must be a sequence"):
        hashing.partitions(5, 3)
    with pytest.raises(TypeError):
        hashing.murmur2("text")


class CountingPartitioner(DefaultPartitioner):
    """aiokafka's default partitioner, counting how often it is asked."""

    asked = 0

    def __call__(self, key: bytes, all_partitions: list[int], available: list[int]) -> int:
        self.asked += 1
        return int(super().__call__(key, all_partitions, available))


MakeProducer = Callable[[int, Any], AIOKafkaProducer]


@pytest.fixture
async def producer_of() -> AsyncIterator[MakeProducer]:
    """Makes aiokafka producers, never started, whose client knows the topic "verdicts" with the
    partitions asked: the metadata a broker's answer gives it. Each is closed at teardown."""
    made: list[AIOKafkaProducer] = []

    def make(partitions: int, partitioner: Any) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", partitioner=partitioner)
        made.append(producer)
        topic = [(0, partition, 0, [0], [0]) for partition in range(partitions)]
        answer = MetadataResponse_v0(brokers=[(0, "127.0.0.1", 9)], topics=[(0, "verdicts", topic)])
        producer.client.cluster.update_metadata(answer)
        return producer

    yield make
    for producer in made:
        await producer.stop()


@pytest.mark.parametrize("count", [1, 3, 7, 12])
async def test_verdict_partitions_are_the_ones_aiokafkas_default_partitioner_picks(
    count: int, producer_of: MakeProducer
) -> None:
    keys = [f"article-{i}".encode() for i in range(300)] + [b"", "dépêche".encode()]
    partitioner = CountingPartitioner()
    producer = producer_of(count, partitioner)
    expected = [DefaultPartitioner()(key, list(range(count)), list(range(count))) for key in keys]
    assert default_partitions(producer, "verdicts", keys) == expected
    assert partitioner.asked == (0 if framework._kafka_hash is not None else len(keys))
    assert len(set(expected)) == count  # the keys spread over every partition


async def test_other_partitioners_and_keyless_messages_are_asked_as_send_would_ask(
    producer_of: MakeProducer,
) -> None:
    asked: list[bytes | None] = []

    def second(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        asked.append(key)
        return 2

    assert default_partitions(producer_of(3, second), "verdicts", [b"a", b"b"]) == [2, 2]
    assert asked == [b"a", b"b"]
    partitioner = CountingPartitioner()
    assert set(default_partitions(producer_of(3, partitioner), "verdicts", [None, b"a"])) <= {0, 1, 2}
    assert partitioner.asked == 2
