"""Exactly-once through the real broker (NEARDUP_PROCESSING_GUARANTEE=exactly_once): a consumer
reading committed records finds each article's verdict once, also when the worker is killed in the
middle of a transaction whose verdicts were already sent."""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.faults import AGENT_FAULT, fault_env

from .conftest import Deployment, TopicReader, load_sample, produce_articles, run_embedded, without_latency

pytestmark = pytest.mark.kafka
EXACTLY_ONCE = {"NEARDUP_PROCESSING_GUARANTEE": "exactly_once"}


def _wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _by_version(records: list[Any]) -> collections.Counter[tuple[str, int]]:
    """How many times each (article id, version) verdict was read."""
    verdicts = (orjson.loads(r.value) for r in records if r.value is not None)
    return collections.Counter((v["article_id"], v["version"]) for v in verdicts)


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


def test_a_kill_inside_a_transaction_repeats_no_verdict(deployment: Deployment, tmp_path: Path) -> None:
    """A backlog decided in transactions of several chunks; the worker is SIGKILLed while a
    transaction holds a chunk's verdicts back after earlier chunks' verdicts were sent. After the
    restart, a read_committed consumer finds every article's verdict exactly once, equal to
    embedded mode's; a read_uncommitted one finds the aborted transaction's verdicts too."""
    articles = load_sample(300)
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    deployment.extra_env.update(
        {
            **EXACTLY_ONCE,
            **fault_env(AGENT_FAULT, "delay:verdicts:3:60000"),
            "NEARDUP_SIGN_BATCH": "8",  # small signatures messages: chunks of a few each
            "NEARDUP_INDEX_HANDOFF": "0",  # batches of many messages from the consumer
        }
    )
    worker = deployment.start_worker()
    uncommitted = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], transactional=True)
    sent = uncommitted.read_until(lambda r: len(r) > 0, timeout=60)
    assert sent, deployment.logs()
    _wait_for(lambda: "injected_delay" in deployment.logs(), timeout=60)
    deployment.kill(worker, signal.SIGKILL)
    for name in list(deployment.extra_env):
        if name.startswith("NEARDUP_TEST"):
            del deployment.extra_env[name]
    deployment.start_worker()
    committed = TopicReader(deployment.bootstrap, deployment.topics["verdicts"], "read_committed")
    records = committed.read_until(lambda r: len(r) >= len(articles), timeout=120)
    counts = _by_version(committed.read_all(timeout=10))
    repeated = {key: n for key, n in counts.items() if n > 1}
    assert not repeated, repeated
    assert {article_id for article_id, _ in counts} == {a["id"] for a in articles}
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    # the kill landed inside a transaction whose verdicts had been sent: aborted, they stay in the
    # log, skipped by read_committed readers only
    everything = _by_version(uncommitted.read_all(timeout=10))
    assert sum(everything.values()) > len(articles)
