"""The sign stage: an input message → its signed record (sketch, band keys, event time,
provenance; never the text), or a dead letter. Stateless and CPU-bound: it runs in the signing
helpers (signer.py), in embedded mode's process, and for the library's calls alike."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from ..core.lsh import band_keys
from ..core.normalize import TooLong
from ..core.params import DedupParams
from ..core.retention import NO_RETENTION, Retention, event_time
from ..core.signing import EmptyText, Sketch, SketchBatch, sketch_of
from ..messages import Article, DeadLetterReason, Deletion, InvalidMessage, dead_letter_dict, decode_message
from .wire import Provenance, Signed, SignedDeletion, encode_deletion, encode_signed

# the dead-letter reason of a message that made a helper process die or hang (signer.py)
PROCESSING_FAILED = "processing_failed"


@dataclass(frozen=True)
class SignResult:
    """Exactly one of `signed` and `dead_letter` is set."""

    signed: bytes | None = None
    dead_letter: bytes | None = None
    reason: str | None = None
    refused_time: bool = False  # a published_at or record time was present but not used


@dataclass(frozen=True)
class SignStage:
    """Stateless and CPU-bound: scales with input partitions and workers. An event time is used
    when `times` accepts it (not before its earliest time nor more than its skew ahead of the
    clock); `keyed`: every message must have a key (the worker's, read from partitions:
    messages.decode_message). Pickled whole to the signing helpers (signer.py)."""

    params: DedupParams
    max_text_bytes: int
    times: Retention = NO_RETENTION
    keyed: bool = False

    @classmethod
    def under(
        cls, params: DedupParams, max_text_bytes: int, retention: Retention, *, keyed: bool = False
    ) -> SignStage:
        """The stage using the event times `retention` accepts (its window plays no part here)."""
        return cls(params, max_text_bytes, retention, keyed)

    def handle(self, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        """Never raises: every failure becomes a dead letter carrying the original bytes. A
        tombstone (a key, no value) becomes a deletion."""
        try:
            signed = self.sign(decode_message(raw, key, self.max_text_bytes, keyed=self.keyed), src)
            if isinstance(signed, SignedDeletion):
                return SignResult(signed=encode_deletion(signed))
            return SignResult(signed=encode_signed(signed), refused_time=signed.refused_time)
        except Exception as exc:  # one bad article must not stop the stream
            return self.failed(exc, raw, key, src)

    def sign(
        self, article: Article | Deletion, src: Provenance, now_ms: int | None = None
    ) -> Signed | SignedDeletion:
        """The signed record of a decoded article; raises signing.EmptyText for an empty text.

        Its event time is judged against this process's clock, never the record's: `published_at`
        when valid, not before the earliest time and at most the skew ahead of the clock, else the
        record's timestamp when that passes too, else the time it is signed (its arrival). One
        producer's clock can then neither expire the index nor keep an article beyond its peers.
        A time present but not used marks the record `refused_time`: the index stage takes it as
        its newest accepted time instead, and the fallback only while it has none."""
        if isinstance(article, Deletion):
            return SignedDeletion(article.article_id, src)
        # at most one canonical character per byte the text may have
        return self.signed(article, sketch_of(article.text, self.params, self.max_text_bytes), src, now_ms)

    def signed(self, article: Article, sketch: Sketch, src: Provenance, now_ms: int | None = None) -> Signed:
        """The signed record of an article whose sketch is made: its band keys and event time."""
        bands, rows = self.params.lsh.bands, self.params.lsh.rows
        keys = tuple(band_keys(sketch.signature, bands, rows))
        now = round(time.time() * 1000) if now_ms is None else now_ms
        stamp = src.timestamp_ms
        stamp_refused = stamp is not None and not self.times.accepts(stamp, now)
        arrival = now if stamp is None or stamp_refused else stamp
        when = event_time(article.published_at, now, arrival, self.times.skew_ms, self.times.earliest_ms)
        refused = when.refused or stamp_refused
        return Signed.of(article.article_id, sketch, src, keys, (bands, rows), when.time_ms, refused)

    @classmethod
    def failed(cls, exc: Exception, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        """The dead letter for a message whose signing raised `exc`."""
        if isinstance(exc, InvalidMessage):
            return cls.dead(exc.reason, exc.detail, raw, key, src)
        if (reason := refusal_reason(exc)) is not None:
            return cls.dead(reason, str(exc), raw, key, src)
        return cls.dead("internal_error", f"{type(exc).__name__}: {exc}", raw, key, src)

    @staticmethod
    def dead(reason: str, detail: str, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        """A dead letter for the message (`raw`, `key`) from `src`."""
        record = dead_letter_dict(reason, detail, raw, src.topic, src.partition, src.offset, key)
        return SignResult(dead_letter=orjson.dumps(record), reason=reason)


def refusal_reason(exc: Exception) -> DeadLetterReason | None:
    """The reason a text is refused when signing raises `exc` (empty or too long once
    normalized), as dead letters and the library's InvalidMessage name it; None: not a refusal."""
    if isinstance(exc, EmptyText):
        return "empty_text"
    if isinstance(exc, TooLong):
        return "oversized"
    return None


Message = tuple[bytes | None, bytes | None, Provenance]  # an input message's value, key, and origin


class SigningBatch:
    """Messages signed as SignStage.sign signs them, the compiled passes of their sketches under way
    on a thread of their own from the start until `results` (core/signing.py: SketchBatch), so that
    a caller signs one batch while it decides the one before."""

    def __init__(self, stage: SignStage, messages: Sequence[Message]) -> None:
        self.stage, self.messages = stage, messages
        # each message decoded, or its dead letter
        self._decoded: list[Article | Deletion | SignResult] = []
        for raw, key, src in messages:
            try:
                self._decoded.append(decode_message(raw, key, stage.max_text_bytes, keyed=stage.keyed))
            except Exception as exc:  # as `handle`: a dead letter, not a stopped stream
                self._decoded.append(stage.failed(exc, raw, key, src))
        texts = [item.text for item in self._decoded if isinstance(item, Article)]
        self._sketches = SketchBatch(texts, stage.params, stage.max_text_bytes)

    def results(self) -> list[Signed | SignedDeletion | SignResult]:
        """Each message's signed record, or its dead letter, in order (once)."""
        sketches = iter(self._sketches.results())
        results: list[Signed | SignedDeletion | SignResult] = []
        for (raw, key, src), item in zip(self.messages, self._decoded, strict=True):
            if isinstance(item, Deletion):
                results.append(SignedDeletion(item.article_id, src))
            elif isinstance(item, Article):
                sketch = next(sketches)
                try:
                    if isinstance(sketch, Exception):
                        raise sketch
                    results.append(self.stage.signed(item, sketch, src))
                except Exception as exc:
                    results.append(self.stage.failed(exc, raw, key, src))
            else:
                results.append(item)
        return results
