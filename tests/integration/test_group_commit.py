"""The transactional writer's group commit through the real broker: batches that come while a
transaction commits join the next one; each commits with the highest offsets of the batches it
carries, and a batch that fails takes down only the transaction it joined."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition

from neardup.config import Settings
from neardup.stream.transactions import Ended, Fenced, TransactionalWriter
from tests.support.broker import TopicReader, create_topic, group_offset

BATCHES = 40


async def _topic(bootstrap: str) -> str:
    name = f"gc-{uuid.uuid4().hex[:10]}"
    await create_topic(bootstrap, name)
    return name


def _writer(
    bootstrap: str, outcomes: list[str], name: str, commit_interval: float = 0.0
) -> TransactionalWriter:
    env = {"NEARDUP_COMMIT_INTERVAL": str(commit_interval)}
    settings = Settings.from_env(env, broker=f"kafka://{bootstrap}", app_id=f"{name}-group")
    return TransactionalWriter(settings, f"{name}-writer", counted=outcomes.append)


async def _batch(
    writer: TransactionalWriter,
    topic: str,
    number: int,
    fail: bool = False,
    inside: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """One batch: one message, committed with the offset after `number` (on the topic's own
    partition, as a stage commits what it consumed); `inside` runs while the batch is in its
    transaction."""
    async with writer.joined({TopicPartition(topic, 0): number + 1}) as transaction:
        transaction.sends.append(await transaction.producer.send(topic, str(number).encode(), partition=0))
        if inside is not None:
            await inside()
        if fail:
            raise RuntimeError("the batch failed")
    await transaction.committed


def _committed_values(bootstrap: str, topic: str, count: int) -> list[int]:
    """The first `count` values a read_committed consumer finds. Read until they are there, not up
    to the end offsets at once: the broker writes a transaction's commit markers after answering
    its commit, and the stable offset a committed reader stops at moves only then."""
    reader = TopicReader(bootstrap, topic, "read_committed")
    return [int(r.value) for r in reader.read_until(lambda records: len(records) >= count, timeout=30)]


def test_batches_arriving_during_a_commit_share_the_next_transaction(kafka: str) -> None:
    async def run() -> tuple[str, list[str], int | None]:
        topic = await _topic(kafka)
        outcomes: list[str] = []
        writer = _writer(kafka, outcomes, topic)
        later: list[asyncio.Future[None]] = []

        async def come_meanwhile() -> None:
            # the other batches come while the first is in its transaction: they wait for its
            # commit, and then share the next one
            later.extend(asyncio.ensure_future(_batch(writer, topic, n)) for n in range(1, BATCHES))
            await asyncio.sleep(0.05)

        try:
            await _batch(writer, topic, 0, inside=come_meanwhile)
            await asyncio.gather(*later)
        finally:
            await writer.stop()
        return topic, outcomes, await group_offset(kafka, topic, f"{topic}-group")

    topic, outcomes, offset = asyncio.run(run())
    assert outcomes == ["committed", "committed"]  # the first batch alone, then all the others
    # each once, in the order they joined
    assert _committed_values(kafka, topic, BATCHES) == list(range(BATCHES))
    assert offset == BATCHES  # the highest offset of the batches the last transaction carried


def test_a_failed_batch_aborts_the_transaction_it_joined_and_nothing_after_it_commits(kafka: str) -> None:
    """An abort is final for its writer: a later batch was built on what aborted (the index's held
    writes, a partition's order), so it is refused until the stage resumes from the last commit."""

    async def run() -> tuple[str, list[str], list[Any], BaseException | None]:
        topic = await _topic(kafka)
        outcomes: list[str] = []
        writer = _writer(kafka, outcomes, topic)
        queued: list[asyncio.Future[None]] = []
        after: BaseException | None = None

        async def queue_two() -> None:
            # 1 and 2 come while 0 is in its transaction: they wait for its commit, then share
            # the next, which 2 fails
            queued.append(asyncio.ensure_future(_batch(writer, topic, 1)))
            queued.append(asyncio.ensure_future(_batch(writer, topic, 2, fail=True)))
            await asyncio.sleep(0.05)

        try:
            await _batch(writer, topic, 0, inside=queue_two)
            results = await asyncio.gather(*queued, return_exceptions=True)
            try:
                await _batch(writer, topic, 3)
            except Ended as exc:
                after = exc
        finally:
            await writer.stop()
        return topic, outcomes, results, after

    topic, outcomes, results, after = asyncio.run(run())
    assert [type(r) for r in results] == [RuntimeError, RuntimeError], results
    assert outcomes == ["committed", "aborted"]
    assert isinstance(after, Ended) and "transaction_aborted" in str(after)
    assert _committed_values(kafka, topic, 1) == [0]


def test_a_fenced_writer_sends_nothing_more(kafka: str) -> None:
    async def run() -> tuple[str, list[str], BaseException | None]:
        topic = await _topic(kafka)
        outcomes: list[str] = []
        old, new = _writer(kafka, outcomes, topic), _writer(kafka, [], topic)
        error: BaseException | None = None
        try:
            await _batch(old, topic, 0)
            await new.start()  # the same transactional id: the old producer is fenced
            for number in (1, 2):  # the fence shows on the first, the second is refused at once
                try:
                    await _batch(old, topic, number)
                except Fenced as exc:
                    error = exc
        finally:
            await old.stop()
            await new.stop()
        return topic, outcomes, error

    topic, outcomes, error = asyncio.run(run())
    assert isinstance(error, Fenced)
    assert outcomes == ["committed", "aborted"]
    assert _committed_values(kafka, topic, 1) == [0]


@pytest.mark.parametrize("interval", [0.0, 1.0])
def test_the_commit_interval_spaces_the_commits(kafka: str, interval: float) -> None:
    """Batches come one by one, each once its send is in (not its commit), over 0.4 s: without an
    interval each commit takes what came during the one before, so there are several; with a
    1 s interval all but the first share the transaction committed 1 s after the first began."""

    async def run() -> tuple[str, list[str], float]:
        topic = await _topic(kafka)
        outcomes: list[str] = []
        writer = _writer(kafka, outcomes, topic, commit_interval=interval)
        loop = asyncio.get_running_loop()
        await writer.start()
        try:
            began = loop.time()
            batches = []
            for number in range(BATCHES // 2):
                batches.append(asyncio.ensure_future(_batch(writer, topic, number)))
                await asyncio.sleep(0.02)
            await asyncio.gather(*batches)
            return topic, outcomes, loop.time() - began
        finally:
            await writer.stop()

    topic, outcomes, took = asyncio.run(run())
    assert set(outcomes) == {"committed"}
    if interval:
        assert outcomes == ["committed", "committed"]
        assert took >= interval
    else:
        assert len(outcomes) > 2
    assert _committed_values(kafka, topic, BATCHES // 2) == list(range(BATCHES // 2))
