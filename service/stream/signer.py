"""Signing off the event loop: helper processes, so that one worker uses more than one core.

Signing (normalize, shingle, MinHash) is the CPU-heavy half of an article's cost and needs no state;
Faust's event handling, Kafka I/O and the index stage stay in the worker's own process meanwhile.
Each helper is a child process (`python -m service.stream.signer`) that reads batches from its stdin
and writes results to its stdout, length-prefixed pickles, through the worker's event loop: no pool
threads competing with the loop for the GIL (concurrent.futures' pool cost ~10% of the worker's CPU).
A helper whose worker dies reads end-of-file and exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import struct
import sys
from typing import BinaryIO

from ..core.params import DedupParams
from .stages import Provenance, SignResult, SignStage

log = logging.getLogger("neardup.signer")

SignItem = tuple[bytes | None, bytes | None, Provenance]  # raw value, key, where it came from
_Wire = tuple[bytes | None, bytes | None, str, int, int, int | None]  # plain tuples pickle fastest
MIN_CHUNK = 16  # smaller batches are not worth splitting across helpers
_LEN = struct.Struct(">I")
_STREAM_LIMIT = 64 * 1024 * 1024  # a batch of results; asyncio's default of 64 KB is far too small


class HelperFailed(RuntimeError):
    """A helper process exited or answered garbage; the batch is signed again elsewhere."""


class _Helper:
    """One child process and the pipes to it; used by one batch at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lock = asyncio.Lock()

    @classmethod
    async def start(cls, stage: SignStage) -> _Helper:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service.stream.signer",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_STREAM_LIMIT,
        )
        helper = cls(process)
        await helper._call((stage.params, stage.max_text_bytes))  # answered once the helper is ready
        return helper

    async def sign(self, items: list[SignItem]) -> list[SignResult]:
        wire: list[_Wire] = [
            (raw, key, src.topic, src.partition, src.offset, src.timestamp_ms) for raw, key, src in items
        ]
        answer = await self._call(wire)
        if not isinstance(answer, list) or len(answer) != len(items):
            raise HelperFailed(f"helper {self.process.pid} answered {type(answer).__name__}")
        return [SignResult(signed, dead, reason) for signed, dead, reason in answer]

    async def _call(self, request: object) -> object:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        frame = _frame(request)
        async with self.lock:
            try:
                stdin.write(frame)
                await stdin.drain()
                (size,) = _LEN.unpack(await stdout.readexactly(_LEN.size))
                return pickle.loads(await stdout.readexactly(size))
            except (OSError, asyncio.IncompleteReadError, pickle.UnpicklingError) as exc:
                raise HelperFailed(f"helper {self.process.pid}: {type(exc).__name__}: {exc}") from exc

    def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


class Signer:
    """Signs batches in `processes` helpers (0: in the calling process), results in input order.
    A helper that fails is replaced and the batch signed again; if that fails too, the batch is
    signed in-process, so input never stalls on a broken helper."""

    def __init__(self, stage: SignStage, processes: int) -> None:
        self.stage = stage
        self.processes = processes
        self._helpers: list[_Helper] = []

    async def warm_up(self) -> None:
        """Start the helpers now (each imports numpy and the core, ~1 s), not on the first article."""
        while len(self._helpers) < self.processes:
            self._helpers.append(await _Helper.start(self.stage))

    async def sign(self, items: list[SignItem]) -> list[SignResult]:
        if self.processes == 0 or not items:
            return self.sign_here(items)
        for attempt in (1, 2):
            try:
                await self.warm_up()
                return await self._sign_in_helpers(items)
            except HelperFailed as exc:
                log.error("sign_helper_failed attempt=%d error=%r", attempt, str(exc))
                self.close()
        return self.sign_here(items)

    def sign_here(self, items: list[SignItem]) -> list[SignResult]:
        return [self.stage.handle(raw, key, src) for raw, key, src in items]

    async def _sign_in_helpers(self, items: list[SignItem]) -> list[SignResult]:
        parts = max(1, min(len(self._helpers), len(items) // MIN_CHUNK))
        size = -(-len(items) // parts)
        chunks = [items[start : start + size] for start in range(0, len(items), size)]
        done = await asyncio.gather(
            *(helper.sign(chunk) for helper, chunk in zip(self._helpers[: len(chunks)], chunks, strict=True))
        )
        return [result for chunk in done for result in chunk]

    @property
    def helper_pids(self) -> list[int]:
        return [helper.process.pid for helper in self._helpers]

    def close(self) -> None:
        for helper in self._helpers:
            helper.stop()
        self._helpers = []


def _read_frame(stream: BinaryIO) -> object | None:
    header = stream.read(_LEN.size)
    if len(header) < _LEN.size:
        return None  # the worker closed the pipe (or died): nothing more to do
    (size,) = _LEN.unpack(header)
    return pickle.loads(stream.read(size))


def _frame(message: object) -> bytes:
    """What travels on the pipes, both ways: a length-prefixed pickle."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(payload)) + payload


def _write_frame(stream: BinaryIO, answer: object) -> None:
    stream.write(_frame(answer))
    stream.flush()


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The helper's loop: the first frame is (params, max_text_bytes), then batches until EOF."""
    first = _read_frame(requests)
    if first is None:
        return
    assert isinstance(first, tuple) and isinstance(first[0], DedupParams), "expected (params, limit)"
    stage = SignStage(first[0], int(first[1]))
    _write_frame(answers, "ready")
    while (batch := _read_frame(requests)) is not None:
        results = []
        for raw, key, topic, partition, offset, timestamp in batch:  # type: ignore[attr-defined]
            result = stage.handle(raw, key, Provenance(topic, partition, offset, timestamp))
            results.append((result.signed, result.dead_letter, result.reason))
        _write_frame(answers, results)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when helpers stop (EOF)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the answers
    serve(sys.stdin.buffer, answers)
