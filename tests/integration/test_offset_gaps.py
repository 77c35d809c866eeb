"""A consumer that goes past signatures messages without delivering them (faust-streaming has open
reports of events skipped around restarts): the index stage notices the gap from the offset the
record table says was applied, reads the missing messages back from Kafka and decides them first.

The gap is made deterministic here: while the worker is stopped, signatures are appended to the
topic as the sign stage would write them, and the group's committed offset is moved past some of
them, so that the restarted worker's consumer starts beyond them."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, UnknownMemberIdError

from neardup.config import Settings
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import Provenance, pack_signed
from neardup.stream.outputs import SHARD_KEY
from neardup.stream.topics import (
    DEAD_LETTER_MAX_BYTES,
    READ_BACK_FETCH_BYTES,
    ChangelogReader,
    LogReader,
    TopicMismatch,
    changelog_topic,
    ensure_topics,
)
from tests.support.broker import TopicReader, create_topic, produce_articles
from tests.support.deployment import Deployment, load_sample, run_embedded, verdicts_by_id, without_latency

SKIPPED = 3  # signatures messages the consumer goes past


async def append_signatures(bootstrap: str, topic: str, packs: list[bytes]) -> list[int]:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=DEAD_LETTER_MAX_BYTES
    )
    await producer.start()
    try:
        sent = [await producer.send_and_wait(topic, pack, key=SHARD_KEY, partition=0) for pack in packs]
    finally:
        await producer.stop()
    return [metadata.offset for metadata in sent]


async def move_group_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Commit `offset` for the stopped worker's group, as if its consumer had read up to it. The
    worker is a static member, which stays in the group after a clean stop until its session
    times out (NEARDUP_SESSION_TIMEOUT_MS): until then the broker refuses the commit."""
    deadline = time.monotonic() + 60
    while True:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.commit({tp: offset})
            return
        except (CommitFailedError, UnknownMemberIdError):
            if time.monotonic() > deadline:
                raise
        finally:
            await consumer.stop()
        await asyncio.sleep(1)


def test_signatures_the_consumer_went_past_are_read_back_in_order(
    deployment: Deployment, tmp_path: Path
) -> None:
    articles = load_sample()
    first, second = articles[:200], articles[200:]
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    # the shortest session the worker takes: the stopped static member leaves the group sooner, and
    # the broker then takes the commit that moves its offset (move_group_offset)
    deployment.extra_env["NEARDUP_SESSION_TIMEOUT_MS"] = "6000"
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, deployment.topics["input"], first)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    reader.reach(lambda r: len(verdicts_by_id(r)) >= len(first), timeout=180, logs=deployment.logs)
    deployment.kill(worker, signal.SIGTERM)  # a clean stop: everything applied is committed

    # The second half signed as the sign stage does, ten articles a message, appended to the topic.
    stage = SignStage(Settings.from_env(deployment.env(0)).params(), 1_000_000)  # the worker's own
    packs = []
    for start in range(0, len(second), 10):
        signed = []
        for offset, article in enumerate(second[start : start + 10], start=start):
            raw = orjson.dumps(article)
            result = stage.handle(raw, article["id"].encode(), Provenance("input", 0, offset, None))
            assert result.signed is not None
            signed.append(result.signed)
        packs.append(pack_signed(signed))
    offsets = asyncio.run(append_signatures(deployment.bootstrap, deployment.topics["signatures"], packs))
    # The consumer will start past the first SKIPPED of them.
    asyncio.run(
        move_group_offset(
            deployment.bootstrap, deployment.name, deployment.topics["signatures"], offsets[SKIPPED]
        )
    )

    worker = deployment.start_worker()
    records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=240)
    verdicts = verdicts_by_id(records)
    for article in second:
        got = [without_latency(v) for v in verdicts[article["id"]]]
        assert got == [expected[article["id"]]], article["id"]
    signatures = deployment.topics["signatures"]
    assert deployment.settled_metric(0, f'neardup_offset_gaps_total{{topic="{signatures}"}}', 1.0) == 1.0
    read_back = f'neardup_offset_gap_messages_total{{topic="{signatures}"}}'
    assert deployment.settled_metric(0, read_back, float(SKIPPED)) == SKIPPED
    deployment.kill(worker, signal.SIGTERM)
    log = (deployment.root / "worker0.log").read_text(errors="replace")
    filled = f"partition=0 expected={offsets[0]} got={offsets[SKIPPED]} read={SKIPPED}"
    assert f"offset_gap_filled topic={deployment.topics['signatures']} {filled}" in log


async def produce_in_transactions(
    bootstrap: str, topic: str, articles: list[dict], per_transaction: int
) -> None:
    """Each transaction ends with a commit marker, which takes an offset of its own: the consumer
    sees a gap of one after every transaction, with nothing to read back."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"neardup-test-{topic}")
    await producer.start()
    try:
        for start in range(0, len(articles), per_transaction):
            async with producer.transaction():
                for article in articles[start : start + per_transaction]:
                    await producer.send(topic, orjson.dumps(article), key=article["id"].encode(), partition=0)
    finally:
        await producer.stop()


def test_transaction_markers_in_the_input_are_gaps_with_nothing_missing(
    deployment: Deployment, tmp_path: Path
) -> None:
    articles = load_sample()
    per_transaction = 50
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    deployment.create_topics()
    asyncio.run(
        produce_in_transactions(deployment.bootstrap, deployment.topics["input"], articles, per_transaction)
    )
    worker = deployment.start_worker()
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=180)
    verdicts = verdicts_by_id(records)
    assert {article_id: without_latency(seen[0]) for article_id, seen in verdicts.items()} == expected
    markers = -(-len(articles) // per_transaction)
    gaps = f'neardup_offset_gaps_total{{topic="{deployment.topics["input"]}"}}'
    # every marker but the last is followed by a message, which reveals it
    assert deployment.settled_metric(0, gaps, markers - 1) == markers - 1
    assert deployment.settled_metric(0, "neardup_articles_in_total", len(articles)) == len(articles)
    read_back = f'neardup_offset_gap_messages_total{{topic="{deployment.topics["input"]}"}}'
    assert deployment.metric(0, read_back) == 0.0
    deployment.kill(worker, signal.SIGTERM)


def test_a_read_back_returns_what_a_gap_holds_and_nothing_after_it(kafka: str) -> None:
    """The read-backs of gaps under exactly-once: a committed transaction's messages (larger than
    one fetch asks), its marker, an aborted transaction and its marker, in one range; and a gap
    that holds only a marker, between messages already delivered, returns nothing."""
    settings = Settings.from_env(
        {"NEARDUP_PROCESSING_GUARANTEE": "exactly_once"},
        broker=f"kafka://{kafka}",
        app_id=f"readback-{time.time_ns()}",
    )
    topic = f"{settings.app_id}-log"
    big = [bytes([n]) * (READ_BACK_FETCH_BYTES * 4) for n in range(3)]

    async def write() -> list[int]:
        await create_topic(kafka, topic)
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka, transactional_id=f"{topic}-writer", max_request_size=2**21
        )
        await producer.start()
        try:
            async with producer.transaction():  # offsets 0-2, its marker 3
                committed = [
                    (await producer.send_and_wait(topic, value, partition=0)).offset for value in big
                ]
            await producer.begin_transaction()  # offsets 4-5, its marker 6
            for value in (b"aborted", b"aborted too"):
                await producer.send_and_wait(topic, value, partition=0)
            await producer.abort_transaction()
            async with producer.transaction():  # offset 7, its marker 8
                last = (await producer.send_and_wait(topic, b"after", partition=0)).offset
        finally:
            await producer.stop()
        return [*committed, last]

    async def read(reader: LogReader, start: int, stop: int) -> list[tuple[int, bytes | None]]:
        return [(found.offset, found.value) for found in await reader.read(topic, 0, start, stop)]

    async def run() -> tuple[list[int], list[tuple[int, bytes | None]], list[tuple[int, bytes | None]]]:
        offsets = await write()
        reader = LogReader(settings)
        try:
            return offsets, await read(reader, 0, offsets[-1]), await read(reader, 3, 7)
        finally:
            await reader.close()

    offsets, whole, between = asyncio.run(run())
    assert offsets == [0, 1, 2, 7]
    assert whole == list(zip(offsets[:3], big, strict=True))
    assert between == []  # a marker, an aborted transaction and its marker: nothing to decide


def test_a_changelog_read_that_stops_moving_fails_within_its_bound(kafka: str) -> None:
    """A rebuild reads the changelog up to the end it was told; a broker that stops answering (here:
    an end beyond what the log holds, so the position stays put) fails the read, loudly, rather than
    keep the index shard waiting without end."""
    settings = Settings(broker=f"kafka://{kafka}", app_id=f"stall-{time.time_ns()}")
    topic = changelog_topic(settings)
    asyncio.run(ensure_topics(settings))
    asyncio.run(append_signatures(kafka, topic, [b"one", b"two", b"three"]))
    reader = ChangelogReader(settings, stall_s=2.0)

    async def read_up_to(end: int) -> list[tuple[bytes, bytes | None]]:
        return [entry async for chunk, _ in reader.read_after(None, end) for entry in chunk]

    assert asyncio.run(reader.end()) == 3
    assert [value for _, value in asyncio.run(read_up_to(3))] == [b"one", b"two", b"three"]
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no record for 2 s at offset 3"):
        asyncio.run(read_up_to(5))
    assert 2.0 <= time.monotonic() - started < 15.0


def test_a_dead_letter_topic_that_takes_less_than_a_dead_letter_is_refused_at_start(kafka: str) -> None:
    """A dead letter of a large input would be refused by the broker and stop the worker at every
    restart: an existing dead-letter topic whose limit is too small is refused up front, by name."""
    settings = Settings(broker=f"kafka://{kafka}", app_id=f"limits-{time.time_ns()}")
    settings = dataclasses.replace(settings, dead_letter_topic=f"{settings.app_id}-small-letters")

    asyncio.run(create_topic(kafka, settings.dead_letter_topic, configs={"max.message.bytes": "100000"}))
    with pytest.raises(TopicMismatch, match=f"'{settings.dead_letter_topic}' takes messages of up to 100000"):
        asyncio.run(ensure_topics(settings))
    fine = dataclasses.replace(settings, dead_letter_topic=f"{settings.app_id}-letters")
    assert fine.dead_letter_topic in asyncio.run(ensure_topics(fine))  # created with the limit it needs
