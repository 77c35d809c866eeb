"""Short garbage-collector pauses for a worker that keeps many objects alive (the record cache).

A full (generation 2) collection walks every live container object: with a large cache of decoded
records that is a pause which stops every stage of the worker, tops the latency tail
(tests/benchmarks/RESULTS.md) and grows with the cache. Cached records hold no reference cycles,
so reference counting frees them when they leave the cache: the collector need not walk them at
all. Every `freeze_every` articles the policy collects the young generations and freezes what
survives (gc.freeze: those objects are skipped by later collections). Cyclic garbage that reached
the old generation before a freeze is only reclaimed when the policy thaws everything again, every
`thaw_every_s` seconds, which costs one full collection then.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("neardup.collector")


class CollectorPolicy:
    def __init__(
        self,
        freeze_every: int = 5_000,
        thaw_every_s: float = 3_600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.freeze_every = freeze_every
        self.thaw_every_s = thaw_every_s
        self._clock = clock
        self._since_freeze = 0
        self._thawed_at = clock()

    def after(self, articles: int) -> None:
        """Call after each processed batch with the number of articles it held."""
        if self.freeze_every <= 0:
            return
        self._since_freeze += articles
        if self._since_freeze < self.freeze_every:
            return
        self._since_freeze = 0
        if self._clock() - self._thawed_at >= self.thaw_every_s:
            frozen = gc.get_freeze_count()
            gc.unfreeze()
            gc.collect()
            self._thawed_at = self._clock()
            log.info("gc_thawed objects=%d", frozen)
        gc.collect(1)
        gc.freeze()
