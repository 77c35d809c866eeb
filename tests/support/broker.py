"""The local Kafka broker of the integration tests (deploy/kafka/kafka.sh): its address, a broker of
a test's own, topics made, messages produced and topics read back."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

KAFKA_SH = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"


PORT = int(os.environ.get("NEARDUP_TEST_KAFKA_PORT", "19092"))


BOOTSTRAP = f"127.0.0.1:{PORT}"


def free_port_pair() -> int:
    """A loopback port that is free, with the next one free too (a broker's controller takes it).
    Below the kernel's ephemeral range (32768 and up by default): a test that stops its broker
    starts it again on the same ports, which an outgoing connection could take meanwhile."""
    for _ in range(200):
        port = random.SystemRandom().randrange(21000, 32000)  # not the per-test seeded generator
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise AssertionError("no two adjacent free ports")


@dataclass
class OwnBroker:
    """A broker of one test's own, for a test that stops it: the shared one serves the tests that
    run beside it (and other runs on the machine)."""

    port: int
    data: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run(self, *command: str) -> None:
        env = {**os.environ, "NEARDUP_KAFKA_PORT": str(self.port), "NEARDUP_KAFKA_DIR": str(self.data)}
        subprocess.run([str(KAFKA_SH), *command], check=True, env=env, timeout=600)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def create_topic(
    bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> None:
    """One topic with one replica, made as an operator would before the worker or a test writes it
    (a partition count or limit other than the worker's own, or a topic it never creates)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        await admin.close()


async def group_offset(bootstrap: str, topic: str, group: str) -> int | None:
    """The offset `group` has committed on partition 0 of `topic`, read through the public consumer
    API (None: none committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()


def raw_app(app_class: Any, topic: str, bootstrap: str, datadir: Path, **settings: Any) -> tuple[Any, Any]:
    """A Faust app of the worker's class on one partition, in memory, without its web server, read
    from the earliest offset, and its source topic of raw bytes (`settings`: further app settings)."""
    app = app_class(
        f"{topic}-app",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=str(datadir),
        web_enabled=False,
        topic_partitions=1,
        consumer_auto_offset_reset="earliest",
        **settings,
    )
    source = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    return app, source


def set_max_message_bytes(bootstrap: str, topic: str, limit: int) -> int:
    """Set `topic`'s max.message.bytes (its only setting: AlterConfigs replaces them all), once the
    broker reports it, as an operator would under a running worker; returns the limit before."""

    async def limit_of(admin: AIOKafkaAdminClient) -> int:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})
        [response] = await admin.describe_configs([resource])
        [(_error, _message, _type, _name, entries)] = response.resources
        return next(int(entry[1]) for entry in entries if entry[0] == "max.message.bytes")

    async def set_limit() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            before = await limit_of(admin)
            resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(limit)})
            await admin.alter_configs([resource])
            for _ in range(50):
                if await limit_of(admin) == limit:
                    return before
                await asyncio.sleep(0.2)
            raise AssertionError(f"{topic}: max.message.bytes still not {limit}")
        finally:
            await admin.close()

    return asyncio.run(set_limit())


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def produce_articles(bootstrap: str, topic: str, articles: list[dict[str, Any]]) -> None:
    asyncio.run(produce(bootstrap, topic, [(a["id"].encode(), orjson.dumps(a)) for a in articles]))


def source_header(article_id: str) -> list[tuple[str, bytes]]:
    """The header each article's input message carries in the filtered-feed tests."""
    return [("source", f"wire-{article_id}".encode())]


async def _produce_with_headers(bootstrap: str, topic: str, messages: dict[str, bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for article_id, value in messages.items():
            await producer.send(topic, value, key=article_id.encode(), headers=source_header(article_id))
        await producer.flush()
    finally:
        await producer.stop()


def produce_with_headers(bootstrap: str, topic: str, messages: dict[str, bytes]) -> None:
    """Each message keyed by its article id, with its `source_header`, in order."""
    asyncio.run(_produce_with_headers(bootstrap, topic, messages))


class TopicReader:
    """Reads a topic from the beginning, in the background of the test's own polling."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        isolation_level: str = "read_uncommitted",
        *,
        transactional: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.records: list[Any] = []
        self.isolation_level = isolation_level  # read_committed: what a consumer of exactly-once reads
        # written in transactions: commit markers take offsets that hold no record
        self.transactional = transactional or isolation_level == "read_committed"

    async def _read(self, until: Any, timeout: float) -> None:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
            isolation_level=self.isolation_level,
        )
        await consumer.start()
        try:
            deadline = time.monotonic() + timeout
            seen = len(self.records)
            skip = seen
            while time.monotonic() < deadline and not until(self.records):
                batch = await consumer.getmany(timeout_ms=300)
                for records in batch.values():
                    for record in records:
                        if skip:
                            skip -= 1
                            continue
                        self.records.append(record)
        finally:
            await consumer.stop()

    def read_until(self, until: Any, timeout: float) -> list[Any]:
        """Re-read the topic from the start until `until(records)` holds or the timeout passes."""
        self.records = []
        asyncio.run(self._read(until, timeout))
        return self.records

    def reach(self, until: Any, timeout: float, logs: Callable[[], str] = str) -> list[Any]:
        """`read_until` that fails the test when the timeout passes first: for a wait that a fault
        injection or the next step relies on (a stall there would otherwise go unseen, and the
        fault land elsewhere than the test says). `logs` gives the workers' logs for the message."""
        records = self.read_until(until, timeout)
        assert until(records), f"{self.topic}: {len(records)} records, short within {timeout:g} s\n{logs()}"
        return records

    async def _read_all(self, timeout: float) -> list[Any]:
        # "earliest" from the start: a seek alone can lose the race with the reset to the default
        # ("latest") that starting the consumer set off, and then the read would find nothing
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level=self.isolation_level,
        )
        await consumer.start()  # without a group: every partition of the topic assigned at once
        try:
            tps = sorted(consumer.assignment())
            assert tps, f"{self.topic}: no partitions"
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            await consumer.seek_to_beginning(*tps)
            records: list[Any] = []
            deadline = time.monotonic() + timeout
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                assert time.monotonic() < deadline, f"{self.topic}: not read to its end in {timeout} s"
                for batch in (await consumer.getmany(timeout_ms=300)).values():
                    records += [r for r in batch if r.offset < ends[TopicPartition(r.topic, r.partition)]]
            # every offset once (the topics read so are neither compacted nor transactional)
            if not self.transactional:
                assert len(records) == sum(ends[tp] - starts[tp] for tp in tps), (self.topic, starts, ends)
            return records
        finally:
            await consumer.stop()

    def read_all(self, timeout: float = 120) -> list[Any]:
        """What the topic holds now: every record below its end offsets at the call, from the start
        (after a SIGKILL of the only worker: everything the broker took from it)."""
        return asyncio.run(self._read_all(timeout))


def repeated_after(before: list[Any], after: list[Any], key: Any) -> int:
    """Records of `after` (a later `read_all` of the same topic) that the topic got after `before`
    was read and that repeat one `before` holds (by `key(record)`): after a kill, what the next
    worker delivered again."""
    ends: dict[int, int] = {}
    for record in before:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    held = {key(record) for record in before}
    return sum(1 for r in after if r.offset >= ends.get(r.partition, 0) and key(r) in held)


def read_feed(bootstrap: str, topic: str, wanted: set[str], timeout: float = 180) -> list[Any]:
    """The filtered feed once every id of `wanted` is on it, and whatever else came within 2 s more
    (anything that should not be there would come with the rest)."""
    reader = TopicReader(bootstrap, topic)
    records = reader.read_until(lambda r: {m.key.decode() for m in r} >= wanted, timeout=timeout)
    time.sleep(2)
    return reader.read_until(lambda r: len(r) > len(records), timeout=3) or records
