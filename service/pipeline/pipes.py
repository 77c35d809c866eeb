"""Child processes that serve requests over pipes: the signing helpers and the index decider.

Each child is `python -m neardup.pipeline.child <module>`, reading length-prefixed pickles from its
stdin and answering on its stdout, through the worker's own event loop: no pool threads competing
with the loop for the GIL (a concurrent.futures pool costs the worker CPU of its own for every
request). A child whose worker dies reads end-of-file and exits.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from ..errors import Error

_LEN = struct.Struct(">I")
_STREAM_LIMIT = 64 * 1024 * 1024  # a batch of answers; asyncio's default of 64 KB is far too small
# A sign batch's requests are many times Linux's default 64 KB pipe: through it the event loop
# writes a batch in many rounds (a wake-up, a write, the rest of its buffer moved up each time). 1 MB
# is the most an unprivileged process may ask (/proc/sys/fs/pipe-max-size, by default).
PIPE_BYTES = 1024 * 1024
# A child's start imports numpy and the core: seconds on a busy machine, whatever its batches take.
START_TIMEOUT_S = 60.0


class ChildFailed(Error, RuntimeError):
    """A child process exited, answered garbage, or did not answer in time."""


class ChildTimedOut(ChildFailed):
    """A child did not answer within its timeout: deemed hung, it was killed."""


@dataclass(frozen=True)
class CallTimeout:
    """How long a child may take to answer one request: `base_s`, plus `per_item_s` for each item
    of work in it (an article to sign or decide, a record to load), so that large batches are not
    taken for a hang."""

    base_s: float = 20.0
    per_item_s: float = 0.1

    def seconds(self, items: int = 0) -> float:
        return self.base_s + self.per_item_s * items


DEFAULT_TIMEOUT = CallTimeout()  # the settings' defaults (NEARDUP_HELPER_TIMEOUT, ..._ITEM_TIMEOUT_MS)


class Child:
    """One child process and the pipes to it; one request at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pid = process.pid
        self.lock = asyncio.Lock()

    @classmethod
    async def start(cls, module: str, setup: object) -> Child:
        """Start a child serving `module` (child.py) and send it `setup`; returns once the child
        answered it."""
        serving = __name__.rsplit(".", 1)[0] + ".child"  # by the name the package was imported under
        pipe = asyncio.subprocess.PIPE
        # a child calls no BLAS routine: OpenBLAS's threads would only spin at numpy's import
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", serving, module, stdin=pipe, stdout=pipe, env=env, limit=_STREAM_LIMIT
        )
        child = cls(process)
        try:
            await child.call(setup, START_TIMEOUT_S)
        except ChildFailed:
            child.stop()
            raise
        return child

    async def call(self, request: object, timeout: float | None = None) -> object:
        async with self.lock:
            self.submit(request)
            return await self.receive(timeout)

    def submit(self, request: object) -> None:
        """Queue a request without waiting for its answer: the child reads it once it has answered
        the ones before. Answers come back in request order (receive). The caller holds `lock`,
        or is the child's only user, as the decider's index agent is."""
        assert self.process.stdin is not None
        if self.process.stdin.is_closing():
            raise ChildFailed(f"child {self.process.pid}: its pipe is closed")
        self.process.stdin.write(frame(request))

    async def receive(self, timeout: float | None = None) -> object:
        """The answer to the oldest request not answered yet. A child that does not answer within
        `timeout` seconds (None: no limit) is killed: ChildTimedOut."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                await stdin.drain()
                (size,) = _LEN.unpack(await stdout.readexactly(_LEN.size))
                return pickle.loads(await stdout.readexactly(size))
        except (OSError, asyncio.IncompleteReadError, pickle.UnpicklingError) as exc:
            if deadline.expired():  # TimeoutError is an OSError
                self.stop()  # a late answer would be read as the next request's
                raise ChildTimedOut(f"child {self.process.pid}: no answer in {timeout:.1f} s") from exc
            raise ChildFailed(f"child {self.process.pid}: {type(exc).__name__}: {exc}") from exc
        except asyncio.CancelledError:
            self.stop()  # its answer would be read as the next call's: this child is done
            raise

    async def wait(self, timeout: float) -> int | None:
        """The exit code once the child has exited by itself, None if it is still running."""
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            return None

    def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    async def end(self, timeout: float = 10.0) -> None:
        """Stop the child and wait until it has exited, inside the event loop: its pipes are then
        closed while the loop runs, not by the garbage collector once it has closed (which printed
        a traceback, "Event loop is closed", at every shutdown of the worker)."""
        self.stop()
        await self.wait(timeout)


def frame(message: object) -> bytes:
    """What travels on the pipes, both ways: a length-prefixed pickle."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(payload)) + payload


def read_frame(stream: BinaryIO) -> object | None:
    header = stream.read(_LEN.size)
    if len(header) < _LEN.size:
        return None  # the worker closed the pipe (or died): nothing more to do
    (size,) = _LEN.unpack(header)
    return pickle.loads(stream.read(size))


def write_frame(stream: BinaryIO, answer: object) -> None:
    stream.write(frame(answer))
    stream.flush()


def child_main(serve: Callable[[object, BinaryIO, BinaryIO], None]) -> None:
    """A child's entry point: requests on stdin, the first its setup, answers on the real stdout,
    anything a library prints on stderr. The worker decides when the child stops (a request, or
    end-of-file when the worker is gone), not a signal sent to the whole process group (Ctrl-C,
    or SIGTERM to the group): the decider must still close its index cleanly after the worker was
    told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for pipe in (0, 1):  # both pipes to the worker
        widen_pipe(pipe)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    if (setup := read_frame(sys.stdin.buffer)) is not None:  # None: the worker is gone already
        serve(setup, sys.stdin.buffer, answers)


def widen_pipe(fd: int) -> int:
    """Make the pipe at `fd` (either end) hold PIPE_BYTES; returns its size in bytes, 0 where it
    cannot be changed (not Linux, not a pipe, or above what this user may ask): the default stays."""
    try:
        return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):  # AttributeError: no F_SETPIPE_SZ off Linux
        return 0
