"""neardup.open / Deduplicator: the library API decides as `neardup dedup` does, continues a state
directory, deletes, and refuses bad input with InvalidMessage and its reason."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

import neardup
from neardup import cli
from neardup.embedded import DECIDE_BATCH
from tests.support.prose import PROSE

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "service" / "data" / "sample_news.jsonl"
LINES = SAMPLE.read_bytes().splitlines()
VERDICT_SCHEMA = Draft202012Validator(json.loads((REPO / "schemas" / "verdict.schema.json").read_text()))


def dedup_cli(lines: list[bytes], tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """The verdicts `neardup dedup` writes for these lines."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    assert cli.main(["dedup", str(source), "-o", str(out), "-q", *args]) == 0
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def without_size(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats without bytes_on_disk, which changes as RocksDB flushes and compacts."""
    return {k: v for k, v in stats.items() if k != "bytes_on_disk"}


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return dedup_cli(LINES, tmp_path_factory.mktemp("cli"))


def test_verdicts_on_the_sample_equal_neardup_dedup(expected: list[dict[str, Any]]) -> None:
    with neardup.open() as dedup:
        verdicts = list(dedup.check_many(orjson.loads(line) for line in LINES))
    assert len(verdicts) == len(LINES) == len(expected)
    assert Counter(v["verdict"] for v in verdicts).keys() >= {"unique", "duplicate", "partial"}
    assert verdicts == expected  # latency_ms is None in both
    for verdict in verdicts[:50]:
        VERDICT_SCHEMA.validate(verdict)


def test_every_input_form_gives_the_same_verdicts(expected: list[dict[str, Any]]) -> None:
    """Dicts, JSON lines (bytes and str) and Article values, mixed."""

    def form(i: int, line: bytes) -> neardup.ArticleInput:
        data = orjson.loads(line)
        return [
            data,
            line,
            line.decode() + "\n",
            neardup.Article(data["id"], data["text"], title=data.get("title"), source=data.get("source")),
        ][i % 4]

    with neardup.open() as dedup:
        verdicts = [dedup.check(form(i, line)) for i, line in enumerate(LINES)]
    assert [v["verdict"] for v in verdicts] == [v["verdict"] for v in expected]
    assert [v["match_id"] for v in verdicts] == [v["match_id"] for v in expected]


def test_reopening_a_state_dir_continues_it(expected: list[dict[str, Any]], tmp_path: Path) -> None:
    half = len(LINES) // 2
    state = tmp_path / "state"
    with neardup.open(state) as dedup:
        first = [dedup.check(line) for line in LINES[:half]]
        written = dedup.stats()
    with neardup.open(state) as dedup:
        reopened = dedup.stats()
        second = [dedup.check(line) for line in LINES[half:]]
        again = dedup.check(LINES[0])  # a re-delivery gets its stored verdict
        final = dedup.stats()
    assert first + second == expected
    assert again == expected[0]
    assert without_size(reopened) == without_size(written) and written["articles"] == half
    assert final["articles"] == len(LINES)


def test_the_command_line_continues_a_state_the_library_wrote(
    expected: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = len(LINES) // 2
    state = tmp_path / "state"
    with neardup.open(state) as dedup:
        first = list(dedup.check_many(LINES[:half]))
    second = dedup_cli(LINES[half:], tmp_path, "--state", str(state))
    assert first + second == expected
    assert cli.main(["stats", "--state", str(state), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])
    with neardup.open(state) as dedup:
        assert without_size(dedup.stats()) == without_size(stats)


def test_reopening_with_other_signing_parameters_is_refused(tmp_path: Path) -> None:
    neardup.open(tmp_path / "state").close()
    with pytest.raises(neardup.IncompatibleState):
        neardup.open(tmp_path / "state", num_perm=64, verify_perm=256)
    with neardup.open(tmp_path / "state", threshold=0.9) as dedup:  # verdict thresholds may change
        assert dedup.check(LINES[0])["params"]["threshold"] == 0.9


def test_a_state_dir_has_one_writer(tmp_path: Path) -> None:
    with neardup.open(tmp_path / "state"), pytest.raises(neardup.StateError):
        neardup.open(tmp_path / "state")


def test_delete_takes_an_article_out_of_the_index() -> None:
    original, copy = PROSE[0], PROSE[0] + " Copyright 2011 The Associated Press."
    with neardup.open() as dedup:
        assert dedup.check({"id": "a", "text": original})["verdict"] == "unique"
        assert dedup.check({"id": "b", "text": copy})["match_id"] == "a"
        assert dedup.delete("a") is True
        assert dedup.delete("a") is False  # no longer held
        assert dedup.delete("never-seen") is False
        assert dedup.check({"id": "c", "text": copy + " More."})["match_id"] == "b"
        assert dedup.delete("b") and dedup.delete("c")
        assert dedup.check({"id": "d", "text": original})["verdict"] == "unique"
        stats = dedup.stats()
    assert stats["articles"] == 1 and stats["deleted"] == 3


def test_a_re_added_id_continues_its_versions() -> None:
    with neardup.open() as dedup:
        assert dedup.check({"id": "a", "text": PROSE[0]})["version"] == 0
        assert dedup.delete("a") is True
        assert dedup.check({"id": "a", "text": PROSE[0]})["version"] == 1


def test_retention_expires_old_articles() -> None:
    now = datetime.now(UTC)
    old, recent = (now - timedelta(days=10)).isoformat(), now.isoformat()
    with neardup.open(retention="1d") as dedup:
        dedup.check({"id": "old", "text": PROSE[0], "published_at": old})
        verdict = dedup.check({"id": "new", "text": PROSE[0], "published_at": recent})
        stats = dedup.stats()
    assert verdict["verdict"] == "unique"  # the old copy is outside the window: no match, expired
    assert stats["expired"] == 1 and stats["articles"] == 1


@pytest.mark.parametrize(
    ("article", "reason"),
    [
        ({"id": "x"}, "schema_violation"),
        ({"text": "no id"}, "schema_violation"),
        ({"id": "", "text": "empty id"}, "schema_violation"),
        ({"id": "x", "text": 17}, "schema_violation"),
        ({"id": "x", "text": "t", "published_at": 1}, "schema_violation"),
        ({"id": "x", "deleted": True}, "schema_violation"),
        (["x", "text"], "schema_violation"),
        (None, "schema_violation"),
        (neardup.Article("x", None), "schema_violation"),  # type: ignore[arg-type]
        ({"id": "x", "text": "a" * 101}, "oversized"),
        ({"id": "x", "text": " \n\t "}, "empty_text"),
        (b'{"id": "x", "text": "cut', "invalid_json"),
        ("", "invalid_json"),
        (b'{"id": "x", "text": "caf\xe9"}', "invalid_utf8"),
    ],
)
def test_bad_input_raises_invalid_message(article: Any, reason: str) -> None:
    with neardup.open(max_text_bytes=100) as dedup:
        with pytest.raises(neardup.InvalidMessage) as caught:
            dedup.check(article)
        assert caught.value.reason == reason
        assert str(caught.value).startswith(reason)
        assert dedup.stats()["articles"] == 0
        assert dedup.check({"id": "x", "text": "still usable"})["verdict"] == "unique"


def test_check_many_is_lazy_and_stops_at_bad_input() -> None:
    with neardup.open() as dedup:
        articles = [{"id": "a", "text": PROSE[0]}, {"id": "b"}, {"id": "c", "text": PROSE[1]}]
        verdicts = dedup.check_many(articles)
        assert dedup.stats()["articles"] == 0
        assert next(verdicts)["article_id"] == "a"
        with pytest.raises(neardup.InvalidMessage):
            next(verdicts)
        assert dedup.stats()["articles"] == 1


@pytest.mark.parametrize(
    "article",
    [
        {"id": "a\ud800", "text": PROSE[0]},
        {"id": "a", "text": PROSE[0] + "\udfff"},
        neardup.Article("a\ud800", PROSE[0]),
        '{"id": "a\ud800", "text": "text"}',
    ],
    ids=["id", "text", "Article", "json"],
)
def test_a_lone_surrogate_is_refused_as_invalid_utf8(article: Any) -> None:
    """Only a caller in process can pass one (a message on the topic is decoded from UTF-8): it is
    refused as the worker refuses bytes that are not UTF-8, not with a UnicodeEncodeError."""
    with neardup.open() as dedup:
        with pytest.raises(neardup.InvalidMessage) as caught:
            dedup.check(article)
        assert caught.value.reason == "invalid_utf8"
        assert dedup.stats()["articles"] == 0


@pytest.mark.parametrize(
    ("article_id", "reason"),
    [
        (123, "schema_violation"),
        (None, "schema_violation"),
        ("", "schema_violation"),
        (["a"], "schema_violation"),
        ("x" * 10_000_000, "schema_violation"),
        ("a\ud800", "invalid_utf8"),
    ],
    ids=["int", "None", "empty", "list", "10 MB", "surrogate"],
)
def test_delete_refuses_what_the_worker_refuses(article_id: Any, reason: str) -> None:
    with neardup.open() as dedup:
        dedup.check({"id": "a", "text": PROSE[0]})
        with pytest.raises(neardup.InvalidMessage) as caught:
            dedup.delete(article_id)
        assert caught.value.reason == reason
        assert len(str(caught.value)) < 1_000  # the detail names the field, not the whole id
        assert dedup.stats()["articles"] == 1 and dedup.stats()["deleted"] == 0


def test_check_many_decides_the_articles_before_a_bad_one() -> None:
    articles = [{"id": "a", "text": PROSE[0]}, {"id": "b", "text": PROSE[0]}, {"id": "c\ud800", "text": "t"}]
    with neardup.open() as dedup:
        verdicts = []
        with pytest.raises(neardup.InvalidMessage) as caught:
            for verdict in dedup.check_many(articles):
                verdicts.append(verdict)
        assert caught.value.reason == "invalid_utf8"
        assert [(v["article_id"], v["verdict"]) for v in verdicts] == [("a", "unique"), ("b", "duplicate")]
        assert dedup.stats()["articles"] == 2


def test_invalid_message_is_a_neardup_error() -> None:
    with neardup.open() as dedup:
        with pytest.raises(neardup.Error) as caught:
            dedup.check({"id": "x"})
        assert isinstance(caught.value, neardup.InvalidMessage)
        with pytest.raises(neardup.Error):
            dedup.delete(123)  # type: ignore[arg-type]


def test_settings_reach_the_engine() -> None:
    with neardup.open(threshold=0.95, containment_threshold=None, num_perm=64, verify_perm=256) as dedup:
        params = dedup.check({"id": "a", "text": PROSE[0]})["params"]
    assert (params["threshold"], params["containment_threshold"], params["num_perm"]) == (0.95, None, 64)
    with pytest.raises(TypeError, match="threshhold"):
        neardup.open(threshhold=0.9)
    with pytest.raises(ValueError, match="duration"):
        neardup.open(retention="a month")


def test_a_closed_deduplicator_refuses_work(tmp_path: Path) -> None:
    dedup = neardup.open(tmp_path / "state")
    dedup.close()
    dedup.close()  # closing again does nothing
    with pytest.raises(ValueError, match="closed"):
        dedup.check({"id": "a", "text": PROSE[0]})
    with neardup.open(tmp_path / "state") as reopened:  # the lock was released
        assert reopened.stats()["articles"] == 0


def test_check_many_signs_one_batch_ahead_and_reads_nothing_past_a_bad_article() -> None:
    """While a batch is decided the next one is read and signed (its compiled passes on a thread of
    their own): the first verdict comes once two batches are read. A bad article stops the reading
    there: the articles before it are decided, nothing after it is read."""
    read: list[int] = []

    def articles(bad_at: int | None) -> Iterator[dict[str, str]]:
        for n in range(100):
            read.append(n)
            yield {"id": f"a{n}", "text": "" if n == bad_at else f"{PROSE[n % len(PROSE)]} Edition {n}."}

    with neardup.open() as dedup:
        verdicts = dedup.check_many(articles(None))
        assert next(verdicts)["article_id"] == "a0" and len(read) == 2 * DECIDE_BATCH
        assert [v["article_id"] for v in verdicts] == [f"a{n}" for n in range(1, 100)]
    read.clear()
    with neardup.open() as dedup:
        verdicts = dedup.check_many(articles(40))
        decided = []
        with pytest.raises(neardup.InvalidMessage) as caught:
            decided.extend(v["article_id"] for v in verdicts)
        assert caught.value.reason == "empty_text" and "a40" in str(caught.value)
        assert decided == [f"a{n}" for n in range(40)] and len(read) == 2 * DECIDE_BATCH
        assert dedup.stats()["articles"] == 40


def test_check_many_decides_no_further_batch_once_closed() -> None:
    articles = [{"id": f"a{n}", "text": f"{PROSE[n % len(PROSE)]} Edition {n}."} for n in range(40)]
    dedup = neardup.open()
    verdicts = dedup.check_many(articles)
    first = [next(verdicts) for _ in range(32)]  # the first batch
    assert [v["article_id"] for v in first] == [f"a{n}" for n in range(32)]
    dedup.close()
    with pytest.raises(ValueError, match="closed"):
        next(verdicts)


def test_each_run_is_started_before_the_one_before_is_handed_on() -> None:
    """started_ahead, which check_many and neardup dedup's signing in process share: item n+1 is
    started before item n is handed on, and nothing is started after a last one."""
    from neardup.state.index import started_ahead

    events: list[str] = []

    def start(n: int) -> int:
        events.append(f"start {n}")
        return n

    for n in started_ahead(range(5), start, last=lambda n: n == 3):
        events.append(f"finish {n}")
    assert events == [
        "start 0",
        "start 1",
        "finish 0",
        "start 2",
        "finish 1",
        "start 3",
        "finish 2",
        "finish 3",
    ]
    assert list(started_ahead([], start)) == [] and list(started_ahead([7], start)) == [7]
