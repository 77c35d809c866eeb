"""The index of a stream that never ends, through the real broker and real RocksDB: deletes by
tombstone, expiry across a retention window, updates re-delivered after SIGKILL, a hot story, and
rebuilds after the state directory is lost."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.broker import TopicReader, produce, produce_articles, repeated_after
from tests.support.deployment import REPO, Deployment, load_sample, run_embedded, without_latency
from tests.support.faults import AGENT_FAULT, fault_env


def verdict_log(records: list[Any]) -> list[tuple[str, dict[str, Any] | None]]:
    """(key, verdict or None for a tombstone), in the order the topic holds them per partition."""
    return [(r.key.decode(), None if r.value is None else orjson.loads(r.value)) for r in records]


def latest(records: list[Any]) -> dict[str, dict[str, Any] | None]:
    """A compacted view of the verdict topic: the last value per key."""
    view: dict[str, dict[str, Any] | None] = {}
    for key, verdict in verdict_log(records):
        view[key] = verdict
    return view


def assert_metric(deployment: Deployment, name: str, expected: float) -> None:
    """The first worker's metric settles at `expected`."""
    value = deployment.settled_metric(0, name, expected)
    assert value == expected, f"{name} is {value}, expected {expected}"


def stats_from_broker(deployment: Deployment) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "neardup", "stats", "--broker", f"kafka://{deployment.bootstrap}", "--json"],
        cwd=REPO,
        env=deployment.env(0),
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def stats_of_state(deployment: Deployment) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "neardup", "stats", "--state", str(deployment.state_dir(0)), "--json"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def restart_without_state(deployment: Deployment, worker: Any) -> Any:
    """SIGKILL, the state directory deleted, a new worker: it rebuilds from the changelog."""
    assert deployment.kill(worker, signal.SIGKILL), f"the worker was running:\n{deployment.logs()}"
    shutil.rmtree(deployment.state_dir(0))
    return deployment.start_worker()


def test_a_tombstone_deletes_a_canonical_which_hands_its_cluster_on(deployment: Deployment) -> None:
    sample = load_sample(40)
    story = sample[0]["text"]
    worker = deployment.start_worker()
    topic = deployment.topics["input"]
    articles = [
        {"id": "a", "text": story},
        {"id": "b", "text": story + " Reporting by the wire desk."},
        {"id": "other", "text": sample[5]["text"]},
    ]
    produce_articles(deployment.bootstrap, topic, articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    reader.reach(lambda r: len(r) >= 3, timeout=120, logs=deployment.logs)
    asyncio.run(produce(deployment.bootstrap, topic, [(b"a", None), (b"nobody", None)]))
    produce_articles(deployment.bootstrap, topic, [{"id": "c", "text": story + " Updated at noon."}])
    records = reader.read_until(lambda r: "c" in latest(r), timeout=120)
    view = latest(records)
    assert view["a"] is None, "the verdict topic got a tombstone under the deleted id"
    c = view["c"]
    assert c is not None and (c["verdict"], c["match_id"], c["canonical_id"]) == ("duplicate", "b", "b")
    assert view["b"] is not None and view["b"]["canonical_id"] == "a"  # as it was decided
    assert ("nobody", None) in verdict_log(records), "a tombstone in, a tombstone out: unknown ids too"
    assert_metric(deployment, 'neardup_deletes_total{status="deleted"}', 1.0)
    assert_metric(deployment, 'neardup_deletes_total{status="unknown_delete"}', 1.0)
    assert_metric(deployment, "neardup_indexed_articles", 3.0)

    # the deletion reached the changelog: a rebuild does not bring "a" back
    worker = restart_without_state(deployment, worker)
    produce_articles(deployment.bootstrap, topic, [{"id": "d", "text": story}])
    view = latest(reader.read_until(lambda r: "d" in latest(r), timeout=180))
    d = view["d"]
    assert d is not None and not d["exact"] and d["match_id"] in {"b", "c"} and d["canonical_id"] == "b"
    stats = stats_from_broker(deployment)
    assert stats["articles"] == 4 and stats["deleted"] >= 1
    deployment.kill(worker, signal.SIGTERM)


def test_a_re_added_id_continues_its_versions_after_a_rebuild(deployment: Deployment) -> None:
    """A tombstone leaves the id's last version (in the changelog too): a re-added id goes on from
    it, so (id, version) never names two articles, also after the index is rebuilt."""
    text = load_sample(1)[0]["text"]
    worker = deployment.start_worker()
    topic = deployment.topics["input"]
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])

    def version_of_a(records: list[Any]) -> int | None:
        verdict = latest(records).get("a")
        return None if verdict is None else int(verdict["version"])

    produce_articles(deployment.bootstrap, topic, [{"id": "a", "text": text}])
    assert version_of_a(reader.read_until(lambda r: version_of_a(r) is not None, timeout=120)) == 0
    asyncio.run(produce(deployment.bootstrap, topic, [(b"a", None)]))
    produce_articles(deployment.bootstrap, topic, [{"id": "a", "text": text}])
    records = reader.read_until(lambda r: version_of_a(r) == 1, timeout=120)
    assert [v and v["version"] for k, v in verdict_log(records) if k == "a"] == [0, None, 1]

    worker = restart_without_state(deployment, worker)
    asyncio.run(produce(deployment.bootstrap, topic, [(b"a", None)]))
    produce_articles(deployment.bootstrap, topic, [{"id": "a", "text": text + " Updated."}])
    records = reader.read_until(lambda r: (version_of_a(r) or 0) >= 2, timeout=180)
    assert version_of_a(records) == 2, "the rebuilt index kept the marker the delete left"
    deployment.kill(worker, signal.SIGTERM)


def test_articles_expire_across_the_retention_window(deployment: Deployment) -> None:
    sample = load_sample(40)
    deployment.extra_env["NEARDUP_RETENTION"] = "30d"
    worker = deployment.start_worker()
    topic = deployment.topics["input"]
    today = datetime.now(UTC).replace(microsecond=0)

    def dated(article_id: str, text: str, days_ago: float) -> dict[str, Any]:
        when = (today - timedelta(days=days_ago)).isoformat().replace("+00:00", "Z")
        return {"id": article_id, "text": text, "published_at": when}

    old, mid = sample[0]["text"], sample[3]["text"]
    articles = [
        dated("old", old, 45),
        dated("mid", mid, 20),
        dated("inside", mid + " Reporting by the wire desk.", 10),
        dated("outside", old + " Reporting by the wire desk.", 2),
        # refused (far ahead of its record's timestamp): it counts under that timestamp, now
        {"id": "future", "text": sample[7]["text"], "published_at": "2099-01-01T00:00:00Z"},
    ]
    produce_articles(deployment.bootstrap, topic, articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    view = latest(reader.read_until(lambda r: len(latest(r)) >= 5, timeout=120))
    inside, outside = view["inside"], view["outside"]
    assert inside is not None and (inside["verdict"], inside["match_id"]) == ("duplicate", "mid")
    assert outside is not None and outside["verdict"] == "unique", "its original is 43 days older"
    assert_metric(deployment, "neardup_expired_total", 1.0)
    assert_metric(deployment, "neardup_refused_times_total", 1.0)
    assert_metric(deployment, "neardup_indexed_articles", 4.0)
    oldest = (today - timedelta(days=20)).timestamp()
    assert_metric(deployment, "neardup_index_oldest_seconds", oldest)  # mid's
    deployment.kill(worker, signal.SIGTERM)
    held = stats_of_state(deployment)
    assert (held["articles"], held["expired"]) == (4, 1)

    # rebuilt from the changelog, the expired article stays gone
    shutil.rmtree(deployment.state_dir(0))
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, topic, [dated("again", old, 1)])
    view = latest(reader.read_until(lambda r: "again" in latest(r), timeout=180))
    again = view["again"]
    assert again is not None and again["match_id"] == "outside" and not again["exact"]
    deployment.kill(worker, signal.SIGTERM)
    assert stats_of_state(deployment)["articles"] == 5


@pytest.mark.xdist_group("heavy")  # one at a time with the other long streams (tests/run)
def test_updates_redelivered_after_sigkill_keep_their_versions(deployment: Deployment) -> None:
    """Every article is sent twice (a correction with new text later); the worker is killed
    while input is pending, before its offsets are committed: the input comes back and is signed
    again, yet no article gets a third version."""
    sample = load_sample()
    count = 1500
    rng = random.Random(7)
    first = [
        {"id": f"u{i:04d}", "text": f"{sample[i % len(sample)]['text']} Edition {i}."} for i in range(count)
    ]
    second = [
        {"id": a["id"], "text": a["text"] + f" Correction: figure {rng.randrange(10**6)} was wrong."}
        for a in first
    ]
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], first + second)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    worker = deployment.start_worker()

    def corrected(records: list[Any]) -> int:  # by id, since re-delivered verdicts repeat
        return len({k for k, v in verdict_log(records) if v is not None and v["version"] == 1})

    at_kills: list[list[Any]] = []  # the verdict topic as each killed worker left it
    pending: list[int] = []  # corrections without a verdict then
    for target in (700, 1900):
        reader.reach(lambda r, t=target: len(r) >= t, timeout=300, logs=deployment.logs)
        assert deployment.kill(worker, signal.SIGKILL), f"the worker was running:\n{deployment.logs()}"
        at_kills.append(reader.read_all())
        pending.append(count - corrected(at_kills[-1]))
        assert pending[-1] > 0, f"the kill at {target} verdicts lands while input is pending"
        worker = deployment.start_worker()
    # until every article's correction is out
    records = reader.read_until(lambda r: corrected(r) >= count, timeout=600)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for key, verdict in verdict_log(records):
        assert verdict is not None
        by_id.setdefault(key, []).append(verdict)
    assert len(by_id) == count
    versions = {v["version"] for seen in by_id.values() for v in seen}
    assert versions == {0, 1}, f"versions seen: {sorted(versions)}"
    for article_id, seen in by_id.items():
        assert seen[-1]["version"] == 1, article_id
    redelivered = len(records) - 2 * count
    # a verdict the topic held at a kill, (id, version) again after it, up to the next kill (or the end)
    later = [*at_kills[1:], reader.read_all()]
    again = [
        repeated_after(at, after, lambda r: (r.key, orjson.loads(r.value)["version"]))
        for at, after in zip(at_kills, later, strict=True)
    ]
    assert all(n > 0 for n in again), f"the kills landed before the input was committed: {again} again"
    assert deployment.kill(worker, signal.SIGTERM), deployment.logs()
    assert stats_of_state(deployment)["articles"] == count
    print(
        f"verdicts={len(records)} redelivered={redelivered} pending at each kill={pending} then again={again}"
    )


@pytest.mark.xdist_group("heavy")  # one at a time with the other long streams (tests/run)
def test_a_hot_story_of_2000_copies(deployment: Deployment, tmp_path: Path) -> None:
    """Enough copies to fill their buckets past the cap many times over; what a cluster of 100,000
    costs as it grows is bench_hot_story.py's."""
    sample = load_sample(60)
    story = max((a["text"] for a in sample), key=len)
    words = story.split(" ")
    rng = random.Random(3)
    articles = []
    for i in range(2_000):
        edited = list(words)
        for _ in range(rng.randint(0, 3)):
            edited[rng.randrange(len(edited))] = rng.choice(words)
        articles.append({"id": f"hot{i:05d}", "text": " ".join(edited) + f" Desk {i % 50}."})
    articles += [{"id": f"news{i}", "text": a["text"]} for i, a in enumerate(sample[1:])]
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(articles, tmp_path)}
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    worker = deployment.start_worker()
    records = reader.read_until(lambda r: len(r) >= len(articles), timeout=900)
    got = {key: without_latency(v) for key, v in verdict_log(records) if v is not None}
    assert got == expected
    kinds = {v["verdict"] for v in got.values()}
    assert kinds >= {"unique", "duplicate"}
    largest = deployment.settled_metric(0, "neardup_index_largest_bucket", 64.0)
    assert (deployment.metric(0, "neardup_index_bytes") or 0) > 0
    deployment.kill(worker, signal.SIGTERM)
    held = stats_of_state(deployment)
    assert held["largest_bucket"] == largest == held["bucket_cap"] == 64
    assert held["articles"] == len(articles)


async def _produce_stamped(
    bootstrap: str, topic: str, stamped: list[tuple[dict[str, Any], int | None]]
) -> None:
    """Articles keyed by id, each with the record timestamp given (None: the producer's clock)."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    # Kafka 4 refuses records stamped more than an hour ahead by default: allow them, as an older
    # broker or a topic configured so would
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        allow = {"message.timestamp.after.max.ms": str(2**63 - 1)}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=allow)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for article, stamp in stamped:
            await _send_once_allowed(producer, topic, article, stamp)
    finally:
        await producer.stop()


async def _send_once_allowed(producer: Any, topic: str, article: dict[str, Any], stamp: int | None) -> None:
    """Send one record, retrying while the topic's new timestamp limit has not reached its leader
    (a config change is applied asynchronously after the admin call returns)."""
    from aiokafka.errors import InvalidTimestampError

    deadline = time.monotonic() + 30
    while True:
        try:
            await producer.send_and_wait(
                topic, orjson.dumps(article), key=article["id"].encode(), timestamp_ms=stamp
            )
            return
        except InvalidTimestampError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def test_a_record_stamped_far_ahead_expires_nothing(deployment: Deployment) -> None:
    """One record whose timestamp is 50 years ahead of the worker's clock: refused as its time
    (counted, the article timed by its arrival), so the retention window does not move past
    everything held, and an exact copy of an earlier article is still a duplicate."""
    sample = load_sample(3)
    deployment.extra_env["NEARDUP_RETENTION"] = "30d"
    deployment.create_topics()
    ahead = int((datetime.now(UTC) + timedelta(days=50 * 365)).timestamp() * 1000)
    stamped = [
        ({"id": "first", "text": sample[0]["text"]}, None),
        ({"id": "broken-clock", "text": sample[1]["text"]}, ahead),
        ({"id": "copy", "text": sample[0]["text"]}, None),
    ]
    asyncio.run(_produce_stamped(deployment.bootstrap, deployment.topics["input"], stamped))
    deployment.start_worker()
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    view = latest(reader.read_until(lambda r: len(latest(r)) >= 3, timeout=120))
    copy = view["copy"]
    assert copy is not None and (copy["verdict"], copy["match_id"], copy["exact"]) == (
        "duplicate",
        "first",
        True,
    )
    assert_metric(deployment, "neardup_refused_times_total", 1.0)
    assert_metric(deployment, "neardup_indexed_articles", 3.0)
    newest = deployment.metric(0, "neardup_index_newest_seconds")
    assert newest is not None and newest < datetime.now(UTC).timestamp() + 3600


def test_a_delete_killed_after_its_changelog_write_gets_its_tombstone_after_the_restart(
    deployment: Deployment,
) -> None:
    """The worker is killed after a deletion reached the changelog and before its tombstone was
    sent: after the restart the index, rebuilt, no longer holds the id, and the deletion, delivered
    again, still answers with its tombstone."""
    sample = load_sample(2)
    topic = deployment.topics["input"]
    # the second chunk decided (the deletion's) waits a minute between its changelog send and its verdicts
    deployment.extra_env.update(fault_env(AGENT_FAULT, "delay:verdicts:2:60000"))
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, topic, [{"id": "a", "text": sample[0]["text"]}])
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    reader.read_until(lambda r: "a" in latest(r), timeout=120)
    asyncio.run(produce(deployment.bootstrap, topic, [(b"a", None)]))
    changelog = TopicReader(deployment.bootstrap, f"{deployment.name}-records-changelog")
    changelog.read_until(lambda r: any(m.key == b"aa" and m.value is None for m in r), timeout=60)
    deployment.kill(worker, signal.SIGKILL)
    assert ("a", None) not in verdict_log(reader.read_all(timeout=5)), "killed before the tombstone"
    deployment.extra_env.clear()
    worker = deployment.start_worker()
    records = reader.read_until(lambda r: ("a", None) in verdict_log(r), timeout=120)
    assert latest(records)["a"] is None
    deployment.kill(worker, signal.SIGTERM)
