"""The two stages as plain objects, free of Faust: the agents in app.py only move bytes in and out.

sign:  raw article bytes → signed record (fingerprint + provenance) or a dead letter.
index: signed record → verdict, applied to the derived index (RocksDB) and to the durable record
       table (a Faust table, changelog-backed) which the index is rebuilt from after a restart.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import orjson

from ..core.dedup import IndexedArticle, decide
from ..core.lsh import BAND_KEY_BYTES, band_keys
from ..core.params import DedupParams, IncompatibleState
from ..core.signing import EmptyText, Fingerprint, fingerprint
from ..messages import InvalidMessage, dead_letter_dict, decode_article, verdict_dict
from ..state.records import encode_article, pack_sketches, unpack_sketches
from ..state.rocks import RocksState

_SIGNED = b"S4"  # with the article's band keys and an 8-bit verifier
_SIGNED_WITHOUT_KEYS = b"S1"  # from before the sign stage computed the band keys
# Every format, by the bytes of its verifier slots: those written before (S3, S2, S1) had wider
# ones, narrowed to 8 bits when read.
_SIGNED_VERIFIER_BYTES = {_SIGNED: 1, b"S3": 2, b"S2": 4, _SIGNED_WITHOUT_KEYS: 4}
_PACKED = b"SP"
_LEN = struct.Struct(">I")
_BANDING = struct.Struct(">HH")  # (bands, rows) of the band keys that follow (0, 0: none)
PACK_MAX_BYTES = 4 * 1024 * 1024  # the signatures topic accepts 8 MB messages (topics.py)
ARTICLE_PREFIX = b"a"
OFFSET_KEY = b"m:applied-offset"
CLEAN_KEY = b"closed-cleanly-at"  # in the derived index: the applied offset it was closed at
T = TypeVar("T")


@dataclass(frozen=True)
class Provenance:
    """Where an article came from, for dead letters, latency and audit."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None


@dataclass(frozen=True)
class Signed:
    """What travels on the signatures topic: one article's fingerprint, no text, and its LSH band
    keys, computed in the sign stage, which scales with the input's partitions, rather than in the
    index stage, which is one process per shard (empty: not computed)."""

    article_id: str
    fingerprint: Fingerprint
    provenance: Provenance
    band_keys: tuple[bytes, ...] = ()
    banding: tuple[int, int] = (0, 0)  # the (bands, rows) that gave band_keys

    def band_keys_for(self, bands: int, rows: int) -> tuple[bytes, ...] | None:
        """The band keys when they were computed for this banding, else None (compute them)."""
        return self.band_keys if self.banding == (bands, rows) and self.band_keys else None


def encode_signed(signed: Signed) -> bytes:
    """S4, meta length, orjson meta, (bands, rows) and the band keys back to back, then the sketches."""
    fp, src = signed.fingerprint, signed.provenance
    bands, rows = signed.banding if signed.band_keys else (0, 0)
    if len(signed.band_keys) != bands or any(len(key) != BAND_KEY_BYTES for key in signed.band_keys):
        raise ValueError(f"band keys must be one per band of {signed.banding}, {BAND_KEY_BYTES} bytes each")
    meta = orjson.dumps(
        {
            "id": signed.article_id,
            "h": fp.content_hash.hex(),
            "n": fp.shingle_count,
            "s": fp.short,
            "m": fp.signature.size,
            "src": [src.topic, src.partition, src.offset, src.timestamp_ms],
        }
    )
    keys = b"".join(signed.band_keys)
    return _SIGNED + _LEN.pack(len(meta)) + meta + _BANDING.pack(bands, rows) + keys + pack_sketches(fp)


@functools.lru_cache(maxsize=8)
def _keys_layout(count: int) -> struct.Struct:
    """`count` band keys back to back: one unpack call slices them all (25 slices in Python cost
    ~3 µs per article, a third of what computing the keys does)."""
    return struct.Struct(f"{BAND_KEY_BYTES}s" * count)


def decode_signed(data: bytes) -> Signed:
    """Inverse of encode_signed; also reads the earlier formats S3, S2 and S1 (no band keys)."""
    magic = data[:2]
    verifier_bytes = _SIGNED_VERIFIER_BYTES.get(magic)
    if verifier_bytes is None:
        raise ValueError(f"not a signed record: {data[:8]!r}")
    (meta_len,) = _LEN.unpack_from(data, 2)
    meta = orjson.loads(data[6 : 6 + meta_len])
    position = 6 + meta_len
    keys: tuple[bytes, ...] = ()
    bands, rows = 0, 0
    if magic != _SIGNED_WITHOUT_KEYS:
        bands, rows = _BANDING.unpack_from(data, position)
        position += _BANDING.size
        if position + bands * BAND_KEY_BYTES > len(data):
            raise ValueError(f"signed record announces {bands} band keys and is shorter")
        keys = _keys_layout(bands).unpack_from(data, position)  # () for none
        position += bands * BAND_KEY_BYTES
    signature, verifier = unpack_sketches(data[position:], meta["m"], verifier_bytes)
    topic, partition, offset, timestamp = meta["src"]
    return Signed(
        meta["id"],
        Fingerprint(bytes.fromhex(meta["h"]), signature, meta["n"], meta["s"], verifier),
        Provenance(topic, partition, offset, timestamp),
        keys,
        (bands, rows),
    )


def pack_signed(records: Sequence[bytes]) -> bytes:
    """Many signed records in one signatures message: the index stage then pays Faust's per-event
    and per-send costs once per sign batch instead of once per article."""
    parts = [_PACKED, _LEN.pack(len(records))]
    for record in records:
        parts += (_LEN.pack(len(record)), record)
    return b"".join(parts)


def pack_in_chunks(records: Sequence[bytes], max_bytes: int = PACK_MAX_BYTES) -> list[bytes]:
    """pack_signed over consecutive runs of `records` of at most `max_bytes` each (≥1 record)."""
    return [pack_signed(run) for run in runs_within(records, lambda r: len(r) + _LEN.size, max_bytes)]


def runs_within(items: Sequence[T], size: Callable[[T], int], max_bytes: int) -> list[list[T]]:
    """Consecutive runs of `items` whose sizes add up to at most `max_bytes` (≥1 item per run: an
    item larger than that gets a run of its own)."""
    runs: list[list[T]] = []
    total = 0
    for item in items:
        weight = size(item)
        if not runs or total + weight > max_bytes:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += weight
    return runs


def unpack_signed(data: bytes) -> list[bytes]:
    """The signed records of one signatures message, packed or (as written before packing) single."""
    if data[:2] in _SIGNED_VERIFIER_BYTES:
        return [data]
    if data[:2] != _PACKED:
        raise ValueError(f"not a signatures message: {data[:8]!r}")
    (count,) = _LEN.unpack_from(data, 2)
    records, position = [], 6
    for _ in range(count):
        (size,) = _LEN.unpack_from(data, position)
        record = data[position + _LEN.size : position + _LEN.size + size]
        if len(record) != size:
            raise ValueError(f"truncated signatures message: {count} records announced")
        records.append(record)
        position += _LEN.size + size
    if position != len(data):
        raise ValueError(f"signatures message has {len(data) - position} trailing bytes")
    return records


class OffsetGap(NamedTuple):
    """Messages of one partition that the consumer went past without delivering them."""

    partition: Any  # the consumer's topic-partition
    expected: int  # the first offset not delivered
    got: int  # the offset delivered instead


def offset_gaps(last: dict[Any, int], delivered: Iterable[tuple[Any, int]]) -> list[OffsetGap]:
    """Gaps in `delivered` ((partition, offset) in delivery order), given the last offset delivered
    before for each partition (`last`, updated in place). Going back is no gap (re-delivery after a
    restart or rebalance); going forward by more than one is, on topics whose offsets have no holes
    (not compacted, no transactions), as the signatures topic."""
    gaps = []
    for partition, offset in delivered:
        before = last.get(partition)
        if before is not None and offset > before + 1:
            gaps.append(OffsetGap(partition, before + 1, offset))
        last[partition] = offset
    return gaps


def in_log_order(
    messages: Sequence[tuple[Any, int, T]], gaps: Sequence[OffsetGap], fills: Sequence[tuple[Any, int, T]]
) -> list[tuple[Any, int, T]]:
    """`messages` ((partition, offset, payload), as delivered) with `fills`, the messages read for
    `gaps`, put back where they belong: each gap's before the message that revealed it."""
    before: dict[tuple[Any, int], list[tuple[Any, int, T]]] = {(gap.partition, gap.got): [] for gap in gaps}
    for fill in sorted(fills, key=lambda entry: entry[1]):
        partition, offset, _ = fill
        gap = next((g for g in gaps if g.partition == partition and g.expected <= offset < g.got), None)
        if gap is None:
            raise ValueError(f"message at offset {offset} of {partition} fills no gap of {list(gaps)}")
        before[(gap.partition, gap.got)].append(fill)
    ordered: list[tuple[Any, int, T]] = []
    for message in messages:
        ordered += before.pop((message[0], message[1]), [])
        ordered.append(message)
    return ordered


def following_run(after: int, messages: Sequence[tuple[int, T]]) -> list[tuple[int, T]]:
    """Of `messages` ((offset, payload), in offset order), those that can be decided right after the
    offset `after` without skipping one: past the ones at or before it (decided already), the
    offsets that follow it one by one."""
    run: list[tuple[int, T]] = []
    for message in messages:
        if message[0] <= after:
            continue
        if message[0] != after + 1 + len(run):
            break
        run.append(message)
    return run


def table_articles(records: Mapping[bytes, bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The article records of the record table, (key, record), without its metadata."""
    return ((key, value) for key, value in records.items() if key.startswith(ARTICLE_PREFIX))


@dataclass(frozen=True)
class SignResult:
    """Exactly one of `signed` and `dead_letter` is set."""

    signed: bytes | None = None
    dead_letter: bytes | None = None
    reason: str | None = None


class SignStage:
    """Stateless and CPU-bound: scales with input partitions and workers."""

    def __init__(self, params: DedupParams, max_text_bytes: int) -> None:
        self.params = params
        self.max_text_bytes = max_text_bytes

    def handle(self, raw: bytes | None, key: bytes | None, src: Provenance) -> SignResult:
        """Never raises: every failure becomes a dead letter carrying the original bytes."""
        try:
            article = decode_article(raw, self.max_text_bytes)
            fp = fingerprint(article.text, self.params)
            bands, rows = self.params.lsh.bands, self.params.lsh.rows
            keys = tuple(band_keys(fp.signature, bands, rows))
            signed = Signed(article.article_id, fp, src, keys, (bands, rows))
            return SignResult(signed=encode_signed(signed))
        except InvalidMessage as exc:
            return self._dead(exc.reason, exc.detail, raw, key, src)
        except EmptyText as exc:
            return self._dead("empty_text", str(exc), raw, key, src)
        except Exception as exc:  # one bad article must not stop the stream
            return self._dead("internal_error", f"{type(exc).__name__}: {exc}", raw, key, src)

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

    @classmethod
    def of(cls, offset: int, result: IndexResult) -> EntryOutcome:
        verdict = result.verdict
        if verdict is None:
            article_id = None if result.article is None else result.article.article_id
            return cls(offset, article_id, result.status)
        return cls(
            offset,
            verdict["article_id"],
            result.status,
            orjson.dumps(verdict),
            verdict["verdict"],
            verdict["latency_ms"],
        )

    @classmethod
    def failed(cls, offset: int, payload: bytes, exc: Exception) -> EntryOutcome:
        return cls(offset, None, "error", error=f"{type(exc).__name__}: {exc}", payload=payload)


class BatchOutcome(NamedTuple):
    entries: list[EntryOutcome]
    indexed: int  # articles in the index after the batch
    handled: int  # signed records handled (what the collector policy counts)


@dataclass(frozen=True)
class IndexResult:
    verdict: dict[str, Any] | None
    article: IndexedArticle | None
    status: str  # "new", "redelivered", "replayed", "stale"


class IndexStage:
    """One writer per shard. The durable truth is `records` (article id → record bytes, plus the
    applied offset); `index` (bands, content map) is derived from it and rebuilt on assignment."""

    def __init__(self, params: DedupParams, index: RocksState, records: MutableMapping[bytes, bytes]) -> None:
        self.params = params
        self.index = index
        self.records = records
        self.applied_offset = -1
        self._checkpointed = -1

    def open(self) -> int | None:
        """At assignment: reopen, else rebuild. Returns the number of articles rebuilt, None when
        the index was kept."""
        return None if self.reopen() else self.rebuild()

    def reopen(self) -> bool:
        """Keep the derived index when it was closed cleanly at the offset the record table says
        was applied (a restart with nothing applied elsewhere in between); False: rebuild it."""
        table_offset = self._table_offset()
        marker = self.index.get_meta(CLEAN_KEY)
        if not marker or int(marker) != table_offset:
            return False
        try:
            self.index.open_header(self.params.header())
        except IncompatibleState:
            return False
        # From now on the index changes: a crash must force a rebuild, so forget the marker on disk
        # before the first change.
        self.index.set_meta({CLEAN_KEY: b""}, durable=True)
        self.applied_offset = self._checkpointed = table_offset
        return True

    def close(self) -> None:
        """Close the derived index; mark it reusable when everything applied is checkpointed."""
        if self.applied_offset == self._checkpointed:
            self.index.set_meta({CLEAN_KEY: str(self.applied_offset).encode()}, durable=True)
        self.index.close()

    def rebuild(self, records: Iterable[tuple[bytes, bytes]] | None = None) -> int:
        """Re-derive bands and content map from the record table's article records (key, record),
        read lazily (default: `records`); returns the number indexed."""
        if records is None:
            records = table_articles(self.records)
        self.index.clear()
        self.index.open_header(self.params.header())
        stored = ((key[len(ARTICLE_PREFIX) :].decode(errors="replace"), value) for key, value in records)
        count = self.index.bulk_load(stored, self.params.lsh.bands, self.params.lsh.rows)
        self.applied_offset = self._checkpointed = self._table_offset()
        return count

    def _table_offset(self) -> int:
        """The offset the record table says was applied (-1: none yet)."""
        stored = self.records.get(OFFSET_KEY)
        return int(stored) if stored is not None else -1

    def handle(self, signed: Signed, offset: int, now: float | None = None) -> IndexResult:
        """Decide one signed record of the signatures message at `offset`. A message holds many
        records: call `applied(offset)` once all of them are handled."""
        article_id, fp = signed.article_id, signed.fingerprint
        if offset <= self.applied_offset:
            # Applied before a restart; Faust re-delivers from its last commit. Re-send the stored
            # verdict when the stored version is this one, so consumers see an identical verdict.
            existing = self.index.get(article_id)
            if existing is not None and existing.fingerprint.content_hash == fp.content_hash:
                return IndexResult(self._verdict(existing, signed, now), existing, "replayed")
            return IndexResult(None, existing, "stale")
        keys = signed.band_keys_for(self.params.lsh.bands, self.params.lsh.rows)  # None: S1, other params
        outcome = decide(article_id, fp, self.index, self.params, keys)
        if outcome.update is not None:
            record = encode_article(outcome.article)
            self.index.apply(outcome.update, record=record)
            self.records[ARTICLE_PREFIX + article_id.encode()] = record
        status = "redelivered" if outcome.redelivered else "new"
        return IndexResult(self._verdict(outcome.article, signed, now), outcome.article, status)

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
                    result = self.handle(decode_signed(record), offset, now)
                except Exception as exc:
                    entries.append(EntryOutcome.failed(offset, record, exc))
                    continue
                entries.append(EntryOutcome.of(offset, result))
            self.applied(offset)
        self.checkpoint()
        return BatchOutcome(entries, self.index.next_seq(), handled)

    def applied(self, offset: int) -> None:
        """Every record of the message at `offset` is handled: a replay of it is recognised."""
        self.applied_offset = max(self.applied_offset, offset)

    def checkpoint(self) -> None:
        """Record the applied offset in the record table: once per batch, not per article (one
        changelog message fewer per article). After a crash, articles applied after the last
        checkpoint come back as re-deliveries of their own records: the same verdict, no new write."""
        if self.applied_offset != self._checkpointed:
            self.records[OFFSET_KEY] = str(self.applied_offset).encode()
            self._checkpointed = self.applied_offset

    def _verdict(self, article: IndexedArticle, signed: Signed, now: float | None) -> dict[str, Any]:
        sent = signed.provenance.timestamp_ms
        now_ms = (time.time() if now is None else now) * 1000.0
        latency = None if sent is None else round(max(now_ms - sent, 0.0), 3)
        return verdict_dict(article, self.params, latency)
