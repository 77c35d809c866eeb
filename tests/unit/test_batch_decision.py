"""A batch decided in one call against the same articles decided one a call (the reference,
tests/support/one_at_a_time.py): the same statuses, verdicts and stored records, in memory and in
RocksDB under the worker's write overlay, with the containment index on and off. The worker's
decider, embedded mode and the library decide in batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup.core.params import DedupParams
from neardup.core.retention import Retention
from neardup.pipeline.shard import IndexShard
from neardup.state.memory import MemoryState
from neardup.state.rocks import RocksState
from tests.support.arrivals import NOW_S, SAMPLE, in_batches, paragraphs, signed_items, stream
from tests.support.changelog import ChangelogTable
from tests.support.one_at_a_time import decide_one_at_a_time
from tests.support.signing import FUTURE, HISTORY

ON, OFF = DedupParams(containment_index=True), DedupParams(containment_index=False)


def outcome(shard: IndexShard, results: list[Any]) -> tuple[list[Any], list[tuple[bytes, bytes]]]:
    """What a run decided and what its state holds: statuses, verdicts (no latency), records."""
    decided = [
        (r.status, r.verdict and {**orjson.loads(r.verdict), "latency_ms": None}, r.deletion) for r in results
    ]
    return decided, sorted(shard.state.kv.scan_records())


@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
@pytest.mark.parametrize("seed", [3, 11])
def test_batches_decide_as_one_article_at_a_time(params: DedupParams, seed: int) -> None:
    items = signed_items(HISTORY + FUTURE + list(stream(seed, 240)), params)
    retention = Retention(window_ms=60_000)  # the stream spans 8 minutes: expiry runs
    reference = IndexShard(MemoryState(), params, retention)
    expected = outcome(reference, decide_one_at_a_time(reference, items, NOW_S))
    for size in (7, 50):
        shard = IndexShard(MemoryState(), params, retention)
        assert outcome(shard, in_batches(shard, items, size, layered=False)) == expected, size
    kinds = {verdict["verdict"] for _, verdict, _ in expected[0] if verdict}
    assert {"unique", "duplicate"} <= kinds and (params is OFF or "partial" in kinds), kinds


@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
def test_the_sample_news_decided_in_batches_as_one_at_a_time(params: DedupParams) -> None:
    """The sample news as it comes (its reposts, rewrites and excerpts among 489 articles)."""
    news = [orjson.loads(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
    items = signed_items([(article["id"], article["text"]) for article in news], params)
    reference = IndexShard(MemoryState(), params)
    expected = outcome(reference, decide_one_at_a_time(reference, items, NOW_S))
    shard = IndexShard(MemoryState(), params)
    assert outcome(shard, in_batches(shard, items, 32, layered=False)) == expected
    assert sum(verdict["verdict"] != "unique" for _, verdict, _ in expected[0] if verdict) >= 10


@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
def test_batches_in_rocksdb_under_the_overlay_decide_as_one_at_a_time(
    params: DedupParams, tmp_path: Path
) -> None:
    items = signed_items(list(stream(5, 200)), params)
    reference = IndexShard(MemoryState(), params)
    expected = outcome(reference, decide_one_at_a_time(reference, items, NOW_S))
    state = RocksState(tmp_path / "state", layered=True)
    shard = IndexShard(state, params, changelog=ChangelogTable())
    shard.restore_point(0, int(NOW_S * 1000), None)  # as a worker opens its derived state
    try:
        decided = outcome(shard, in_batches(shard, items, 20, layered=True))
    finally:
        state.close()
    assert decided[0] == expected[0]
    assert decided[1] == expected[1]


def test_a_copy_right_after_its_source_in_one_batch_is_its_duplicate() -> None:
    text = paragraphs()[0]
    items = signed_items([("src", text), ("copy", text + " Reporting by the wire desk."), ("src", None)], OFF)
    results = IndexShard(MemoryState(), OFF).decide(items, now=NOW_S)
    assert [r.status for r in results] == ["new", "new", "deleted"]
    assert results[1].verdict is not None and orjson.loads(results[1].verdict)["match_id"] == "src"
