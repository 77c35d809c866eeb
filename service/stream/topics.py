"""Create the service's topics up front with explicit partition counts; report mismatches clearly."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient as Admin
from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code

from ..config import Settings
from ..errors import Error
from ..messages import DEAD_LETTER_MAX_BYTES, input_max_bytes, verdict_max_bytes
from ..pipeline.shard import Entry
from ..pipeline.wire import packed_max_bytes, signed_max_bytes, wrapped_max_bytes
from .connect import start_client

log = logging.getLogger("neardup.topics")


class StoredMessage(NamedTuple):
    """One message as LogReader.read finds it in the log."""

    offset: int
    key: bytes | None
    value: bytes | None  # None: a tombstone
    timestamp_ms: int | None
    headers: tuple[tuple[str, bytes], ...] = ()


class TopicMismatch(Error, RuntimeError):
    """An existing topic has a partition count, replication or limit the service cannot work with,
    or a topic could not be created."""


# The producer's batch size (app.py's producer_max_batch_size): aiokafka fills a batch up to it, and
# the broker holds a whole batch to a topic's max.message.bytes, so every topic the worker writes
# must take that much besides its largest message.
PRODUCER_BATCH_BYTES = 512 * 1024
# What a message the worker sends takes besides its value: its key (an article id, at most 2 KB in
# UTF-8; a dead letter's own key is counted in its value's room), the headers the filtered feed
# forwards with an input message, and Kafka's framing of the record and its batch (under 100 bytes).
RECORD_HEADROOM = 64 * 1024
# The broker's own default (message.max.bytes): a topic the worker creates never takes less.
KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    # the largest message (or batch) the worker sends it, None for a topic it does not write: the
    # topic is created to take it, and an existing topic that takes less is refused at start, as
    # the broker would refuse that message later and stop the worker at every restart
    max_message_bytes: int | None = None
    compact: bool = False
    # an existing topic must have exactly `partitions` (else more or fewer are fine, and logged)
    exact: bool = False
    # internal, as a Kafka Streams repartition topic: no time or size retention (a long stop must not
    # lose what is not decided yet); what is decided is purged with delete-records (purge.py)
    internal: bool = False


@dataclass(frozen=True)
class Replication:
    """What every topic the worker creates gets: replicas, and min.insync.replicas."""

    factor: int
    min_insync: int


# What a read-back asks per partition and fetch (LogReader): a marker batch is ~80 bytes.
READ_BACK_FETCH_BYTES = 16 * 1024
# How long a read-back waits for the broker before it gives up (LogReader.read raises TimeoutError)
READ_BACK_TIMEOUT_S = 60.0
# The topic settings that make the signatures topic keep its messages until they are purged
INTERNAL_RETENTION = {"retention.ms": "-1", "retention.bytes": "-1"}
# CreateTopics' error for a topic that exists already (another worker created it meanwhile)
TOPIC_ALREADY_EXISTS = 36


def changelog_topic(settings: Settings) -> str:
    return f"{settings.app_id}-records-changelog"


def feed_max_bytes(settings: Settings) -> int:
    """The filtered feed's largest message: an input message forwarded unchanged, as large as the
    input decoder accepts, with its key and headers."""
    return max(PRODUCER_BATCH_BYTES, input_max_bytes(settings.max_text_bytes) + RECORD_HEADROOM)


def verdicts_max_bytes(settings: Settings) -> int:
    """The verdicts topic's largest message or batch."""
    return max(PRODUCER_BATCH_BYTES, verdict_max_bytes(settings.params()) + RECORD_HEADROOM)


def signatures_max_bytes(settings: Settings) -> int:
    """The signatures topic's largest message: a sign batch's records packed up to
    wire.PACK_MAX_BYTES, or one larger record alone; with the filtered feed a record carries its
    input message and headers too."""
    record = signed_max_bytes(settings.params())
    if settings.unique_topic:
        record = wrapped_max_bytes(record, input_max_bytes(settings.max_text_bytes), RECORD_HEADROOM)
    return max(DEAD_LETTER_MAX_BYTES, packed_max_bytes(record) + RECORD_HEADROOM)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    specs = [
        TopicSpec(settings.input_topic, settings.input_partitions),
        TopicSpec(settings.signatures_topic, 1, signatures_max_bytes(settings), exact=True, internal=True),
        TopicSpec(settings.verdicts_topic, settings.verdicts_partitions, verdicts_max_bytes(settings)),
        # a dead letter carries its original bytes base64-encoded (4/3 larger) plus metadata, cut
        # to fit this (messages.dead_letter_dict)
        TopicSpec(settings.dead_letter_topic, 1, DEAD_LETTER_MAX_BYTES),
        # an index record takes far less than a batch (under 100 KB at the largest num_perm)
        TopicSpec(changelog_topic(settings), 1, PRODUCER_BATCH_BYTES, compact=True, exact=True),
        TopicSpec(f"{settings.app_id}-__assignor-__leader", 1),
    ]
    if settings.unique_topic:
        specs.append(TopicSpec(settings.unique_topic, settings.verdicts_partitions, feed_max_bytes(settings)))
    return specs


def max_request_bytes(settings: Settings) -> int:
    """The producer's max_request_size: the largest message the worker sends to any topic."""
    return max(s.max_message_bytes for s in topic_specs(settings) if s.max_message_bytes is not None)


async def ensure_topics(settings: Settings) -> dict[str, int]:
    """Create missing topics with the replication asked for; raise TopicMismatch naming the topic if
    a fixed count differs, or a topic the worker writes has fewer replicas, a lower min.insync, a
    retention that can lose pending messages or takes smaller messages than the worker sends it.
    Returns each topic's partition count."""
    admin = admin_client(settings)
    await start_client(settings, admin)
    try:
        specs = topic_specs(settings)
        replication = await _replication(admin, settings)
        existing = await _replicas(admin, [s.name for s in specs])
        if missing := [s for s in specs if s.name not in existing]:
            await _create(admin, missing, replication)
            # new topics reach the metadata a moment after CreateTopics returns
            for _ in range(100):
                existing = await _replicas(admin, [s.name for s in specs])
                if all(s.name in existing for s in specs):
                    break
                await asyncio.sleep(0.2)
        for spec in specs:
            if spec.name not in existing:
                raise TopicMismatch(f"topic {spec.name!r} could not be created")
            if (have := len(existing[spec.name])) != spec.partitions:
                if spec.exact:
                    raise TopicMismatch(
                        f"topic {spec.name!r} has {have} partitions, the service needs {spec.partitions}; "
                        "delete it or point the service at another topic name"
                    )
                log.info("topic=%s partitions=%d (configured %d; fine)", spec.name, have, spec.partitions)
        written = [spec for spec in specs if spec.max_message_bytes is not None]
        _check_replicas(existing, written, replication, settings.bootstrap_servers)
        await _check_configs(admin, written, replication)
        return {name: len(replicas) for name, replicas in existing.items()}
    finally:
        await admin.close()


async def _replication(admin: Admin, settings: Settings) -> Replication:
    """The settings', or where one is none the broker's own default (CreateTopics' -1, "the
    broker's default", is not something aiokafka's request can carry)."""
    factor, min_insync = settings.replication_factor, settings.min_insync_replicas
    if factor is None or min_insync is None:
        defaults = await _broker_defaults(admin)
        factor = int(defaults["default.replication.factor"]) if factor is None else factor
        min_insync = int(defaults["min.insync.replicas"]) if min_insync is None else min_insync
    if min_insync > factor:
        # the broker would refuse every send with acks=all to such a topic (NotEnoughReplicas)
        raise TopicMismatch(
            f"min.insync.replicas {min_insync} is above the replication factor {factor}: set "
            "NEARDUP_MIN_INSYNC_REPLICAS or NEARDUP_REPLICATION_FACTOR so that it is not"
        )
    return Replication(factor, min_insync)


async def _broker_defaults(admin: Admin) -> dict[str, str]:
    """default.replication.factor and min.insync.replicas as one broker has them (DescribeConfigs)."""
    brokers = (await admin.describe_cluster())["brokers"]
    if not brokers:
        raise TopicMismatch("the cluster lists no broker: cannot read its default replication")
    wanted = {"default.replication.factor": None, "min.insync.replicas": None}
    resource = ConfigResource(ConfigResourceType.BROKER, str(brokers[0]["node_id"]), wanted)
    described = await _describe_configs(admin, [resource])
    found = {key: value for configs in described.values() for key, value in configs.items() if key in wanted}
    if set(found) != set(wanted):
        raise TopicMismatch(f"broker {brokers[0]['node_id']} did not describe {sorted(wanted)}: got {found}")
    return found


async def _create(admin: Admin, missing: list[TopicSpec], replication: Replication) -> None:
    """Create `missing`; one that another worker created meanwhile is fine, any other refusal
    (too few brokers for the replication asked, a policy) stops the start, saying why."""
    factor = replication.factor
    response = await admin.create_topics(
        [NewTopic(s.name, s.partitions, factor, topic_configs=_configs(s, replication)) for s in missing]
    )
    for name, code, message, *_ in response.topic_errors:
        if not code:
            log.info("created topic=%s replicas=%d min_insync=%d", name, factor, replication.min_insync)
        elif code != TOPIC_ALREADY_EXISTS:
            raise TopicMismatch(
                f"topic {name!r} could not be created with {factor} replicas: "
                f"{for_code(code).__name__}: {message}"
            )


def _check_replicas(
    replicas: dict[str, list[int]], specs: list[TopicSpec], replication: Replication, bootstrap: str
) -> None:
    """Refuse a topic the worker writes that has fewer replicas than asked: one broker down would
    stop the worker, and one disk lost would lose what it acknowledged."""
    for spec in specs:
        if (have := min(replicas[spec.name])) < replication.factor:
            raise TopicMismatch(
                f"topic {spec.name!r} has {have} replicas, the service asks for {replication.factor} "
                "(NEARDUP_REPLICATION_FACTOR, by default the broker's default.replication.factor); "
                f"add replicas with kafka-reassign-partitions.sh --bootstrap-server {bootstrap} "
                f"--execute --reassignment-json-file FILE, FILE listing each of its partitions with "
                f"{replication.factor} broker ids as its replicas (deploy/docs/operations.md, "
                '"Replication"), or delete the topic (the changelog only with the state: it is the '
                "index's copy) so that the service creates it again"
            )


async def _check_configs(admin: Admin, specs: list[TopicSpec], replication: Replication) -> None:
    """Refuse topics whose max.message.bytes is below what the service sends them, whose
    min.insync.replicas is below what is asked, and an internal topic with a retention."""
    names = ("max.message.bytes", "min.insync.replicas", *INTERNAL_RETENTION)
    wanted = [ConfigResource(ConfigResourceType.TOPIC, s.name, dict.fromkeys(names)) for s in specs]
    configs = await _describe_configs(admin, wanted)
    for spec in specs:
        for problem in _config_problems(spec, configs.get(spec.name, {}), replication):
            raise TopicMismatch(problem)


async def _describe_configs(admin: Admin, resources: list[ConfigResource]) -> dict[str, dict[str, str]]:
    """Each resource's configs by name: DescribeConfigs' answer, walked here once for the broker's
    defaults, the topics' checks and the changelog's tombstone retention."""
    configs: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for _error, _message, _type, name, entries in response.resources:
            configs[name] = {entry[0]: entry[1] for entry in entries}
    return configs


def _config_problems(spec: TopicSpec, have: dict[str, str], replication: Replication) -> list[str]:
    """What is wrong with one topic's configs, each said with the command that fixes it."""
    fix = f"kafka-configs.sh --alter --entity-type topics --entity-name {spec.name} --add-config"
    problems = []
    limit, need = have.get("max.message.bytes"), spec.max_message_bytes
    if limit is not None and need is not None and int(limit) < need:
        problems.append(
            f"topic {spec.name!r} takes messages of up to {limit} bytes (max.message.bytes), the "
            f"service sends it up to {need}; raise its limit ({fix} max.message.bytes={need}) "
            "or point the service at another topic name"
        )
    min_insync = have.get("min.insync.replicas")
    if min_insync is not None and int(min_insync) < replication.min_insync:
        problems.append(
            f"topic {spec.name!r} has min.insync.replicas={min_insync}, the service asks for "
            f"{replication.min_insync} (NEARDUP_MIN_INSYNC_REPLICAS, by default the broker's); "
            f"raise it ({fix} min.insync.replicas={replication.min_insync})"
        )
    kept = {key: have.get(key) for key in INTERNAL_RETENTION}
    if spec.internal and any(value is not None and value != "-1" for value in kept.values()):
        problems.append(
            f"topic {spec.name!r} is internal and must keep its messages until they are decided "
            f"and purged, but has retention {kept}; remove it ({fix} retention.ms=-1,retention.bytes=-1)"
        )
    return problems


def _configs(spec: TopicSpec, replication: Replication) -> dict[str, str]:
    configs = {"min.insync.replicas": str(replication.min_insync)}
    if spec.compact:
        configs["cleanup.policy"] = "compact"
    if spec.max_message_bytes is not None:
        configs["max.message.bytes"] = str(max(spec.max_message_bytes, KAFKA_DEFAULT_MAX_MESSAGE_BYTES))
    if spec.internal:
        configs.update(INTERNAL_RETENTION)
    return configs


async def _replicas(admin: Admin, names: list[str]) -> dict[str, list[int]]:
    """Each topic of `names` that exists: its partitions' replica counts (their number is its
    partition count)."""
    return {
        topic["topic"]: [len(partition["replicas"]) for partition in topic["partitions"]]
        for topic in await admin.describe_topics(names)
        if topic.get("error_code", 0) == 0 and topic.get("partitions")
    }


def admin_client(settings: Settings) -> Admin:
    return Admin(bootstrap_servers=settings.bootstrap_servers, **settings.client_security())


def groupless_consumer(settings: Settings, **options: Any) -> AIOKafkaConsumer:
    """A consumer of no group, for reading a partition directly from where it is told to."""
    return AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        isolation_level=settings.isolation_level,
        **options,
        **settings.client_security(),
    )


async def _records_before(
    consumer: AIOKafkaConsumer, tp: TopicPartition, stop: int, stall_s: float | None = None
) -> AsyncIterator[Any]:
    """The records of `tp` from the consumer's position up to offset `stop` (excluded). Raises
    TimeoutError when the position stays put for `stall_s` seconds (None: no limit): the broker
    is away, and a reader that waits for it without end would stall the worker unnoticed."""
    position, moved_at = await consumer.position(tp), time.monotonic()
    while position < stop:
        for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
            if record.offset < stop:
                yield record
        now, before = time.monotonic(), position
        position = await consumer.position(tp)
        if position > before:
            moved_at = now
        elif stall_s is not None and now - moved_at > stall_s:
            raise TimeoutError(
                f"{tp.topic}[{tp.partition}]: no record for {stall_s:.0f} s at offset {position}"
            )


class LogReader:
    """Reads ranges of a partition's log directly, with a consumer of no group: what the worker's
    own consumer went past without delivering it (app.py). The consumer is started at the first
    read and kept: starting one (connections, metadata) is slow next to a read, and an input written
    in transactions has a gap (its commit marker) after every transaction. One read at a time (the
    agents share it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def read(self, topic: str, partition: int, start: int, stop: int) -> list[StoredMessage]:
        """The messages from offset `start` up to `stop` (excluded). Offsets with no message (a
        transaction marker; removed by retention or compaction) are simply absent. Raises
        TimeoutError when the broker does not answer in READ_BACK_TIMEOUT_S."""
        async with self._lock, asyncio.timeout(READ_BACK_TIMEOUT_S):
            if (consumer := self._consumer) is None:
                consumer = groupless_consumer(
                    self.settings,
                    # a gap that holds only a transaction marker has no record to return: the broker
                    # would answer only once its fetch wait (500 ms by default) has passed
                    fetch_max_wait_ms=0,
                    # A fetch returns the first record batch at its offset whatever its size (a marker
                    # is one, an oversized message another): a small limit keeps the broker from
                    # adding the messages after the gap, which the worker's consumer delivered already.
                    max_partition_fetch_bytes=READ_BACK_FETCH_BYTES,
                    fetch_max_bytes=2 * DEAD_LETTER_MAX_BYTES,
                )
                await consumer.start()
                self._consumer = consumer
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start)  # before the log's start: reset to it (auto_offset_reset)
            return [
                StoredMessage(
                    record.offset, record.key, record.value, record.timestamp, tuple(record.headers or ())
                )
                async for record in _records_before(consumer, tp, stop)
                if record.offset >= start
            ]

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()


class ChangelogReader:
    """The changelog (one partition), read from its start by a consumer of no group:
    what a rebuild of the index, and `neardup stats --broker`, read. A consumer is started per call:
    rebuilds are rare, and it must not hold connections between them."""

    chunk = 2000  # messages per chunk that read_after yields

    def __init__(self, settings: Settings, stall_s: float = 60.0) -> None:
        self.settings = settings
        self.topic = changelog_topic(settings)
        self.partition = TopicPartition(self.topic, 0)  # its only one
        # A rebuild that the broker leaves without an answer this long fails (the worker exits,
        # its supervisor restarts it) rather than keep the index shard waiting unreported.
        self.stall_s = stall_s

    async def end(self) -> int:
        """The offset the changelog's next message will take."""
        consumer = groupless_consumer(self.settings)
        try:
            async with asyncio.timeout(self.stall_s):
                await start_client(self.settings, consumer)
                return int((await consumer.end_offsets([self.partition]))[self.partition])
        finally:
            await consumer.stop()

    async def read_after(self, start: int | None, end: int) -> AsyncIterator[tuple[list[Entry], int]]:
        """Its messages from `start` (None: the log's start) up to `end` (excluded), `chunk` at a
        time, each chunk with the offset after its last message (`end` for the last)."""
        if start is not None and start >= end:
            return
        consumer = groupless_consumer(self.settings)
        try:
            async with asyncio.timeout(self.stall_s):
                await start_client(self.settings, consumer)
                consumer.assign([self.partition])
                if start is None:
                    await consumer.seek_to_beginning(self.partition)
                else:
                    consumer.seek(self.partition, start)
            chunk: list[Entry] = []
            async for record in _records_before(consumer, self.partition, end, self.stall_s):
                if record.key is not None:
                    chunk.append((record.key, record.value))
                if len(chunk) >= self.chunk:
                    yield chunk, record.offset + 1
                    chunk = []
            yield chunk, end
        finally:
            await consumer.stop()

    async def tombstones_kept_ms(self) -> int | None:
        """The changelog's delete.retention.ms: how long compaction keeps a tombstone."""
        admin = admin_client(self.settings)
        try:
            async with asyncio.timeout(self.stall_s):
                await admin.start()
                wanted = ConfigResource(ConfigResourceType.TOPIC, self.topic, {"delete.retention.ms": None})
                described = await _describe_configs(admin, [wanted])
        finally:
            await admin.close()
        kept = described.get(self.topic, {}).get("delete.retention.ms")
        return None if kept is None else int(kept)
