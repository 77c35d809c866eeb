"""A warm standby (NEARDUP_STANDBY_REPLICAS=1), through the real broker and real RocksDB: the
worker that does not own the index shard keeps its own index current from the changelog, and when
the owner's process group is SIGKILLed, it takes the shard over after the session timeout and
decides again at once, having replayed only its lag (the changelog after its stored position),
with an uninterrupted run's verdicts."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import orjson
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

SESSION_TIMEOUT_MS = 6_000  # the broker's smallest: what the takeover waits for first
DECIDES_WITHIN_S = 10.0
# the time of a log line, as the worker's format writes it and as Faust's (once it runs) does
ASSIGNED = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]? .*index_shard_assigned", re.MULTILINE)


def standby_metric(dep: Deployment, index: int, name: str) -> float:
    value = dep.metric(index, name)
    assert value is not None, f"{name} is exported"
    return value


def wait_caught_up(dep: Deployment, index: int, timeout: float = 30.0) -> float:
    """The standby's lag once it is 0 after a catch-up that applied records: it keeps up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = standby_metric(dep, index, "neardup_index_standby")
        lag = standby_metric(dep, index, "neardup_index_standby_lag_records")
        applied = standby_metric(dep, index, "neardup_index_standby_applied_records_total")
        if held == 1 and lag == 0 and applied > 0:
            return applied
        time.sleep(0.2)
    raise AssertionError(f"the standby did not catch up (lag {lag}, applied {applied}):\n{dep.logs()}")


def assigned_at(log: Path) -> float:
    """When the worker was given the index shard (its log's index_shard_assigned line)."""
    found = ASSIGNED.findall(log.read_text(errors="replace"))
    assert found, f"{log.name} got the shard"
    return datetime.strptime(found[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _standby_deployment(kafka: str, tmp_path: Path, interval: str, **env: str) -> Deployment:
    """Workers keeping a standby copy, caught up every `interval` seconds, with a short session
    timeout. One input partition: the log order, and so every verdict, is the embedded run's."""
    dep = Deployment(kafka, tmp_path, input_partitions=1)
    dep.extra_env.update(
        NEARDUP_STANDBY_REPLICAS="1",
        NEARDUP_STANDBY_INTERVAL=interval,
        NEARDUP_SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
        NEARDUP_HEARTBEAT_INTERVAL_MS="1000",
        NEARDUP_LOG_LEVEL="info",
        **env,
    )
    return dep


@pytest.mark.budget(90)  # two workers, the dead owner's session timeout, an embedded reference run
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_standby_takes_the_shard_over_replaying_only_its_lag(
    kafka: str, tmp_path: Path, guarantee: str
) -> None:
    # under exactly-once the standby reads committed records only, and commit markers take offsets
    dep = _standby_deployment(kafka, tmp_path, "0.5", NEARDUP_PROCESSING_GUARANTEE=guarantee)
    articles = stream_of(3_000)
    before = 2_000
    copy = {"id": "copy-after-takeover", "text": articles[10]["text"]}
    articles.append(copy)
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    try:
        dep.create_topics()
        workers = [dep.start_worker(0), dep.start_worker(1)]
        produce_articles(dep.bootstrap, dep.topics["input"], articles[:before])
        reader = TopicReader(dep.bootstrap, dep.topics["verdicts"])
        reader.reach(lambda r: len(verdicts_by_id(r)) >= before, timeout=300, logs=dep.logs)
        owner = max((0, 1), key=lambda i: indexed_articles(dep, i))
        standby = 1 - owner
        assert indexed_articles(dep, owner) > 0 and indexed_articles(dep, standby) == 0
        assert standby_metric(dep, owner, "neardup_index_standby") == 0
        applied = wait_caught_up(dep, standby)
        assert standby_metric(dep, standby, "neardup_index_replayed_records_total") == 0

        assert dep.kill(workers[owner], signal.SIGKILL), f"the owner was running:\n{dep.logs()}"
        killed = time.time()
        produce_articles(dep.bootstrap, dep.topics["input"], articles[before:])
        records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=120)
        assert_as_embedded(records, expected, dep.logs())
        [verdict] = {orjson.dumps(v) for v in verdicts_by_id(records)[copy["id"]]}
        seen = orjson.loads(verdict)
        assert (seen["verdict"], seen["exact"]) == ("duplicate", True), seen

        taken = assigned_at(dep.root / f"worker{standby}.log")
        first = first_verdict_times(records)
        resumed = min(t for t in first.values() if t > killed)
        replayed = standby_metric(dep, standby, "neardup_index_replayed_records_total")
        opens = (
            standby_metric(dep, standby, 'neardup_index_opens_total{how="restored"}'),
            standby_metric(dep, standby, 'neardup_index_opens_total{how="rebuilt"}'),
        )
        print(
            f"takeover: shard {taken - killed:.1f} s after the kill (session timeout "
            f"{SESSION_TIMEOUT_MS / 1000:g} s), first verdict {resumed - taken:.1f} s after that; "
            f"replayed {replayed:.0f} changelog records, the standby had caught up on {applied:.0f}"
        )
        assert taken > killed and resumed - taken < DECIDES_WITHIN_S, dep.logs()
        assert opens == (1, 0), f"restored once, never rebuilt: {opens}\n{dep.logs()}"
        assert replayed < applied, "the takeover replayed its lag, not the changelog"
        assert indexed_articles(dep, standby) > 0
    finally:
        dep.discard()


def wait_standing_by(dep: Deployment, index: int, timeout: float = 30.0) -> None:
    """Until the worker's standby copy has caught up once (the gauge is 1 only off the shard)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dep.metric(index, "neardup_index_standby") == 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"worker {index} keeps no standby copy:\n{dep.logs()}")


@pytest.mark.budget(60)  # two workers, the dead owner's session timeout, an embedded reference run
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_standby_behind_the_changelog_replays_exactly_its_lag_on_takeover(
    kafka: str, tmp_path: Path, guarantee: str
) -> None:
    # one catch-up as the standby starts, then none before the kill: its copy falls behind
    dep = _standby_deployment(kafka, tmp_path, "3600", NEARDUP_PROCESSING_GUARANTEE=guarantee)
    isolation = "read_committed" if guarantee == "exactly_once" else "read_uncommitted"
    articles = stream_of(3_000)
    held, behind = 1_000, 2_000  # decided before the standby's catch-up; before the kill
    copy = {"id": "copy-after-takeover", "text": articles[10]["text"]}
    articles.append(copy)
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    try:
        dep.create_topics()
        owner = dep.start_worker(0)
        reader = TopicReader(dep.bootstrap, dep.topics["verdicts"])
        produce_articles(dep.bootstrap, dep.topics["input"], articles[:held])
        reader.reach(lambda r: len(verdicts_by_id(r)) >= held, timeout=120, logs=dep.logs)
        dep.start_worker(1)
        wait_standing_by(dep, 1)
        produce_articles(dep.bootstrap, dep.topics["input"], articles[held:behind])
        reader.reach(lambda r: len(verdicts_by_id(r)) >= behind, timeout=120, logs=dep.logs)
        assert indexed_articles(dep, 0) > 0 and indexed_articles(dep, 1) == 0, "worker 0 kept the shard"
        # read beside the running standby: it writes its copy only when it catches up, which the
        # interval holds off, or once it owns the shard, which the owner holds
        position, _ = stored_position(dep.state_dir(1))

        assert dep.kill(owner, signal.SIGKILL), f"the owner was running:\n{dep.logs()}"
        killed = time.time()
        changelog = f"{dep.name}-records-changelog"
        lag, end = asyncio.run(changelog_records(dep.bootstrap, changelog, position.offset, isolation))
        everything, _ = asyncio.run(changelog_records(dep.bootstrap, changelog, 0, isolation))
        assert 0 < lag < everything, (lag, everything)
        produce_articles(dep.bootstrap, dep.topics["input"], articles[behind:])
        records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=120)
        assert_as_embedded(records, expected, dep.logs())
        [verdict] = {orjson.dumps(v) for v in verdicts_by_id(records)[copy["id"]]}
        seen = orjson.loads(verdict)
        assert (seen["verdict"], seen["match_id"], seen["exact"]) == ("duplicate", articles[10]["id"], True)

        taken = assigned_at(dep.root / "worker1.log")
        resumed = min(t for t in first_verdict_times(records).values() if t > killed)
        replayed = standby_metric(dep, 1, "neardup_index_replayed_records_total")
        print(
            f"takeover: shard {taken - killed:.1f} s after the kill (session timeout "
            f"{SESSION_TIMEOUT_MS / 1000:g} s), first verdict {resumed - taken:.1f} s after that; "
            f"replayed {replayed:.0f} changelog records, its lag, of {everything} ({end} offsets)"
        )
        assert taken > killed and resumed - taken < DECIDES_WITHIN_S, dep.logs()
        assert replayed == lag, f"replayed {replayed}, the lag after offset {position.offset} was {lag}"
        assert f"index_restored records_replayed={lag} " in (dep.root / "worker1.log").read_text()
    finally:
        dep.discard()
