"""The write overlay (state/overlay.py) and the restore of the worker's index: writes held in
layers are read through, committed in one batch or discarded; a state restored from its committed
changelog offset equals one rebuilt from the whole changelog."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup.core.params import DedupParams
from neardup.core.retention import Retention
from neardup.pipeline.shard import (
    CLOCK_MARGIN_MS,
    POSITION_KEY,
    IndexShard,
    Position,
)
from neardup.pipeline.wire import Signed, SignedDeletion
from neardup.state.index import META
from neardup.state.memory import MemoryKV
from neardup.state.overlay import LayeredKV
from neardup.state.port import Batch, KeyValue
from neardup.state.rocks import RocksKV, RocksOptions, RocksState
from tests.support.changelog import compacted
from tests.support.signing import SRC, signed

REPO = Path(__file__).resolve().parents[2]
PARAMS = DedupParams(containment_index=True)  # the posting lists restored too


@pytest.fixture(params=["memory", "rocks"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValue]:
    kv: KeyValue = MemoryKV() if request.param == "memory" else RocksKV(tmp_path / "kv", RocksOptions())
    yield kv
    kv.close()


Writes = dict[bytes, bytes | None]


def put(kv: KeyValue, main: Writes, records: Writes | None = None) -> None:
    kv.write(Batch(main=dict(main), records=dict(records or {})))


def applied(into: dict[bytes, bytes], writes: Writes) -> None:
    for key, value in writes.items():
        if value is None:
            into.pop(key, None)
        else:
            into[key] = value


def test_reads_see_the_newest_layer_over_the_store(base: KeyValue) -> None:
    put(base, {b"xa": b"1", b"xb": b"1", b"xc": b"1"}, {b"r1": b"1"})
    kv = LayeredKV(base)
    kv.hold(1)
    put(kv, {b"xa": b"2", b"xb": None}, {b"r1": None, b"r2": b"2"})
    kv.hold(2)
    put(kv, {b"xa": b"3", b"xd": b"3"})
    assert kv.get_many([b"xa", b"xb", b"xc", b"xd", b"xe"]) == [b"3", None, b"1", b"3", None]
    assert kv.records([b"r1", b"r2"]) == [None, b"2"]
    assert base.get_many([b"xa", b"xb", b"xd"]) == [b"1", b"1", None]  # nothing reached the store


def test_scans_merge_the_layers_in_key_order_with_deletions_honoured(base: KeyValue) -> None:
    put(base, {b"xa": b"1", b"xc": b"1", b"xe": b"1", b"y": b"1"}, {b"r1": b"1", b"r3": b"1"})
    kv = LayeredKV(base)
    kv.hold(1)
    put(kv, {b"xb": b"2", b"xc": None, b"xe": b"2", b"xf": b"2", b"w": b"2"}, {b"r2": b"2", b"r3": None})
    kv.hold(2)
    put(kv, {b"xc": b"3", b"xb": None, b"x": b"3"}, {b"r0": b"3"})
    assert list(kv.scan(b"x")) == [(b"x", b"3"), (b"xa", b"1"), (b"xc", b"3"), (b"xe", b"2"), (b"xf", b"2")]
    assert list(kv.scan(b"xe")) == [(b"xe", b"2")]
    assert list(kv.scan_records()) == [(b"r0", b"3"), (b"r1", b"1"), (b"r2", b"2")]
    first = kv.scan(b"x")
    assert next(first) == (b"x", b"3")  # lazy: a caller that wants the first pays for the first


def test_commit_writes_the_layers_up_to_a_tag_in_one_batch_and_keeps_the_rest(base: KeyValue) -> None:
    put(base, {b"xa": b"1"})
    kv = LayeredKV(base)
    kv.hold(1)
    put(kv, {b"xa": b"2", b"xb": b"2"}, {b"r1": b"2"})
    kv.hold(2)
    put(kv, {b"xa": None, b"xc": b"3"})
    kv.hold(3)
    put(kv, {b"xd": b"4"})
    assert kv.commit_through(2, {b"mpos": b"p2"}) == 2
    assert kv.held == [3]
    assert base.get_many([b"xa", b"xb", b"xc", b"xd", b"mpos"]) == [None, b"2", b"3", None, b"p2"]
    assert base.records([b"r1"]) == [b"2"]
    assert kv.get_many([b"xd"]) == [b"4"]
    assert kv.commit_through(2, {b"mpos": b"again"}) == 0  # nothing held up to 2: nothing written
    assert base.get_many([b"mpos"]) == [b"p2"]


def test_discard_leaves_the_store_at_its_last_commit(base: KeyValue) -> None:
    put(base, {b"xa": b"1"})
    kv = LayeredKV(base)
    kv.hold(1)
    put(kv, {b"xa": None, b"xb": b"2"}, {b"r": b"2"})
    kv.discard()
    assert kv.held == []
    assert kv.get_many([b"xa", b"xb"]) == [b"1", None] and kv.records([b"r"]) == [None]
    assert list(kv.scan(b"x")) == [(b"xa", b"1")]
    put(kv, {b"xc": b"3"})  # no layer held: straight to the store
    assert base.get_many([b"xc"]) == [b"3"]
    with pytest.raises(ValueError):
        kv.hold(5)
        kv.hold(4)  # tags go up


def test_the_overlay_reads_as_a_plain_store_would_through_random_work(base: KeyValue) -> None:
    rng = random.Random(7)
    model: dict[bytes, bytes] = {}  # what a store written at once would hold
    committed: dict[bytes, bytes] = {}
    kv = LayeredKV(base)
    keys = [bytes([rng.choice(b"xyz")]) + bytes([rng.randrange(256)]) for _ in range(60)]
    tag = 0
    pending: list[tuple[int, Writes]] = []
    for _ in range(300):
        step = rng.random()
        if step < 0.15:
            tag += 1
            kv.hold(tag)
            pending.append((tag, {}))
        elif step < 0.25 and pending:
            upto = rng.choice(pending)[0]
            kv.commit_through(upto)
            for _, writes in [p for p in pending if p[0] <= upto]:
                applied(committed, writes)
            pending = [p for p in pending if p[0] > upto]
        elif step < 0.28:
            kv.discard()
            pending, model = [], dict(committed)
        else:
            writes: dict[bytes, bytes | None] = {
                rng.choice(keys): (None if rng.random() < 0.3 else b"%d" % rng.randrange(100))
                for _ in range(3)
            }
            put(kv, writes, writes)  # the records family the same as the main one
            for key, value in writes.items():
                model.pop(key, None) if value is None else model.__setitem__(key, value)
            if pending:
                pending[-1][1].update(writes)
            else:
                for key, value in writes.items():
                    committed.pop(key, None) if value is None else committed.__setitem__(key, value)
        for prefix in (b"x", b"y"):
            assert list(kv.scan(prefix)) == sorted((k, v) for k, v in model.items() if k.startswith(prefix))
        assert kv.get_many(keys[:10]) == [model.get(key) for key in keys[:10]]
        assert kv.records(keys[10:20]) == [model.get(key) for key in keys[10:20]]
    kv.discard()
    assert dict(kv.scan(b"")) == committed


def test_a_commit_survives_a_sigkill_of_the_process_and_held_writes_do_not(tmp_path: Path) -> None:
    """Through RocksDB's write-ahead log: the process is killed right after its writes."""
    script = f"""
import os, signal
from neardup.state.port import Batch
from neardup.state.rocks import RocksOptions, RocksState
state = RocksState({str(tmp_path / "db")!r}, RocksOptions(write_ahead_log=True), layered=True)
kv = state.kv
kv.hold(1)
kv.write(Batch(main={{b"xa": b"committed"}}, records={{b"r1": b"record"}}))
kv.hold(2)
kv.write(Batch(main={{b"xb": b"held"}}))
kv.commit_through(1, {{b"mpos": b"41"}})
os.kill(os.getpid(), signal.SIGKILL)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, timeout=60)
    assert done.returncode == -9
    state = RocksState(tmp_path / "db")
    try:
        assert state.kv.get_many([b"xa", b"xb", b"mpos"]) == [b"committed", None, b"41"]
        assert state.kv.records([b"r1"]) == [b"record"]
    finally:
        state.close()


# --- the incremental replay against a rebuild ------------------------------------------------------

DAY = 86_400_000
NOW_S = 40 * DAY / 1000


def sample_articles() -> list[dict[str, Any]]:
    lines = (REPO / "service" / "data" / "sample_news.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines if line.strip()]


def workload(count: int) -> list[Signed | SignedDeletion]:
    """Articles with near and exact copies, new versions of ids, deletions and re-adds, and times
    spread over days so that a 10-day window expires some."""
    sample = sample_articles()
    rng = random.Random(3)
    items: list[Signed | SignedDeletion] = []
    held: list[str] = []
    deleted: list[str] = []
    for n in range(count):
        roll = rng.random()
        if roll < 0.06 and held:
            gone = held.pop(rng.randrange(len(held)))
            deleted.append(gone)
            src = SRC._replace(offset=10_000 + n)
            items.append(SignedDeletion(gone, src))
            continue
        text = sample[rng.randrange(len(sample))]["text"]
        if roll < 0.09 and len(deleted) > 4:  # an id deleted before, added again
            article_id = deleted.pop(0)
            held.append(article_id)
        elif roll < 0.16 and held:  # a new version of an id
            article_id = rng.choice(held)
        else:
            article_id = f"n{n}"
            held.append(article_id)
        item = signed(article_id, text, 10_000 + n, PARAMS)
        items.append(item._replace(time_ms=int(n * 30 * DAY / count)))
    return items


class Live:
    """The index stage as the worker runs it: chunks decided into the overlay, their writes in a
    changelog (a list), each chunk committed once `commit` says the changelog has it."""

    def __init__(self, path: Path, retention: Retention) -> None:
        self.entries: list[tuple[bytes, bytes | None]] = []
        state = RocksState(path, RocksOptions(bucket_cap=1024), layered=True)
        self.shard = IndexShard(state, PARAMS, retention, self.entries)
        self.shard.replay({})
        self.shard.mark_position(0, 0)
        self.chunk = 0

    def decide(self, items: list[Signed | SignedDeletion], offset: int, *, commit: bool = True) -> None:
        self.chunk += 1
        self.shard.begin(self.chunk)
        self.shard.decide(items, offset, now=NOW_S)
        self.shard.checkpoint()
        if commit:
            self.shard.commit(self.chunk, len(self.entries))


def scans(state: RocksState) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    """Everything the state holds but its metadata (positions, counters differ by how it was made)."""
    main = {key: value for key, value in state.kv.scan(b"") if not key.startswith(META)}
    return main, dict(state.kv.scan_records())


@pytest.mark.parametrize("stop_at", [40, 170])
def test_a_restored_index_equals_one_rebuilt_from_the_whole_changelog(tmp_path: Path, stop_at: int) -> None:
    items = workload(260)
    chunks = [items[i : i + 10] for i in range(0, len(items), 10)]
    live = Live(tmp_path / "index", Retention(window_ms=10 * DAY))
    for n, chunk in enumerate(chunks):
        # after `stop_at` items, chunks are decided and in the changelog but never committed, as
        # when the process is killed before the acknowledgements come
        live.decide(chunk, n, commit=n * 10 < stop_at)
    committed = Position.decode(live.shard.state.get_meta(POSITION_KEY))
    assert committed is not None and 0 < committed.offset < len(live.entries)
    live.shard.state.close()  # the held chunks are lost with the process

    restored = IndexShard(RocksState(tmp_path / "index", layered=True), PARAMS, changelog=[])
    point, why = restored.restore_point(len(live.entries), committed.since_ms, None)
    assert why == "ok" and point == committed
    tail = live.entries[point.offset :]
    for start in range(0, len(tail), 100):
        run = tail[start : start + 100]
        restored.restore(run, point.offset + start + len(run), point.since_ms)
    restored.mark_position(len(live.entries), 0)

    rebuilt = IndexShard(RocksState(tmp_path / "rebuilt"), PARAMS, changelog=[])
    rebuilt.replay(compacted(live.entries))
    try:
        prefixes = {key[:1] for key in scans(rebuilt.state)[0]}
        assert prefixes >= {b"a", b"b", b"c", b"d", b"k", b"n", b"t", b"x"}
        assert scans(restored.state) == scans(rebuilt.state)
        assert (restored.applied_offset, restored.inputs) == (rebuilt.applied_offset, rebuilt.inputs)
        mine, theirs = restored.state.counts, rebuilt.state.counts
        assert (mine.articles, mine.clusters, mine.buckets, mine.expired, mine.deleted) == (
            theirs.articles,
            theirs.clusters,
            theirs.buckets,
            theirs.expired,
            theirs.deleted,
        )
        # the anchor posting lists too: held in the overlay, replayed, counted alike
        assert (mine.postings, mine.boilerplate) == (theirs.postings, theirs.boilerplate)
        assert mine.postings > 0
        assert mine.expired > 0 and mine.deleted > 0  # the tail or the state held both kinds
        assert restored.state.next_seq() == rebuilt.state.next_seq()
    finally:
        restored.state.close()
        rebuilt.state.close()


def test_a_restore_point_is_refused_when_compaction_may_have_dropped_its_tombstones(tmp_path: Path) -> None:
    live = Live(tmp_path / "index", Retention())
    live.decide([signed("a", sample_articles()[0]["text"], params=PARAMS)], 0)
    point = Position.decode(live.shard.state.get_meta(POSITION_KEY))
    assert point is not None and point.offset == len(live.entries)
    end = len(live.entries)
    retention = 3_600_000
    young = point.since_ms + retention - CLOCK_MARGIN_MS - 1
    assert live.shard.restore_point(end, young, retention) == (point, "ok")
    assert live.shard.restore_point(end, young + 1, retention) == (None, "older_than_delete_retention")
    assert live.shard.restore_point(end - 1, young, retention) == (None, "past_changelog_end")
    live.shard.state.close()
    fresh = IndexShard(RocksState(tmp_path / "fresh", layered=True), PARAMS, changelog=[])
    assert fresh.restore_point(end, young, retention) == (None, "no_position")
    fresh.state.close()
