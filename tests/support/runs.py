"""What a worker's run left behind (its verdicts, its changelog, its committed position) compared
with an uninterrupted embedded run of the same articles."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from neardup.core.dedup import IndexedArticle
from neardup.pipeline.shard import POSITION_KEY, Position
from neardup.state.held import HOLD_KEY
from neardup.state.index import META
from neardup.state.rocks import RocksKV, RocksOptions, RocksState
from tests.support.deployment import REPO, Deployment, verdicts_by_id, without_latency


def reference_state(articles: list[dict[str, Any]], tmp: Path) -> tuple[list[dict[str, Any]], list[Any]]:
    """An uninterrupted run of the articles in embedded mode: its verdicts and its final state."""
    source = tmp / "ref-in.jsonl"
    source.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in articles))
    state_dir = tmp / "ref-state"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "neardup",
            "dedup",
            str(source),
            "-o",
            str(tmp / "ref-out.jsonl"),
            "-q",
            "--state",
            str(state_dir),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    verdicts = [orjson.loads(line) for line in (tmp / "ref-out.jsonl").read_bytes().splitlines()]
    state = RocksState(state_dir)
    try:
        return verdicts, list(state.articles())
    finally:
        state.close()


def untimed(article: IndexedArticle) -> IndexedArticle:
    return dataclasses.replace(article, time_ms=0)


def first_verdict_times(records: list[Any]) -> dict[str, float]:
    """When each article's first verdict was produced (its record's timestamp), in seconds."""
    first: dict[str, float] = {}
    for record in records:
        article_id = orjson.loads(record.value)["article_id"]
        first[article_id] = min(first.get(article_id, float("inf")), record.timestamp / 1000)
    return first


def assert_as_embedded(records: list[Any], expected: dict[str, dict[str, Any]], logs: str) -> None:
    verdicts = verdicts_by_id(records)
    missing = sorted(set(expected) - set(verdicts))
    assert not missing, f"{len(missing)} articles without verdict, e.g. {missing[:5]}\n{logs}"
    differing = [i for i, seen in verdicts.items() if any(without_latency(v) != expected[i] for v in seen)]
    assert not differing, f"{len(differing)} verdicts differ from the embedded run, e.g. {differing[:5]}"


def indexed_articles(deployment: Deployment, index: int) -> float:
    """The worker's neardup_indexed_articles: above 0 only where the index shard was decided."""
    found = re.search(r"^neardup_indexed_articles (\S+)$", deployment.metrics(index), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def changelog_records(
    bootstrap: str, topic: str, start: int, isolation_level: str = "read_uncommitted"
) -> tuple[int, int]:
    """(records from offset `start` to the changelog's end, the end): what a restore replays
    (under exactly-once, read committed: the end is then the first offset of a transaction still
    open, which its producer's successor aborts)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        end = int((await consumer.end_offsets([tp]))[tp])
        consumer.assign([tp])
        consumer.seek(tp, start)
        count = 0
        while await consumer.position(tp) < end:
            for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                count += record.offset < end and record.key is not None
        return count, end
    finally:
        await consumer.stop()


def stored_position(state_dir: Path) -> tuple[Position, bool]:
    """The changelog position the killed worker's index committed, read beside it, and whether
    the index holds its buckets and posting lists in memory (state/held.py)."""
    kv = RocksKV(state_dir / "index", RocksOptions(), read_only=True)
    try:
        position = Position.decode(kv.get_many([META + POSITION_KEY])[0])
        held = kv.get_many([HOLD_KEY])[0] is not None
    finally:
        kv.close()
    assert position is not None, "the index committed a position"
    return position, held
