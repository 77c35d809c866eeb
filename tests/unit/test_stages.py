"""neardup.pipeline.sign and .shard: the sign stage (bytes → signed record or dead letter) and the index shard
(signed record → verdict) over RocksDB and a plain dict standing in for the record table."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from neardup.core.lsh import band_keys
from neardup.core.params import DedupParams, IncompatibleState
from neardup.core.retention import Retention
from neardup.core.signing import sketch_of
from neardup.pipeline.shard import ARTICLE_PREFIX, INPUTS_KEY, MARKER_PREFIX, OFFSET_KEY, IndexShard
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import (
    Provenance,
    Signed,
    SignedDeletion,
    decode_signed,
    encode_signed,
    pack_signed,
    unpack_signed,
)
from neardup.state.memory import MemoryState
from neardup.state.rocks import RocksState
from tests.support.changelog import ChangelogTable
from tests.support.prose import PROSE
from tests.support.shard import process
from tests.support.signing import FUTURE, HISTORY, INPUT_OFFSETS, PARAMS, SRC, article, signed
from tests.support.state import id_for_content

NOW = 1_717_000_000.250  # seconds; 250 ms after SRC's timestamp


# --- sign -----------------------------------------------------------------------------------------

BAD: list[tuple[str, bytes | None, str]] = [
    ("invalid utf-8", b'{"id": "a", "text": "na\xefve \xff"}', "invalid_utf8"),
    ("truncated utf-8", article("a", "ok")[:-3] + b"\xe2\x82", "invalid_utf8"),
    ("invalid json", b'{"id": "a", "text": "unterminated}', "invalid_json"),
    ("not json at all", b"Memorial Day, observed on the last Monday of May", "invalid_json"),
    ("json array", b'[{"id": "a", "text": "t"}]', "schema_violation"),
    ("json number", b"42", "schema_violation"),
    ("json string", b'"text"', "schema_violation"),
    ("json null", b"null", "schema_violation"),
    ("missing id", b'{"text": "A body."}', "schema_violation"),
    ("id not a string", article(12345, "A body."), "schema_violation"),
    ("empty id", article("", "A body."), "schema_violation"),
    ("missing text", b'{"id": "a", "title": "Headline"}', "schema_violation"),
    ("text not a string", article("a", ["A", "body"]), "schema_violation"),
    ("text null", article("a", None), "schema_violation"),
    ("title not a string", article("a", "A body.", title={"main": "Headline"}), "schema_violation"),
    ("oversized text", article("a", "word " * 40), "oversized"),
    ("oversized multibyte text", article("a", "€" * 34), "oversized"),  # 102 bytes, 34 characters
    ("empty text", article("a", ""), "empty_text"),
    ("whitespace text", article("a", " \n\t\u3000 \r\n "), "empty_text"),
    ("keyed by another id", article("b", "A body."), "key_mismatch"),
]


@pytest.fixture
def sign() -> SignStage:
    return SignStage(PARAMS, max_text_bytes=100)


@pytest.mark.parametrize(
    ("raw", "reason"), [(raw, reason) for _, raw, reason in BAD], ids=[c[0] for c in BAD]
)
def test_bad_input_becomes_a_dead_letter(sign: SignStage, raw: bytes | None, reason: str) -> None:
    result = sign.handle(raw, b"a", SRC)  # the id of the articles that have one, but "b"
    assert result.signed is None and result.dead_letter is not None
    assert result.reason == reason
    record = orjson.loads(result.dead_letter)
    assert record["reason"] == reason and record["detail"]
    assert (record["topic"], record["partition"], record["offset"]) == (SRC.topic, SRC.partition, SRC.offset)
    assert base64.b64decode(record["key_b64"]) == b"a"
    if raw is None:
        assert record["value_b64"] is None
    else:
        assert base64.b64decode(record["value_b64"], validate=True) == raw


def test_dead_letter_without_key(sign: SignStage) -> None:
    record = orjson.loads(sign.handle(b"{", None, SRC).dead_letter or b"")
    assert record["key_b64"] is None


def test_schema_violation_detail_names_field(sign: SignStage) -> None:
    record = orjson.loads(sign.handle(article("a-7", "t", title=3), None, SRC).dead_letter or b"")
    assert "'title'" in record["detail"] and "'a-7'" in record["detail"]


def test_unexpected_errors_do_not_escape(sign: SignStage, monkeypatch: pytest.MonkeyPatch) -> None:
    import neardup.pipeline.sign as stages

    def explode(text: str, params: DedupParams, max_points: int | None = None) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(stages, "sketch_of", explode)
    raw = article("a", "A perfectly good body.")
    result = sign.handle(raw, None, SRC)
    assert result.reason == "internal_error"
    record = orjson.loads(result.dead_letter or b"")
    assert record["detail"] == "MemoryError: no room"
    assert base64.b64decode(record["value_b64"]) == raw


@pytest.mark.parametrize("text", [PROSE[0], PROSE[4][:100], "Short.", "ünïcødé ✓ 東京"])
def test_valid_article_is_signed_and_round_trips(text: str) -> None:
    stage = SignStage(PARAMS, max_text_bytes=1_000_000)
    result = stage.handle(article("wire-1", text, title="T", extra=1), b"wire-1", SRC)
    assert result.dead_letter is None and result.reason is None and result.signed is not None
    signed = decode_signed(result.signed)
    assert signed.article_id == "wire-1"
    assert signed.provenance == SRC
    assert signed.sketch == sketch_of(text, PARAMS)
    assert signed.sketch.signature.dtype == np.uint64
    assert encode_signed(signed) == result.signed


def test_signed_record_carries_the_band_keys_of_its_signature() -> None:
    result = SignStage(PARAMS, 1_000_000).handle(article("x", PROSE[1]), None, SRC)
    item = decode_signed(result.signed or b"")
    sketch = sketch_of(PROSE[1], PARAMS)
    assert item.band_keys == tuple(band_keys(sketch.signature, PARAMS.lsh.bands, PARAMS.lsh.rows))
    assert item.banding == (PARAMS.lsh.bands, PARAMS.lsh.rows) == (25, 5)
    assert item.band_keys_for(25, 5) == item.band_keys
    assert item.band_keys_for(25, 4) is None and item.band_keys_for(20, 5) is None


def test_a_tombstone_becomes_a_deletion_in_its_place(sign: SignStage) -> None:
    result = sign.handle(None, b"wire-7", SRC)
    assert result.dead_letter is None and result.signed is not None
    deletion = decode_signed(result.signed)
    assert deletion == SignedDeletion("wire-7", SRC)
    assert unpack_signed(pack_signed([result.signed])) == [result.signed]
    as_json = sign.handle(b'{"id": "wire-7", "deleted": true}', b"wire-7", SRC)
    assert as_json.signed == result.signed


def test_a_tombstone_without_a_key_is_dead_lettered(sign: SignStage) -> None:
    result = sign.handle(None, None, SRC)
    assert result.signed is None and result.reason == "invalid_json"
    assert "tombstone" in orjson.loads(result.dead_letter or b"")["detail"]


def test_the_event_time_is_published_at_or_the_record_timestamp(sign: SignStage) -> None:
    stage = SignStage(PARAMS, max_text_bytes=1_000_000)
    dated = decode_signed(
        stage.handle(article("a", "A body.", published_at="2024-05-29T12:00:00Z"), None, SRC).signed or b""
    )
    assert isinstance(dated, Signed) and dated.time_ms == 1_716_984_000_000 and not dated.refused_time
    undated = decode_signed(stage.handle(article("a", "A body."), None, SRC).signed or b"")
    assert isinstance(undated, Signed) and undated.time_ms == SRC.timestamp_ms
    ahead = stage.handle(article("a", "A body.", published_at="2099-01-01T00:00:00Z"), None, SRC)
    future = decode_signed(ahead.signed or b"")
    assert ahead.refused_time and isinstance(future, Signed)
    assert future.time_ms == SRC.timestamp_ms and future.refused_time


def test_signed_record_carries_no_text() -> None:
    result = SignStage(PARAMS, 1_000_000).handle(article("x", PROSE[1]), None, SRC)
    assert result.signed is not None
    assert b"Memorial" not in result.signed


def test_text_at_the_limit_is_accepted(sign: SignStage) -> None:
    assert sign.handle(article("a", "x" * 100), None, SRC).signed is not None
    assert sign.handle(article("a", "x" * 101), None, SRC).reason == "oversized"


def test_provenance_without_timestamp_round_trips() -> None:
    src = Provenance("t", 0, 0, None)
    result = SignStage(PARAMS, 1000).handle(article("a", "Some body text."), None, src)
    assert decode_signed(result.signed or b"").provenance == src


# --- index ----------------------------------------------------------------------------------------


def story_with_a_copy() -> list[Signed]:
    """a, then b (a copy of a with a byline: a duplicate), then c (unrelated)."""
    return [
        signed("a", PROSE[0]),
        signed("b", PROSE[0] + " Reporting by the wire desk."),
        signed("c", PROSE[2]),
    ]


class Shard:
    """An index stage over its own RocksDB directory and a dict standing in for the record table."""

    def __init__(self, path: Path, records: dict[bytes, bytes] | None = None) -> None:
        self.state = RocksState(path)
        self.records = ChangelogTable({} if records is None else records)
        self.stage = IndexShard(self.state, PARAMS, changelog=self.records)
        self.count = self.stage.replay(self.records)

    def handle(self, item: Signed | SignedDeletion, offset: int) -> tuple[str, dict[str, Any] | None]:
        [result] = self.stage.decide([item], offset, now=NOW)
        self.stage.checkpoint()  # a message of one record, a batch of one message
        return result.status, None if result.verdict is None else orjson.loads(result.verdict)


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[Any]:
    opened: list[Shard] = []

    def make(name: str, records: dict[bytes, bytes] | None = None) -> Shard:
        shard = Shard(tmp_path / name, records)
        opened.append(shard)
        return shard

    yield make
    for shard in opened:
        shard.state.close()


def test_new_article_gets_a_verdict(shards: Any) -> None:
    shard = shards("index")
    assert shard.count == 0 and shard.stage.applied_offset == -1
    status, verdict = shard.handle(signed("a", PROSE[0]), 0)
    assert status == "new" and verdict is not None
    assert (verdict["article_id"], verdict["verdict"], verdict["canonical_id"]) == ("a", "unique", "a")
    assert verdict["latency_ms"] == pytest.approx(250.0, abs=0.01)
    assert verdict["params"] == PARAMS.audit()
    assert ARTICLE_PREFIX + b"a" in shard.records
    assert shard.records[OFFSET_KEY] == b"0" and shard.stage.applied_offset == 0
    assert shard.state.get("a") is not None

    status, verdict = shard.handle(signed("b", PROSE[0] + " Reporting by the wire desk."), 1)
    assert status == "new" and verdict is not None
    assert (verdict["verdict"], verdict["match_id"], verdict["canonical_id"]) == ("duplicate", "a", "a")
    assert shard.records[OFFSET_KEY] == b"1"


def test_redelivery_with_a_higher_offset_repeats_the_verdict(shards: Any) -> None:
    shard = shards("index")
    shard.handle(signed("a", PROSE[0]), 0)
    item = signed("b", PROSE[0] + " Reporting by the wire desk.")
    status, first = shard.handle(item, 1)
    shard.handle(signed("c", PROSE[2]), 2)
    records_before = {k: v for k, v in shard.records.items() if k not in (OFFSET_KEY, INPUTS_KEY)}

    # the same article sent again upstream: a new input message with the same content
    status, again = shard.handle(signed("b", PROSE[0] + " Reporting by the wire desk."), 3)
    assert status == "redelivered"
    assert again == first
    assert {k: v for k, v in shard.records.items() if k not in (OFFSET_KEY, INPUTS_KEY)} == records_before
    assert shard.records[OFFSET_KEY] == b"3" and shard.stage.applied_offset == 3
    assert shard.state.counts.articles == 3
    # the same input message signed again (a producer retry, a restart of the sign stage): the
    # stored verdict, recognised by where it came from
    status, replayed = shard.handle(item, 4)
    assert (status, replayed) == ("replayed", first)


def test_replay_at_or_below_the_applied_offset(shards: Any) -> None:
    shard = shards("index")
    items = story_with_a_copy()
    verdicts = [shard.handle(item, offset)[1] for offset, item in enumerate(items)]
    records_before = dict(shard.records)
    for offset, item in enumerate(items):
        status, verdict = shard.handle(item, offset)
        assert status == "replayed"
        assert verdict == verdicts[offset]
    assert shard.records == records_before  # replay writes nothing, not even the offset
    assert shard.stage.applied_offset == 2


def test_replay_of_a_superseded_version_is_stale(shards: Any) -> None:
    shard = shards("index")
    old, new = signed("a", PROSE[0]), signed("a", PROSE[1])
    shard.handle(old, 0)
    status, verdict = shard.handle(new, 1)
    assert status == "new" and verdict is not None and verdict["version"] == 1
    status, verdict = shard.handle(old, 0)
    assert (status, verdict) == ("stale", None)
    assert shard.state.get("a").version == 1  # type: ignore[union-attr]


def test_applied_offset_is_restored_from_the_records(shards: Any) -> None:
    first = shards("one")
    items = [signed("a", PROSE[0]), signed("b", PROSE[1]), signed("c", PROSE[0])]
    verdicts = [first.handle(item, offset * 10)[1] for offset, item in enumerate(items)]
    assert first.records[OFFSET_KEY] == b"20"

    second = shards("two", dict(first.records))  # a restart: a fresh derived index, the same table
    assert second.count == 3 and second.stage.applied_offset == 20
    assert second.state.counts.articles == 3
    # re-delivered from before the last commit: the same verdicts again, nothing re-decided
    for offset, item in enumerate(items):
        assert second.handle(item, offset * 10) == ("replayed", verdicts[offset])


def test_records_of_one_message_are_decided_in_order_and_replayed_together(shards: Any) -> None:
    shard = shards("index")
    message = story_with_a_copy()
    first = shard.stage.decide(message, 5, now=NOW)
    assert [r.status for r in first] == ["new", "new", "new"]  # one offset, three articles
    assert [r.kind for r in first if r.verdict] == ["unique", "duplicate", "unique"]
    crashed = dict(shard.records)  # killed before the batch's checkpoint
    assert OFFSET_KEY not in crashed

    shard.stage.checkpoint()
    again = shard.stage.decide(message, 5, now=NOW)
    assert [r.status for r in again] == ["replayed"] * 3
    assert [r.verdict for r in again] == [r.verdict for r in first]

    restarted = shards("restarted", crashed)
    assert restarted.stage.applied_offset == -1
    redone = restarted.stage.decide(message, 5, now=NOW)
    assert [r.status for r in redone] == ["redelivered"] * 3
    assert [r.verdict for r in redone] == [r.verdict for r in first]


def test_records_with_and_without_band_keys_get_the_same_verdicts(shards: Any) -> None:
    """The index stage uses the sign stage's band keys when a record has them for its banding and
    computes them otherwise: the decisions and the state are the same."""
    items = [*story_with_a_copy(), signed("d", PROSE[2] + " Updated at noon.")]
    other_rows = [  # as a signer configured with 4 rows per band would send them
        item._replace(band_keys=tuple(band_keys(item.sketch.signature, 25, 4)), banding=(25, 4))
        for item in items
    ]
    runs = []
    for name, batch in (
        ("keys", items),
        ("other", [decode_signed(encode_signed(item)) for item in other_rows]),
    ):
        shard = shards(name)
        runs.append([shard.handle(item, offset) for offset, item in enumerate(batch)])  # type: ignore[arg-type]
        runs[-1].append(sorted(shard.records.items()))
    assert runs[0] == runs[1]
    assert [verdict["verdict"] for _, verdict in runs[0][:4]] == [
        "unique",
        "duplicate",
        "unique",
        "duplicate",
    ]


def test_the_sign_stages_band_keys_are_the_ones_looked_up(shards: Any) -> None:
    """With every band key the same, an unrelated article shares buckets with everything before it:
    the verifier still calls it unique, but it now has candidates, so the given keys were used."""
    same = tuple(bytes([0, band]) + b"\0" * 8 for band in range(PARAMS.lsh.bands))
    items = story_with_a_copy()
    plain, bogus = shards("plain"), shards("bogus")
    _, honest = [plain.handle(item, offset) for offset, item in enumerate(items)][-1]
    _, shared = [bogus.handle(item._replace(band_keys=same), n) for n, item in enumerate(items)][-1]
    assert honest is not None and shared is not None
    assert honest["verdict"] == shared["verdict"] == "unique"
    assert honest["candidates"] == []
    assert sorted(c["article_id"] for c in shared["candidates"]) == ["a", "b"]


def test_rebuild_reproduces_subsequent_verdicts(shards: Any) -> None:
    live = shards("live")
    for offset, (article_id, text) in enumerate(HISTORY):
        assert live.handle(signed(article_id, text), offset)[0] == "new"
    snapshot = dict(live.records)

    restarted = shards("restarted", dict(snapshot))
    assert restarted.count == len({article_id for article_id, _ in HISTORY})
    assert restarted.stage.applied_offset == len(HISTORY) - 1
    assert [a.article_id for a in restarted.state.articles()] == [a.article_id for a in live.state.articles()]

    kinds = []
    for offset, (article_id, text) in enumerate(FUTURE, start=len(HISTORY)):
        item = signed(article_id, text)
        expected = live.handle(item, offset)
        assert restarted.handle(item, offset) == expected, f"{article_id} at offset {offset}"
        assert expected[1] is not None
        kinds.append((expected[1]["verdict"], expected[1]["exact"]))
    assert restarted.records == live.records
    # the sequence does cover the interesting cases
    assert ("duplicate", True) in kinds and ("partial", False) in kinds and ("unique", False) in kinds


def test_a_record_table_of_an_earlier_format_is_refused(shards: Any) -> None:
    live = shards("live")
    live.handle(signed("a", PROSE[0]), 0)
    old_table = {**live.records, ARTICLE_PREFIX + b"old": b"N3\x00\x00\x00\x02{}"}
    with pytest.raises(IncompatibleState, match=r"earlier state format.*NEARDUP_APP_ID"):
        shards("restarted", old_table)


def test_rebuild_on_the_same_directory_wipes_the_derived_index(shards: Any) -> None:
    shard = shards("index")
    for offset, (article_id, text) in enumerate(HISTORY):
        shard.handle(signed(article_id, text), offset)
    shard.records.pop(ARTICLE_PREFIX + b"f")  # the table is the truth: what it lacks is not indexed
    assert shard.stage.replay(shard.records) == len({a for a, _ in HISTORY}) - 1
    assert shard.state.get("f") is None
    status, verdict = shard.handle(signed("f2", PROSE[3]), 100)
    assert status == "new" and verdict is not None and verdict["verdict"] == "unique"


@pytest.mark.parametrize("kind", ["memory", "rocks"])
def test_content_map_passes_to_a_remaining_exact_copy(kind: str, tmp_path: Path) -> None:
    from neardup.state.memory import MemoryState

    state = MemoryState() if kind == "memory" else RocksState(tmp_path / "state")
    try:
        engine = IndexShard(state, PARAMS)
        first = process(engine, "first", PROSE[0])
        process(engine, "copy-1", PROSE[0])
        process(engine, "copy-2", PROSE[0])
        process(engine, "first", PROSE[1])  # the first holder changes; its copies still hold the text
        assert id_for_content(state, first.sketch.content_hash) == "copy-1"
        again = process(engine, "late", PROSE[0])
        assert (again.decision.exact, again.decision.match_id) == (True, "copy-1")
        process(engine, "copy-1", PROSE[2])
        process(engine, "copy-2", PROSE[3])
        assert id_for_content(state, first.sketch.content_hash) == "late"
        process(engine, "late", PROSE[4])
        assert id_for_content(state, first.sketch.content_hash) is None
    finally:
        state.close()


def test_a_rebuild_counts_the_removals_the_record_table_counted(shards: Any) -> None:
    live = shards("live")
    for offset, (article_id, text) in enumerate(HISTORY):
        live.handle(signed(article_id, text), offset)
    deleted_id = HISTORY[0][0]
    src = SRC._replace(offset=next(INPUT_OFFSETS))  # after the records', never a replay
    status, _ = live.handle(SignedDeletion(deleted_id, src), len(HISTORY))
    assert status == "deleted" and live.state.stats().deleted == 1
    restarted = shards("restarted", dict(live.records))
    assert (restarted.state.stats().deleted, restarted.state.stats().expired) == (1, 0)
    assert restarted.state.get(deleted_id) is None


def test_a_rebuild_keeps_the_deleted_ids_versions(shards: Any) -> None:
    """The delete's marker is in the changelog: after a rebuild, a re-added id still continues."""
    live = shards("live")
    live.handle(signed("a", PROSE[0]), 0)
    live.handle(signed("a", PROSE[1]), 1)  # version 1
    src = SRC._replace(offset=next(INPUT_OFFSETS))
    assert live.handle(SignedDeletion("a", src), 2)[0] == "deleted"
    assert ARTICLE_PREFIX + b"a" not in live.records and MARKER_PREFIX + b"a" in live.records
    restarted = shards("restarted", dict(live.records))
    assert restarted.state.deleted_version("a") == 1
    status, verdict = restarted.handle(signed("a", PROSE[1]), 3)
    assert status == "new" and verdict is not None and verdict["version"] == 2
    assert MARKER_PREFIX + b"a" not in restarted.records, "the re-add tombstones the marker"
    again = shards("again", dict(restarted.records))
    assert again.state.deleted_version("a") is None and again.state.get("a") is not None


def test_expiry_removes_deletion_markers_and_tombstones_them() -> None:
    day = 86_400_000
    records = ChangelogTable()
    stage = IndexShard(MemoryState(), PARAMS, Retention(window_ms=2 * day), changelog=records)
    now = 30 * day / 1000

    def at(article_id: str, text: str, time_ms: int) -> Signed:
        return signed(article_id, text)._replace(time_ms=time_ms)

    stage.decide([at("a", PROSE[0], 0), SignedDeletion("a", SRC), at("b", PROSE[1], day)], now=now)
    assert records[MARKER_PREFIX + b"a"] == stage.state.deletion_marker("a")
    stage.decide([at("c", PROSE[2], 3 * day)], now=now)  # the cutoff moves past the deletion (day 0)
    assert stage.state.deleted_version("a") is None and MARKER_PREFIX + b"a" not in records
    [readded] = stage.decide([at("a", PROSE[0], 3 * day)], now=now)
    assert readded.verdict is not None and orjson.loads(readded.verdict)["version"] == 0


def test_a_text_expanding_past_the_limit_is_dead_lettered_oversized() -> None:
    stage = SignStage(PARAMS, 100_000)
    raw = article("heavy", "\ufdfa" * 30_000)  # 90 KB of UTF-8, 540,000 characters after NFKC
    result = stage.handle(raw, None, SRC)
    assert result.reason == "oversized"
    record = orjson.loads(result.dead_letter or b"")
    assert "normalised" in record["detail"] and base64.b64decode(record["value_b64"]) == raw
    assert stage.handle(article("light", "\ufdfa" * 3_000), None, SRC).signed is not None
