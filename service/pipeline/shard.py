"""One index shard: decides signed articles in order against its state, applies them, expires what
the retention window leaves behind, and writes the changelog that rebuilds it.

The one engine of the worker's index stage, embedded mode, the library and `neardup evaluate`. In
the worker the state is derived: the durable truth is the changelog (`changelog`, sent by the
adapter to the compacted topic `<app_id>-records-changelog`), whose key layout this module owns.
There the state sits on a write overlay (state/overlay.py): a chunk's writes are held until the
changelog has its records (`commit`), then written in one batch with the changelog offset they
reflect, so that a restart replays only the changelog after that offset (`restore_point`,
`restore`). Elsewhere the state is the only copy, there is no changelog, and writes land at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from mmap import mmap
from typing import NamedTuple, Protocol, cast

import orjson

from ..core.compiled import _sketch
from ..core.dedup import IndexedArticle, fresh_settings
from ..core.params import DedupParams, IncompatibleState
from ..core.retention import NO_RETENTION, Retention
from ..state.index import META, IndexState
from ..state.overlay import LayeredKV
from ..state.records import MAGIC as RECORD_MAGIC
from ..state.records import CorruptRecord
from .sign import PROCESSING_FAILED
from .wire import Provenance, Signed, SignedDeletion, decode_signed, unpack_signed

# The changelog's keys: one record per article, one marker per deleted id (its last version and the
# deletion's time, state.tables.encode_marker: a re-added id continues its versions, also after a
# rebuild; tombstoned when the id is added again or the marker expires), the applied offsets, the
# removal counts.
ARTICLE_PREFIX = b"a"
MARKER_PREFIX = b"d"
OFFSET_KEY = b"m:applied-offset"
# the input offsets applied, per input partition (replay safety), with the offset of the
# signatures message that last moved them
INPUTS_KEY = b"m:applied-inputs"
# how many articles expiry and deletes removed ({"expired", "deleted"}), so that a replayed index,
# and `neardup stats --broker`, count them as the worker did
REMOVED_KEY = b"m:removed"
# in the derived state only: the changelog offset it reflects (every record before it applied, none
# after) and a time no record at or after that offset precedes (`Position`)
POSITION_KEY = b"changelog-position"
# The changelog's compaction and this process do not share a clock: a restore point is kept only
# while it is this much younger than the time the changelog keeps a tombstone
CLOCK_MARGIN_MS = 60_000
SIZE_EVERY_S = 10.0  # how often a batch's outcome carries the index's size on disk

log = logging.getLogger("neardup.shard")

Item = Signed | SignedDeletion
SignedMessage = tuple[int, bytes]  # (offset, value) of one signatures message
Entry = tuple[bytes, bytes | None]  # a changelog message: key, value (None: a tombstone)


class Position(NamedTuple):
    """Where the derived state stands in the changelog: `offset`, the first record it has not
    applied; `since_ms`, a time before any record at or after `offset` was written (when the chunk
    that led there was decided, or when the changelog's end was read): compaction may drop a
    tombstone once the changelog has kept it long enough, so a tail older than that is incomplete."""

    offset: int
    since_ms: int

    def encode(self) -> bytes:
        return orjson.dumps(self._asdict())

    @classmethod
    def decode(cls, data: bytes | None) -> Position | None:
        return cls(**orjson.loads(data)) if data else None


class Compacted(Protocol):
    """The changelog as read for a replay: a mapping, or the changelog compacted on disk."""

    def get(self, key: bytes) -> bytes | None: ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


class ChangelogSink(Protocol):
    """Where the shard writes the changelog's messages, in order (a list, in the worker): a
    compiled run's together."""

    def append(self, entry: Entry, /) -> None: ...

    def extend(self, entries: Iterable[Entry], /) -> None: ...


def table_entries(records: Compacted, prefix: bytes) -> Iterator[tuple[str, bytes]]:
    """The records under `prefix` (ARTICLE_PREFIX: the articles; MARKER_PREFIX: the deleted ids'
    markers), (article id, value), without the applied offsets beside them."""
    for key, value in records.items():
        if key.startswith(prefix):
            yield key[len(prefix) :].decode(errors="replace"), value


def removed_counts(stored: bytes | None) -> tuple[int, int]:
    """(expired, deleted) as the changelog last counted them (REMOVED_KEY's value)."""
    if stored is None:
        return 0, 0
    counted = orjson.loads(stored)
    return int(counted["expired"]), int(counted["deleted"])


class Decided(NamedTuple):
    """One item through the shard, from its decision to what is published of it, in every mode
    (the worker, embedded mode, the library): a verdict (its JSON) to publish, a deletion, or an
    error. A tuple of plain values: it crosses the pipe from the decider process (decider.py).
    `status`: "new", "redelivered" (the same id and content again: its stored verdict), "replayed"
    (an input already applied, recognised by where it came from), "stale" (an input since
    replaced), "deleted", "unknown_delete", or "error". In the worker, what the filtered feed
    forwards and what a dead letter carries stay in the signatures message, found by `offset` and
    `record` (publication.py), rather than cross the pipe back."""

    offset: int  # of the signatures message (-1: not from one)
    article_id: str | None
    status: str
    verdict: bytes | None = None
    kind: str | None = None  # the verdict's kind; a deletion's: the removed article's, if any
    latency_ms: float | None = None
    error: str | None = None  # why it could not be decided: "<exception type>: <message>"
    expired: int = 0
    # its index in the signatures message (unpack_signed), with a verdict or an error;
    # WHOLE_MESSAGE: an error of the message itself (it could not be unpacked)
    record: int = -1
    deletion: bool = False  # answers a deletion: a tombstone goes out under `article_id`
    reason: str = "internal_error"  # an error's dead-letter reason

    @classmethod
    def failed(cls, offset: int, exc: Exception, record: int = -1) -> Decided:
        return cls(offset, None, "error", error=f"{type(exc).__name__}: {exc}", record=record)

    @classmethod
    def isolated(cls, offset: int, record: int, culprit: Culprit, article_id: str | None) -> Decided:
        """A record the decider process failed on (`culprit`), left out of the retry: dead-lettered
        as `processing_failed`. `article_id`: set only when the record decodes safely (it failed in
        its decision, not in its decoding), which lets its dead letter name its input message."""
        return cls(offset, article_id, "error", error=culprit.detail, record=record, reason=PROCESSING_FAILED)


@dataclass
class ShardCounts:
    """What the shard did beside deciding, for summaries."""

    refused_times: int = 0  # published_at or record time not used (unparseable, or too far ahead)
    unknown_deletes: int = 0
    expired: int = 0


@dataclass
class IndexShard:
    """One writer per shard. `decide` takes a batch of signed articles in order; `replay` rebuilds
    the state from the changelog, `restore` continues it from its position. With a `changelog`, the
    state is derived from it (its header is checked at `restore_point`, else it is replayed);
    without, the state is the only copy and its header is checked now."""

    state: IndexState
    params: DedupParams
    retention: Retention = NO_RETENTION
    changelog: ChangelogSink | None = None
    counts: ShardCounts = field(default_factory=ShardCounts)
    applied_offset: int = -1  # the last signatures message applied
    # per input partition ("topic:partition"), the last input offset applied
    inputs: dict[str, int] = field(default_factory=dict)
    _checkpointed: tuple[int, dict[str, int], dict[str, int]] = (-1, {}, {"expired": 0, "deleted": 0})
    # when each chunk held in the overlay was decided (`begin`)
    _decided_at: dict[int, int] = field(default_factory=dict)
    _audit: bytes = field(init=False, repr=False, default=b"")
    _rule: tuple[float | int | bool, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        # the parameters as every verdict gives them, written once (messages.verdict_dict: "params")
        self._audit = orjson.dumps(self.params.audit())
        self._rule = fresh_settings(self.params)
        if self.changelog is None:
            self.state.open_header(self.params.header())

    # -- a batch of articles -----------------------------------------------------------------

    def decide(
        self,
        items: Sequence[Item],
        offset: int | None = None,
        now: float | None = None,
        before: Callable[[int], None] | None = None,
        records: Sequence[int] | None = None,
    ) -> list[Decided]:
        """Decide `items` in order, each applied before the next is decided; never raises for one
        item (its result has status "error"). `offset`: the signatures message they came in (the
        worker), by which a re-delivered input is recognised and answered with its stored verdict,
        never a new version; None: no such tracking (the state's content check still answers an
        article sent again with its stored verdict). `before(n)`: called as item n starts (the
        decider child marks the record it is on: RecordMarker). `records`: each item's index in its
        signatures message, which its result carries (Decided.record)."""
        now_s = time.time() if now is None else now
        at = -1 if offset is None else offset
        results: list[Decided] = []
        # rows the next compiled run is offered: twice what the last one took, one after none, so
        # that the articles it stops at (a batch of deletions or re-deliveries) do not each make
        # the rest of the batch into rows again; one alone after a run that raised, which finds
        # the one that fails
        offer = len(items)
        while (n := len(results)) < len(items):
            try:
                taken = self._run(items[n : n + offer], n, at, now_s, before, records)
            except Exception as exc:  # one bad record must not stop the shard
                if offer > 1:
                    offer = 1
                    continue
                log.error("decide_failed article=%r", items[n].article_id, exc_info=True)
                if at >= 0:  # its input is taken: it is not decided again
                    self.inputs[_sketch.input_key(items[n].provenance)] = items[n].provenance.offset
                taken = [_placed(Decided.failed(at, exc), records, n)]
            results += taken
            offer = 2 * len(taken) or 1
            if taken:
                continue
            # not one a run takes: a deletion, an input applied already, the version held again
            if before is not None:
                before(n)
            try:
                answer = self._answer(items[n], at, now_s)
            except Exception as exc:
                log.error("decide_failed article=%r", items[n].article_id, exc_info=True)
                answer = Decided.failed(at, exc)
            results.append(_placed(answer, records, n))
        if offset is not None:
            self.applied_offset = max(self.applied_offset, offset)
        return results

    def _run(
        self,
        items: Sequence[Item],
        start: int,
        offset: int,
        now_s: float,
        before: Callable[[int], None] | None,
        records: Sequence[int] | None,
    ) -> list[Decided]:
        """`items` (from `start` in the batch) decided and indexed in one compiled call
        (IndexState.add_fresh), their rows made and their results finished by compiled code too
        (_sketch.fresh_rows and fresh_results: their comment says which articles a run takes).
        Returns their results, none when it took none; raises what the call raises, having
        written none of them."""
        counts, lsh, retention = self.state.counts, self.params.lsh, self.retention
        latest_ms = round(now_s * 1000) + retention.skew_ms
        due_ms = retention.due_from(counts.expired_before_ms)
        shell = (Signed, offset, self.applied_offset, dict(self.inputs), counts.newest_ms, now_s * 1000.0)
        rows, keys = _sketch.fresh_rows(
            items, (*shell, latest_ms, retention.window_ms, due_ms, lsh.bands, lsh.rows)
        )
        written = self.state.add_fresh(rows, self._rule, self._audit, before, start) if rows else []
        inputs = self.inputs if offset >= 0 else None
        writes: list[Entry] | None = None if self.changelog is None else []
        finish = (Decided(offset, None, "new"), inputs, writes, records, start, ARTICLE_PREFIX)
        results, refused = _sketch.fresh_results(items, (rows, keys), written, (*finish, MARKER_PREFIX))
        if writes and self.changelog is not None:
            self.changelog.extend(writes)
        self.counts.refused_times += refused
        if results:
            results[-1] = results[-1]._replace(expired=self._expire_due())
        return results

    def _answer(self, item: Item, offset: int, now_s: float) -> Decided:
        """An item no run takes: an input applied already (its stored verdict), a deletion, or the
        version the index holds sent again (its stored verdict, status "redelivered")."""
        if offset >= 0:
            if self._replayed(item, offset, self.inputs):
                return self._replay_one(item, offset, now_s)
            self.inputs[_sketch.input_key(item.provenance)] = item.provenance.offset
        if isinstance(item, SignedDeletion):
            return self._delete(item.article_id, offset)
        self.counts.refused_times += item.refused_time
        existing = self.state.get(item.article_id)
        if existing is None or existing.sketch.content_hash != item.content_hash:
            raise CorruptRecord(f"{item.article_id!r}: neither a new version nor the one held")
        return self._verdict("redelivered", existing, item, offset, now_s, self._expire_due())

    def _replayed(self, item: Item, offset: int, inputs: dict[str, int]) -> bool:
        """Whether the item's input is applied already (_sketch.replayed: the rule the compiled
        run applies too)."""
        return _sketch.replayed(item.provenance, offset, self.applied_offset, inputs)

    def _expire_due(self) -> int:
        """An expiry pass when the cutoff has moved far enough since the last one."""
        counts = self.state.counts
        cutoff = self.retention.cutoff(counts.newest_ms)
        due_ms = self.retention.due_from(counts.expired_before_ms)
        if cutoff is None or due_ms is None or cutoff < due_ms:
            return 0
        removed = self.state.expire(cutoff)
        for gone in removed:
            self._forget(gone.article_id)
        for article_id in self.state.expire_markers(cutoff):
            self._forget(article_id, MARKER_PREFIX)
        self.counts.expired += len(removed)
        return len(removed)

    def _replay_one(self, item: Item, offset: int, now_s: float) -> Decided:
        """The stored verdict when the stored version is this one; nothing otherwise (a version
        since replaced, or a deletion already applied)."""
        if isinstance(item, SignedDeletion):
            return Decided(offset, item.article_id, "stale", deletion=True)
        existing = self.state.get(item.article_id)
        if existing is not None and existing.sketch.content_hash == item.content_hash:
            return self._verdict("replayed", existing, item, offset, now_s)
        return Decided(offset, None if existing is None else existing.article_id, "stale")

    def _delete(self, article_id: str, offset: int) -> Decided:
        removed = self.state.delete(article_id)
        if removed is None:
            self.counts.unknown_deletes += 1
            return Decided(offset, article_id, "unknown_delete", deletion=True)
        self._forget(article_id)
        marker = self.state.deletion_marker(article_id)
        if self.changelog is not None and marker is not None:
            self.changelog.append((MARKER_PREFIX + article_id.encode(), marker))
        # the removed article's kind: whether the filtered feed carried it
        return Decided(offset, article_id, "deleted", kind=removed.decision.kind, deletion=True)

    def _forget(self, article_id: str, prefix: bytes = ARTICLE_PREFIX) -> None:
        """The article's record (or with MARKER_PREFIX, its deletion marker) leaves the changelog
        (a tombstone), so a replay does not bring it back."""
        if self.changelog is not None:
            self.changelog.append((prefix + article_id.encode(), None))

    def _verdict(
        self, status: str, article: IndexedArticle, item: Signed, offset: int, now_s: float, expired: int = 0
    ) -> Decided:
        """The article's verdict, as published: messages.verdict_dict as orjson writes it, in one
        compiled pass (_sketch.verdict_json)."""
        latency = _sketch.latency_ms(item.provenance.timestamp_ms, now_s * 1000.0)
        verdict = _sketch.verdict_json(article, self._audit, latency)
        return Decided(
            offset, article.article_id, status, verdict, article.decision.kind, latency, expired=expired
        )

    def checkpoint(self) -> None:
        """Write the applied offsets and removal counts to the changelog, when they moved: once per
        batch, not per article. After a crash, articles applied after the last checkpoint come
        back as re-deliveries of their own records: the same verdict, no new write."""
        if self.changelog is None:
            return
        offset, inputs, removed = self._checkpointed
        if self.inputs != inputs or self.applied_offset != offset:
            self.state.set_meta(self._applied())  # the derived state's, committed with the chunk's writes
        if self.inputs != inputs:
            self.changelog.append((INPUTS_KEY, orjson.dumps(self.inputs)))
        if self.applied_offset != offset:
            self.changelog.append((OFFSET_KEY, str(self.applied_offset).encode()))
        if (now_removed := self._removed()) != removed:
            self.changelog.append((REMOVED_KEY, orjson.dumps(now_removed)))
        self._checkpointed = (self.applied_offset, dict(self.inputs), now_removed)

    def _applied(self) -> dict[bytes, bytes]:
        """The applied offsets as the state's metadata keeps them."""
        return {OFFSET_KEY: str(self.applied_offset).encode(), INPUTS_KEY: orjson.dumps(self.inputs)}

    def _removed(self) -> dict[str, int]:
        """The removal counts, as REMOVED_KEY's value holds them."""
        return {"expired": self.state.counts.expired, "deleted": self.state.counts.deleted}

    # -- the derived state's life ------------------------------------------------------------

    @property
    def layers(self) -> LayeredKV | None:
        """The write overlay under the state; None where writes land at once."""
        kv = self.state.kv
        return kv if isinstance(kv, LayeredKV) else None

    def begin(self, chunk: int) -> None:
        """The writes from now on are chunk `chunk`'s (numbered upwards), held until committed."""
        if (layers := self.layers) is not None:
            layers.hold(chunk)
            self._decided_at[chunk] = round(time.time() * 1000)

    def commit(self, chunk: int, changelog_end: int) -> int:
        """The changelog holds every record of the chunks up to `chunk`, and ends at
        `changelog_end` once they are in it: their writes reach the store in one batch with that
        position. Returns how many chunks were written (0: none held, or discarded since)."""
        if (layers := self.layers) is None:
            return 0
        done = [tag for tag in layers.held if tag <= chunk]
        if not done:
            return 0
        # records after this position come from later chunks, decided after this one started
        position = Position(changelog_end, self._decided_at[done[-1]])
        for tag in done:
            del self._decided_at[tag]
        return layers.commit_through(chunk, {META + POSITION_KEY: position.encode()})

    def discard(self) -> None:
        """Forget the writes not committed: the state as the store holds it, at its position."""
        if (layers := self.layers) is not None:
            layers.discard()
        self._decided_at.clear()
        self.state.reload()
        self._restore(self.state.get_meta(OFFSET_KEY), self.state.get_meta(INPUTS_KEY))

    def restore_point(self, end: int, now_ms: int, kept_ms: int | None) -> tuple[Position | None, str]:
        """Where a restore starts, or None and why the state must be rebuilt instead: no position
        (a lost, new or half-rebuilt state), a format or header not this version's, a position
        past the changelog's `end` (another changelog), or one older than `kept_ms`, how
        long the changelog keeps a tombstone before its compaction may drop it (None: nothing
        is compacted away), less CLOCK_MARGIN_MS: tombstones after it that the state never saw may
        be gone. (The reason keeps the name operators know it by, Kafka's setting.)"""
        self.discard()
        position = Position.decode(self.state.get_meta(POSITION_KEY))
        if position is None:
            return None, "no_position"
        try:
            self.state.open_header(self.params.header())
        except IncompatibleState:
            return None, "format_refused"
        if position.offset > end:
            return None, "past_changelog_end"
        if kept_ms is not None and now_ms - position.since_ms + CLOCK_MARGIN_MS >= kept_ms:
            return None, "older_than_delete_retention"
        return position, "ok"

    def restore(self, entries: Sequence[Entry], next_offset: int, since_ms: int) -> None:
        """Apply changelog records, in their order, after the state's position: one step, committed
        with the position `next_offset` (the offset after the last of them) and `since_ms`.
        Records of an earlier format are refused."""
        if (layers := self.layers) is not None:
            layers.hold(0)  # nothing else is held during a restore: the position lands in this layer
        for key, value in entries:
            self._apply_entry(key, value)
        self.state.set_meta({POSITION_KEY: Position(next_offset, since_ms).encode()})
        if layers is not None:
            layers.commit_through(0)
        self._checkpointed = (self.applied_offset, dict(self.inputs), self._removed())

    def hold(self, chunk: int, writes: Sequence[Entry]) -> None:
        """Writes a chunk made before its process was replaced, held again as chunk `chunk`'s until
        committed: under exactly-once, those of the open transaction, which a restore from the
        changelog's committed records does not bring back."""
        self.begin(chunk)
        for key, value in writes:
            self._apply_entry(key, value)

    def _apply_entry(self, key: bytes, value: bytes | None) -> None:
        """One changelog record into the state, as the write that made it had left it."""
        if key.startswith(ARTICLE_PREFIX):
            article_id = key[len(ARTICLE_PREFIX) :].decode(errors="replace")
            if value is None:
                self.state.drop_article(article_id)
            else:
                self.state.put_record(_current_format(article_id, value))
        elif key.startswith(MARKER_PREFIX):
            self.state.put_marker(key[len(MARKER_PREFIX) :].decode(errors="replace"), value)
        elif key == OFFSET_KEY and value is not None:
            self.applied_offset = int(value)
            self.state.set_meta({OFFSET_KEY: value})
        elif key == INPUTS_KEY and value is not None:
            self.inputs = dict(orjson.loads(value))
            self.state.set_meta({INPUTS_KEY: value})
        elif key == REMOVED_KEY:
            self.state.set_removed(*removed_counts(value or None))

    def mark_position(self, end: int, since_ms: int) -> None:
        """After a rebuild or a restore up to `end`, where the changelog ended when read at
        `since_ms`: the state's position, with the applied offsets, in one write."""
        self.state.set_meta({POSITION_KEY: Position(end, since_ms).encode(), **self._applied()})

    def replay(self, table: Compacted) -> int:
        """Re-derive the state from `table`, the changelog compacted, its article records read
        lazily; returns the number indexed. Records of an earlier format are refused."""
        self.discard()
        self.state.clear()
        self.state.open_header(self.params.header())
        articles = table_entries(table, ARTICLE_PREFIX)
        try:
            count = self.state.bulk_load(
                ((article_id, _current_format(article_id, record)) for article_id, record in articles),
                removed=removed_counts(table.get(REMOVED_KEY)),
                markers=table_entries(table, MARKER_PREFIX),
            )
        except CorruptRecord as exc:
            raise IncompatibleState(str(exc)) from exc
        self._restore(table.get(OFFSET_KEY), table.get(INPUTS_KEY))
        return count

    def _restore(self, offset: bytes | None, inputs: bytes | None) -> None:
        """The applied offsets as checkpointed (-1 and none: nothing applied yet)."""
        self.applied_offset = int(offset) if offset is not None else -1
        self.inputs = dict(orjson.loads(inputs)) if inputs else {}
        self._checkpointed = (self.applied_offset, dict(self.inputs), self._removed())


# -- the worker's batches: signatures messages in, outcomes out (they cross the decider's pipe) --


class BatchOutcome(NamedTuple):
    entries: list[Decided]
    indexed: int  # articles in the index after the batch
    handled: int  # signed records handled (what the collector policy counts)
    clusters: int = 0
    buckets: int = 0
    oldest_ms: int | None = None
    newest_ms: int | None = None
    largest_bucket: int = 0
    bytes_on_disk: int | None = None  # None: not measured again since the last batch that was
    anchor_postings: int = 0
    boilerplate_anchors: int = 0


class Culprit(NamedTuple):
    """A record that a decider process died or hung on, and what happened: left out when its
    message is decided again. `deciding`: it failed in its decision (so it decodes safely), not
    in its decoding."""

    deciding: bool
    detail: str


WHOLE_MESSAGE = -1  # a record index that stands for the whole signatures message (its unpacking)
RecordAt = tuple[int, int]  # (signatures offset, record index in its message, or WHOLE_MESSAGE)


class DecisionMarker(Protocol):
    """Where a decision is, for the worker to read after the process doing it died (RecordMarker):
    `memory`, which the compiled calls write as they go (_sketch.mark)."""

    @property
    def memory(self) -> mmap | bytearray: ...

    def at(self, offset: int, index: int, *, deciding: bool) -> None: ...

    def clear(self) -> None: ...


def decide_messages(
    shard: IndexShard,
    messages: Sequence[SignedMessage],
    size: SizeGauge,
    marker: DecisionMarker | None = None,
    skip: Mapping[RecordAt, Culprit] | None = None,
) -> BatchOutcome:
    """A batch of signatures messages ((offset, value), in order), each unpacked and its records
    decided in order, then checkpointed. Never raises for bad input: a message or record that
    cannot be handled comes back as an error at its place, for the dead-letter topic. `marker`
    learns which record is being decoded or decided; the records in `skip` are answered as
    isolated (Decided.isolated) without being decoded or decided again."""
    entries: list[Decided] = []
    handled = 0
    skip = skip or {}
    memory = None if marker is None else marker.memory
    for offset, value in messages:
        if (culprit := skip.get((offset, WHOLE_MESSAGE))) is not None:
            entries.append(Decided.isolated(offset, WHOLE_MESSAGE, culprit, None))
            continue
        if marker is not None:
            marker.at(offset, WHOLE_MESSAGE, deciding=False)
        # a retry decodes none of the records a decider failed on: one at a time, in Python
        retried = any(at[0] == offset for at in skip)
        records: Sequence[Item | bytes] = []
        try:
            # decoded in one compiled call where it can (None: a message of another shape)
            unpacked = None if retried else _sketch.signed_records(value, Signed, Provenance, memory, offset)
            records, left = unpacked or (unpack_signed(value), -1)
        except Exception as exc:  # a corrupt internal message must not stop the shard
            entries.append(Decided.failed(offset, exc, WHOLE_MESSAGE))
            left = 0
        handled += len(records)
        items: Sequence[Item]
        indexes: Sequence[int]
        if left == 0:
            items, indexes = cast(Sequence[Item], records), range(len(records))
        else:
            items, indexes = _decoded(offset, records, skip, marker, entries)
        before = None if memory is None else partial(_sketch.mark_deciding, memory, offset, indexes)
        entries += shard.decide(items, offset, before=before, records=indexes)
        if marker is not None:
            marker.clear()
    shard.checkpoint()
    counts = shard.state.counts
    return BatchOutcome(
        entries,
        counts.articles,
        handled,
        counts.clusters,
        counts.buckets,
        shard.state.oldest_ms() if counts.articles else None,
        counts.newest_ms,
        counts.largest_bucket,
        size.measure(shard.state),
        counts.postings,
        counts.boilerplate,
    )


def _decoded(
    offset: int,
    records: Sequence[Item | bytes],
    skip: Mapping[RecordAt, Culprit],
    marker: DecisionMarker | None,
    entries: list[Decided],
) -> tuple[list[Item], list[int]]:
    """A message's records that the compiled decoder left (their bytes), or that `skip` names,
    one at a time: the items to decide and their indexes, the errors and isolated ones into
    `entries`."""
    items: list[Item] = []
    indexes: list[int] = []
    for index, record in enumerate(records):
        if (culprit := skip.get((offset, index))) is not None:
            # a record that failed in its decision decodes safely: its dead letter names its input
            article_id = _item(record).article_id if culprit.deciding else None
            entries.append(Decided.isolated(offset, index, culprit, article_id))
            continue
        if marker is not None:
            marker.at(offset, index, deciding=False)
        try:
            items.append(_item(record))
            indexes.append(index)
        except Exception as exc:
            entries.append(Decided.failed(offset, exc, index))
    return items, indexes


def _item(record: Item | bytes) -> Item:
    return decode_signed(record) if isinstance(record, bytes) else record


@dataclass
class SizeGauge:
    """The index's size on disk, measured at most every SIZE_EVERY_S: it lists the directory."""

    measured_at: float = -SIZE_EVERY_S

    def measure(self, state: IndexState) -> int | None:
        now = time.monotonic()
        if now - self.measured_at < SIZE_EVERY_S:
            return None
        self.measured_at = now
        return state.kv.size_bytes()


def _placed(result: Decided, records: Sequence[int] | None, n: int) -> Decided:
    """Item n's result with its index in its signatures message, where it has one."""
    return result if records is None else result._replace(record=records[n])


def _current_format(article_id: str, record: bytes) -> bytes:
    """The record, refused when of an earlier format with a message that says what to do."""
    if record[:2] != RECORD_MAGIC:
        raise IncompatibleState(
            f"the changelog holds a record of an earlier state format ({record[:2]!r}, article "
            f"{article_id!r}); this version cannot rebuild from it. Start from a new NEARDUP_APP_ID "
            "(a new consumer group and changelog) with a new NEARDUP_SIGNATURES_TOPIC and an empty "
            "state directory: the input is then decided again from its start"
        )
    return record
