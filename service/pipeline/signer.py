"""Signing off the event loop: helper processes, so that one worker uses more than one core.

Signing (normalize, shingle, MinHash) is the CPU-heavy part of an article's cost and needs no state;
Faust's event handling, Kafka I/O and the index stage stay in the worker's own process meanwhile.
Each helper is a child process (`python -m neardup.pipeline.child neardup.pipeline.signer`, see
pipes.py) that signs the batches it reads from its stdin.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import BinaryIO, cast

from ..errors import Error
from .pipes import DEFAULT_TIMEOUT, CallTimeout, Child, ChildFailed, read_frame, write_frame
from .sign import PROCESSING_FAILED, SignResult, SignStage
from .wire import Provenance

log = logging.getLogger("neardup.signer")

SignItem = tuple[bytes | None, bytes | None, Provenance]  # raw value, key, where it came from
_Wire = tuple[bytes | None, bytes | None, str, int | None, int, int | None]  # plain tuples pickle fastest
MIN_CHUNK = 16  # smaller batches are not worth splitting across helpers


class SignerFailed(Error, RuntimeError):
    """Signing helpers cannot start: the worker cannot go on."""


class Signer:
    """Signs batches in `processes` helpers (0: in the calling process), results in input order.
    A helper that fails (dies, or does not answer within `timeout`) is replaced, and the message
    that made it fail is found by signing the batch again in halves (`sign`): it is dead-lettered,
    the rest signed in order, never skipped.

    `nice`: niceness the helpers add to their own. Signing can run on any core while deciding is
    one serial process: on a saturated machine the helpers then yield the CPU to the decider and
    sign in larger batches meanwhile. They yield to every other process too, which costs where
    other busy processes share the CPU group (tests/benchmarks/RESULTS.md has both)."""

    def __init__(
        self, stage: SignStage, processes: int, nice: int = 0, timeout: CallTimeout = DEFAULT_TIMEOUT
    ) -> None:
        self.stage = stage
        self.processes = processes
        self.nice = nice
        self.timeout = timeout
        self._helpers: list[Child] = []
        self.isolating = False  # signing the halves of a batch that broke a helper (not a stall)
        self.isolated = 0  # messages dead-lettered for breaking a helper
        # The worker warms up at start while the first batch may already be signing: the lock keeps
        # both from starting helpers, which would run more than were asked for.
        self._starting = asyncio.Lock()

    async def warm_up(self) -> None:
        """Start the helpers now (each imports numpy and the core), not on the first article, so that
        the first articles do not wait for the imports."""
        async with self._starting:
            # answered once the helper is ready; the child runs this module, by the name the package
            # was imported under
            while len(self._helpers) < self.processes:
                self._helpers.append(await Child.start(__name__, (self.stage, self.nice)))

    async def sign(self, items: list[SignItem]) -> list[SignResult]:
        """Each item's result, in order. A batch that breaks a helper (it dies or hangs) is signed
        again in halves, each in fresh helpers, down to the one message that breaks it, which is
        dead-lettered (processing_failed) once it has failed alone too: the stream goes on."""
        if self.processes == 0 or not items:
            return [self.stage.handle(raw, key, src) for raw, key, src in items]
        signed = await self._attempt(items)
        if not isinstance(signed, ChildFailed):
            return signed
        self.isolating = True
        try:
            return await self._isolate(items)
        finally:
            self.isolating = False

    async def _attempt(self, items: list[SignItem]) -> list[SignResult] | ChildFailed:
        """`items` signed in the helpers, or how a helper failed on them: the helpers are then
        stopped, for fresh ones to sign what is tried next. Helpers are started when they are not:
        helpers that cannot even start are no message's doing, and no message is dead-lettered for
        it (SignerFailed)."""
        try:
            await self.warm_up()
        except ChildFailed as exc:
            self.close()
            raise SignerFailed(f"signing helpers cannot start: {exc}") from exc
        try:
            return await self._sign_in_helpers(items)
        except ChildFailed as exc:
            log.error("sign_helper_failed articles=%d error=%r", len(items), str(exc))
            self.close()
            return exc

    async def _isolate(self, items: list[SignItem]) -> list[SignResult]:
        """`items`, of a batch that broke a helper: each half signed in fresh helpers, a half that
        breaks one isolated further; a message that breaks one alone is dead-lettered."""
        parts = [items[: len(items) // 2], items[len(items) // 2 :]] if len(items) > 1 else [items]
        results: list[SignResult] = []
        for part in parts:
            signed = await self._attempt(part)
            if not isinstance(signed, ChildFailed):
                results += signed
            elif len(part) > 1:
                results += await self._isolate(part)
            else:
                raw, key, src = part[0]
                detail = f"the signing helper failed on this message alone, twice: {signed}"
                results.append(SignStage.dead(PROCESSING_FAILED, detail, raw, key, src))
                self.isolated += 1
        return results

    async def _sign_in_helpers(self, items: list[SignItem]) -> list[SignResult]:
        parts = max(1, min(len(self._helpers), len(items) // MIN_CHUNK))
        size = -(-len(items) // parts)
        chunks = [items[start : start + size] for start in range(0, len(items), size)]
        # every part answered or failed (each within its timeout) before the batch is retried
        done = await asyncio.gather(
            *(self._sign_in(self._helpers[n], chunk) for n, chunk in enumerate(chunks)),
            return_exceptions=True,
        )
        for part in done:
            if isinstance(part, BaseException):
                raise part
        return [result for chunk in cast(list[list[SignResult]], done) for result in chunk]

    async def _sign_in(self, helper: Child, items: list[SignItem]) -> list[SignResult]:
        wire: list[_Wire] = [
            (raw, key, src.topic, src.partition, src.offset, src.timestamp_ms) for raw, key, src in items
        ]
        answer = await helper.call(wire, self.timeout.seconds(len(items)))
        if not isinstance(answer, list) or len(answer) != len(items):
            raise ChildFailed(f"helper {helper.pid} answered {type(answer).__name__}")
        return [SignResult(*result) for result in answer]

    def close(self) -> None:
        for helper in self._helpers:
            helper.stop()
        self._helpers = []

    async def aclose(self) -> None:
        """At shutdown, once no agent signs any more: the helpers stopped and waited for."""
        helpers, self._helpers = self._helpers, []
        for helper in helpers:
            await helper.end()


def serve(setup: object, requests: BinaryIO, answers: BinaryIO) -> None:
    """The helper's loop: `setup` is (the SignStage, the niceness to add), then batches until
    EOF."""
    stage, nice = cast(tuple[SignStage, int], setup)
    if nice:
        os.nice(nice)
    write_frame(answers, "ready")
    while (batch := read_frame(requests)) is not None:
        write_frame(answers, sign_batch(stage, cast(list[_Wire], batch)))


def sign_batch(
    stage: SignStage, batch: list[_Wire]
) -> list[tuple[bytes | None, bytes | None, str | None, bool]]:
    """One request: each item's result, as plain tuples (they pickle fastest)."""
    results = []
    for raw, key, topic, partition, offset, timestamp in batch:
        result = stage.handle(raw, key, Provenance(topic, partition, offset, timestamp))
        results.append((result.signed, result.dead_letter, result.reason, result.refused_time))
    return results
