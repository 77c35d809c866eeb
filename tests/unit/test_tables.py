"""Each of the index's tables (state/tables.py) on its own, over the in-memory and the RocksDB store:
its keys, its reads as a batch leaves them, its counts, and a cache that never shows what the store
no longer holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from neardup.core.anchors import NO_ANCHORS, Anchors
from neardup.state.memory import MemoryKV
from neardup.state.port import Batch, Counts, KeyValue
from neardup.state.rocks import RocksKV, RocksOptions
from neardup.state.tables import BAND, POSTING, POSTING_ENTRY, Buckets, Postings, seq_key


class Reads:
    """A store that counts the keys read from its main family."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv, self.keys = kv, 0

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        self.keys += len(keys)
        return self.kv.get_many(keys)

    def __getattr__(self, name: str) -> object:
        return getattr(self.kv, name)


@pytest.fixture(params=["memory", "rocks"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Reads]:
    store: KeyValue = MemoryKV() if request.param == "memory" else RocksKV(tmp_path / "db", RocksOptions())
    yield Reads(store)
    store.close()


def counts() -> Counts:
    return Counts(bucket_sizes=[0])


def commit(kv: KeyValue, batch: Batch, *tables: Buckets | Postings) -> None:
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
    assert buckets.members(b"k1") == [2, 3, 4]
    assert buckets.members(b"k2") == [1, 3]
    assert kv.get_many([BAND + b"k1"])[0] == b"".join(seq_key(seq) for seq in (2, 3, 4))
    assert buckets.counts.buckets == 2 and buckets.counts.largest_bucket == 3


def test_a_bucket_left_by_its_last_member_is_gone(kv: Reads) -> None:
    buckets = Buckets(kv, counts(), cap=4)
    batch = Batch()
    buckets.join(batch, 7, [b"k"])
    buckets.join(batch, 8, [b"k"])  # reads the first join from the batch
    commit(kv, batch, buckets)
    assert buckets.members(b"k") == [7, 8]
    for seq in (7, 8):
        batch = Batch()
        buckets.leave(batch, seq, [b"k", b"absent"])
        commit(kv, batch, buckets)
    assert buckets.members(b"k") == [] and kv.get_many([BAND + b"k"]) == [None]
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
    assert buckets.members(b"a") == [1, 2, 3] and buckets.members(b"c") == [2, 3]
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
    assert buckets.members(b"a") == [1, 2] and buckets.members(b"b") == [2, 1]


# -- posting lists ---------------------------------------------------------------------------


def anchors(*hashes: int) -> Anchors:
    return Anchors.of(list(hashes), list(range(0, 10 * len(hashes), 10)))


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
    assert kv.keys == read and postings.cached() == 3
    batch = Batch()
    postings.leave(batch, 4, text)
    commit(kv, batch, postings)
    assert postings.lookup(text, newest=4, top=5) == [] and kv.keys == read


def test_the_posting_cache_stays_within_its_size(kv: Reads) -> None:
    postings = Postings(kv, counts(), cap=8, cache_size=4)
    for seq in range(6):
        batch = Batch()
        postings.join(batch, seq, anchors(2 * seq + 100, 2 * seq + 101, 7))
        commit(kv, batch, postings)
        assert postings.cached() <= 4
    assert postings.lookup(anchors(7, 111), newest=5, top=5) == [(5, 2)]
