"""The index of a stream that never ends, on every store: capped buckets, copies represented by
their holder, deletes that hand a cluster on, expiry by event time, stats, the format header."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from neardup.core.params import DedupParams, IncompatibleState
from neardup.core.retention import Retention
from neardup.core.signing import sketch_of
from neardup.pipeline.shard import IndexShard
from neardup.state.index import HEADER_KEY, IndexState
from neardup.state.memory import MemoryState
from neardup.state.port import Batch, StateStore
from neardup.state.rocks import RocksOptions, RocksState
from tests.support.reference_decide import Outcome, decide
from tests.support.shard import process
from tests.support.state import MakeState, band_members, contents, id_for_content

PARAMS = DedupParams()
DAY_MS = 86_400_000


def index(state: StateStore, article_id: str, text: str, time_ms: int = 0) -> Outcome:
    outcome = decide(article_id, sketch_of(text, PARAMS), state, PARAMS, time_ms=time_ms)
    assert outcome.update is not None
    state.apply(outcome.update)
    return outcome


@pytest.fixture(params=["memory", "rocks"])
def capped(request: pytest.FixtureRequest, tmp_path: Path) -> StateStore:
    state: IndexState
    if request.param == "memory":
        state = MemoryState(bucket_cap=3)
    else:
        state = RocksState(tmp_path / "capped", RocksOptions(bucket_cap=3))
    state.open_header(PARAMS.header())
    return state


def test_a_bucket_keeps_its_latest_members_up_to_the_cap(capped: IndexState, prose: tuple[str, ...]) -> None:
    copies = [index(capped, f"c{i}", prose[0] + f" Copy number {i}.").article for i in range(8)]
    shared = set(copies[0].keys).intersection(*(c.keys for c in copies[1:]))
    assert shared, "near copies share buckets"
    for key in shared:
        assert list(band_members(capped, key)) == ["c5", "c6", "c7"]
    largest = capped.stats().largest_bucket
    assert largest == 3
    # what one article reads is bounded too: at most the cap per bucket
    found = capped.candidates(copies[0].keys, "nobody", 1000)
    assert 3 <= len(found) <= 3 * len(copies[0].keys)
    late = index(capped, "late", prose[0] + " Copy number 9.").article.decision
    assert late.kind == "duplicate" and late.match_id in {"c5", "c6", "c7"}
    assert late.canonical_id == "c0", "the cluster's first article stays its canonical"
    capped.close()


def test_exact_copies_stay_out_of_the_buckets_and_the_next_one_takes_over(
    make_state: MakeState, prose: tuple[str, ...]
) -> None:
    state = make_state()
    state.open_header(PARAMS.header())
    first = index(state, "first", prose[0]).article
    copies = [index(state, f"copy-{i}", prose[0]).article for i in range(3)]
    assert all(c.decision.exact and c.decision.match_id == "first" for c in copies)
    for key in first.keys:
        assert list(band_members(state, key)) == ["first"]
    assert state.delete("first") is not None
    assert id_for_content(state, first.sketch.content_hash) == "copy-0"
    for key in first.keys:
        assert list(band_members(state, key)) == ["copy-0"]
    later = index(state, "later", prose[0]).article.decision
    assert (later.exact, later.match_id, later.canonical_id) == (True, "copy-0", "copy-0")
    near = index(state, "near", prose[0] + " Reporting by the wire desk.").article.decision
    assert (near.kind, near.match_id) == ("duplicate", "copy-0")


def test_a_deleted_canonical_hands_its_cluster_to_the_next_surviving_member(
    make_state: MakeState, prose: tuple[str, ...]
) -> None:
    state = make_state()
    state.open_header(PARAMS.header())
    index(state, "a", prose[0])
    b = index(state, "b", prose[0] + " Reporting by the wire desk.").article
    index(state, "c", prose[0] + " Additional reporting from the bureau.")
    index(state, "other", prose[2])
    assert b.decision.canonical_id == "a"
    before = state.stats()
    removed = state.delete("a")
    assert removed is not None and removed.article_id == "a"
    assert state.get("a") is None and state.stats().articles == before.articles - 1
    assert state.stats().clusters == before.clusters, "the cluster lives on in b and c"
    assert state.head_of(b.cluster) == "b"
    d = index(state, "d", prose[0] + " Updated at noon.").article.decision
    assert d.kind == "duplicate" and d.match_id in {"b", "c"} and d.canonical_id == "b"
    state.delete("b")
    e = index(state, "e", prose[0] + " Updated at one.").article.decision
    assert e.kind == "duplicate" and e.canonical_id == "c"
    for article_id in ("c", "d", "e"):
        state.delete(article_id)
    assert state.stats().clusters == before.clusters - 1, "its last member gone, the cluster is gone"
    assert index(state, "f", prose[0]).article.decision.kind == "unique"
    assert state.delete("nobody") is None


def test_expiry_removes_old_articles_from_every_structure(
    make_state: MakeState, prose: tuple[str, ...]
) -> None:
    state = make_state()
    state.open_header(PARAMS.header())
    for day, text in enumerate(prose):
        index(state, f"day{day}", text, time_ms=day * DAY_MS)
    index(state, "copy0", prose[0], time_ms=4 * DAY_MS)  # an exact copy, recent
    index(state, "near1", prose[1] + " Reporting by the wire desk.", time_ms=1 * DAY_MS)
    assert state.stats().articles == 7
    removed = state.expire(2 * DAY_MS)
    assert sorted(a.article_id for a in removed) == ["day0", "day1", "near1"]
    assert [a.article_id for a in state.articles()] == ["day2", "day3", "day4", "copy0"]
    stats = state.stats()
    assert (stats.articles, stats.expired, stats.oldest_ms, stats.newest_ms) == (4, 3, 2 * DAY_MS, 4 * DAY_MS)
    assert state.get("day1") is None
    # the copy inside the window stands for the content now: a later copy matches it
    again = index(state, "again", prose[0], time_ms=5 * DAY_MS).article.decision
    assert (again.exact, again.match_id, again.canonical_id) == (True, "copy0", "copy0")
    # what expired is never named: a later copy of it is unique
    late = index(state, "late1", prose[1] + " Reporting by the wire desk.", time_ms=5 * DAY_MS).article
    assert late.decision.kind == "unique"


def test_after_expiry_and_deletes_a_rebuild_gives_the_same_state(
    tmp_path: Path, prose: tuple[str, ...]
) -> None:
    """What removal leaves equals what indexing the surviving records from scratch gives."""
    state = RocksState(tmp_path / "live")
    state.open_header(PARAMS.header())
    texts = [
        *prose,
        prose[0] + " Updated at noon.",
        prose[0],
        prose[0] + " By the desk.",
        prose[2] + " Again.",
    ]
    for i, text in enumerate(texts):
        index(state, f"a{i}", text, time_ms=i * DAY_MS)
    state.expire(2 * DAY_MS)
    state.delete("a6")
    records = [(a.article_id, _record(state, a.seq)) for a in state.articles()]
    rebuilt = RocksState(tmp_path / "rebuilt")
    rebuilt.open_header(PARAMS.header())
    markers = [(key[1:].decode(), value) for key, value in state.kv.scan(b"d")]
    assert [article_id for article_id, _ in markers] == ["a6"]
    rebuilt.bulk_load(iter(records), removed=(state.counts.expired, state.counts.deleted), markers=markers)
    try:
        live, fresh = contents(state), contents(rebuilt)
        assert {k: v for k, v in live.items() if not k.startswith(b"mcounts")} == {
            k: v for k, v in fresh.items() if not k.startswith(b"mcounts")
        }
        kept = orjson.loads(live[b"mcounts"])
        assert (kept["articles"], kept["clusters"], kept["buckets"], kept["expired"], kept["deleted"]) == (
            rebuilt.counts.articles,
            rebuilt.counts.clusters,
            rebuilt.counts.buckets,
            rebuilt.counts.expired,
            rebuilt.counts.deleted,
        )
        assert (kept["expired"], kept["deleted"]) == (2, 1)
    finally:
        state.close()
        rebuilt.close()


def _record(state: IndexState, seq: int) -> bytes:
    from neardup.state.tables import seq_key

    (record,) = state.kv.records([seq_key(seq)])
    assert record is not None
    return record


def test_a_state_of_an_earlier_format_is_refused_with_how_to_rebuild(tmp_path: Path) -> None:
    state = RocksState(tmp_path / "old")
    old_header = {**PARAMS.header(), "format": 3}
    state.kv.write(Batch(main={HEADER_KEY: orjson.dumps(old_header)}))
    try:
        with pytest.raises(IncompatibleState, match=r"format 3.*Rebuild"):
            state.open_header(PARAMS.header())
    finally:
        state.close()


def test_an_article_without_a_date_takes_the_time_it_is_processed(
    prose: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    engine = IndexShard(MemoryState(), PARAMS, Retention(window_ms=1000))
    process(engine, "first", prose[0])
    clock[0] += 2.5  # later than the window: what came first is past it
    process(engine, "second", prose[1])
    assert engine.state.get("second").time_ms == 1_800_000_002_500  # type: ignore[union-attr]
    assert engine.state.get("first") is None and engine.counts.refused_times == 0
    again = process(engine, "again", prose[0])
    assert again.decision.kind == "unique"  # a copy of what expired


def bucket_sizes_by_scan(state: IndexState) -> list[int]:
    """Buckets by member count, counted from every bucket stored."""
    from neardup.state.tables import BAND, SEQ

    sizes = [0] * (state.bucket_cap + 1)
    for _, members in state.kv.scan(BAND):
        sizes[len(members) // SEQ.size] += 1
    return sizes


def test_the_largest_bucket_is_counted_exactly_as_articles_come_and_go(
    capped: IndexState, prose: tuple[str, ...]
) -> None:
    for i in range(6):
        index(capped, f"c{i}", prose[0] + f" Copy number {i}.", time_ms=i * DAY_MS)
    index(capped, "other", prose[1], time_ms=6 * DAY_MS)
    assert capped.counts.bucket_sizes == bucket_sizes_by_scan(capped)
    assert capped.stats().largest_bucket == 3
    capped.delete("c5")
    capped.delete("c4")
    capped.expire(4 * DAY_MS)  # c0..c3 go: the story's buckets are empty, "other" stays
    assert capped.counts.bucket_sizes[: capped.bucket_cap + 1] == bucket_sizes_by_scan(capped)
    assert capped.stats().largest_bucket == max(
        size for size, count in enumerate(bucket_sizes_by_scan(capped)) if count
    )
    assert capped.stats().largest_bucket == 1


def test_a_state_counted_without_bucket_sizes_counts_them_at_open(
    tmp_path: Path, prose: tuple[str, ...]
) -> None:
    from neardup.state.index import COUNTS_KEY

    state = RocksState(tmp_path / "state")
    state.open_header(PARAMS.header())
    for i in range(3):
        index(state, f"c{i}", prose[0] + f" Copy number {i}.")
    counted = orjson.loads(state.kv.get_many([COUNTS_KEY])[0] or b"{}")
    del counted["bucket_sizes"]
    state.kv.write(Batch(main={COUNTS_KEY: orjson.dumps(counted)}))
    state.close()
    reopened = RocksState(tmp_path / "state")
    try:
        assert (
            reopened.counts.bucket_sizes
            == bucket_sizes_by_scan(reopened)[: len(reopened.counts.bucket_sizes or [])]
        )
        assert reopened.stats().largest_bucket == 3
    finally:
        reopened.close()
