"""Delivery under faults, through the real broker: a verdict or a filtered-feed message the broker
refuses (its topic's limit lowered under a running worker) turns /health to 503 and stops the worker
without committing past it; a broker stopped under load loses nothing; an exception in an agent or a
helper stops the worker and a restart misses nothing; a kill between a decision and its changelog
leaves no state that a later rebuild would lack, and the index rebuilt once the state directory is
lost decides as an uninterrupted run."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from neardup.state.rocks import RocksState
from tests.support.broker import (
    OwnBroker,
    TopicReader,
    produce_articles,
    produce_with_headers,
    read_feed,
    set_max_message_bytes,
    source_header,
)
from tests.support.deployment import (
    Deployment,
    health,
    load_sample,
    run_embedded,
    stream_of,
    verdicts_by_id,
    without_latency,
)
from tests.support.faults import AGENT_FAULT, HELPER_FAULT, fault_env
from tests.support.runs import reference_state, untimed


async def _admin(bootstrap: str, action: Any) -> Any:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await action(admin)
    finally:
        await admin.close()


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    """The group's committed offset for partition 0 of `topic` (None: nothing committed)."""

    async def read(admin: AIOKafkaAdminClient) -> int | None:
        offsets = await admin.list_consumer_group_offsets(group)
        for tp, meta in offsets.items():
            if tp.topic == topic and tp.partition == 0 and meta.offset >= 0:
                return int(meta.offset)
        return None

    return asyncio.run(_admin(bootstrap, read))


def _wait_exit(deployment: Deployment, worker: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not stop:\n{deployment.logs()}") from None


def _exit_watching_health(
    deployment: Deployment, worker: subprocess.Popen[bytes], timeout: float
) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    """Until the worker exits, its /health polled: the exit code, and each answer that differs from
    the one before (status code and body, the uptime left out), in order."""
    url = deployment.health_url(0)
    answers: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    while worker.poll() is None:
        assert time.monotonic() < deadline, f"the worker did not stop:\n{deployment.logs()}"
        answer = health(url)
        if answer is not None:
            code, body = answer[0], {k: v for k, v in answer[1].items() if k != "uptime_s"}
            if not answers or answers[-1] != (code, body):
                answers.append((code, body))
        time.sleep(0.02)
    return worker.returncode, answers


def _assert_failed_on_health(answers: list[tuple[int, dict[str, Any]]], reason: str) -> None:
    """/health turned 503 with `reason` while the worker still ran, and stayed so."""
    codes = [code for code, _ in answers]
    assert 503 in codes, f"/health never answered 503 before the exit: {answers}"
    turned = codes.index(503)
    assert set(codes[:turned]) <= {200}, answers  # healthy until the failure
    assert all(code == 503 for code in codes[turned:]), answers
    failed = answers[turned][1]
    assert failed["status"] == "failed" and reason in failed["reason"], answers


def _assert_verdicts_as_embedded(
    deployment: Deployment, articles: list[dict[str, Any]], tmp_path: Path, *, once: bool
) -> dict[str, list[dict[str, Any]]]:
    """Every article has its verdict, each repeat equal to the embedded run's; `once`: no repeat."""
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=300)
    if once:  # repeats would arrive right after: give them the time to
        time.sleep(3)
        records = reader.read_until(lambda r: len(r) > len(records), timeout=3) or records
    verdicts = verdicts_by_id(records)
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    missing = [a["id"] for a in articles if a["id"] not in verdicts]
    assert not missing, f"{len(missing)} without verdict, e.g. {missing[:5]}\n{deployment.logs()}"
    for article_id, seen in verdicts.items():
        assert all(without_latency(v) == expected[article_id] for v in seen), (article_id, seen)
        if once:
            assert len(seen) == 1, (article_id, seen)
    return verdicts


def test_a_verdict_the_broker_refuses_stops_the_worker_without_committing_past_it(
    deployment: Deployment, tmp_path: Path
) -> None:
    articles = load_sample(60)
    verdicts_topic = deployment.topics["verdicts"]
    worker, limit = _start_then_shrink(deployment, verdicts_topic, 200)  # smaller than any verdict
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    _assert_stopped_before_committing(deployment, worker, len(articles))
    _set_limit(deployment, verdicts_topic, limit)
    deployment.start_worker()
    _assert_verdicts_as_embedded(deployment, articles, tmp_path, once=True)


def _start_then_shrink(deployment: Deployment, topic: str, limit: int) -> tuple[subprocess.Popen[bytes], int]:
    """A worker started, then its output `topic` set to take messages of up to `limit` bytes while
    it runs (a topic that takes too little at start is refused then: test_stream.py); returns the
    worker and the topic's limit before."""
    deployment.extra_env["NEARDUP_FAILURE_EXIT_TIMEOUT"] = "15"
    worker = deployment.start_worker()
    return worker, _set_limit(deployment, topic, limit)


def _assert_stopped_before_committing(
    deployment: Deployment, worker: subprocess.Popen[bytes], produced: int
) -> None:
    """The refused send stopped the worker: exit 1, reported on /health, once in the log; the
    signatures were delivered, so the input moved on, but nothing decided from them."""
    started = time.monotonic()
    code, answers = _exit_watching_health(deployment, worker, 90)
    assert code == 1, deployment.logs()
    assert time.monotonic() - started < 60
    logs = deployment.log_text()
    assert logs.count("delivery_failed stage=index") == 1, deployment.logs()
    _assert_failed_on_health(answers, "delivery_failed stage=index")
    assert _committed(deployment.bootstrap, deployment.name, deployment.topics["signatures"]) in (None, 0)
    assert _committed(deployment.bootstrap, deployment.name, deployment.topics["input"]) == produced


def _set_limit(deployment: Deployment, topic: str, limit: int) -> int:
    return set_max_message_bytes(deployment.bootstrap, topic, limit)


def test_a_feed_message_the_broker_refuses_stops_the_worker_without_committing_past_it(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The filtered feed has the verdicts' guarantees: an article it cannot take stops the worker
    before its input is committed, and after the limit is raised every unique article is on it."""
    articles = load_sample(60)
    messages = {a["id"]: orjson.dumps(a) for a in articles}
    feed_topic = f"{deployment.name}-unique"
    deployment.extra_env["NEARDUP_UNIQUE_TOPIC"] = feed_topic
    small = 200
    assert min(map(len, messages.values())) > small, "every article is larger than the feed takes"
    worker, limit = _start_then_shrink(deployment, feed_topic, small)
    produce_with_headers(deployment.bootstrap, deployment.topics["input"], messages)
    _assert_stopped_before_committing(deployment, worker, len(articles))
    assert TopicReader(deployment.bootstrap, feed_topic).read_all() == []
    _set_limit(deployment, feed_topic, limit)
    deployment.start_worker()
    verdicts = _assert_verdicts_as_embedded(deployment, articles, tmp_path, once=False)
    unique = {article_id for article_id, seen in verdicts.items() if seen[0]["verdict"] == "unique"}
    assert 0 < len(unique) < len(articles)
    records = read_feed(deployment.bootstrap, feed_topic, unique)
    assert {m.key.decode() for m in records} == unique, deployment.logs()
    for message in records:
        article_id = message.key.decode()
        assert message.value == messages[article_id]
        assert list(message.headers) == source_header(article_id)


@pytest.mark.budget(45)  # the 30 s outage
def test_a_broker_stopped_for_30s_under_load_loses_nothing(own_broker: OwnBroker, tmp_path: Path) -> None:
    deployment = Deployment(own_broker.bootstrap, tmp_path)
    try:
        articles = stream_of(4_000)
        deployment.create_topics()
        produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
        worker = deployment.start_worker()
        reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
        seen = reader.read_until(lambda r: len(r) >= 500, timeout=300)
        assert len(verdicts_by_id(seen)) < len(articles), "the broker stops while input is pending"
        own_broker.run("stop")
        try:
            time.sleep(30)
        finally:
            own_broker.run("start")
        verdicts = _assert_verdicts_as_embedded(deployment, articles, tmp_path, once=False)
        assert worker.poll() is None, f"the worker must go on by itself:\n{deployment.logs()}"
    finally:
        deployment.discard()
    versions = {article_id: {v["version"] for v in seen} for article_id, seen in verdicts.items()}
    assert all(len(found) == 1 for found in versions.values())


@pytest.mark.parametrize(
    ("variable", "spec", "logged"),
    [
        pytest.param(AGENT_FAULT, "raise:sign:1", "agent_failed", marks=pytest.mark.smoke),
        (AGENT_FAULT, "raise:index:1", "agent_failed"),
        (HELPER_FAULT, "crash:signer:0", "signing_unavailable"),  # helpers that cannot start
        (HELPER_FAULT, "crash:decider:1", "index_unavailable"),
    ],
    ids=["sign-agent", "index-agent", "signing-helper", "decider-helper"],
)
def test_an_exception_in_an_agent_or_a_helper_stops_the_worker_and_a_restart_misses_nothing(
    deployment: Deployment, tmp_path: Path, variable: str, spec: str, logged: str
) -> None:
    articles = load_sample(80)
    deployment.extra_env.update(fault_env(variable, spec))
    # After the index agent raised (itself, or on the decider's failure), Faust's supervisor of that
    # agent never finishes stopping: the worker exits when this bound ends the stop (30 s by default)
    deployment.extra_env["NEARDUP_FAILURE_EXIT_TIMEOUT"] = "5"
    if spec.endswith(":0"):  # helpers that cannot start: the worker never gets ready
        deployment.create_topics()
        produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
        worker = deployment.start_worker(wait=False)
    else:
        worker = deployment.start_worker()
        produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    started = time.monotonic()
    assert _wait_exit(deployment, worker, 90) == 1, deployment.logs()
    assert time.monotonic() - started < 45
    assert logged in deployment.log_text(), deployment.logs()
    deployment.extra_env.clear()
    deployment.start_worker()
    _assert_verdicts_as_embedded(deployment, articles, tmp_path, once=False)


def test_a_kill_between_decision_and_changelog_leaves_nothing_a_rebuild_lacks(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Killed while a decided chunk waits for its changelog send, restarted on the same state, the
    stream goes on; then the state directory is lost: the index rebuilt from the changelog decides
    the rest of the stream as an uninterrupted run does, each article once, and ends equal to it."""
    articles = load_sample()
    first, second, rest = articles[:300], articles[300:400], articles[400:]
    deployment.extra_env.update(fault_env(AGENT_FAULT, "delay:index:2:60000"))
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, deployment.topics["input"], first)
    log = deployment.root / "worker0.log"
    deadline = time.monotonic() + 120
    while "injected_delay" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, deployment.logs()
        time.sleep(0.1)
    assert deployment.kill(worker, signal.SIGKILL), f"the worker was running:\n{deployment.logs()}"
    deployment.extra_env.clear()
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, deployment.topics["input"], second)
    _assert_verdicts_as_embedded(deployment, first + second, tmp_path, once=False)
    deployment.kill(worker, signal.SIGTERM)
    shutil.rmtree(deployment.state_dir(0))
    # the shard's next batch opens the index: rebuilt, as there is no state to restore
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, deployment.topics["input"], rest)
    verdicts = _assert_verdicts_as_embedded(deployment, articles, tmp_path, once=False)
    assert all(len(verdicts[a["id"]]) == 1 for a in rest), "each decided once, by the rebuilt index"
    deployment.kill(worker, signal.SIGTERM)
    rebuilt = RocksState(deployment.state_dir(0) / "index")
    try:
        stored = [untimed(a) for a in rebuilt.articles()]
    finally:
        rebuilt.close()
    assert stored == [untimed(a) for a in reference_state(articles, tmp_path)[1]]
