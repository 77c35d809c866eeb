"""Exactly-once through the real broker (NEARDUP_PROCESSING_GUARANTEE=exactly_once): a consumer
reading committed records finds each article's verdict once, also when the worker is killed in the
middle of a transaction whose verdicts were already sent."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests.support.broker import TopicReader, produce_articles
from tests.support.deployment import (
    Deployment,
    content_stats,
    load_sample,
    run_embedded,
    verdicts_by_version,
    without_latency,
)
from tests.support.faults import AGENT_FAULT, ARMED, fault_env

EXACTLY_ONCE = {"NEARDUP_PROCESSING_GUARANTEE": "exactly_once"}


def _wait_for(condition: Callable[[], bool], timeout: float, logs: Callable[[], str] = str) -> None:
    """Until `condition()` holds; past `timeout`, the test fails with `logs()` (the workers')."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out\n{logs()}"
        time.sleep(0.2)


@pytest.mark.smoke
def test_exactly_once_verdicts_equal_embedded_mode(deployment: Deployment, tmp_path: Path) -> None:
    articles = load_sample(120)
    deployment.extra_env.update(EXACTLY_ONCE)
    deployment.start_worker()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    records = reader.read_until(lambda r: len(r) >= len(articles), timeout=120)
    assert len(records) == len(articles), deployment.logs()
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    committed = deployment.metric(0, 'neardup_index_transactions_total{outcome="committed"}')
    assert committed is not None and committed >= 1


def test_a_backlog_on_three_partitions_gets_every_verdict_once(deployment: Deployment) -> None:
    """Each input partition has its own writer, and a sign batch carries records of several: the
    writers start (slowly) as the first batches come, and a later batch's records of a partition
    must still reach the signatures topic after an earlier one's, or the index would take the
    earlier ones as replays and answer nothing for them."""
    articles = load_sample(400)
    deployment.input_partitions = 3
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    deployment.extra_env.update({**EXACTLY_ONCE, "NEARDUP_SIGN_BATCH": "16"})
    deployment.start_worker()
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    committed.read_until(lambda r: len(r) >= len(articles), timeout=90)
    counts = verdicts_by_version(committed.read_all(timeout=10))
    assert {article_id for article_id, _ in counts} == {a["id"] for a in articles}, deployment.logs()
    assert all(n == 1 for n in counts.values())


@pytest.mark.parametrize("layout", ["keyed", "held"])
def test_a_kill_inside_a_transaction_repeats_no_verdict(
    deployment: Deployment, tmp_path: Path, layout: str
) -> None:
    """A backlog, and more input once a transaction committed, decided in transactions; the
    worker is SIGKILLed while a transaction whose verdicts were all sent and acknowledged waits
    for its commit. After the restart, a read_committed consumer finds every article's verdict
    exactly once, equal to embedded mode's; a read_uncommitted one finds the aborted
    transaction's verdicts too. Either layout of the index (NEARDUP_INDEX_IN_MEMORY)."""
    articles = load_sample(300)
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[:150])
    deployment.extra_env.update(
        {
            **EXACTLY_ONCE,
            **fault_env(AGENT_FAULT, "delay:commit:2:60000"),
            "NEARDUP_SIGN_BATCH": "8",  # small signatures messages: chunks of a few each
            "NEARDUP_INDEX_HANDOFF": "0",  # batches of many messages from the consumer
            "NEARDUP_INDEX_IN_MEMORY": str(layout == "held").lower(),
        }
    )
    worker = deployment.start_worker()
    uncommitted = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], transactional=True)
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    # the rest once a transaction committed: however the backlog was batched (all of it can join
    # one transaction), the rest is decided in a later one, which there is then to hold
    committed.reach(lambda r: len(r) >= 1, timeout=60, logs=deployment.logs)
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[150:])
    _wait_for(lambda: "injected_delay" in deployment.log_text(), timeout=60, logs=deployment.logs)
    # the held transaction's verdicts are in the log
    assert len(uncommitted.read_all(timeout=10)) > len(committed.read_all(timeout=10)), deployment.logs()
    deployment.kill(worker, signal.SIGKILL)
    for name in list(deployment.extra_env):
        if name.startswith("NEARDUP_TEST"):
            del deployment.extra_env[name]
    deployment.start_worker()
    records = committed.read_until(lambda r: len(r) >= len(articles), timeout=120)
    counts = verdicts_by_version(committed.read_all(timeout=10))
    repeated = {key: n for key, n in counts.items() if n > 1}
    assert not repeated, repeated
    assert {article_id for article_id, _ in counts} == {a["id"] for a in articles}
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    # the kill landed inside a transaction whose verdicts had been sent: aborted, they stay in the
    # log, skipped by read_committed readers only (and not sent again by the restart)
    everything = verdicts_by_version(uncommitted.read_all(timeout=10))
    assert sum(everything.values()) > len(articles)


@pytest.mark.budget(60)  # the group waits a session timeout for the paused owner before the takeover
def test_a_paused_owner_is_fenced_and_nothing_it_tries_lands(deployment: Deployment, tmp_path: Path) -> None:
    """The owner of the index shard is paused (SIGSTOP) in the middle of a transaction, its
    verdicts held back; another worker takes the shard over and decides the same articles. Resumed,
    the old owner is fenced: it exits non-zero saying so, and a read_committed consumer finds every
    verdict once, equal to embedded mode's; a rebuild of the changelog equals the new owner's index."""
    articles = load_sample(30)
    deployment.extra_env.update(
        {
            **EXACTLY_ONCE,
            "NEARDUP_SESSION_TIMEOUT_MS": "6000",
            "NEARDUP_HEARTBEAT_INTERVAL_MS": "1000",
        }
    )
    # the first chunk decided once the test arms the fault (after the first ten verdicts) is held,
    # long enough to outlast the checks below on a loaded machine (once resumed, the old owner
    # waits out what is left of it, then tries to write)
    armed = tmp_path / "armed"
    fault = {**fault_env(AGENT_FAULT, "delay:verdicts:armed:20000"), ARMED: str(armed)}
    deployment.extra_env.update(fault)
    owner = deployment.start_worker(0)
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[:10])
    committed.reach(lambda r: len(r) >= 10, timeout=60, logs=deployment.logs)
    armed.touch()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[10:20])
    _wait_for(lambda: "injected_delay" in deployment.log_text(), timeout=60, logs=deployment.logs)
    changelog = f"{deployment.name}-records-changelog"
    written = TopicReader(deployment.bootstrap, changelog, transactional=True)
    kept = TopicReader(deployment.bootstrap, changelog, "read_committed")
    # the held chunk's changelog records are in the log, their transaction open
    _wait_for(
        lambda: len(written.read_all(timeout=10)) > len(kept.read_all(timeout=10)),
        timeout=30,
        logs=deployment.logs,
    )
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        for name in fault:
            del deployment.extra_env[name]
        deployment.start_worker(1)
        committed.reach(lambda r: len(r) >= 20, timeout=90, logs=deployment.logs)
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    assert owner.wait(timeout=60) != 0
    assert "producer_fenced" in (deployment.root / "worker0.log").read_text(errors="replace")
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[20:])
    records = committed.read_until(lambda r: len(r) >= len(articles), timeout=60)
    counts = verdicts_by_version(committed.read_all(timeout=10))
    assert all(n == 1 for n in counts.values()), {key: n for key, n in counts.items() if n > 1}
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    # the old owner did write before its pause: its transaction's changelog records are in the
    # log, aborted, skipped by a rebuild (which reads committed records only)
    assert len(written.read_all(timeout=10)) > len(kept.read_all(timeout=10))
    live = deployment.workers[-1]
    assert deployment.kill(live, signal.SIGTERM) and live.returncode == 0
    assert content_stats(deployment, "--broker", f"kafka://{deployment.bootstrap}") == content_stats(
        deployment, "--state", str(deployment.state_dir(1))
    )
