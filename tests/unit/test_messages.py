"""neardup.messages: article decoding and validation, verdict and dead-letter records."""

from __future__ import annotations

import base64
import hashlib
import time
import typing

import orjson
import pytest

from neardup.core.dedup import VerdictKind
from neardup.core.params import DedupParams
from neardup.messages import (
    DEAD_LETTER_HEADROOM,
    DEAD_LETTER_MAX_BYTES,
    DEAD_LETTER_REASONS,
    MAX_ID_LENGTH,
    OPTIONAL_STRING_FIELDS,
    VERDICT_KINDS,
    Article,
    DeadLetterReason,
    Deletion,
    InvalidMessage,
    article_from_dict,
    dead_letter_dict,
    decode_article,
    decode_message,
    dumps,
    parse_verdict_filter,
    verdict_dict,
)
from neardup.pipeline.shard import IndexShard
from neardup.state.memory import MemoryState
from tests.support.prose import PROSE
from tests.support.shard import process

LIMIT = 1_000_000


def reject(raw: bytes | None, limit: int = LIMIT) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as info:
        decode_article(raw, limit)
    return info.value


def test_reason_literal_and_tuple_agree() -> None:
    assert typing.get_args(DeadLetterReason) == DEAD_LETTER_REASONS
    assert len(set(DEAD_LETTER_REASONS)) == len(DEAD_LETTER_REASONS)


def test_minimal_article() -> None:
    article = decode_article(b'{"id": "a-1", "text": "Body."}', LIMIT)
    assert article == Article("a-1", "Body.")
    assert all(getattr(article, name) is None for name in OPTIONAL_STRING_FIELDS)


def test_optional_fields_are_carried_and_unknown_ones_ignored() -> None:
    data = {
        "id": "a-1",
        "text": "Body.",
        "title": "Title",
        "url": "https://example.com/a-1",
        "source": "Wire",
        "published_at": "2024-05-30T14:05:00Z",
        "language": "en",
        "tags": ["x"],
        "wordcount": 1,
    }
    article = decode_article(orjson.dumps(data), LIMIT)
    assert article == Article(
        "a-1", "Body.", "Title", "https://example.com/a-1", "Wire", "2024-05-30T14:05:00Z", "en"
    )


def test_unicode_text_round_trips() -> None:
    text = "Zürich — 東京 ✓ \U0001f600"
    assert decode_article(orjson.dumps({"id": "u", "text": text}), LIMIT).text == text


def test_tombstone_is_invalid_json() -> None:
    exc = reject(None)
    assert (exc.reason, exc.detail) == ("invalid_json", "message has no value (tombstone)")


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"not json", b"{'id': 'a'}", b'{"id": "a", "text": "x"} trailing', b"NaN"]
)
def test_invalid_json(raw: bytes) -> None:
    assert reject(raw).reason == "invalid_json"


def test_invalid_utf8_names_the_byte() -> None:
    raw = b'{"id": "a", "text": "ok \xc3\x28"}'
    exc = reject(raw)
    assert exc.reason == "invalid_utf8"
    position = raw.index(b"\xc3")
    assert exc.detail.startswith(f"byte {position}:")


def test_utf8_is_checked_before_json() -> None:
    # not JSON either, but the first problem found is the encoding
    assert reject(b"\xff\xfe garbage").reason == "invalid_utf8"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([1, 2], "object"),
        (3, "object"),
        ("s", "object"),
        (None, "object"),
        ({"text": "t"}, "'id'"),
        ({"id": 5, "text": "t"}, "'id'"),
        ({"id": "", "text": "t"}, "'id'"),
        ({"id": "x" * (MAX_ID_LENGTH + 1), "text": "t"}, "'id'"),
        ({"id": "a"}, "'text'"),
        ({"id": "a", "text": 1.5}, "'text'"),
        ({"id": "a", "text": "t", "title": 1}, "'title'"),
        ({"id": "a", "text": "t", "url": {}}, "'url'"),
        ({"id": "a", "text": "t", "source": []}, "'source'"),
        ({"id": "a", "text": "t", "published_at": 0}, "'published_at'"),
        ({"id": "a", "text": "t", "language": False}, "'language'"),
    ],
)
def test_schema_violations_name_the_field(data: object, field: str) -> None:
    exc = reject(orjson.dumps(data))
    assert exc.reason == "schema_violation"
    assert field in exc.detail
    assert str(exc) == f"schema_violation: {exc.detail}"


def test_violation_after_the_id_names_the_article() -> None:
    exc = reject(b'{"id": "wire-9", "text": "t", "title": 7}')
    assert "'wire-9'" in exc.detail


def test_id_length_bounds() -> None:
    assert decode_article(orjson.dumps({"id": "x" * MAX_ID_LENGTH, "text": "t"}), LIMIT).article_id
    assert decode_article(orjson.dumps({"id": "ü" * MAX_ID_LENGTH, "text": "t"}), LIMIT).article_id


def test_text_limit_counts_utf8_bytes() -> None:
    assert decode_article(orjson.dumps({"id": "a", "text": "é" * 50}), 100).text == "é" * 50
    exc = reject(orjson.dumps({"id": "a", "text": "é" * 51}), 100)
    assert exc.reason == "oversized"
    assert "102 bytes, limit 100" in exc.detail and "'a'" in exc.detail


def test_huge_messages_are_rejected_before_parsing() -> None:
    raw = b"\xff" + b"x" * (100 + 64 * 1024)  # neither UTF-8 nor JSON: the size wins
    exc = reject(raw, 100)
    assert exc.reason == "oversized"
    assert str(len(raw)) in exc.detail


def test_large_metadata_within_the_envelope_is_accepted() -> None:
    data = {"id": "a", "text": "x" * 100, "notes": "n" * 60_000}
    assert decode_article(orjson.dumps(data), 100).text == "x" * 100


def test_article_from_dict_accepts_decoded_data() -> None:
    assert article_from_dict({"id": "a", "text": "t", "title": None}, 10) == Article("a", "t")
    with pytest.raises(InvalidMessage):
        article_from_dict({"id": "a", "text": "t" * 11}, 10)


# --- decode_message: the key ---------------------------------------------------------------------


def reject_keyed(raw: bytes | None, key: bytes | None) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as info:
        decode_message(raw, key, LIMIT)
    return info.value


@pytest.mark.parametrize("key", [b"y", None], ids=["keyed-by-its-id", "no-key"])
def test_a_message_keyed_by_its_id_or_not_keyed_is_decoded(key: bytes | None) -> None:
    assert decode_message(b'{"id": "y", "text": "t"}', key, LIMIT) == Article("y", "t")
    assert decode_message(b'{"id": "y", "deleted": true}', key, LIMIT) == Deletion("y")


def test_a_non_ascii_id_is_compared_in_utf8() -> None:
    raw = orjson.dumps({"id": "café-😀", "text": "t"})
    assert decode_message(raw, "café-😀".encode(), LIMIT).article_id == "café-😀"
    assert reject_keyed(raw, "cafe-😀".encode()).reason == "key_mismatch"


@pytest.mark.parametrize(
    "raw", [b'{"id": "y", "text": "t"}', b'{"id": "y", "deleted": true}'], ids=["article", "deletion"]
)
def test_a_message_keyed_by_another_id_is_a_key_mismatch_naming_both(raw: bytes) -> None:
    exc = reject_keyed(raw, b"x")
    assert exc.reason == "key_mismatch"
    assert "the key 'x' is not the id 'y'" in exc.detail and str(exc) == f"key_mismatch: {exc.detail}"


def test_an_empty_key_is_a_key_and_does_not_match() -> None:
    assert "the key '' is not the id 'y'" in reject_keyed(b'{"id": "y", "text": "t"}', b"").detail


def test_a_key_that_is_not_utf8_is_a_key_mismatch_showing_its_bytes() -> None:
    exc = reject_keyed(b'{"id": "y", "text": "t"}', b"y\xff")
    assert exc.reason == "key_mismatch"
    assert "the key b'y\\xff' (not UTF-8) is not the id 'y'" in exc.detail


def test_a_long_key_is_cut_in_the_detail() -> None:
    key = b"k" * (MAX_ID_LENGTH + 100)
    exc = reject_keyed(b'{"id": "y", "text": "t"}', key)
    assert f"'{'k' * MAX_ID_LENGTH}'… ({len(key)} bytes) is not the id 'y'" in exc.detail


def test_the_value_is_checked_before_the_key() -> None:
    assert reject_keyed(b'{"id": "y", "text": 1}', b"x").reason == "schema_violation"
    assert reject_keyed(b"not json", b"x").reason == "invalid_json"


def test_a_tombstone_is_a_deletion_of_its_key() -> None:
    assert decode_message(None, b"y", LIMIT) == Deletion("y")
    assert reject_keyed(None, b"\xff").reason == "invalid_utf8"
    assert reject_keyed(None, None).reason == "invalid_json"


# --- verdict_dict ---------------------------------------------------------------------------------


def test_verdict_dict_mirrors_the_decision() -> None:
    params = DedupParams()
    engine = IndexShard(MemoryState(), params)
    process(engine, "a", PROSE[0])
    dup = process(engine, "b", PROSE[0] + " One more closing line for the syndicated copy.")
    record = verdict_dict(dup, params, 4.25)
    d = dup.decision
    assert list(record) == [
        "article_id",
        "verdict",
        "match_id",
        "jaccard",
        "containment",
        "contains",
        "canonical_id",
        "exact",
        "version",
        "candidates",
        "params",
        "latency_ms",
    ]
    assert (record["article_id"], record["verdict"], record["match_id"]) == ("b", "duplicate", "a")
    assert (record["jaccard"], record["containment"], record["contains"]) == (
        d.jaccard,
        d.containment,
        d.contains,
    )
    assert record["canonical_id"] == "a" and record["exact"] is False and record["version"] == 0
    assert record["candidates"] == [
        {
            "article_id": c.article_id,
            "jaccard": c.jaccard,
            "containment": c.containment,
            "contains": c.contains,
        }
        for c in d.candidates
    ]
    assert record["params"] == params.audit()
    assert record["latency_ms"] == 4.25
    assert verdict_dict(dup, params)["latency_ms"] is None
    assert orjson.loads(dumps(record)) == record


def test_unique_verdict_has_no_match() -> None:
    params = DedupParams()
    record = verdict_dict(process(IndexShard(MemoryState(), params), "solo", PROSE[2]), params)
    assert record["verdict"] == "unique"
    assert (record["match_id"], record["jaccard"], record["containment"], record["contains"]) == (None,) * 4
    assert record["canonical_id"] == "solo" and record["candidates"] == []


# --- dead_letter_dict -----------------------------------------------------------------------------


def test_dead_letter_round_trips_bytes() -> None:
    original = b'\x00\xff{"id": broken'
    before = time.time()
    record = dead_letter_dict("invalid_utf8", "byte 1", original, "topic", 3, 99, b"\x01key")
    assert base64.b64decode(record["value_b64"]) == original
    assert base64.b64decode(record["key_b64"]) == b"\x01key"
    assert (record["reason"], record["detail"], record["topic"], record["partition"], record["offset"]) == (
        "invalid_utf8",
        "byte 1",
        "topic",
        3,
        99,
    )
    assert before <= record["failed_at"] <= time.time()
    assert orjson.loads(dumps(record)) == record


def test_dead_letter_without_value_or_key() -> None:
    record = dead_letter_dict("invalid_json", "tombstone", None)
    assert record["value_b64"] is None and record["key_b64"] is None
    assert (record["topic"], record["partition"], record["offset"]) == (None, None, None)


def test_empty_bytes_are_not_none() -> None:
    record = dead_letter_dict("invalid_json", "empty", b"", key=b"")
    assert record["value_b64"] == "" and record["key_b64"] == ""


def test_a_dead_letter_too_large_for_the_topic_carries_the_start_of_the_value_and_its_hash() -> None:
    limit = DEAD_LETTER_HEADROOM + 4000
    original = bytes(range(256)) * 20  # 5,120 bytes: 6,828 in base64
    key = b"k" * 100
    record = dead_letter_dict("oversized", "too large", original, "in", 2, 7, key, max_bytes=limit)
    assert record["value_truncated"] is True
    assert record["value_size"] == len(original)
    assert record["value_sha256"] == hashlib.sha256(original).hexdigest()
    kept = base64.b64decode(record["value_b64"], validate=True)
    assert 0 < len(kept) < len(original) and original.startswith(kept)
    # the record and its key fit in the limit less the headroom, and use most of it
    used = len(dumps(record)) + len(key)
    assert limit - DEAD_LETTER_HEADROOM - 8 <= used <= limit - DEAD_LETTER_HEADROOM
    assert (record["topic"], record["partition"], record["offset"]) == ("in", 2, 7)
    assert base64.b64decode(record["key_b64"]) == key


def test_a_dead_letter_that_fits_is_whole_and_unmarked() -> None:
    original = b"x" * 2000
    record = dead_letter_dict("oversized", "too large", original, max_bytes=DEAD_LETTER_HEADROOM + 4000)
    assert base64.b64decode(record["value_b64"]) == original
    assert not {"value_truncated", "value_size", "value_sha256"} & set(record)


def test_a_message_at_the_producer_limit_dead_letters_within_the_topic_limit() -> None:
    """The default limit: the dead-letter topic's max.message.bytes, which a message near the
    input's own limit (the same 8 MB) exceeds by a third once in base64."""
    original = b"{" + b"a" * (DEAD_LETTER_MAX_BYTES - 200)
    record = dead_letter_dict("oversized", "message is too large", original, "in", 0, 1, b"id")
    assert record["value_truncated"] is True and record["value_size"] == len(original)
    assert len(dumps(record)) + 2 <= DEAD_LETTER_MAX_BYTES - DEAD_LETTER_HEADROOM


def test_the_verdict_filter_knows_the_engine_kinds() -> None:
    assert set(VERDICT_KINDS) == set(typing.get_args(VerdictKind))
    assert parse_verdict_filter("unique") == {"unique"}
    assert parse_verdict_filter(" unique , partial ") == {"unique", "partial"}
    assert parse_verdict_filter(",".join(VERDICT_KINDS)) == set(VERDICT_KINDS)
    assert parse_verdict_filter("partial,partial") == {"partial"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names no verdict kind"),
        (" , ", "names no verdict kind"),
        ("unique,,partial", "empty entry"),
        ("unique,duplicates", "unknown verdict kind 'duplicates'"),
        ("Unique", "unknown verdict kind 'Unique'"),
    ],
)
def test_a_bad_verdict_filter_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_verdict_filter(text)
    assert all(kind in str(info.value) for kind in VERDICT_KINDS)
