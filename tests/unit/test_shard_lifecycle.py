"""The index shard's lifecycle on a worker (pipeline/lifecycle.py), without a broker: the index
opens after each assignment of the shard's topic, the shard's next message follows the offset the
index applied, and a hand-off decides only the run that follows the last message decided."""

from __future__ import annotations

from typing import NamedTuple

from neardup.pipeline.lifecycle import ShardLifecycle


class Partition(NamedTuple):
    topic: str
    partition: int


SHARD = Partition("signatures", 0)
INPUT = Partition("articles", 0)


def test_each_assignment_of_the_shards_topic_opens_the_index_again() -> None:
    lifecycle = ShardLifecycle(SHARD, {})
    assert lifecycle.needs_open and not lifecycle.owner
    assert lifecycle.assigned({SHARD, INPUT})  # the shard becomes this worker's
    assert lifecycle.needs_open and lifecycle.owner
    lifecycle.opened(41)
    assert not lifecycle.needs_open and lifecycle.delivered == {SHARD: 41}
    assert not lifecycle.assigned({SHARD, INPUT})  # kept: no takeover, but opened again
    assert lifecycle.needs_open and lifecycle.delivered == {}
    lifecycle.opened(50)
    assert not lifecycle.assigned({INPUT})  # another partition only: the index stays open
    assert not lifecycle.needs_open and not lifecycle.owner


def test_a_revoked_shard_is_no_longer_owned_nor_handed_off() -> None:
    delivered = {INPUT: 7}
    lifecycle = ShardLifecycle(SHARD, delivered)
    lifecycle.assigned({SHARD})
    lifecycle.opened(9)
    lifecycle.revoked({INPUT})
    assert lifecycle.owner and SHARD not in delivered  # no hand-off until the next assignment
    assert lifecycle.to_hand_off([(10, b"a")]) == []
    lifecycle.revoked({SHARD})
    assert not lifecycle.owner


def test_a_hand_off_decides_the_run_that_follows_the_last_message_decided() -> None:
    lifecycle = ShardLifecycle(SHARD, {})
    lifecycle.assigned({SHARD})
    assert lifecycle.to_hand_off([(0, b"a")]) == []  # the index is not open yet
    lifecycle.opened(9)
    assert lifecycle.to_hand_off([(11, b"b")]) == []  # another worker's message 10 comes first
    assert lifecycle.to_hand_off([(9, b"x"), (10, b"a"), (11, b"b"), (13, b"c")]) == [
        (10, b"a"),
        (11, b"b"),
    ]
    lifecycle.handed(11)
    assert lifecycle.delivered[SHARD] == 11  # the gap check's next message follows it
    assert [offset for offset in (10, 11, 12) if offset > lifecycle.handed_off] == [12]
    lifecycle.needs_open = True  # half a batch decided: the index opens again first
    assert lifecycle.to_hand_off([(12, b"d")]) == []
    lifecycle.assigned({SHARD})
    assert lifecycle.handed_off < 10  # the consumer starts again from the commit


def test_stopping_ends_the_hand_offs() -> None:
    lifecycle = ShardLifecycle(SHARD, {})
    lifecycle.assigned({SHARD})
    lifecycle.opened(3)
    lifecycle.stop_handing_off()
    assert lifecycle.to_hand_off([(4, b"a")]) == []
