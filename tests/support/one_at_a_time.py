"""The reference a batch decision is compared with: each article decided in a call of its own, as
the index decided before batches were the unit of decision (an article sees every one before it
applied; nothing read ahead for another)."""

from __future__ import annotations

from collections.abc import Sequence

from neardup.pipeline.shard import Decided, IndexShard, Item


def decide_one_at_a_time(shard: IndexShard, items: Sequence[Item], now_s: float) -> list[Decided]:
    """`items` decided one a call, each as the signatures message of its own position."""
    return [shard.decide([item], offset=n, now=now_s)[0] for n, item in enumerate(items)]
