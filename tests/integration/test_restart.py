"""How soon verdicts flow again after a worker dies, through the real broker, and what its index
replays then.

A worker restarted after SIGKILL takes its place in the consumer group at once (static membership:
NEARDUP_INSTANCE_ID), and when the worker that owns the index shard dies for good, another takes
the shard over once the dead one's session expires (NEARDUP_SESSION_TIMEOUT_MS). Both keep the
verdicts of an uninterrupted (embedded) run.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.support.broker import TopicReader, produce_articles
from tests.support.deployment import Deployment, run_embedded, stream_of, verdicts_by_id, without_latency
from tests.support.runs import (
    assert_as_embedded,
    changelog_records,
    first_verdict_times,
    indexed_articles,
    stored_position,
)

# Timed, so not beside the other heavy tests (tests/run)
pytestmark = [pytest.mark.xdist_group("heavy")]

RESTART_WITHIN_S = 10.0
FAILOVER_WITHIN_S = 30.0


def test_restarted_worker_resumes_within_10s(deployment: Deployment, tmp_path: Path) -> None:
    articles = stream_of(6_000)
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    worker = deployment.start_worker()
    reader.read_until(lambda r: len(r) >= 1_500, timeout=300)
    assert deployment.kill(worker, signal.SIGKILL), f"the worker was running:\n{deployment.logs()}"
    killed = time.time()
    restarted = time.time()
    deployment.start_worker()
    records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=300)
    assert_as_embedded(records, expected, deployment.logs())
    first = first_verdict_times(records)
    new = [t for t in first.values() if t > killed]
    assert len(new) < len(articles) and new, "the kill lands while input is pending"
    again = len(records) - len(first)
    assert again > 0, "killed before its offsets were committed, the restarted worker saw input again"
    resumed = min(new) - restarted
    print(
        f"restart to first new verdict: {resumed:.1f} s ({len(first) - len(new)} before the kill, "
        f"{again} delivered again)"
    )
    assert resumed < RESTART_WITHIN_S, deployment.logs()


@pytest.mark.budget(30)  # the dead owner's session expires first; the workload is benchmarks.md's
def test_shard_fails_over_to_the_other_worker_within_30s(kafka: str, tmp_path: Path) -> None:
    # One input partition: the log order, and so every verdict, is the embedded run's whichever
    # worker signs and decides.
    dep = Deployment(kafka, tmp_path, input_partitions=1)
    articles = stream_of(6_000)
    # Sent before the kill, which comes once 1,000 verdicts are read: a worker that catches up
    # decides thousands a second while the test produces and reads, and with half of the stream
    # (3,000) it was once through all of them by the kill
    before = 4_500
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    try:
        dep.create_topics()
        workers = [dep.start_worker(0), dep.start_worker(1)]
        produce_articles(dep.bootstrap, dep.topics["input"], articles[:before])
        reader = TopicReader(dep.bootstrap, dep.topics["verdicts"])
        reader.reach(lambda r: len(r) >= 1_000, timeout=300, logs=dep.logs)
        owner = max((0, 1), key=lambda i: indexed_articles(dep, i))
        assert indexed_articles(dep, owner) > 0 and indexed_articles(dep, 1 - owner) == 0
        assert dep.kill(workers[owner], signal.SIGKILL), f"the owner was running:\n{dep.logs()}"
        killed = time.time()
        produce_articles(dep.bootstrap, dep.topics["input"], articles[before:])
        input_end = time.time()
        records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=300)
        assert_as_embedded(records, expected, dep.logs())
        first = first_verdict_times(records)
        assert sum(t < killed for t in first.values()) < before, "the kill lands while input is pending"
        again = len(records) - len(first)
        assert again > 0, "the owner was killed before its offsets were committed: the other saw input again"
        done = max(first.values())
        print(
            f"failover: every verdict {done - input_end:.1f} s after the input's end "
            f"({done - killed:.1f} s after the kill, {again} delivered again)"
        )
        assert done - input_end < FAILOVER_WITHIN_S, dep.logs()
        assert indexed_articles(dep, 1 - owner) > 0
    finally:
        dep.discard()


@pytest.mark.budget(60)  # two worker starts, a stream of 4,000 and an embedded reference run
@pytest.mark.parametrize("layout", ["keyed", "held"])
def test_a_killed_worker_replays_only_the_changelog_after_its_committed_offset(
    deployment: Deployment, tmp_path: Path, layout: str
) -> None:
    """Either layout of the index (NEARDUP_INDEX_IN_MEMORY): restored from what it committed."""
    articles = stream_of(4_000)
    deployment.extra_env["NEARDUP_INDEX_IN_MEMORY"] = str(layout == "held").lower()
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    deployment.extra_env["NEARDUP_LOG_LEVEL"] = "info"
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    worker = deployment.start_worker()
    reader.read_until(lambda r: len(r) >= 1_500, timeout=300)
    # the worker and its helper children, as when a pod is killed
    assert deployment.kill(worker, signal.SIGKILL), f"the worker was running:\n{deployment.logs()}"
    position, held = stored_position(deployment.state_dir(0))
    assert held is (layout == "held")
    changelog = f"{deployment.name}-records-changelog"
    tail, end = asyncio.run(changelog_records(deployment.bootstrap, changelog, position.offset))
    assert 0 < position.offset <= end

    deployment.start_worker()
    records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=300)
    assert_as_embedded(records, expected, deployment.logs())
    replayed = deployment.metric(0, "neardup_index_replayed_records_total")
    restored = deployment.metric(0, 'neardup_index_opens_total{how="restored"}')
    rebuilt = deployment.metric(0, 'neardup_index_opens_total{how="rebuilt"}')
    print(f"restore: {tail} changelog records replayed of {end} (committed offset {position.offset})")
    assert (replayed, rebuilt) == (tail, 0) and restored is not None and restored >= 1, deployment.logs()
    log = (deployment.root / "worker0.log").read_text(errors="replace")
    assert f"index_restored records_replayed={tail} " in log

    # an exact copy of an article indexed before the kill is its duplicate: the index has it
    copy = {"id": "copy-after-restart", "text": articles[0]["text"]}
    produce_articles(deployment.bootstrap, deployment.topics["input"], [copy])
    records = reader.read_until(lambda r: copy["id"] in verdicts_by_id(r), timeout=60)
    [verdict] = verdicts_by_id(records)[copy["id"]]
    seen = (verdict["verdict"], verdict["match_id"], verdict["exact"])
    assert seen == ("duplicate", articles[0]["id"], True)
