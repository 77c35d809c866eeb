"""The shard's rules for each article in compiled code (service/core/_shard.c) against the Python
that made them before (tests/support/reference_decide.py), result for result: the input key, the
replay check, the latency, the decider's marker, a message's records, a run's rows and results."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from neardup.core import compiled
from neardup.core.lsh import band_keys
from neardup.core.params import DedupParams
from neardup.core.retention import NO_RETENTION, Retention
from neardup.pipeline.shard import (
    ARTICLE_PREFIX,
    MARKER_PREFIX,
    Culprit,
    Decided,
    IndexShard,
    SizeGauge,
    decide_messages,
)
from neardup.pipeline.wire import (
    Provenance,
    Signed,
    SignedDeletion,
    decode_signed,
    encode_deletion,
    encode_signed,
    pack_signed,
    unpack_signed,
    with_original,
)
from neardup.state.memory import MemoryState
from tests.support import reference_decide as reference
from tests.support.arrivals import signed_items, stream
from tests.support.prose import PROSE
from tests.support.signing import signed

_sketch = compiled._sketch
PARAMS = DedupParams()
NOW_S = 1_765_000_000.123456
NOW_MS = round(NOW_S * 1000)
HOUR_MS = 3_600_000


def sources(rng: random.Random) -> Provenance:
    timestamp = rng.choice([None, 0, round(NOW_S * 1000) - rng.randrange(10**6), round(NOW_S * 1000) + 5])
    return Provenance(
        rng.choice(["in", "other", "ü"]), rng.choice([0, 1, None]), rng.randrange(40), timestamp
    )


def generated(rng: random.Random, count: int) -> list[Any]:
    """Signed records of every kind a run meets: times refused or ahead, band keys of this banding,
    another or none, deletions among them."""
    base = [signed(f"s{n}", PROSE[n % 5][: 60 + 40 * n]) for n in range(6)]
    lsh = PARAMS.lsh
    items: list[Any] = []
    for n in range(count):
        if rng.random() < 0.1:
            items.append(SignedDeletion(f"s{n % 6}", sources(rng)))
            continue
        item = rng.choice(base)
        banding = rng.choice([(lsh.bands, lsh.rows), (0, 0), (4, 2)])
        keys = () if banding == (0, 0) else tuple(band_keys(item.sketch.signature, *banding))
        if rng.random() < 0.1:
            keys = ()  # this banding, none computed
        time_ms = rng.choice(
            [round(NOW_S * 1000) - rng.randrange(3 * HOUR_MS), round(NOW_S * 1000) + HOUR_MS, 0]
        )
        refused = rng.random() < 0.3
        items.append(item._replace(band_keys=keys, banding=banding, time_ms=time_ms, refused_time=refused,
                                   provenance=sources(rng), article_id=f"id-{n}"))  # fmt: skip
    return items


RETENTIONS = [NO_RETENTION, Retention(window_ms=HOUR_MS), Retention(window_ms=2 * HOUR_MS, skew_ms=0)]


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_rows_are_the_python_ones(seed: int) -> None:
    rng = random.Random(seed)
    items = generated(rng, 60)
    lsh = PARAMS.lsh
    for start in range(0, len(items), 3):
        retention = rng.choice(RETENTIONS)
        offset, applied = rng.choice([(-1, -1), (5, 3), (5, 5), (7, 9)])
        inputs = {f"{p.topic}:{p.partition}": rng.randrange(30) for p in (sources(rng) for _ in range(3))}
        newest = rng.choice([None, NOW_MS - 2 * HOUR_MS, NOW_MS + 10])
        expired_before = rng.choice(
            [None, round(NOW_S * 1000) - 3 * HOUR_MS, round(NOW_S * 1000) - 2 * HOUR_MS]
        )
        mine = dict(inputs)
        expected = reference.fresh_rows(items[start:], offset, applied, inputs, newest, expired_before, NOW_S,
                                        retention, PARAMS)  # fmt: skip
        latest = NOW_MS + retention.skew_ms
        due = retention.due_from(expired_before)
        shell = (Signed, offset, applied, mine, newest, NOW_S * 1000.0, latest, retention.window_ms, due)
        rows, keys = _sketch.fresh_rows(items[start:], (*shell, lsh.bands, lsh.rows))
        assert rows == expected
        assert keys == [reference.input_key(item.provenance) for item in items[start : start + len(rows)]]
        assert [tuple(map(type, row)) for row in rows] == [tuple(map(type, row)) for row in expected]
        assert mine == inputs


def test_the_compiled_results_are_the_python_ones() -> None:
    rng = random.Random(3)
    items = [item for item in generated(rng, 40) if isinstance(item, Signed)]
    rows = reference.fresh_rows(items[1:], -1, -1, {}, None, None, NOW_S, NO_RETENTION, PARAMS)
    keys = [reference.input_key(item.provenance) for item in items[1:]]
    written = [(b"record-%d" % n, b"verdict-%d" % n, "unique", n % 3 == 0) for n in range(len(rows) - 2)]
    for offset, records in ((-1, None), (8, list(range(100, 100 + len(items))))):
        inputs: dict[str, int] | None = {} if offset >= 0 else None
        changelog: list[tuple[bytes, bytes | None]] = []
        finish = (Decided(offset, None, "new"), inputs, changelog, records, 1, ARTICLE_PREFIX, MARKER_PREFIX)
        results, refused = _sketch.fresh_results(items[1:], (rows, keys), written, finish)
        expected, expected_log, expected_inputs = [], [], {}
        for n, (item, row, (record, verdict, kind, revived)) in enumerate(
            zip(items[1:], rows, written, strict=False)
        ):
            expected_inputs[reference.input_key(item.provenance)] = item.provenance.offset
            expected_log.append((ARTICLE_PREFIX + item.article_id.encode(), record))
            if revived:
                expected_log.append((MARKER_PREFIX + item.article_id.encode(), None))
            place = -1 if records is None else records[1 + n]
            expected.append(Decided(offset, item.article_id, "new", verdict, kind, row[10], record=place))
        assert results == expected and all(type(result) is Decided for result in results)
        assert refused == sum(item.refused_time for item in items[1 : 1 + len(written)])
        assert changelog == expected_log
        assert inputs == (None if offset < 0 else expected_inputs)


def test_the_input_key_and_the_replay_check_are_the_python_ones() -> None:
    rng = random.Random(1)
    for _ in range(500):
        src = sources(rng)
        inputs = {reference.input_key(sources(rng)): rng.randrange(40) for _ in range(2)}
        offset, applied = rng.randrange(10), rng.randrange(10)
        assert _sketch.input_key(src) == reference.input_key(src)
        assert _sketch.replayed(src, offset, applied, inputs) == reference.replayed(
            src, offset, applied, inputs
        )


def test_the_latency_is_rounded_as_python_rounds_it() -> None:
    rng = random.Random(2)
    now_ms = NOW_S * 1000.0
    sent = [None, 0, 2**53, round(now_ms), round(now_ms) + 1]
    sent += [round(now_ms) - rng.randrange(10**9) for _ in range(3000)]
    for timestamp in sent:
        for now in (now_ms, now_ms + rng.random(), float(round(now_ms)) + 0.0005, 1e15 + 0.125):
            mine = _sketch.latency_ms(timestamp, now)
            assert mine == reference.latency_ms(timestamp, now) and type(mine) is type(
                reference.latency_ms(timestamp, now)
            )


def test_the_marker_is_three_little_endian_int64() -> None:
    memory = bytearray(24)
    for values in ((-1, 0, False), (2**63 - 1, -(2**63), True), (7, 3, True)):
        _sketch.mark(memory, *values)
        assert struct.unpack("<qqq", memory) == (values[0], values[1], int(values[2]))
        assert _sketch.marked(memory) == values
    _sketch.mark_deciding(memory, 9, range(4, 10), 2)
    assert _sketch.marked(memory) == (9, 6, True)
    with pytest.raises(ValueError, match="24 bytes"):
        _sketch.mark(bytearray(23), 1, 1, False)
    with pytest.raises(BufferError):
        _sketch.mark(b"\0" * 24, 1, 1, False)  # not writable


def python_records(message: bytes) -> list[Any]:
    """unpack_signed, and each record decode_signed takes as its compiled decoder would."""
    return [_sketch.signed_record(record, Signed, Provenance) or record for record in unpack_signed(message)]


def test_a_message_s_records_are_what_unpacking_and_decoding_give() -> None:
    items = [signed(f"m{n}", PROSE[n % 5]) for n in range(5)]
    records = [encode_signed(item) for item in items]
    records += [encode_deletion(SignedDeletion("m1", items[0].provenance)), with_original(records[0], b"{}")]
    records += [b"S6" + records[1][2:40], encode_signed(items[2]._replace(article_id='"q"'))]
    memory = bytearray(24)
    for message in (pack_signed(records), pack_signed([]), records[0], pack_signed(records[:1])):
        decoded, left = _sketch.signed_records(message, Signed, Provenance, memory, 12)
        assert decoded == python_records(message)
        assert left == sum(isinstance(record, bytes) for record in decoded)
        assert [decode_signed(r) if isinstance(r, bytes) else r for r in decoded[:5]] == items[
            : len(decoded[:5])
        ]
        if decoded:
            assert _sketch.marked(memory) == (12, len(decoded) - 1, False)
    message = pack_signed(records)
    for end in range(len(message)):
        cut = message[:end]
        result = _sketch.signed_records(cut, Signed, Provenance, None, 0)
        if result is None:
            try:
                unpack_signed(cut)
            except (ValueError, struct.error):
                continue
        assert result is not None and result[0] == python_records(cut)
    for other in (b'{"id": "a"}', message + b"\0", records[5], b""):
        assert _sketch.signed_records(other, Signed, Provenance, None, 0) is None


class Marker:
    """The decider's marker over memory of its own (RecordMarker maps a file)."""

    def __init__(self) -> None:
        self.memory = bytearray(24)

    def at(self, offset: int, index: int, *, deciding: bool) -> None:
        _sketch.mark(self.memory, offset, index, deciding)

    def clear(self) -> None:
        _sketch.mark(self.memory, -1, 0, False)


def messages_of(items: list[Any], rng: random.Random) -> list[tuple[int, bytes]]:
    """The items packed as the sign stage packs them, a few at a time, with records the compiled
    decoder leaves (an id with an escape, a cut record) and messages it does not read."""
    records = [encode_signed(i) if isinstance(i, Signed) else encode_deletion(i) for i in items]
    records[3] = encode_signed(items[3]._replace(article_id='with "quotes"'))
    records[5] = records[5][:40]
    messages, at = [], 0
    while at < len(records):
        size = rng.randrange(1, 12)
        messages.append(pack_signed(records[at : at + size]))
        at += size
    messages[2] = records[0]  # a single record, as written before packing
    messages[4] = messages[4][:-3]  # a message cut short
    return list(enumerate(messages, start=100))


@pytest.mark.parametrize("params", [PARAMS, DedupParams(containment_index=False)], ids=["on", "off"])
def test_messages_decide_as_the_python_shard_decides_them(params: DedupParams) -> None:
    """decide_messages through the compiled rows, results and decoding, against the reference
    shard, which decides each article in Python: the same outcomes, changelog and state."""
    rng = random.Random(7)
    items = signed_items(list(stream(3, 160)), params)
    items = [i._replace(provenance=i.provenance._replace(timestamp_ms=None)) for i in items]  # no clock
    messages = messages_of(items, rng)
    runs = []
    for shard_type in (reference.ReferenceShard, IndexShard):
        writes: list[tuple[bytes, bytes | None]] = []
        shard = shard_type(MemoryState(), params, Retention(window_ms=HOUR_MS), writes)
        marker = Marker()
        outcomes = [
            decide_messages(shard, messages[at : at + 3], SizeGauge(), marker) for at in range(0, 30, 3)
        ]
        runs.append((outcomes, writes, reference.everything(shard, [])))
    assert runs[1] == runs[0]
    entries = [entry for outcome in runs[1][0] for entry in outcome.entries]
    assert {entry.status for entry in entries} >= {"new", "deleted", "error"}
    assert sum(entry.record == -1 for entry in entries) == 1, "the message cut short"


def test_a_retry_decodes_no_record_a_decider_failed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message holding a record a decider process died on as it decoded it: the retry leaves that
    record out (isolated) and decodes the others one at a time, never through the compiled call
    that decodes the whole message."""
    items = [signed(f"r{n}", PROSE[n]) for n in range(3)]
    message = pack_signed([encode_signed(item) for item in items])

    def refused(*args: Any) -> Any:
        raise AssertionError("the whole message decoded again")

    monkeypatch.setattr(_sketch, "signed_records", refused)
    shard = IndexShard(MemoryState(), PARAMS)
    culprit = Culprit(deciding=False, detail="child 1: killed")
    outcome = decide_messages(shard, [(4, message)], SizeGauge(), Marker(), {(4, 1): culprit})
    assert [(entry.record, entry.status, entry.article_id) for entry in outcome.entries] == [
        (1, "error", None),
        (0, "new", "r0"),
        (2, "new", "r2"),
    ]
