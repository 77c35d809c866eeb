"""Warm standby of the index (NEARDUP_STANDBY_REPLICAS): a worker that does not own the index
shard keeps its own index current from the committed changelog, so that when the shard comes to
it, its open replays only what was written since its last catch-up."""

from __future__ import annotations

import asyncio
import logging

from ..config import Settings
from .index_agent import IndexAgent

log = logging.getLogger("neardup.stream")


class Standby:
    """Catches the decider's index up with the changelog every `standby_interval` seconds while
    this worker does not own the shard. It takes the index agent's lock, so a catch-up and an
    open (or a decision) never overlap: when the shard is assigned in the middle of one, the open
    waits for it and then replays only the rest. Run only with standby_replicas at 1 or more (app.py)."""

    def __init__(self, settings: Settings, index: IndexAgent) -> None:
        self.settings = settings
        self.index = index

    async def run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.settings.standby_interval)

    async def step(self) -> bool:
        """One catch-up, unless this worker owns the shard, or its own last decisions are not all
        acknowledged yet (a former owner: the changelog lacks them, the next step has them).
        Returns whether it caught up."""
        index, metrics = self.index, self.index.metrics
        if index.lifecycle.owner:
            metrics.standby.set(0)
            return False
        async with index.lock:
            if index.lifecycle.owner or index.deliveries.unsettled:
                return False
            decider = index.decider
            try:
                count = await decider.catch_up()
            except asyncio.CancelledError:
                decider.kill()  # a request in flight: its answer would be read as the next one's
                raise
            except Exception as exc:
                # The broker away or the decider child lost: a standby is an optimisation, and
                # the owner's open restores whatever a missed step left.
                log.warning("standby_catch_up_failed error=%r", str(exc))
                decider.kill()
                return False
        # the shard may have come to this worker during the catch-up (on_assigned set 0 then)
        metrics.standby.set(0 if index.lifecycle.owner else 1)
        metrics.standby_lag.set(decider.behind)
        if count is not None:
            log.info("standby_rebuilt articles=%d", count)
        else:
            metrics.standby_applied.inc(decider.replayed)
        return True
