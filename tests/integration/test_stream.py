"""Through the real broker: verdicts equal the embedded mode's, all partitions are seen, bad input
lands in the dead-letter topic, the filtered feed forwards what passes its filter."""

from __future__ import annotations

import asyncio
import base64
import re
from pathlib import Path

import orjson
import pytest

from neardup.core.params import DedupParams
from neardup.core.signing import sketch_of
from tests.support.broker import (
    TopicReader,
    create_topic,
    produce,
    produce_articles,
    produce_with_headers,
    read_feed,
    source_header,
)
from tests.support.deployment import Deployment, load_sample, run_embedded, verdicts_by_id, without_latency


@pytest.mark.parametrize(
    "handoff", [pytest.param(1, marks=pytest.mark.smoke), 0], ids=["hand-off", "through-the-consumer"]
)
def test_stream_verdicts_equal_embedded_mode(deployment: Deployment, tmp_path: Path, handoff: int) -> None:
    articles = load_sample()
    expected = run_embedded(articles, tmp_path)
    deployment.extra_env["NEARDUP_INDEX_HANDOFF"] = str(handoff)
    deployment.start_worker()
    # A few first, until their verdicts come: the worker then owns the index shard and has decided
    # from it, so the hand-off can take the rest (else a fast signer may send every signatures
    # message before the index agent's first batch, and the consumer path decides them all).
    first = 20
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[:first])
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    assert len(reader.read_until(lambda r: len(r) >= first, timeout=120)) == first, deployment.logs()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles[first:])
    records = reader.read_until(lambda r: len(r) >= len(articles), timeout=180)
    assert len(records) == len(articles), deployment.logs()
    # The verdict topic is partitioned by article id, so compare per article, not by topic order.
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in expected}
    kinds = {v["verdict"] for v in got.values()}
    assert kinds >= {"unique", "duplicate", "partial"}
    assert all(orjson.loads(r.value)["latency_ms"] >= 0 for r in records)
    # decided on the acknowledgement of the worker's own sends, or only as the consumer reads them
    handed_off = re.search(r"^neardup_index_handed_off_total (\S+)$", deployment.metrics(0), re.MULTILINE)
    assert handed_off is not None
    assert (float(handed_off.group(1)) > 0) == bool(handoff)
    # A clean stop ends the helper processes inside the event loop: no traceback on the way out
    deployment.stop_all()
    log = deployment.logs()
    assert "Traceback" not in log and "Event loop is closed" not in log, log


def test_two_workers_three_partitions_see_every_earlier_article(kafka: str, tmp_path: Path) -> None:
    dep = Deployment(kafka, tmp_path, input_partitions=3)
    try:
        dep.start_worker(0)
        dep.start_worker(1)
        articles = load_sample()
        produce_articles(dep.bootstrap, dep.topics["input"], articles)
        reader = TopicReader(dep.bootstrap, dep.topics["verdicts"])
        records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=240)
        verdicts = verdicts_by_id(records)
        assert set(verdicts) == {a["id"] for a in articles}, dep.logs()
        # Articles with equal canonical text are keyed differently, so they travel on different
        # partitions; in each such group exactly one (the first indexed) is not an exact duplicate,
        # and every other one names a member of the group.
        params = DedupParams()
        groups: dict[bytes, list[str]] = {}
        for article in articles:
            groups.setdefault(sketch_of(article["text"], params).content_hash, []).append(article["id"])
        multi = [ids for ids in groups.values() if len(ids) > 1]
        assert len(multi) > 20
        for ids in multi:
            exact = [verdicts[i][0] for i in ids if verdicts[i][0]["exact"]]
            assert len(exact) == len(ids) - 1, [verdicts[i][0] for i in ids]
            assert all(v["match_id"] in ids for v in exact)
    finally:
        dep.discard()


@pytest.mark.smoke
def test_bad_messages_go_to_dead_letters_and_valid_ones_get_verdicts(deployment: Deployment) -> None:
    valid = load_sample(20)
    bad: list[tuple[bytes | None, bytes | None, str]] = [
        (b"x1", b"{not json", "invalid_json"),
        (b"x2", b'{"id": "x2", "text": "caf\xe9 latin-1 bytes"}', "invalid_utf8"),
        (b"x3", b'{"id": "x3"}', "schema_violation"),
        (b"x4", b'{"id": 4, "text": "numeric id"}', "schema_violation"),
        (b"x5", b'["an", "array"]', "schema_violation"),
        (b"x6", orjson.dumps({"id": "x6", "text": "w " * 300_000}), "oversized"),
        (b"x7", b'{"id": "x7", "text": "   \\n\\t "}', "empty_text"),
    ]
    messages: list[tuple[bytes | None, bytes | None]] = []
    for i, article in enumerate(valid):
        messages.append((article["id"].encode(), orjson.dumps(article)))
        if i < len(bad):
            messages.append((bad[i][0], bad[i][1]))
    # a tombstone (key, no value) deletes an article: of an unknown id, it is counted and answered
    # with a tombstone, no dead letter
    messages.append((b"x8", None))
    deployment.extra_env["NEARDUP_MAX_TEXT_BYTES"] = "500000"
    deployment.start_worker()

    asyncio.run(produce(deployment.bootstrap, deployment.topics["input"], messages))
    dead = TopicReader(deployment.bootstrap, deployment.topics["dead"]).read_until(
        lambda r: len(r) >= len(bad), timeout=180
    )
    letters = [orjson.loads(r.value) for r in dead]
    assert len(letters) == len(bad), deployment.logs()
    by_key = {None if d["key_b64"] is None else base64.b64decode(d["key_b64"]): d for d in letters}
    for key, value, reason in bad:
        letter = by_key[key]
        assert letter["reason"] == reason, letter
        assert letter["topic"] == deployment.topics["input"]
        assert letter["partition"] == 0 and letter["offset"] >= 0
        original = None if letter["value_b64"] is None else base64.b64decode(letter["value_b64"])
        assert original == value
    verdicts = TopicReader(deployment.bootstrap, deployment.topics["verdicts"]).read_until(
        lambda r: len(r) >= len(valid) + 1, timeout=120
    )
    decided = [orjson.loads(r.value)["article_id"] for r in verdicts if r.value is not None]
    assert sorted(decided) == sorted(a["id"] for a in valid)
    assert [r.key for r in verdicts if r.value is None] == [b"x8"]
    assert deployment.settled_metric(0, 'neardup_deletes_total{status="unknown_delete"}', 1.0) == 1.0
    again = TopicReader(deployment.bootstrap, deployment.topics["dead"]).read_until(
        lambda r: False, timeout=3
    )
    assert len(again) == len(bad), "the tombstone was not dead-lettered"


def test_a_message_keyed_by_another_id_is_dead_lettered_and_the_next_one_gets_its_verdict(
    deployment: Deployment,
) -> None:
    """Keyed "x" with id "y" (or keyed by bytes that are not UTF-8): a key_mismatch dead letter
    with the original key and bytes, no verdict; the correctly keyed messages around it are judged."""
    before, after = load_sample(2)
    mismatched = [
        (b"x", b'{"id": "y", "text": "An article keyed by another id."}'),
        (b"z\xff", b'{"id": "z", "text": "An article keyed by bytes that are not UTF-8."}'),
    ]
    messages: list[tuple[bytes | None, bytes | None]] = [
        (before["id"].encode(), orjson.dumps(before)),
        *mismatched,
        (after["id"].encode(), orjson.dumps(after)),
    ]
    deployment.start_worker()
    asyncio.run(produce(deployment.bootstrap, deployment.topics["input"], messages))

    verdicts = TopicReader(deployment.bootstrap, deployment.topics["verdicts"]).read_until(
        lambda r: after["id"] in verdicts_by_id(r), timeout=120
    )
    assert sorted(verdicts_by_id(verdicts)) == sorted([before["id"], after["id"]]), deployment.logs()
    dead = TopicReader(deployment.bootstrap, deployment.topics["dead"]).read_until(
        lambda r: len(r) >= len(mismatched), timeout=30
    )
    letters = [orjson.loads(r.value) for r in dead]
    assert [(d["reason"], d["offset"]) for d in letters] == [("key_mismatch", 1), ("key_mismatch", 2)]
    for (key, value), letter, record in zip(mismatched, letters, dead, strict=True):
        assert record.key == key
        assert (base64.b64decode(letter["key_b64"]), base64.b64decode(letter["value_b64"])) == (key, value)
        assert letter["topic"] == deployment.topics["input"] and letter["partition"] == 0
    assert "the key 'x' is not the id 'y'" in letters[0]["detail"]
    assert "the key b'z\\xff' (not UTF-8) is not the id 'z'" in letters[1]["detail"]
    metric = 'neardup_dead_letters_total{reason="key_mismatch"}'
    assert deployment.settled_metric(0, metric, 2.0) == 2.0


def test_partition_mismatch_is_reported_not_crash_looped(deployment: Deployment) -> None:
    """An internal topic with the wrong partition count stops the worker with a clear message."""
    asyncio.run(create_topic(deployment.bootstrap, deployment.topics["signatures"], partitions=2))
    import subprocess
    import sys

    from tests.support.deployment import REPO

    result = subprocess.run(
        [sys.executable, "-m", "neardup", "worker"],
        cwd=REPO,
        env=deployment.env(0),
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 2
    log = result.stderr.decode() + result.stdout.decode()
    assert "topic_mismatch" in log
    assert deployment.topics["signatures"] in log and "has 2 partitions" in log


def test_a_feed_topic_that_takes_less_than_an_input_message_is_refused_at_start(
    deployment: Deployment,
) -> None:
    """A feed topic left at Kafka's default limit takes less than an input message the worker
    accepts under the default text limit: the worker refuses to start, naming the topic and the
    command that raises its limit; raised so, the worker starts."""
    import subprocess
    import sys

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from neardup.config import Settings
    from neardup.stream.topics import KAFKA_DEFAULT_MAX_MESSAGE_BYTES, feed_max_bytes
    from tests.support.deployment import REPO

    feed_topic = f"{deployment.name}-unique"
    deployment.extra_env["NEARDUP_UNIQUE_TOPIC"] = feed_topic
    need = feed_max_bytes(Settings.from_env(deployment.env(0)))

    async def admin(action: str) -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=deployment.bootstrap)
        await client.start()
        try:
            if action == "create":
                configs = {"max.message.bytes": str(KAFKA_DEFAULT_MAX_MESSAGE_BYTES)}
                await client.create_topics([NewTopic(feed_topic, 3, 1, topic_configs=configs)])
            else:
                limit = {"max.message.bytes": str(need)}
                await client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, feed_topic, limit)])
        finally:
            await client.close()

    asyncio.run(admin("create"))
    result = subprocess.run(
        [sys.executable, "-m", "neardup", "worker"],
        cwd=REPO,
        env=deployment.env(0),
        capture_output=True,
        timeout=120,
    )
    log = result.stderr.decode() + result.stdout.decode()
    assert result.returncode == 2, log
    assert "topic_mismatch" in log
    assert f"'{feed_topic}' takes messages of up to {KAFKA_DEFAULT_MAX_MESSAGE_BYTES} bytes" in log
    command = f"kafka-configs.sh --alter --entity-type topics --entity-name {feed_topic}"
    assert f"{command} --add-config max.message.bytes={need}" in log
    asyncio.run(admin("raise"))
    deployment.start_worker()  # ready: its topics passed the check


@pytest.mark.parametrize(
    ("setting", "kinds"),
    [(None, {"unique", "revised"}), ("unique,partial", {"unique", "partial"})],
    ids=["default-unique", "unique-partial"],
)
def test_the_filtered_feed_forwards_each_unique_articles_message_unchanged(
    deployment: Deployment, tmp_path: Path, setting: str | None, kinds: set[str]
) -> None:
    """NEARDUP_UNIQUE_TOPIC: the input message (bytes and headers) of every article whose verdict
    passes the filter (NEARDUP_UNIQUE_FILTER, `unique,revised` when unset), keyed by id, once; an article
    that does not pass never appears."""
    articles = load_sample(150)
    feed_topic = f"{deployment.name}-unique"
    deployment.extra_env["NEARDUP_UNIQUE_TOPIC"] = feed_topic
    if setting is not None:
        deployment.extra_env["NEARDUP_UNIQUE_FILTER"] = setting
    deployment.start_worker()
    messages = {a["id"]: orjson.dumps(a) for a in articles}
    produce_with_headers(deployment.bootstrap, deployment.topics["input"], messages)
    verdicts = {v["article_id"]: v["verdict"] for v in run_embedded(articles, tmp_path)}
    wanted = {article_id for article_id, kind in verdicts.items() if kind in kinds}
    left_out = {kind for kind in verdicts.values() if kind not in kinds}
    assert wanted and "duplicate" in left_out and left_out <= {"unique", "duplicate", "partial", "revised"}, (
        "the sample holds articles in and out of the filter"
    )
    records = read_feed(deployment.bootstrap, feed_topic, wanted)
    assert sorted(m.key.decode() for m in records) == sorted(wanted), deployment.logs()
    for message in records:
        article_id = message.key.decode()
        assert message.value == messages[article_id]
        assert list(message.headers) == source_header(article_id)
