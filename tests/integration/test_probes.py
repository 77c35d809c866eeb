"""Readiness is delivery, liveness a wedged process: a broker stopped (SIGSTOP) under a stream makes
the worker not ready but leaves it alive, and it delivers everything once the broker is back. And
the signatures topic is purged up to what is decided, never past it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.support.broker import OwnBroker, TopicReader, produce_articles
from tests.support.deployment import (
    Deployment,
    decider_pid,
    health,
    stream_of,
    verdicts_by_id,
    verdicts_by_version,
)


def _ready_url(deployment: Deployment, index: int = 0) -> str:
    return deployment.health_url(index).replace("/health", "/ready")


def _watch_probes(deployment: Deployment, seconds: float) -> list[tuple[Any, Any]]:
    """(/health, /ready) answers, five a second for `seconds`."""
    answers = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answers.append((health(deployment.health_url(0)), health(_ready_url(deployment))))
        time.sleep(0.2)
    return answers


def _wait_ready(deployment: Deployment, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (answer := health(_ready_url(deployment))) is None or answer[0] != 200:
        assert time.monotonic() < deadline, f"/ready: {answer}\n{deployment.logs()}"
        time.sleep(0.2)


def _outage_under_a_stream(
    deployment: Deployment,
    broker: OwnBroker,
    articles: list[dict[str, Any]],
    reader: TopicReader,
    seconds: float,
) -> tuple[Any, list[tuple[Any, Any]]]:
    """A worker fed `articles`, its broker stopped (SIGSTOP) for `seconds` once 100 verdicts are in
    and input is still pending: the worker, and its probes' answers meanwhile."""
    broker_pid = int((broker.data / "kafka.pid").read_text())
    worker = deployment.start_worker()
    _wait_ready(deployment, 30)
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    seen = reader.read_until(lambda r: len(r) >= 100, timeout=60)
    assert len(verdicts_by_id(seen)) < len(articles), "the broker stops while input is pending"
    os.kill(broker_pid, signal.SIGSTOP)
    try:
        return worker, _watch_probes(deployment, seconds)
    finally:
        os.kill(broker_pid, signal.SIGCONT)


@pytest.mark.budget(30)  # a broker stopped for 10 s under a stream, then the rest of the stream
def test_a_stopped_broker_makes_the_worker_unready_not_dead_and_nothing_is_lost(
    own_broker: OwnBroker, tmp_path: Path
) -> None:
    deployment = Deployment(own_broker.bootstrap, tmp_path)
    # limits far below the outage: the old single /health turned 503 after the stall timeout of
    # unacknowledged sends, which a liveness probe turned into a restart
    deployment.extra_env.update({"NEARDUP_READY_TIMEOUT": "2", "NEARDUP_STALL_TIMEOUT": "4"})
    articles = stream_of(1_500)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    try:
        worker, answers = _outage_under_a_stream(deployment, own_broker, articles, reader, 10)
        lives = [live for live, _ in answers]
        readies = [ready for _, ready in answers]
        assert all(live is not None and live[0] == 200 for live in lives), lives
        unready = [ready for ready in readies if ready is not None and ready[0] == 503]
        assert unready, f"/ready never answered 503 during the outage: {readies}"
        assert all(ready[1]["status"] == "not_ready" for ready in unready), unready
        _wait_ready(deployment, 60)
        verdicts = verdicts_by_id(
            reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=120)
        )
        assert set(verdicts) == {a["id"] for a in articles}, deployment.logs()
        assert worker.poll() is None, f"the worker must go on by itself:\n{deployment.logs()}"
        assert health(deployment.health_url(0)) is not None
    finally:
        deployment.discard()


@pytest.mark.budget(60)  # a 12 s outage, a supervised restart and the rest of the stream
def test_an_outage_past_the_transaction_timeout_loses_and_repeats_nothing_under_exactly_once(
    own_broker: OwnBroker, tmp_path: Path
) -> None:
    """Exactly-once, a broker stopped for longer than the transaction and delivery timeouts under a
    stream: the worker is not ready meanwhile and stays alive; once the broker is back it finds its
    transaction aborted (fenced by its own timeout) and stops, and restarted as a supervisor would,
    it restores its index and delivers again within 30 s of the broker's return: a read_committed
    consumer finds every verdict once."""
    deployment = Deployment(own_broker.bootstrap, tmp_path)
    deployment.extra_env.update(
        {
            "NEARDUP_PROCESSING_GUARANTEE": "exactly_once",
            "NEARDUP_TRANSACTION_TIMEOUT": "4",
            "NEARDUP_DELIVERY_TIMEOUT": "4",
            "NEARDUP_READY_TIMEOUT": "2",
            "NEARDUP_STALL_TIMEOUT": "4",
        }
    )
    articles = stream_of(1_500)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    try:
        worker, answers = _outage_under_a_stream(deployment, own_broker, articles, reader, 12)
        back = time.monotonic()
        # Alive throughout; or, where a send of a transaction open at the stop times out inside
        # the outage (NEARDUP_DELIVERY_TIMEOUT), failed for that abort, which is final for its
        # writer: the worker stops (unanswered from then on), and is restarted below.
        lives = [live for live, _ in answers]
        failed = next((n for n, live in enumerate(lives) if live is not None and live[0] != 200), len(lives))
        assert all(live is not None and live[0] == 200 for live in lives[:failed]), answers
        stopping = [
            live is None or "transaction_aborted" in live[1].get("reason", "") for live in lives[failed:]
        ]
        assert all(stopping), answers
        assert any(ready is not None and ready[0] == 503 for _, ready in answers), answers
        # the supervisor: a worker that stops is started again
        restarts = 0
        while len(verdicts_by_id(reader.read_all(timeout=30))) < len(articles):
            assert time.monotonic() - back < 60, deployment.logs()
            if worker.poll() is not None:
                worker = deployment.start_worker(wait=False)
                restarts += 1
            time.sleep(0.5)
        records = reader.read_all(timeout=30)
        counts = verdicts_by_version(records)
        assert [key for key, n in counts.items() if n > 1] == []
        assert {article_id for article_id, _ in counts} == {a["id"] for a in articles}
        first_after = _first_verdict_after(records, back)
        assert first_after is not None and first_after - back < 30, (first_after, back, restarts)
    finally:
        deployment.discard()


def _first_verdict_after(records: list[Any], since_monotonic: float) -> float | None:
    """When (monotonic) the first verdict written after `since_monotonic` was written, by its
    record timestamp (the wall clock of the worker's producer)."""
    since_ms = (time.time() - (time.monotonic() - since_monotonic)) * 1000
    after = [r.timestamp for r in records if r.timestamp >= since_ms]
    if not after:
        return None
    return since_monotonic + (min(after) - since_ms) / 1000


async def _signatures_offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    """The signatures partition's log start and end offsets."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        start, end = await consumer.beginning_offsets([tp]), await consumer.end_offsets([tp])
        return int(start[tp]), int(end[tp])
    finally:
        await consumer.stop()


async def _committed(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        found = offsets.get(TopicPartition(topic, 0))
        return -1 if found is None else int(found.offset)
    finally:
        await admin.close()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_the_signatures_topic_is_purged_up_to_what_is_decided_and_never_past_it(
    deployment: Deployment, guarantee: str
) -> None:
    deployment.extra_env["NEARDUP_SIGNATURES_PURGE_INTERVAL"] = "0.5"
    deployment.extra_env["NEARDUP_PROCESSING_GUARANTEE"] = guarantee
    topic = deployment.topics["signatures"]
    articles = stream_of(120)
    first, second = articles[:60], articles[60:]
    worker = deployment.start_worker()
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    produce_articles(deployment.bootstrap, deployment.topics["input"], first)
    reader.reach(lambda r: len(verdicts_by_id(r)) >= len(first), timeout=60, logs=deployment.logs)
    decided_start, end = _purged_to_committed(deployment, topic, 0)
    # the index stage stopped for real: what is signed now stays undecided
    decider = decider_pid(worker.pid)
    os.kill(decider, signal.SIGSTOP)
    try:
        produce_articles(deployment.bootstrap, deployment.topics["input"], second)
        deadline = time.monotonic() + 15
        while asyncio.run(_signatures_offsets(deployment.bootstrap, topic))[1] == end:
            assert time.monotonic() < deadline, f"nothing signed\n{deployment.logs()}"
            time.sleep(0.3)
        time.sleep(3)  # six purge intervals
        start, end = asyncio.run(_signatures_offsets(deployment.bootstrap, topic))
        assert start == decided_start < end, (start, decided_start, end)
        assert asyncio.run(_committed(deployment.bootstrap, deployment.name, topic)) == decided_start
    finally:
        os.kill(decider, signal.SIGCONT)
    reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=60)
    start, _ = _purged_to_committed(deployment, topic, decided_start)
    assert deployment.metric(0, "neardup_signatures_log_start") == start


def _purged_to_committed(deployment: Deployment, topic: str, above: int) -> tuple[int, int]:
    """The signatures topic's log start and end once the start is above `above` and at the group's
    committed offset, with everything decided: the end at it, or under exactly-once one beyond it
    (a transaction's commit marker; at least once, an offset one short of the end is a message
    decided whose commit is still to come)."""
    marker = deployment.extra_env.get("NEARDUP_PROCESSING_GUARANTEE") == "exactly_once"
    deadline = time.monotonic() + 15
    while True:
        start, end = asyncio.run(_signatures_offsets(deployment.bootstrap, topic))
        committed = asyncio.run(_committed(deployment.bootstrap, deployment.name, topic))
        if above < start == committed >= end - int(marker):
            return start, end
        assert time.monotonic() < deadline, f"not purged: {start, end, committed}\n{deployment.logs()}"
        time.sleep(0.3)
