"""The index shard's lifecycle on a worker, whatever assigns it: the index opens (restored or
rebuilt) at the shard's first batch after each assignment, the shard's next message follows the
last one the index applied, and the worker's own messages decided by a hand-off are not decided
again when the consumer delivers them."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from .order import following_run

T = TypeVar("T")


class ShardLifecycle:
    """Where this worker stands with the index shard (`shard`: its partition, as the consumer
    names it). The offsets delivered per partition (`delivered`) are the gap check's, shared:
    the shard's says which message the next one must follow."""

    def __init__(self, shard: Any, delivered: dict[Any, int]) -> None:
        self.shard = shard
        self.delivered = delivered
        # raised whenever the shard's topic is (re)assigned: the index is restored or rebuilt first
        self.needs_open = True
        # whether the group assigned the shard to this worker (a standby catches up only while not)
        self.owner = False
        # the last offset decided by a hand-off since the shard's assignment: the consumer
        # delivers those messages too, and the index agent lets them pass
        self.handed_off = -1

    def assigned(self, assigned: Collection[Any]) -> bool:
        """The group's new assignment to this worker; True when it makes this worker the shard's
        owner. The consumer starts every partition again from its committed offset, so what was
        delivered before says nothing about what comes next."""
        self.delivered.clear()
        self.handed_off = -1
        was_owner, self.owner = self.owner, self.shard in assigned
        if any(tp.topic == self.shard.topic for tp in assigned):
            self.needs_open = True
        return self.owner and not was_owner

    def revoked(self, revoked: Collection[Any]) -> None:
        """Partitions taken from this worker: the shard may be another worker's."""
        self.stop_handing_off()
        if self.shard in revoked:
            self.owner = False

    def stop_handing_off(self) -> None:
        """No hand-off from now on (the shard may be another worker's, or the worker stops): it
        waits for the next assignment and the index's next open."""
        self.delivered.pop(self.shard, None)

    def opened(self, applied_offset: int) -> None:
        """The index opened: the shard's next message follows the last one it applied (a first
        message beyond it is a gap too)."""
        self.needs_open = False
        self.delivered[self.shard] = applied_offset

    def to_hand_off(self, messages: Sequence[tuple[int, T]]) -> list[tuple[int, T]]:
        """Of this worker's acknowledged messages ((offset, payload), in offset order), the run a
        hand-off decides now: none while the index is not open on this worker, else those that
        follow the last message decided without skipping one (another worker's may come first)."""
        last = self.delivered.get(self.shard)
        if self.needs_open or last is None:
            return []
        return following_run(last, messages)

    def handed(self, last_offset: int) -> None:
        """A hand-off decided up to `last_offset`: what the gap check records for the batches the
        consumer delivers."""
        self.delivered[self.shard] = self.handed_off = last_offset
