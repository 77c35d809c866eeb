"""Exactly-once that holds through an abort and through a failure after a commit, against the real
broker: an aborted transaction is final for its writer (nothing decided or signed after it commits
before the stage resumes from what was committed), and a failure once a commit has landed stops
the stage rather than wedge it. The worker's decider process killed around a commit is replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from neardup.config import Settings
from neardup.stream.transactions import Ended, TransactionalWriter
from tests.support.broker import TopicReader, create_topic, produce_articles, set_max_message_bytes
from tests.support.deployment import (
    Deployment,
    content_stats,
    decider_pid,
    run_embedded,
    stream_of,
    verdicts_by_version,
    without_latency,
)
from tests.support.faults import AGENT_FAULT, fault_env

EXACTLY_ONCE = {"NEARDUP_PROCESSING_GUARANTEE": "exactly_once"}
SMALL = 1500  # max.message.bytes lowered under the stream: every article's message is larger


# --- the writer alone, on the real broker --------------------------------------------------------


async def _started_writer(bootstrap: str, name: str) -> tuple[TransactionalWriter, list[str]]:
    """A transactional writer of its own, started, and the reasons it gives when it ends."""
    settings = Settings.from_env(
        {"NEARDUP_BROKER": f"kafka://{bootstrap}", "NEARDUP_APP_ID": name, **EXACTLY_ONCE}
    )
    reasons: list[str] = []
    writer = TransactionalWriter(settings, f"{name}-writer", failed=reasons.append)
    await writer.start()
    return writer, reasons


async def _abort_then_more(bootstrap: str, name: str) -> tuple[list[str], BaseException | None]:
    """A transaction whose record its topic refuses (too large), then another batch: the reasons
    the writer gave, and what the second batch met."""
    small, other = f"{name}-small", f"{name}-other"
    await create_topic(bootstrap, small, configs={"max.message.bytes": str(SMALL)})
    await create_topic(bootstrap, other)
    writer, reasons = await _started_writer(bootstrap, name)
    try:
        async with writer.joined({}) as transaction:
            transaction.sends.append(await transaction.producer.send(small, b"x" * (4 * SMALL)))
        with pytest.raises(Exception, match="MessageSizeTooLarge"):
            await transaction.committed
        try:
            async with writer.joined({}) as later:
                later.sends.append(await later.producer.send(other, b"after the abort"))
            await later.committed
        except Ended as exc:
            return reasons, exc
        return reasons, None
    finally:
        await writer.stop()


def test_an_abort_is_final_for_its_writer(kafka: str) -> None:
    name = f"abort{os.getpid()}{time.monotonic_ns() % 10**6}"
    reasons, met = asyncio.run(_abort_then_more(kafka, name))
    assert isinstance(met, Ended), "a transaction after an abort must not commit"
    assert len(reasons) == 1 and reasons[0].startswith("transaction_aborted"), reasons
    assert TopicReader(kafka, f"{name}-other", "read_committed").read_all(timeout=30) == []


async def _failing_after_commit(bootstrap: str, name: str) -> tuple[list[str], list[str]]:
    topic = f"{name}-out"
    await create_topic(bootstrap, topic)
    outcomes: list[str] = []
    writer, reasons = await _started_writer(bootstrap, name)

    def breaks() -> None:
        raise OSError("the index's disk is full")

    try:
        async with writer.joined({}) as transaction:
            transaction.sends.append(await transaction.producer.send(topic, b"committed"))
            transaction.on_commit.append(breaks)
        try:
            await asyncio.wait_for(transaction.committed, 30)  # resolved: never a wedge
            outcomes.append("committed")
        except Ended:
            outcomes.append("ended")
        try:
            async with writer.joined({}):
                outcomes.append("joined")
        except Ended:
            outcomes.append("refused")
        return reasons, outcomes
    finally:
        await writer.stop()


def test_a_failure_after_a_commit_ends_the_writer_and_fails_the_stage(kafka: str) -> None:
    name = f"post{os.getpid()}{time.monotonic_ns() % 10**6}"
    reasons, outcomes = asyncio.run(_failing_after_commit(kafka, name))
    assert outcomes == ["ended", "refused"]
    assert len(reasons) == 1 and reasons[0].startswith("post_commit_failed"), reasons
    assert "disk is full" in reasons[0]
    # the commit itself stands
    records = TopicReader(kafka, f"{name}-out", "read_committed").read_all(timeout=30)
    assert [r.value for r in records] == [b"committed"]


# --- the worker ---------------------------------------------------------------------------------


def _near_copies(count: int) -> list[dict[str, Any]]:
    """One article, then `count` lightly edited copies of it: every message larger than SMALL."""
    base = stream_of(1)[0]["text"]
    text = " ".join([base] * max(1, (2 * SMALL) // len(base) + 1))
    articles = [{"id": "a-original", "text": text}]
    articles += [{"id": f"b{i:04d}", "text": f"{text} Update {i}."} for i in range(count)]
    return articles


async def _produce_paced(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    """As a feed arrives: one message every 5 ms, so that batches and transactions follow each
    other while the worker stops."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, value, key=key)
            await asyncio.sleep(0.005)
        await producer.flush()
    finally:
        await producer.stop()


def _supervised_until_decided(deployment: Deployment, worker: Any, ids: set[str], timeout: float) -> Any:
    """Restart the worker whenever it stops, as a supervisor would, until every id has a committed
    verdict; returns the worker running at the end."""
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    deadline = time.monotonic() + timeout
    while {key for key, _ in verdicts_by_version(committed.read_all(timeout=30))} != ids:
        assert time.monotonic() < deadline, deployment.logs()
        if worker.poll() is not None:
            worker = deployment.start_worker()
        time.sleep(0.5)
    return worker


@pytest.mark.budget(60)  # a stop for the abort, a restart and a restore, twice the stream
@pytest.mark.parametrize("stage", ["index", "sign"])
def test_an_aborted_transaction_loses_nothing_and_nothing_commits_past_it(
    deployment: Deployment, tmp_path: Path, stage: str
) -> None:
    """A topic a stage writes to refuses its messages mid-stream (max.message.bytes lowered, as an
    operator's change or a policy would): the index stage's filtered feed, or the sign stage's
    dead letters (one oversized malformed message among the articles). The transaction aborts;
    the worker stops without committing anything decided or signed after it, and once the limit is
    restored and the worker restarted, every article has exactly one committed verdict, equal to
    embedded mode's, and a rebuild from the changelog equals the worker's index."""
    articles = _near_copies(300)
    messages = [(a["id"].encode(), orjson.dumps(a)) for a in articles]
    deployment.extra_env.update({**EXACTLY_ONCE, "NEARDUP_FAILURE_EXIT_TIMEOUT": "10"})
    if stage == "index":
        refusing = deployment.extra_env["NEARDUP_UNIQUE_TOPIC"] = f"{deployment.name}-unique"
    else:
        refusing = deployment.topics["dead"]
        malformed = b'{"id": "bad", "text": ' + b"x" * (4 * SMALL)  # never closed: invalid JSON
        messages.insert(40, (b"bad", malformed))
    worker = deployment.start_worker()
    limit = set_max_message_bytes(deployment.bootstrap, refusing, SMALL)
    asyncio.run(_produce_paced(deployment.bootstrap, deployment.topics["input"], messages))
    assert worker.wait(timeout=90) != 0, deployment.logs()
    stopped_by = deployment.log_text()
    set_max_message_bytes(deployment.bootstrap, refusing, limit)
    ids = {a["id"] for a in articles}
    worker = _supervised_until_decided(deployment, worker, ids, timeout=120)
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    records = committed.read_all(timeout=30)
    counts = verdicts_by_version(records)
    assert [key for key, n in counts.items() if n > 1] == [], deployment.logs()
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    if stage == "sign":
        letters = TopicReader(deployment.bootstrap, refusing, "read_committed").read_all(timeout=30)
        assert [r.key for r in letters] == [b"bad"], letters
    assert "transaction_aborted" in stopped_by and f"stage={stage}" in stopped_by, stopped_by[-4000:]
    assert deployment.kill(worker, signal.SIGTERM) and worker.returncode == 0, deployment.logs()
    assert content_stats(deployment, "--broker", f"kafka://{deployment.bootstrap}") == content_stats(
        deployment, "--state", str(deployment.state_dir(0))
    )


@pytest.mark.budget(40)  # the held commit, then the rest of the stream
def test_the_decider_killed_in_an_open_transaction_wedges_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The decider process SIGKILLed while the index stage's transaction waits for its commit,
    its sends acknowledged: the commit then tells a dead process. The worker replaces it and goes
    on (no wedge, no restart): every verdict once, read committed, equal to embedded mode's."""
    articles = stream_of(200)
    held_s = 6.0
    deployment.extra_env.update(
        {
            **EXACTLY_ONCE,
            **fault_env(AGENT_FAULT, f"delay:commit:2:{held_s * 1000:.0f}"),
            "NEARDUP_STALL_TIMEOUT": "20",
        }
    )
    worker = deployment.start_worker()
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[:20])
    committed.reach(lambda r: len(r) >= 1, timeout=60, logs=deployment.logs)
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[20:40])
    deadline = time.monotonic() + 60
    while "injected_delay" not in deployment.log_text():
        assert time.monotonic() < deadline, deployment.logs()
        time.sleep(0.1)
    # whatever else came is decided (in milliseconds) and waits to join the next transaction:
    # the kill lands between decisions, so the commit is the first to find the process gone
    time.sleep(1)
    os.kill(decider_pid(worker.pid), signal.SIGKILL)
    time.sleep(held_s)
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[40:])
    records = committed.reach(lambda r: len(r) >= len(articles), timeout=60, logs=deployment.logs)
    assert worker.poll() is None, deployment.logs()
    counts = verdicts_by_version(committed.read_all(timeout=30))
    assert [key for key, n in counts.items() if n > 1] == []
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    assert "decider_failed at a commit" in deployment.log_text()
