"""Signing off the event loop: a pool of helper processes, so that one worker uses more than one core.

Signing (normalize, shingle, MinHash) is the CPU-heavy half of an article's cost and needs no state;
Faust's event handling, Kafka I/O and the index stage stay in the worker's own process meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..core.params import DedupParams
from .stages import Provenance, SignResult, SignStage

log = logging.getLogger("neardup.signer")

SignItem = tuple[bytes | None, bytes | None, Provenance]  # raw value, key, where it came from
MIN_CHUNK = 16  # smaller batches are not worth splitting across processes

_child_stage: SignStage | None = None


def _start_child(params: DedupParams, max_text_bytes: int) -> None:
    global _child_stage
    _child_stage = SignStage(params, max_text_bytes)


def _sign_in_child(items: list[SignItem]) -> list[SignResult]:
    assert _child_stage is not None, "pool initializer did not run"
    return [_child_stage.handle(raw, key, src) for raw, key, src in items]


class Signer:
    """Signs batches in `processes` helper processes (0: in the calling process). Results come back
    in input order. A pool that breaks (a helper killed) is replaced once per batch; if the new one
    fails as well, that batch is signed in-process, so input never stalls on a broken pool."""

    def __init__(self, stage: SignStage, processes: int) -> None:
        self.stage = stage
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.processes,
                # spawn, not fork: the worker has threads (Faust's consumer) and open RocksDB handles
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_child,
                initargs=(self.stage.params, self.stage.max_text_bytes),
            )
        return self._pool

    async def warm_up(self) -> None:
        """Start the helpers now (each imports numpy and the core, ~1 s) rather than on the first
        article, which would wait for them."""
        if self.processes:
            loop, pool = asyncio.get_running_loop(), self._started()
            await asyncio.gather(
                *(loop.run_in_executor(pool, _sign_in_child, []) for _ in range(self.processes))
            )

    async def sign(self, items: list[SignItem]) -> list[SignResult]:
        if self.processes == 0 or not items:
            return self.sign_here(items)
        for attempt in (1, 2):
            try:
                return await self._sign_in_pool(items)
            except BrokenProcessPool as exc:
                log.error("sign_pool_broken attempt=%d error=%r", attempt, str(exc))
                self.close()
        return self.sign_here(items)

    def sign_here(self, items: list[SignItem]) -> list[SignResult]:
        return [self.stage.handle(raw, key, src) for raw, key, src in items]

    async def _sign_in_pool(self, items: list[SignItem]) -> list[SignResult]:
        pool, loop = self._started(), asyncio.get_running_loop()
        parts = max(1, min(self.processes, len(items) // MIN_CHUNK))
        size = -(-len(items) // parts)
        chunks = [items[start : start + size] for start in range(0, len(items), size)]
        done = await asyncio.gather(*(loop.run_in_executor(pool, _sign_in_child, chunk) for chunk in chunks))
        return [result for chunk in done for result in chunk]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
