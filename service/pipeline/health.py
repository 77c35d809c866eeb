"""The worker's health and failure policy, whatever the transport: when it stops for a failure,
why it is not ready (a stage waits too long on the broker's acknowledgements, no broker answers,
the index opens), which topics' stalls count, and how many records of a partition its agent has
yet to take (what a stall is measured on). The adapter feeds these with what its consumer and
clients know (stream/progress.py, stream/app.py)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .delivery import Deliveries

log = logging.getLogger("neardup.stream")


class ShowsFailure(Protocol):
    """Where /health reads the failure the worker stops for (the worker's metrics)."""

    failure: str | None


@dataclass
class Failure:
    """Stopping the worker for a failure it cannot go on from (the decider or a signing helper
    failed twice on a batch, an agent raised, a broker refused a send): stop it the way a
    supervisor would, so that it restarts and the unacknowledged batch is re-delivered, rather
    than keep consuming with a crashed agent and a gap that blocks every later commit."""

    metrics: ShowsFailure
    exit_timeout: float  # a stop that takes longer ends the process (exit_later)
    # how the worker is stopped: SIGTERM to this process, as a supervisor would send
    stop_worker: Callable[[], None] = lambda: signal.raise_signal(signal.SIGTERM)
    # what bounds that stop: the worker's command passes app.exit_after (the in-memory tests do not)
    exit_later: Callable[[float], None] = lambda seconds: None
    failed: bool = False  # stopped for such a failure: the worker exits non-zero

    def fail(self, message: str, *, exc_info: bool = False) -> None:
        """Stop the worker (logged once): /health turns 503 at once, and a stop that takes longer
        than the settings allow ends the process (non-zero)."""
        if not self.failed:
            log.critical(message, exc_info=exc_info)
            self.failed = True
            self.metrics.failure = message
            self.exit_later(self.exit_timeout)
            self.stop_worker()


@dataclass(frozen=True)
class FetchState:
    """Where the consumer stands in a partition, as the consumer knows it without a request."""

    position: int | None  # the next offset the consumer returns (None: being reset)
    end: int | None  # the high-water mark, or under read_committed the last stable offset
    handed: int | None  # the last offset handed to the partition's stream


def waiting(state: FetchState, delivered: int | None) -> int:
    """Records of a partition that its agent has yet to take: those the consumer has not fetched
    up to the end it can read (the high-water mark, or the last stable offset under
    read_committed), and those handed to the stream after the last the agent took. Not the
    offset of the last record against the high-water mark: a commit marker or an aborted record
    holds an offset that no agent is ever delivered, and an idle worker under exactly-once would
    look wedged for good."""
    unfetched = 0 if state.position is None or state.end is None else max(state.end - state.position, 0)
    untaken = 0 if state.handed is None or delivered is None else max(state.handed - delivered, 0)
    return unfetched + untaken


def broker_away(unseen: float, limit: float) -> bool:
    """No broker answered for `limit` seconds (`unseen`: since one last did): an outage, which the
    delivery timeout bounds, and which makes the worker not ready. No stall counts meanwhile:
    nothing is available to take, whatever the last high-water mark said, so the stall clocks
    start again when a broker answers."""
    return unseen > limit


def busy(topics: tuple[str, str], stages: Sequence[Deliveries], opening: bool, isolating: bool) -> set[str]:
    """Of the input and the shard's topics (`topics`, consumed by the sign and index `stages`),
    those whose stall does not count: their agent is at work on its batch (the input's while the
    signer isolates a message that broke a helper, the shard's while the index is opened or
    rebuilt), or their stage waits for the broker's acknowledgements."""
    working = zip(topics, (isolating, opening), stages, strict=True)
    return {topic for topic, at_work, stage in working if at_work or stage.unsettled}


def unready(stages: Sequence[Deliveries], unseen: float, opening: bool, limit: float) -> str | None:
    """Why the worker does not deliver now, if it does not: sends unacknowledged for `limit`
    seconds, no broker answering for as long (`unseen`: since one last did), or the index opening
    (rebuilt from the changelog) before the shard's next batch. Sends unacknowledged that long mean
    the broker is away or overloaded, not a wedged process (the producer's delivery timeout bounds
    the wait): the worker is not ready, not dead."""
    now = time.monotonic()
    for stage in stages:
        if stage.unsettled and (waited := now - stage.settled_at) > limit:
            return f"stage {stage.stage}: {stage.unsettled} batches unacknowledged for {waited:.0f} s"
    if broker_away(unseen, limit):
        return f"no broker answered for {unseen:.0f} s"
    if opening:
        return "opening the index"
    return None
