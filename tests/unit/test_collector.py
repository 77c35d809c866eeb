"""neardup.pipeline.collector: what survives is frozen out of full collections every so many articles,
and everything is thawed (and collected once) every so often."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from neardup.pipeline.collector import CollectorPolicy


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # leave the test process as it was


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_freezes_every_so_many_articles() -> None:
    policy = CollectorPolicy(freeze_every=100, thaw_every_s=3600, clock=Clock())
    policy.after(60)
    assert gc.get_freeze_count() == 0
    kept = [[n] for n in range(1000)]  # long-lived containers, like cached records
    policy.after(60)
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)
    more = [[n] for n in range(1000)]  # a freeze now would move these too
    policy.after(99)
    # the count restarted at the freeze: none since (frozen objects that die leave the count)
    assert gc.get_freeze_count() < frozen + len(more)


def test_thaws_and_collects_every_so_often() -> None:
    clock = Clock()
    policy = CollectorPolicy(freeze_every=10, thaw_every_s=60, clock=clock)
    policy.after(10)
    assert gc.get_freeze_count() > 0

    class Node:
        def __init__(self) -> None:
            self.me = self  # a reference cycle: only the collector can free it

    node = Node()
    ref = weakref.ref(node)
    policy.after(10)  # frozen while still referenced
    del node
    gc.collect()
    assert ref() is not None  # frozen: a full collection does not see it
    clock.now = 61
    policy.after(10)
    assert ref() is None  # thawed and collected


def test_off_when_zero() -> None:
    policy = CollectorPolicy(freeze_every=0)
    policy.after(1_000_000)
    assert gc.get_freeze_count() == 0
