"""Each of the index's tables (state/tables.py) on its own, over the in-memory and the RocksDB store:
its keys, its reads as a batch leaves them, its counts, and a cache that never shows what the store
no longer holds."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from neardup.core.anchors import NO_ANCHORS, Anchors
from neardup.core.compiled import _sketch
from neardup.core.dedup import Decision, IndexedArticle
from neardup.state.held import HeldFamilies
from neardup.state.memory import MemoryKV
from neardup.state.port import Batch, Counts, KeyValue
from neardup.state.records import encode_record
from neardup.state.rocks import HELD, RocksKV, RocksOptions
from neardup.state.tables import (
    BAND,
    CONTENT,
    COPY,
    HEAD,
    MARKER,
    MARKER_TIME,
    MEMBER,
    POSTING,
    POSTING_ENTRY,
    ArticleVersions,
    Buckets,
    Clusters,
    Contents,
    Marker,
    Markers,
    Postings,
    TimeOrder,
    decode_marker,
    encode_marker,
    seq_key,
)
from tests.support.prose import PROSE
from tests.support.reference_anchors import packed_anchors
from tests.support.reference_state import join_buckets as reference_join_buckets
from tests.support.signing import signed
from tests.support.state import bucket_seqs


class Reads:
    """A store that counts the keys read from its main family."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv, self.keys = kv, 0

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        self.keys += len(keys)
        return self.kv.get_many(keys)

    def __getattr__(self, name: str) -> object:
        return getattr(self.kv, name)


@pytest.fixture(params=["memory", "rocks", "rocks-held"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Reads]:
    store: KeyValue = MemoryKV() if request.param == "memory" else RocksKV(tmp_path / "db", RocksOptions())
    if request.param == "rocks-held":
        store = HeldFamilies(store, HELD)
    yield Reads(store)
    store.close()


def counts() -> Counts:
    return Counts(bucket_sizes=[0])


def commit(
    kv: KeyValue, batch: Batch, *tables: ArticleVersions | Buckets | Postings | Contents | Markers | TimeOrder
) -> None:
    kv.write(batch)
    for table in tables:
        table.written(batch)


# -- band buckets ------------------------------------------------------------------------------


def test_buckets_keep_their_latest_members_in_joining_order(kv: Reads) -> None:
    buckets = Buckets(kv, counts(), cap=3)
    for seq in range(5):
        batch = Batch()
        buckets.join(batch, seq, [b"k1", b"k2"] if seq % 2 else [b"k1"])
        commit(kv, batch, buckets)
    assert bucket_seqs(kv, b"k1") == [2, 3, 4]
    assert bucket_seqs(kv, b"k2") == [1, 3]
    assert kv.get_many([BAND + b"k1"])[0] == b"".join(seq_key(seq) for seq in (2, 3, 4))
    assert buckets.counts.buckets == 2 and buckets.counts.largest_bucket == 3


def test_a_bucket_left_by_its_last_member_is_gone(kv: Reads) -> None:
    buckets = Buckets(kv, counts(), cap=4)
    batch = Batch()
    buckets.join(batch, 7, [b"k"])
    buckets.join(batch, 8, [b"k"])  # reads the first join from the batch
    commit(kv, batch, buckets)
    assert bucket_seqs(kv, b"k") == [7, 8]
    for seq in (7, 8):
        batch = Batch()
        buckets.leave(batch, seq, [b"k", b"absent"])
        commit(kv, batch, buckets)
    assert bucket_seqs(kv, b"k") == [] and kv.get_many([BAND + b"k"]) == [None]
    assert buckets.counts.buckets == 0 and buckets.counts.largest_bucket == 0


def test_buckets_lookup_is_reused_for_equal_keys_until_a_bucket_is_written(kv: Reads) -> None:
    buckets = Buckets(kv, counts(), cap=8)
    batch = Batch()
    buckets.join(batch, 1, [b"a", b"b"])
    commit(kv, batch, buckets)
    assert buckets.lookup([b"a", b"b", b"c"], 10) == [1]
    read = kv.keys
    batch = Batch()
    buckets.join(batch, 2, [b"a", b"b", b"c"])  # equal keys, another list: no second read
    assert kv.keys == read
    commit(kv, batch, buckets)
    batch = Batch()
    buckets.join(batch, 3, [b"a", b"b", b"c"])  # written since: read again, and right
    assert kv.keys == read + 3
    commit(kv, batch, buckets)
    assert bucket_seqs(kv, b"a") == [1, 2, 3] and bucket_seqs(kv, b"c") == [2, 3]
    assert buckets.lookup([b"c", b"a"], 2) == [2, 3]


def test_an_earlier_holder_rejoins_only_the_buckets_it_left(kv: Reads) -> None:
    buckets = Buckets(kv, counts(), cap=8)
    batch = Batch()
    buckets.join(batch, 1, [b"a"])
    buckets.join(batch, 2, [b"a", b"b"])
    commit(kv, batch, buckets)
    batch = Batch()
    buckets.join(batch, 1, [b"a", b"b"], if_absent=True)
    commit(kv, batch, buckets)
    assert bucket_seqs(kv, b"a") == [1, 2] and bucket_seqs(kv, b"b") == [2, 1]


# -- posting lists ---------------------------------------------------------------------------


def anchors(*hashes: int) -> Anchors:
    return packed_anchors(list(hashes), list(range(0, 10 * len(hashes), 10)))


def test_posting_lists_hold_each_distinct_anchor_once_per_article(kv: Reads) -> None:
    postings = Postings(kv, counts(), cap=4, cache_size=100)
    text = anchors(5, 6, 5, 7)
    assert postings.names(text) == [POSTING + bytes.fromhex(h) for h in ("00000005", "00000006", "00000007")]
    assert postings.names(NO_ANCHORS) == []
    batch = Batch()
    postings.join(batch, 3, text)
    commit(kv, batch, postings)
    stored = kv.get_many(postings.names(text))
    assert stored == [(3).to_bytes(POSTING_ENTRY, "big")] * 3
    assert postings.counts.postings == 3
    assert postings.lookup(anchors(5, 7), newest=3, top=5) == [(3, 2)]
    assert postings.lookup(anchors(5, 9), newest=3, top=5) == []  # one shared: not enough


def test_a_full_posting_list_proposes_nobody_until_one_leaves(kv: Reads) -> None:
    postings = Postings(kv, counts(), cap=2, cache_size=100)
    for seq in (1, 2):
        batch = Batch()
        postings.join(batch, seq, anchors(1, seq + 10))
        commit(kv, batch, postings)
    assert postings.counts.boilerplate == 1
    assert postings.lookup(anchors(1, 11), newest=2, top=5) == []  # 11 alone: one anchor shared
    batch = Batch()
    postings.leave(batch, 1, anchors(1, 11))
    commit(kv, batch, postings)
    assert postings.counts.boilerplate == 0 and postings.counts.postings == 2
    assert postings.lookup(anchors(1, 12), newest=2, top=5) == [(2, 2)]


def test_posting_reads_are_cached_and_the_cache_follows_the_writes(kv: Reads) -> None:
    postings = Postings(kv, counts(), cap=8, cache_size=100)
    text = anchors(1, 2, 3)
    assert postings.lookup(text, newest=0, top=5) == []
    read = kv.keys
    batch = Batch()
    postings.join(batch, 4, anchors(1, 2, 3))  # equal anchors, another object: no read
    commit(kv, batch, postings)
    assert kv.keys == read
    assert postings.lookup(anchors(3, 2), newest=4, top=5) == [(4, 2)]  # from the cache
    assert kv.keys == read and len(postings._cache) == 3
    batch = Batch()
    postings.leave(batch, 4, text)
    commit(kv, batch, postings)
    assert postings.lookup(text, newest=4, top=5) == [] and kv.keys == read


def test_without_a_posting_cache_every_lookup_reads_the_store_as_written(kv: Reads) -> None:
    postings = Postings(kv, counts(), cap=8, cache_size=0)
    text = anchors(1, 2, 3)
    assert postings.lookup(text, newest=0, top=5) == []
    read = kv.keys
    batch = Batch()
    postings.join(batch, 4, anchors(1, 2, 3))  # the lists its lookup read: no second read
    commit(kv, batch, postings)
    assert kv.keys == read
    assert postings.lookup(anchors(3, 2), newest=4, top=5) == [(4, 2)]
    assert kv.keys == read + 2 and not postings._cache


def test_the_posting_cache_stays_within_its_size(kv: Reads) -> None:
    postings = Postings(kv, counts(), cap=8, cache_size=4)
    for seq in range(6):
        batch = Batch()
        postings.join(batch, seq, anchors(2 * seq + 100, 2 * seq + 101, 7))
        commit(kv, batch, postings)
        assert len(postings._cache) <= 4
    assert postings.lookup(anchors(7, 111), newest=5, top=5) == [(5, 2)]


# -- exact contents ----------------------------------------------------------------------------


def test_a_content_is_held_by_one_and_handed_to_its_earliest_copy(kv: Reads) -> None:
    contents = Contents(kv)
    digest = b"h" * 16
    batch = Batch()
    assert contents.add(batch, digest, seq_key(1), exact=False)
    assert not contents.add(batch, digest, seq_key(3), exact=True)
    assert not contents.add(batch, digest, seq_key(2), exact=True)
    commit(kv, batch, contents)
    assert contents.holder(digest) == seq_key(1)
    assert {key for key, _ in kv.scan(COPY)} == {COPY + digest + seq_key(2), COPY + digest + seq_key(3)}
    batch = Batch()
    assert contents.remove(batch, digest, seq_key(3)) is None  # a copy goes: nothing handed on
    assert contents.remove(batch, digest, seq_key(1)) == seq_key(2)
    assert contents.holder(digest, batch) == seq_key(2)
    commit(kv, batch, contents)
    assert contents.holder(digest) == seq_key(2) and list(kv.scan(COPY)) == []
    batch = Batch()
    assert contents.remove(batch, digest, seq_key(2)) is None
    commit(kv, batch, contents)
    assert contents.holder(digest) is None and list(kv.scan(CONTENT)) == []


def test_a_content_held_again_after_its_holder_expired_passes_to_the_newer(kv: Reads) -> None:
    contents = Contents(kv)
    batch = Batch()
    contents.add(batch, b"d" * 16, seq_key(1), exact=False)
    commit(kv, batch, contents)
    assert contents.holder(b"d" * 16) == seq_key(1)
    read = kv.keys
    batch = Batch()
    assert contents.add(batch, b"d" * 16, seq_key(5), exact=False)  # the holder read is reused
    assert kv.keys == read
    commit(kv, batch, contents)
    assert contents.holder(b"d" * 16) == seq_key(5) and kv.keys == read + 1  # read again after a write
    assert [key for key, _ in kv.scan(COPY)] == [COPY + b"d" * 16 + seq_key(1)]


# -- clusters ------------------------------------------------------------------------------------


def entry(seq: bytes) -> bytes:
    """A head entry as the index writes it: the member's seq and id (here "id<seq>")."""
    return seq + b"id" + str(int.from_bytes(seq, "big")).encode()


def test_a_cluster_is_handed_on_to_its_earliest_surviving_member(kv: Reads) -> None:
    clusters = Clusters(kv, Counts())
    batch = Batch()
    for seq in (4, 6, 9):
        clusters.add(batch, seq, 4)
    kv.write(batch)
    assert clusters.counts.clusters == 1 and clusters.head_of(4) is None
    assert [key for key, _ in kv.scan(MEMBER)] == [MEMBER + seq_key(4) + seq_key(s) for s in (6, 9)]
    batch = Batch()
    clusters.leave(batch, 4, 4, entry)
    kv.write(batch)
    assert clusters.head_of(4) == "id6"
    batch = Batch()
    clusters.leave(batch, 9, 4, entry)  # not the head: the head stays
    kv.write(batch)
    assert clusters.head_of(4) == "id6"
    batch = Batch()
    clusters.leave(batch, 6, 4, entry)
    kv.write(batch)
    assert clusters.counts.clusters == 0 and list(kv.scan(HEAD)) == [] and list(kv.scan(MEMBER)) == []


def test_clusters_without_their_first_are_found_for_a_rebuild(kv: Reads) -> None:
    clusters = Clusters(kv, Counts())
    batch = Batch()
    for seq, cluster in ((2, 1), (3, 1), (8, 5)):
        clusters.add(batch, seq, cluster)
    kv.write(batch)
    assert list(clusters.earliest_members()) == [(seq_key(1), seq_key(2)), (seq_key(5), seq_key(8))]
    batch = Batch()
    clusters.hand_on(batch, seq_key(5), entry(seq_key(8)))
    kv.write(batch)
    assert clusters.head_of(5) == "id8" and clusters.counts.clusters == 1


# -- the time order ----------------------------------------------------------------------------


def test_the_time_order_gives_the_oldest_first_and_times_before_1970(kv: Reads) -> None:
    times = TimeOrder(kv)
    assert times.oldest_ms() is None
    batch = Batch()
    for time_ms, seq in ((5_000, 1), (-2_000, 2), (5_000, 0), (9_000, 3)):
        times.add(batch, time_ms, seq)
    commit(kv, batch, times)
    assert times.oldest_ms() == -2_000
    assert times.before(5_001, 10) == [2, 0, 1]
    assert times.before(5_001, 2) == [2, 0]
    assert times.before(-2_000, 10) == []
    batch = Batch()
    times.remove(batch, -2_000, 2)
    commit(kv, batch, times)
    assert times.oldest_ms() == 5_000


def test_the_oldest_time_kept_is_the_oldest_stored(kv: Reads) -> None:
    """The cached oldest time against a new table's scan, through random batches of arrivals and
    removals (the oldest among them, and all of them)."""
    rng = random.Random(5)
    times, held = TimeOrder(kv), set()
    for step in range(60):
        batch = Batch()
        for _ in range(rng.randint(1, 4)):
            if held and rng.random() < 0.45:
                gone = min(held) if rng.random() < 0.5 else rng.choice(sorted(held))
                times.remove(batch, *gone)
                held.discard(gone)
            else:
                arrival = (rng.randint(-50, 50) * 1_000, step * 10 + len(held))
                times.add(batch, *arrival)
                held.add(arrival)
        commit(kv, batch, times)
        expected = min(held)[0] if held else None
        assert times.oldest_ms() == TimeOrder(kv).oldest_ms() == expected, step


# -- deletion markers ----------------------------------------------------------------------------


def test_markers_keep_the_last_version_and_expire_by_deletion_time(kv: Reads) -> None:
    markers = Markers(kv)
    batch = Batch()
    markers.put(batch, "old", encode_marker(Marker(3, -1_000)))
    markers.put(batch, "new", encode_marker(Marker(1, 7_000)))
    commit(kv, batch, markers)
    assert markers.marker("old") == Marker(3, -1_000)
    assert decode_marker(kv.get_many([MARKER + b"new"])[0] or b"") == Marker(1, 7_000)
    batch = Batch()
    assert markers.expire(batch, 7_000, 10) == ["old"]
    commit(kv, batch, markers)
    assert markers.stored("old") is None and len(list(kv.scan(MARKER_TIME))) == 1
    batch = Batch()
    markers.drop(batch, "new")
    markers.drop(batch, "never")
    commit(kv, batch, markers)
    assert list(kv.scan(MARKER)) == [] and list(kv.scan(MARKER_TIME)) == []


def test_a_marker_seen_beside_the_id_map_is_not_read_again_until_a_write(kv: Reads) -> None:
    markers = Markers(kv)
    batch = Batch()
    markers.put(batch, "x", encode_marker(Marker(2, 0)))
    commit(kv, batch, markers)
    markers.seen("x", kv.get_many([markers.key("x")])[0])
    read = kv.keys
    assert markers.marker("x") == Marker(2, 0) and kv.keys == read
    assert markers.stored("y") is None and kv.keys == read + 1  # another id: read
    markers.seen("x", kv.get_many([markers.key("x")])[0])
    batch = Batch()
    markers.drop(batch, "x")
    commit(kv, batch, markers)
    assert markers.stored("x") is None  # not the value seen before the write


# -- article versions: the id map and the records ----------------------------------------------


def version(article_id: str, seq: int, text: str) -> IndexedArticle:
    sketch = signed(article_id, text).sketch
    decision = Decision("unique", None, None, None, None, article_id, False, ())
    return IndexedArticle(article_id, 0, seq, sketch, decision, keys=(b"k" * 10,) * 2)


def test_article_versions_are_read_whole_or_as_probes_by_seq(kv: Reads) -> None:
    versions = ArticleVersions(kv, record_cache=10, probe_cache=10)
    first, second = version("a", 0, PROSE[0]), version("b", 1, PROSE[1])
    batch = Batch()
    for article in (first, second):
        versions.put(batch, article, encode_record(article))
    commit(kv, batch, versions)
    assert versions.held(["a", "b", "c"]) == [True, True, False]
    found = ArticleVersions(kv, record_cache=10, probe_cache=10).arrivals([1, 5, 0])  # a cold cache
    assert [a and (a.article_id, a.seq, a.sketch.content_hash) for a in found] == [
        ("b", 1, second.sketch.content_hash),
        None,
        ("a", 0, first.sketch.content_hash),
    ]
    probes = versions.prospects([0, 1])
    assert [(p.article_id, p.shingle_count) for p in probes if p] == [
        ("a", first.sketch.shingle_count),
        ("b", second.sketch.shingle_count),
    ]
    assert [a.article_id for a in versions.scan()] == ["a", "b"]


def test_a_version_removed_leaves_both_caches_and_keeps_its_id_when_replaced(kv: Reads) -> None:
    versions = ArticleVersions(kv, record_cache=10, probe_cache=10)
    old, new = version("a", 0, PROSE[0]), version("a", 1, PROSE[2])
    batch = Batch()
    versions.put(batch, old, encode_record(old))
    commit(kv, batch, versions)
    assert versions.arrivals([0])[0] is not None and versions.prospects([0])[0] is not None  # cached
    batch = Batch()
    versions.remove(batch, old, keep_id=True)
    versions.put(batch, new, encode_record(new))
    commit(kv, batch, versions)
    assert versions.arrivals([0]) == [None] and versions.prospects([0]) == [None]
    assert versions.held(["a"]) == [True]
    batch = Batch()
    versions.remove(batch, new, keep_id=False)
    commit(kv, batch, versions)
    assert versions.held(["a"]) == [False] and list(versions.scan()) == []


def test_article_version_caches_stay_within_their_sizes(kv: Reads) -> None:
    versions = ArticleVersions(kv, record_cache=2, probe_cache=2)
    articles = [version(f"v{n}", n, PROSE[n % len(PROSE)]) for n in range(5)]
    batch = Batch()
    for article in articles:
        versions.put(batch, article, encode_record(article))
    commit(kv, batch, versions)
    read = kv.records
    calls = []

    def counted(keys: list[bytes]) -> list[bytes | None]:
        calls.append(len(keys))
        return read(keys)

    kv.records = counted  # type: ignore[method-assign]
    versions.arrivals([0, 1, 2, 3, 4])
    versions.prospects([0, 1, 2, 3, 4])
    assert calls == [5, 5]
    versions.arrivals([3, 4])
    versions.prospects([3, 4])
    assert calls == [5, 5]  # the latest two of each held
    versions.arrivals([0])
    assert calls == [5, 5, 1]  # an earlier one read again


@pytest.mark.parametrize("seed", range(6))
def test_compiled_bucket_joins_equal_the_reference(seed: int) -> None:
    """_sketch.join_buckets against tests/support/reference_state.py: the same buckets, sizes and
    count of buckets started, for absent buckets, partly filled ones and full ones."""
    rng = random.Random(seed)
    cap = rng.choice([1, 3, 64])
    names = [BAND + rng.randbytes(10) for _ in range(rng.randint(0, 30))]
    found = [None if rng.random() < 0.4 else rng.randbytes(8 * rng.randint(1, cap)) for _ in names]
    sizes = [0, *[rng.randint(5, 9) for _ in range(rng.randint(0, cap + 1))]]
    entry = rng.randbytes(8)
    expected_into: dict[bytes, bytes] = {}
    expected_sizes = list(sizes)
    created = reference_join_buckets(names, found, entry, 8 * cap, expected_into, expected_sizes)
    into: dict[bytes, bytes] = {}
    assert _sketch.join_buckets(names, found, entry, 8 * cap, into, sizes) == created
    assert into == expected_into and sizes == expected_sizes
