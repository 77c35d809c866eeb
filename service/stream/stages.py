"""The two stages as plain objects, free of Faust: the agents in app.py only move bytes in and out.

sign:  raw article bytes → signed record (fingerprint + provenance) or a dead letter.
index: signed record → verdict, applied to the index (RocksDB, which holds each record once) and
       written as a record or a tombstone for the compacted changelog topic
       `<app_id>-records-changelog`, which the worker sends it to and rebuilds the index from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import orjson

from ..core.dedup import IndexedArticle
from ..core.lsh import band_keys
from ..core.params import DedupParams, IncompatibleState
from ..core.retention import NO_RETENTION, Retention, event_time
from ..core.signing import EmptyText, fingerprint
from ..engine import Engine
from ..messages import Deletion, InvalidMessage, dead_letter_dict, decode_message, verdict_dict
from ..state.records import MAGIC as RECORD_MAGIC
from ..state.records import CorruptRecord
from ..state.rocks import RocksState
from .wire import (
    Headers,
    Provenance,
    Signed,
    SignedDeletion,
    decode_signed,
    encode_deletion,
    encode_signed,
    unpack_signed,
)

ARTICLE_PREFIX = b"a"
OFFSET_KEY = b"m:applied-offset"
# in the changelog (and the index): the input offsets applied, per input partition (replay
# safety), with the offset of the signatures message that last moved them
INPUTS_KEY = b"m:applied-inputs"
# in the changelog: how many articles expiry and deletes removed ({"expired", "deleted"}), so
# that a rebuilt index, and `neardup stats --broker`, count them as the worker did
REMOVED_KEY = b"m:removed"
# in the derived index: where the changelog ended when it was closed cleanly (the applied offsets
# beside it, under the changelog's keys)
CLEAN_KEY = b"closed-cleanly-at"
SIZE_EVERY_S = 10.0  # how often a batch's outcome carries the index's size on disk


class Compacted(Protocol):
    """The records as read for a rebuild: a mapping, or the changelog compacted on disk."""

    def get(self, key: bytes) -> bytes | None: ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


def table_articles(records: Compacted) -> Iterator[tuple[str, bytes]]:
    """The article records, (article id, record), without the applied offsets beside them."""
    prefix = len(ARTICLE_PREFIX)
    for key, value in records.items():
        if key.startswith(ARTICLE_PREFIX):
            yield key[prefix:].decode(errors="replace"), value


def removed_counts(records: Compacted) -> tuple[int, int]:
    """(expired, deleted) as the changelog last counted them."""
    stored = records.get(REMOVED_KEY)
    if stored is None:
        return 0, 0
    counted = orjson.loads(stored)
    return int(counted["expired"]), int(counted["deleted"])


@dataclass(frozen=True)
class SignResult:
    """Exactly one of `signed` and `dead_letter` is set."""

    signed: bytes | None = None
    dead_letter: bytes | None = None
    reason: str | None = None
    refused_time: bool = False  # the article's published_at was present but not used
    # the article's published_at as given: embedded mode times an article by the newest time its
    # state has seen, which only the deciding process knows
    published_at: str | None = None


class SignStage:
    """Stateless and CPU-bound: scales with input partitions and workers."""

    def __init__(
        self, params: DedupParams, max_text_bytes: int, time_skew_ms: int = NO_RETENTION.skew_ms
    ) -> None:
        self.params = params
        self.max_text_bytes = max_text_bytes
        self.time_skew_ms = time_skew_ms

    def handle(self, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        """Never raises: every failure becomes a dead letter carrying the original bytes. A
        tombstone (a key, no value) becomes a deletion."""
        try:
            article = decode_message(raw, key, self.max_text_bytes)
            if isinstance(article, Deletion):
                return SignResult(signed=encode_deletion(SignedDeletion(article.article_id, src)))
            fp = fingerprint(article.text, self.params)
            bands, rows = self.params.lsh.bands, self.params.lsh.rows
            keys = tuple(band_keys(fp.signature, bands, rows))
            # the record's timestamp is the reference and the fallback; without one, the clock
            stamp = src.timestamp_ms if src.timestamp_ms is not None else round(time.time() * 1000)
            when = event_time(article.published_at, stamp, stamp, self.time_skew_ms)
            signed = Signed(article.article_id, fp, src, keys, (bands, rows), when.time_ms, when.refused)
            return SignResult(
                signed=encode_signed(signed), refused_time=when.refused, published_at=article.published_at
            )
        except Exception as exc:  # one bad article must not stop the stream
            return self.failed(exc, raw, key, src)

    @classmethod
    def failed(cls, exc: Exception, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        """The dead letter for a message whose signing raised `exc`."""
        if isinstance(exc, InvalidMessage):
            return cls._dead(exc.reason, exc.detail, raw, key, src)
        if isinstance(exc, EmptyText):
            return cls._dead("empty_text", str(exc), raw, key, src)
        return cls._dead("internal_error", f"{type(exc).__name__}: {exc}", raw, key, src)

    @staticmethod
    def _dead(reason: str, detail: str, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        record = dead_letter_dict(reason, detail, raw, src.topic, src.partition, src.offset, key)
        return SignResult(dead_letter=orjson.dumps(record), reason=reason)


class EntryOutcome(NamedTuple):
    """One signed record as the index agent needs it: a verdict (JSON) to publish, or an error and
    the bytes to dead-letter. A tuple: it crosses the pipe from the decider process (decider.py)."""

    offset: int  # of the signatures message
    article_id: str | None
    status: str  # IndexResult.status, or "error"
    verdict: bytes | None = None
    kind: str | None = None  # the verdict's kind
    latency_ms: float | None = None
    error: str | None = None
    payload: bytes | None = None
    expired: int = 0
    original: bytes | None = None  # the input message, for the filtered feed (with_original)
    headers: Headers = ()

    @classmethod
    def of(
        cls, offset: int, result: IndexResult, signed: Signed | SignedDeletion | None = None
    ) -> EntryOutcome:
        verdict = result.verdict
        if verdict is None:
            article_id = None if result.article is None else result.article.article_id
            return cls(offset, article_id, result.status, expired=result.expired)
        original, headers = (signed.original, signed.headers) if isinstance(signed, Signed) else (None, ())
        return cls(
            offset,
            verdict["article_id"],
            result.status,
            orjson.dumps(verdict),
            verdict["verdict"],
            verdict["latency_ms"],
            expired=result.expired,
            original=original,
            headers=headers,
        )

    @classmethod
    def failed(cls, offset: int, payload: bytes, exc: Exception) -> EntryOutcome:
        return cls(offset, None, "error", error=f"{type(exc).__name__}: {exc}", payload=payload)


class BatchOutcome(NamedTuple):
    entries: list[EntryOutcome]
    indexed: int  # articles in the index after the batch
    handled: int  # signed records handled (what the collector policy counts)
    clusters: int = 0
    buckets: int = 0
    oldest_ms: int | None = None
    newest_ms: int | None = None
    largest_bucket: int = 0
    bytes_on_disk: int | None = None  # None: not measured again since the last batch that was


@dataclass(frozen=True)
class IndexResult:
    verdict: dict[str, Any] | None
    article: IndexedArticle | None
    # "new", "redelivered", "replayed", "stale", "deleted", "unknown_delete"
    status: str
    expired: int = 0  # articles an expiry pass removed after this one


class IndexStage:
    """One writer per shard. The durable truth is the changelog: `records` takes its writes
    (article id → record bytes, a deletion for a tombstone, plus the applied offsets), which the
    worker sends to the compacted changelog topic. `index` (records, bands, content map, clusters,
    times) is derived from them: kept across a clean restart, else rebuilt from the changelog.
    Deciding, applying and expiring go through the one Engine."""

    def __init__(
        self,
        params: DedupParams,
        index: RocksState,
        records: MutableMapping[bytes, bytes],
        retention: Retention = NO_RETENTION,
    ) -> None:
        self.params = params
        self.index = index
        self.records = records
        self.retention = retention
        self.engine: Engine | None = None
        self.applied_offset = -1
        self._checkpointed = -1
        # per input partition ("topic:partition"), the last input offset applied
        self.inputs: dict[str, int] = {}
        self._inputs_checkpointed: dict[str, int] = {}
        self._removed_checkpointed = (0, 0)
        self._size_measured_at = -SIZE_EVERY_S
        self.refused_times = 0
        self.unknown_deletes = 0

    def _engine(self) -> Engine:
        if self.engine is None:
            self.engine = Engine(self.index, self.params, self.retention)
        return self.engine

    def open(self, position: bytes = b"") -> int | None:
        """At assignment: reopen, else rebuild from `records`. Returns the number of articles
        rebuilt, None when the index was kept."""
        return None if self.reopen(position) else self.rebuild()

    def reopen(self, position: bytes) -> bool:
        """Keep the derived index when it was closed cleanly at `position`, where the changelog
        ends now (nothing was written to it since, by this worker or another); False: rebuild it."""
        marker = self.index.get_meta(CLEAN_KEY)
        if not marker or marker != position:
            return False
        try:
            self.index.open_header(self.params.header())
        except IncompatibleState:
            return False
        offset, inputs = self.index.get_meta(OFFSET_KEY), self.index.get_meta(INPUTS_KEY)
        # From now on the index changes: a crash must force a rebuild, so forget the marker on disk
        # before the first change.
        self.index.set_meta({CLEAN_KEY: b""}, durable=True)
        self._restore(offset, inputs)
        return True

    def mark_reusable(self, position: bytes | None) -> bool:
        """At close, with the changelog's end `position` (None: unknown, after a failure): mark
        the index reusable when everything applied is checkpointed. Whether it was marked."""
        if position is None or self.applied_offset != self._checkpointed:
            return False
        marker = {CLEAN_KEY: position, OFFSET_KEY: str(self.applied_offset).encode()}
        self.index.set_meta({**marker, INPUTS_KEY: orjson.dumps(self.inputs)}, durable=True)
        return True

    def close(self, position: bytes | None = None) -> None:
        """Close the derived index, marked reusable if it can be (mark_reusable)."""
        self.mark_reusable(position)
        self.index.close()

    def rebuild(self, table: Compacted | None = None) -> int:
        """Re-derive the index from `table`, the changelog compacted (default: `records`), its
        article records read lazily; returns the number indexed. Records of an earlier format are
        refused."""
        if table is None:
            table = self.records
        self.index.clear()
        self.index.open_header(self.params.header())
        try:
            count = self.index.bulk_load(
                _current_format(table_articles(table)), removed=removed_counts(table)
            )
        except CorruptRecord as exc:
            raise IncompatibleState(str(exc)) from exc
        self._restore(table.get(OFFSET_KEY), table.get(INPUTS_KEY))
        return count

    def _restore(self, offset: bytes | None, inputs: bytes | None) -> None:
        """The applied offsets as checkpointed (-1 and none: nothing applied yet)."""
        self.applied_offset = self._checkpointed = int(offset) if offset is not None else -1
        self.inputs = dict(orjson.loads(inputs)) if inputs else {}
        self._inputs_checkpointed = dict(self.inputs)
        self._removed_checkpointed = self._removed()
        self.engine = None

    def _removed(self) -> tuple[int, int]:
        return self.index.counts.expired, self.index.counts.deleted

    def handle(self, signed: Signed | SignedDeletion, offset: int, now: float | None = None) -> IndexResult:
        """Decide one signed record of the signatures message at `offset`. A message holds many
        records: call `applied(offset)` once all of them are handled.

        A record is applied once, however it comes back: a signatures message at or before the
        applied offset (a restart of this stage), or an input message at or before the input
        offset applied for its partition (a restart of the sign stage, a rebalance, a producer
        retry: the input is signed again) gets its stored verdict, never a new version."""
        src = signed.provenance
        partition = f"{src.topic}:{src.partition}"
        done = self.inputs.get(partition, -1)
        if offset <= self.applied_offset or src.offset <= done:
            return self._replay(signed, now)
        self.inputs[partition] = src.offset
        if isinstance(signed, SignedDeletion):
            return self._delete(signed.article_id)
        article_id, fp = signed.article_id, signed.fingerprint
        if signed.refused_time:
            self.refused_times += 1
        keys = signed.band_keys_for(self.params.lsh.bands, self.params.lsh.rows)
        indexed = self._engine().index_outcome(article_id, fp, signed.time_ms, keys)
        outcome = indexed.outcome
        if indexed.record is not None:
            self.records[ARTICLE_PREFIX + article_id.encode()] = indexed.record
        for gone in indexed.expired:
            self._forget(gone.article_id)
        status = "redelivered" if outcome.redelivered else "new"
        return IndexResult(
            self._verdict(outcome.article, signed, now), outcome.article, status, len(indexed.expired)
        )

    def _replay(self, signed: Signed | SignedDeletion, now: float | None) -> IndexResult:
        """The stored verdict when the stored version is this one; nothing otherwise (a version
        since replaced, or a deletion already applied)."""
        if isinstance(signed, SignedDeletion):
            return IndexResult(None, None, "stale")
        existing = self.index.get(signed.article_id)
        if existing is not None and existing.fingerprint.content_hash == signed.fingerprint.content_hash:
            return IndexResult(self._verdict(existing, signed, now), existing, "replayed")
        return IndexResult(None, existing, "stale")

    def _delete(self, article_id: str) -> IndexResult:
        removed = self._engine().delete(article_id)
        if removed is None:
            self.unknown_deletes += 1
            return IndexResult(None, None, "unknown_delete")
        self._forget(article_id)
        return IndexResult(None, removed, "deleted")

    def _forget(self, article_id: str) -> None:
        """The article's record leaves the table: its changelog gets a tombstone, so that a
        rebuild does not bring it back."""
        del self.records[ARTICLE_PREFIX + article_id.encode()]

    def handle_messages(
        self, messages: Sequence[tuple[int, bytes]], now: float | None = None
    ) -> BatchOutcome:
        """A batch of signatures messages ((offset, value), in order), each unpacked and its records
        decided in order, then checkpointed. Never raises for bad input: a message or record that
        cannot be handled comes back as an error with its bytes, for the dead-letter topic."""
        entries: list[EntryOutcome] = []
        handled = 0
        for offset, value in messages:
            try:
                records = unpack_signed(value)
            except Exception as exc:  # a corrupt internal message must not stop the shard
                entries.append(EntryOutcome.failed(offset, value, exc))
                records = []
            handled += len(records)
            for record in records:
                try:
                    signed = decode_signed(record)
                    result = self.handle(signed, offset, now)
                except Exception as exc:
                    entries.append(EntryOutcome.failed(offset, record, exc))
                    continue
                entries.append(EntryOutcome.of(offset, result, signed))
            self.applied(offset)
        self.checkpoint()
        counts = self.index.counts
        oldest = self.index.oldest_ms() if counts.articles else None
        return BatchOutcome(
            entries,
            counts.articles,
            handled,
            counts.clusters,
            counts.buckets,
            oldest,
            counts.newest_ms,
            counts.largest_bucket,
            self._bytes_on_disk(),
        )

    def _bytes_on_disk(self) -> int | None:
        """The index's size, measured at most every SIZE_EVERY_S: it lists the directory."""
        now = time.monotonic()
        if now - self._size_measured_at < SIZE_EVERY_S:
            return None
        self._size_measured_at = now
        return self.index.kv.size_bytes()

    def applied(self, offset: int) -> None:
        """Every record of the message at `offset` is handled: a replay of it is recognised."""
        self.applied_offset = max(self.applied_offset, offset)

    def checkpoint(self) -> None:
        """Write the applied offsets to `records` (the changelog): once per batch, not per article (one
        changelog message fewer per article). After a crash, articles applied after the last
        checkpoint come back as re-deliveries of their own records: the same verdict, no new write."""
        if self.inputs != self._inputs_checkpointed:
            self.records[INPUTS_KEY] = orjson.dumps(self.inputs)
            self._inputs_checkpointed = dict(self.inputs)
        if self.applied_offset != self._checkpointed:
            self.records[OFFSET_KEY] = str(self.applied_offset).encode()
            self._checkpointed = self.applied_offset
        if (removed := self._removed()) != self._removed_checkpointed:
            self.records[REMOVED_KEY] = orjson.dumps(dict(zip(("expired", "deleted"), removed, strict=True)))
            self._removed_checkpointed = removed

    def _verdict(self, article: IndexedArticle, signed: Signed, now: float | None) -> dict[str, Any]:
        sent = signed.provenance.timestamp_ms
        now_ms = (time.time() if now is None else now) * 1000.0
        latency = None if sent is None else round(max(now_ms - sent, 0.0), 3)
        return verdict_dict(article, self.params, latency)


def _current_format(records: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
    """The records, refusing the first of an earlier format with a message that says what to do."""
    for article_id, record in records:
        if record[:2] != RECORD_MAGIC:
            raise IncompatibleState(
                f"the changelog holds a record of an earlier state format ({record[:2]!r}, article "
                f"{article_id!r}); this version cannot rebuild from it. Start from a new NEARDUP_APP_ID "
                "(a new consumer group and changelog) with a new NEARDUP_SIGNATURES_TOPIC and an empty "
                "state directory: the input is then decided again from its start"
            )
        yield article_id, record
