"""fingerprint → decide → apply → expire over any StateStore: the one engine of embedded mode,
evaluation and the worker's index stage."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .core.dedup import IndexedArticle, Outcome, decide
from .core.params import DedupParams
from .core.retention import NO_RETENTION, Retention, event_time
from .core.signing import Fingerprint, fingerprint
from .state.port import StateStore
from .state.records import encode_article


@dataclass
class EngineCounts:
    """What the engine did beside deciding, for the summary and the metrics."""

    refused_times: int = 0  # published_at present but unparseable or too far ahead: not used
    unknown_deletes: int = 0  # deletes of ids the index does not hold
    expired: list[int] = field(default_factory=list)  # articles removed by each expiry pass


@dataclass(frozen=True)
class Indexed:
    """One article through the engine: its outcome, its record (encoded once, for the state and
    the caller's durable copy; None on re-delivery), and the articles an expiry pass removed."""

    outcome: Outcome
    record: bytes | None
    expired: list[IndexedArticle]


class Engine:
    """The index side of the pipeline, and sign → index for callers that hold the text."""

    def __init__(self, state: StateStore, params: DedupParams, retention: Retention = NO_RETENTION) -> None:
        state.open_header(params.header())
        self.state = state
        self.params = params
        self.retention = retention
        self.counts = EngineCounts()

    def process(
        self,
        article_id: str,
        text: str,
        extra: dict[bytes, bytes] | None = None,
        *,
        published_at: str | None = None,
    ) -> IndexedArticle:
        """Verdict-bearing record for one article; raises signing.EmptyText for empty texts. Timed
        as `index_published` times it."""
        return self.index_published(article_id, fingerprint(text, self.params), published_at, extra=extra)

    def index_published(
        self,
        article_id: str,
        fp: Fingerprint,
        published_at: str | None,
        keys: Sequence[bytes] | None = None,
        extra: dict[bytes, bytes] | None = None,
    ) -> IndexedArticle:
        """Decide about a signed article timed as in embedded mode: `published_at` when valid and
        not ahead of the clock; none: the time it is processed; one refused (unparsable, or ahead
        of the clock): the newest valid time seen so far (else now), so that one bad date can
        neither expire the index nor be kept beyond its peers."""
        now_ms = round(time.time() * 1000)
        if published_at is None:
            return self.index(article_id, fp, now_ms, keys, extra)
        newest = self.state.counts.newest_ms
        fallback = now_ms if newest is None else newest
        time_ms = self.article_time(published_at, now_ms, fallback)
        return self.index(article_id, fp, time_ms, keys, extra)

    def article_time(self, published_at: str | None, reference_ms: int, fallback_ms: int) -> int:
        stamp = event_time(published_at, reference_ms, fallback_ms, self.retention.skew_ms)
        if stamp.refused:
            self.counts.refused_times += 1
        return stamp.time_ms

    def index(
        self,
        article_id: str,
        fp: Fingerprint,
        time_ms: int,
        keys: Sequence[bytes] | None = None,
        extra: dict[bytes, bytes] | None = None,
    ) -> IndexedArticle:
        """Decide about a signed article and apply it; see `index_outcome`."""
        return self.index_outcome(article_id, fp, time_ms, keys, extra).outcome.article

    def index_outcome(
        self,
        article_id: str,
        fp: Fingerprint,
        time_ms: int,
        keys: Sequence[bytes] | None = None,
        extra: dict[bytes, bytes] | None = None,
    ) -> Indexed:
        """Decide, apply (with `extra` metadata in the same write), then expire what the window
        leaves behind. An article already older than the window is still decided (against what
        is held) and then expires with the next pass."""
        cutoff = self.retention.cutoff(self._newest(time_ms))
        outcome = decide(article_id, fp, self.state, self.params, keys, time_ms, cutoff)
        record = None
        if outcome.update is not None:
            record = encode_article(outcome.article)
            self.state.apply(outcome.update, extra, record=record)
        elif extra:
            self.state.set_meta(extra)
        return Indexed(outcome, record, self.expire_due())

    def _newest(self, time_ms: int) -> int:
        newest = self.state.counts.newest_ms
        return time_ms if newest is None else max(newest, time_ms)

    def expire_due(self) -> list[IndexedArticle]:
        """An expiry pass when the cutoff has moved far enough since the last one."""
        counts = self.state.counts
        cutoff = self.retention.cutoff(counts.newest_ms)
        if cutoff is None or not self.retention.due(cutoff, counts.expired_before_ms):
            return []
        removed = self.state.expire(cutoff)
        self.counts.expired.append(len(removed))
        return removed

    def delete(self, article_id: str, extra: dict[bytes, bytes] | None = None) -> IndexedArticle | None:
        """Delete an article; None (and counted) when the index does not hold it."""
        removed = self.state.delete(article_id, extra)
        if removed is None:
            self.counts.unknown_deletes += 1
        return removed
