"""The input rules: a refused event time never moves the index's time, event times have a lower
bound, a text of only invisible characters is empty, and the worker refuses unkeyed records."""

from __future__ import annotations

import asyncio
import base64
import itertools
import unicodedata
from pathlib import Path
from typing import Any

import orjson
import pytest

import neardup
from neardup import cli
from neardup.config import ConfigError, Settings
from neardup.core.normalize import DEFAULT_IGNORABLE, INVISIBLE_CATEGORIES, is_visible
from neardup.core.params import DedupParams
from neardup.core.retention import Retention, parse_duration_ms, parse_rfc3339_ms
from neardup.core.shingle import ShingleOptions
from neardup.core.signing import EmptyText, sketch_of
from neardup.messages import DEAD_LETTER_REASONS, InvalidMessage, decode_message
from neardup.pipeline.shard import ARTICLE_PREFIX, IndexShard
from neardup.pipeline.sign import SignStage
from neardup.pipeline.signer import Signer
from neardup.pipeline.wire import Provenance, Signed, decode_signed
from neardup.state.memory import MemoryState
from neardup.state.records import decode_record
from neardup.stream.metrics import Metrics
from tests.support.changelog import compacted
from tests.support.prose import PROSE

PARAMS = DedupParams()
WINDOW = Retention(parse_duration_ms("30d"))
DAY_MS = 86_400_000
TOPIC = Provenance("neardup-articles", 0, 7, None)
OFFSETS = itertools.count()  # each input offset once: the shard takes one seen again for a replay


def article(article_id: str, text: str, published_at: str | None = None) -> dict[str, Any]:
    return {"id": article_id, "text": text, "published_at": published_at}


def backfill(refused_at: str) -> list[dict[str, Any]]:
    """January–February 2026 news: an original, a copy of it 10 days later, and between them one
    article whose time is refused."""
    return [
        article("original", PROSE[0], "2026-01-05T08:00:00Z"),
        article("other", PROSE[1], "2026-01-10T08:00:00Z"),
        article("refused", PROSE[2], refused_at),
        article("copy", PROSE[0] + " Updated.", "2026-01-15T08:00:00Z"),
        article("late", PROSE[3], "2026-02-20T08:00:00Z"),
    ]


# --- a refused time is taken as the newest accepted one -------------------------------------------


@pytest.mark.parametrize("refused_at", ["2099-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "not a date"])
def test_a_refused_time_does_not_move_the_librarys_index_time(refused_at: str) -> None:
    with neardup.open(retention="30d") as dedup:
        verdicts = {a["id"]: dedup.check(a) for a in backfill(refused_at)}
        stats = dedup.stats()
    assert verdicts["copy"]["verdict"] == "duplicate" and verdicts["copy"]["match_id"] == "original"
    # the February article expires January's, the refused one with them: it took January's time
    assert stats["expired"] == 4 and stats["newest_ms"] == parse_rfc3339_ms("2026-02-20T08:00:00Z")


def test_a_refused_time_does_not_collapse_a_backfill_in_neardup_dedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in backfill("2099-01-01T00:00:00Z")))
    assert (
        cli.main(["dedup", str(source), "-o", str(out), "--retention", "30d", "--state", str(tmp_path / "s")])
        == 0
    )
    verdicts = {v["article_id"]: v for v in map(orjson.loads, out.read_bytes().splitlines())}
    assert verdicts["copy"]["verdict"] == "duplicate"
    summary = capsys.readouterr()
    assert "refused_times=1" in summary.out + summary.err
    assert "expired=2" not in summary.out + summary.err


def signed(
    stage: SignStage, article_id: str, text: str, published_at: str | None, stamp: int | None
) -> Signed:
    src = Provenance("neardup-articles", 0, next(OFFSETS), stamp)
    result = stage.handle(orjson.dumps(article(article_id, text, published_at)), article_id.encode(), src)
    assert result.signed is not None
    item = decode_signed(result.signed)
    assert isinstance(item, Signed)
    return item


def test_the_shard_times_a_refused_article_by_its_newest_time_and_a_replay_repeats_it() -> None:
    """The worker's path: a refused published_at, or a record timestamp ahead, is taken as the
    newest time the shard holds; before it holds one, as the signer's fallback. The changelog's
    record carries the time taken, so a rebuild from it gives the same index."""
    now_ms = parse_rfc3339_ms("2026-12-01T00:00:00Z")
    assert now_ms is not None
    stage = SignStage.under(PARAMS, 1 << 20, WINDOW, keyed=True)
    writes: list[tuple[bytes, bytes | None]] = []
    shard = IndexShard(MemoryState(), PARAMS, WINDOW, writes)
    first = signed(stage, "first", PROSE[4], "2099-01-01T00:00:00Z", now_ms - DAY_MS)
    items = [
        first,
        signed(stage, "jan", PROSE[0], "2026-01-05T08:00:00Z", now_ms),
        signed(stage, "ahead", PROSE[1], None, now_ms + 365 * DAY_MS),  # a record time ahead
        signed(stage, "year-one", PROSE[2], "0001-01-01T00:00:00Z", now_ms),
    ]
    assert [item.refused_time for item in items] == [True, False, True, True]
    assert first.time_ms == now_ms - DAY_MS  # nothing held yet: its record timestamp
    results = shard.decide(items, offset=0, now=now_ms / 1000)
    assert all(r.verdict is not None for r in results), [r.error for r in results]
    held = [shard.state.get(item.article_id) for item in items]
    times = {article.article_id: article.time_ms for article in held if article is not None}
    assert times == {
        "first": now_ms - DAY_MS,
        "jan": times["jan"],
        "ahead": now_ms - DAY_MS,
        "year-one": now_ms - DAY_MS,
    }
    assert shard.counts.refused_times == 3

    fresh = IndexShard(MemoryState(), PARAMS, WINDOW)
    later = [signed(stage, "jan", PROSE[0], "2026-01-05T08:00:00Z", now_ms)]
    later += [signed(stage, "refused", PROSE[1], "2099-01-01T00:00:00Z", now_ms)]
    later += [signed(stage, "copy", PROSE[0] + " Updated.", "2026-01-15T08:00:00Z", now_ms)]
    decided = fresh.decide(later, now=now_ms / 1000)
    jan_ms = parse_rfc3339_ms("2026-01-05T08:00:00Z")
    assert decided[1].status == "new" and fresh.state.get("refused").time_ms == jan_ms  # type: ignore[union-attr]
    assert decided[2].kind == "duplicate"

    rebuilt = IndexShard(MemoryState(), PARAMS, WINDOW, [])
    changelog = compacted(writes)
    rebuilt.replay(changelog)
    for key, record in changelog.items():
        if key.startswith(ARTICLE_PREFIX):
            stored = decode_record(record)
            assert times[stored.article_id] == stored.time_ms
            held = rebuilt.state.get(stored.article_id)
            assert held is not None and held.time_ms == stored.time_ms


def test_embedded_mode_with_helpers_takes_a_refused_time_as_the_newest(tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in backfill("0001-01-01T00:00:00Z")))
    argv = ["dedup", str(source), "-o", str(out), "-q", "--retention", "30d", "--sign-processes", "1"]
    assert cli.main([*argv, "--state", str(tmp_path / "s")]) == 0
    verdicts = {v["article_id"]: v for v in map(orjson.loads, out.read_bytes().splitlines())}
    assert verdicts["copy"]["verdict"] == "duplicate"


# --- the earliest event time ----------------------------------------------------------------------


def test_a_published_at_of_year_one_is_refused_and_counted() -> None:
    stage = SignStage.under(PARAMS, 1 << 20, Settings().retention_window(), keyed=True)
    raw = orjson.dumps(article("old", PROSE[0], "0001-01-01T00:00:00Z"))
    result = stage.handle(raw, b"old", Provenance("in", 0, 0, 1_780_000_000_000))
    assert result.refused_time and result.signed is not None
    epoch = stage.handle(orjson.dumps(article("e", PROSE[0], "1970-01-01T00:00:00Z")), b"e", TOPIC)
    assert not epoch.refused_time


def test_a_record_timestamp_before_the_earliest_is_refused() -> None:
    stage = SignStage.under(
        PARAMS, 1 << 20, Retention(earliest_ms=parse_rfc3339_ms("2000-01-01T00:00:00Z") or 0)
    )
    item = signed(stage, "a", PROSE[0], None, parse_rfc3339_ms("1999-06-01T00:00:00Z"))
    assert item.refused_time


def test_year_one_no_longer_expires_a_later_copy_at_once() -> None:
    with neardup.open(retention="30d") as dedup:
        dedup.check(article("now", PROSE[1], "2026-11-01T00:00:00Z"))
        dedup.check(article("zero", PROSE[0], "0001-01-01T00:00:00Z"))
        copy = dedup.check(article("copy", PROSE[0] + " Updated.", "2026-11-02T00:00:00Z"))
        assert dedup.stats()["expired"] == 0
    assert copy["verdict"] == "duplicate" and copy["match_id"] == "zero"


def test_the_earliest_event_time_is_a_setting_in_every_mode_that_times(tmp_path: Path) -> None:
    old = article("old", PROSE[0], "1950-06-01T00:00:00Z")
    with neardup.open(min_event_time="1900-01-01T00:00:00Z") as dedup:
        dedup.check(old)
        assert dedup.stats()["newest_ms"] == parse_rfc3339_ms("1950-06-01T00:00:00Z")
    with neardup.open() as dedup:
        dedup.check(old)
        assert dedup.stats()["newest_ms"] != parse_rfc3339_ms("1950-06-01T00:00:00Z")
    settings = Settings.from_env({"NEARDUP_MIN_EVENT_TIME": "1900-01-01T00:00:00+01:00"})
    assert settings.retention_window().earliest_ms == parse_rfc3339_ms("1900-01-01T00:00:00+01:00")
    assert Settings().retention_window().earliest_ms == 0
    with pytest.raises(ConfigError, match="NEARDUP_MIN_EVENT_TIME: not an RFC 3339 date-time"):
        Settings.from_env({"NEARDUP_MIN_EVENT_TIME": "1900"})


async def _sign_in_helper(stage: SignStage, raw: bytes, key: bytes | None) -> Any:
    signer = Signer(stage, processes=1)
    try:
        [result] = await signer.sign([(raw, key, TOPIC)])
    finally:
        signer.close()
    return result


def test_signing_helpers_take_the_earliest_time_and_the_key_rule() -> None:
    stage = SignStage.under(PARAMS, 1 << 20, Settings().retention_window(), keyed=True)
    raw = orjson.dumps(article("old", PROSE[0], "0001-01-01T00:00:00Z"))
    assert asyncio.run(_sign_in_helper(stage, raw, b"old")).refused_time
    assert asyncio.run(_sign_in_helper(stage, raw, None)).reason == "unkeyed"


# --- a text of only invisible characters is empty -------------------------------------------------

INVISIBLE = [
    "\x00" * 40,
    "\x00\x01\x7f\x9f",
    "\u200b\u200c\u200d\u2060\ufeff",
    "\u00ad\u034f\u061c\u180e",
    "\u3164\u115f\u1160\uffa0",  # Hangul fillers: letters by category, default-ignorable
    "\ue000\U000f0000",  # private use
    "\u0378\U0010fffe",  # unassigned
    "\u0301\u20dd\u0903",  # combining marks
    "\u2028\u2029\u00a0\u3000",  # separators
    "\U000e0041\U000e007f\U000e0100",  # tags, variation selectors
    "\u00a8",  # NFKC: a space and a combining diaeresis
    "\u200b" * 5000,
]
VISIBLE = ["a", "\x00!", "\u200b" * 5000 + "字", "\u0301e", "\u3164x", "…"]


@pytest.mark.parametrize("unit", ["char", "word"])
def test_a_text_of_only_invisible_characters_is_empty(unit: str) -> None:
    params = DedupParams(shingle=ShingleOptions(5 if unit == "char" else 2, unit))  # type: ignore[arg-type]
    for text in INVISIBLE:
        with pytest.raises(EmptyText):
            sketch_of(text, params)
    for text in VISIBLE:
        sketch_of(text, params)


@pytest.mark.parametrize("text", INVISIBLE[:3])
def test_invisible_texts_are_dead_lettered_as_empty_text_everywhere(text: str, tmp_path: Path) -> None:
    raw = orjson.dumps(article("junk", text))
    result = SignStage(PARAMS, 1 << 20, keyed=True).handle(raw, b"junk", TOPIC)
    assert result.reason == "empty_text" and result.dead_letter is not None
    assert base64.b64decode(orjson.loads(result.dead_letter)["value_b64"]) == raw
    with neardup.open() as dedup, pytest.raises(InvalidMessage) as info:
        dedup.check(article("junk", text))
    assert info.value.reason == "empty_text"


def test_the_default_ignorable_table_is_ordered_and_beyond_the_categories() -> None:
    assert all(low <= high for low, high in DEFAULT_IGNORABLE)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(DEFAULT_IGNORABLE))
    # the fillers are letters by category: only the table makes them invisible
    fillers = [0x115F, 0x1160, 0x3164, 0xFFA0]
    assert {unicodedata.category(chr(p)) for p in fillers} == {"Lo"} and not any(map(is_visible, fillers))
    assert "Lo" not in INVISIBLE_CATEGORIES and is_visible(ord("a")) and is_visible(0x4E00)


# --- unkeyed records ------------------------------------------------------------------------------


def test_the_worker_dead_letters_an_unkeyed_record_with_its_bytes() -> None:
    raw = orjson.dumps(article("a", PROSE[0]))
    result = SignStage(PARAMS, 1 << 20, keyed=True).handle(raw, None, TOPIC)
    assert result.reason == "unkeyed" and result.dead_letter is not None
    letter = orjson.loads(result.dead_letter)
    assert letter["key_b64"] is None and base64.b64decode(letter["value_b64"]) == raw
    assert "has no key: produce it keyed by its id" in letter["detail"]
    deletion = orjson.dumps({"id": "a", "deleted": True})
    assert SignStage(PARAMS, 1 << 20, keyed=True).handle(deletion, None, TOPIC).reason == "unkeyed"


def test_a_bad_value_keeps_its_own_reason_without_a_key() -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_message(b'{"id": "a"}', None, 1000, keyed=True)
    assert info.value.reason == "schema_violation"


def test_embedded_mode_and_the_library_take_messages_without_keys() -> None:
    raw = orjson.dumps(article("a", PROSE[0]))
    assert SignStage(PARAMS, 1 << 20).handle(raw, None, Provenance("file.jsonl", None, 1, None)).signed
    with neardup.open() as dedup:
        assert dedup.check(raw)["verdict"] == "unique"


def test_unkeyed_is_a_reason_of_the_dead_letter_metric() -> None:
    assert "unkeyed" in DEAD_LETTER_REASONS
    sample = Metrics().registry.get_sample_value("neardup_dead_letters_total", {"reason": "unkeyed"})
    assert sample == 0.0
