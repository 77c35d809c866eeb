"""Embedded mode: a JSON-lines file through the engine, dead letters, and resuming after a crash."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import orjson
import pytest

from neardup import cli, embedded
from neardup.config import ConfigError
from neardup.core.params import DedupParams
from neardup.core.retention import Retention, parse_rfc3339_ms
from neardup.embedded import run_file
from neardup.state.memory import MemoryState
from neardup.state.port import StateStore
from neardup.state.rocks import RocksOptions, RocksState
from neardup.stream.commands import worker_settings

PARAMS = DedupParams()
FOOTER = " Copyright 2011 The Associated Press. All rights reserved."

AS_EMBEDDED = RocksOptions(hold_families=True)  # the state `neardup dedup --state` creates


def article(article_id: str, text: str, **extra: str) -> bytes:
    return orjson.dumps({"id": article_id, "text": text, **extra})


def corpus_lines(prose: tuple[str, ...]) -> list[bytes]:
    """Valid articles and bad lines interleaved, each line ending in a newline."""
    lines = [
        article("a0", prose[0], title="Romo weds", source="wire"),
        article("a1", prose[1]),
        b'{"id": "bad-utf8", "text": "caf\xe9 au lait \xff"}',
        article("a2", prose[0] + FOOTER),
        b"",  # blank lines are skipped
        b'{"id": "cut", "text": "the json ends',
        article("a3", prose[2]),
        article("a4", prose[0]),
        b'{"id": 17, "text": "id is not a string"}',
        article("a5", "   \n\t  "),
        article("a6", prose[3][: len(prose[3]) * 6 // 10]),
        article("a7", prose[3]),
        article("a1", prose[1] + FOOTER),  # a new version of a1
        b"[1, 2, 3]",
        article("a8", prose[4]) + b"\r",  # CRLF line end
        article("a0", prose[0]),  # re-delivery
        article("a9", prose[3][len(prose[3]) // 3 :]),
    ]
    return [line + b"\n" for line in lines]


VALID_IDS = ["a0", "a1", "a2", "a3", "a4", "a6", "a7", "a1", "a8", "a0", "a9"]
DEAD_REASONS = ["invalid_utf8", "invalid_json", "schema_violation", "empty_text", "schema_violation"]


def read_jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def dead_without_time(path: Path) -> list[dict]:
    """Dead letters without the fields that differ between runs: time, and the input's directory."""
    return [{k: v for k, v in d.items() if k not in ("failed_at", "topic")} for d in read_jsonl(path)]


def die_at_checkpoint(state: RocksState, crash_at: int) -> None:
    """The state's `crash_at`-th progress checkpoint raises Crash: the process dies just before it."""
    checkpoint = state.set_meta
    calls = 0

    def dying_set_meta(values: dict[bytes, bytes]) -> None:
        nonlocal calls
        calls += 1
        if calls == crash_at:
            raise Crash
        checkpoint(values)

    state.set_meta = dying_set_meta  # type: ignore[method-assign]


def run(
    tmp: Path, lines: list[bytes], state: StateStore, name: str = "in.jsonl", batch: int = 1
) -> embedded.RunSummary:
    """`batch`: lines decided and checkpointed together (one: a checkpoint per line)."""
    source = tmp / name
    source.write_bytes(b"".join(lines))
    return run_file(source, tmp / "out.jsonl", state, PARAMS, decide_batch=batch)


@pytest.fixture
def reference(tmp_path: Path, prose: tuple[str, ...]) -> tuple[bytes, list[dict]]:
    """Output and dead letters of one uninterrupted in-memory run over the whole corpus."""
    ref = tmp_path / "reference"
    ref.mkdir()
    run(ref, corpus_lines(prose), MemoryState())
    return (ref / "out.jsonl").read_bytes(), dead_without_time(ref / "out.jsonl.dead.jsonl")


def test_one_verdict_per_valid_article_in_input_order(tmp_path: Path, prose: tuple[str, ...]) -> None:
    lines = corpus_lines(prose)
    summary = run(tmp_path, lines, MemoryState())
    verdicts = read_jsonl(tmp_path / "out.jsonl")
    assert [v["article_id"] for v in verdicts] == VALID_IDS
    by_position = {i: v for i, v in enumerate(verdicts)}
    assert by_position[0]["verdict"] == "unique"
    assert (by_position[2]["verdict"], by_position[2]["match_id"]) == ("duplicate", "a0")
    assert (by_position[4]["verdict"], by_position[4]["exact"], by_position[4]["match_id"]) == (
        "duplicate",
        True,
        "a0",
    )
    assert by_position[5]["verdict"] == "unique"  # a6 (head of a7) comes first
    assert (by_position[6]["verdict"], by_position[6]["match_id"]) == ("partial", "a6")
    assert by_position[7]["version"] == 1
    assert by_position[9] == by_position[0]  # re-delivery repeats the verdict
    assert all(v["params"]["bands"] == PARAMS.lsh.bands for v in verdicts)
    assert summary.articles == len(VALID_IDS) + len(DEAD_REASONS)
    assert sum(summary.verdicts.values()) == len(VALID_IDS)
    assert sum(summary.dead_letters.values()) == len(DEAD_REASONS)
    assert "articles=16" in summary.render()


def test_dead_letters_keep_reason_and_original_bytes(tmp_path: Path, prose: tuple[str, ...]) -> None:
    lines = corpus_lines(prose)
    run(tmp_path, lines, MemoryState())
    dead = read_jsonl(tmp_path / "out.jsonl.dead.jsonl")
    assert [d["reason"] for d in dead] == DEAD_REASONS
    originals = [base64.b64decode(d["value_b64"]) for d in dead]
    assert originals[0] == b'{"id": "bad-utf8", "text": "caf\xe9 au lait \xff"}'
    for original, d in zip(originals, dead, strict=True):
        line_no = d["offset"]
        assert lines[line_no - 1].rstrip(b"\r\n") == original
        assert d["topic"].endswith("in.jsonl") and d["detail"]


def test_oversized_text_is_a_dead_letter(tmp_path: Path, prose: tuple[str, ...]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(article("small", prose[4]) + b"\n" + article("big", prose[0] * 10) + b"\n")
    dead_path = tmp_path / "rejected.jsonl"
    summary = run_file(
        source, tmp_path / "out.jsonl", MemoryState(), PARAMS, dead_letter_path=dead_path, max_text_bytes=5000
    )
    assert [v["article_id"] for v in read_jsonl(tmp_path / "out.jsonl")] == ["small"]
    assert [d["reason"] for d in read_jsonl(dead_path)] == ["oversized"]
    assert summary.dead_letters["oversized"] == 1


def test_rocks_state_gives_the_same_output(tmp_path: Path, prose: tuple[str, ...], reference) -> None:
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run(tmp_path, corpus_lines(prose), state)
    finally:
        state.close()
    assert (tmp_path / "out.jsonl").read_bytes() == reference[0]
    assert dead_without_time(tmp_path / "out.jsonl.dead.jsonl") == reference[1]


def test_rerun_on_a_finished_file_changes_nothing(tmp_path: Path, prose: tuple[str, ...], reference) -> None:
    for _ in range(2):
        state = RocksState(tmp_path / "state", AS_EMBEDDED)
        try:
            summary = run(tmp_path, corpus_lines(prose), state)
        finally:
            state.close()
    assert summary.articles == 0 and summary.resumed_from_line == len(corpus_lines(prose))
    assert (tmp_path / "out.jsonl").read_bytes() == reference[0]


@pytest.mark.parametrize("split", [3, 7, 12])
def test_appended_input_resumes_where_it_stopped(
    tmp_path: Path, prose: tuple[str, ...], reference, split: int
) -> None:
    lines = corpus_lines(prose)
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run(tmp_path, lines[:split], state)
    finally:
        state.close()
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        summary = run(tmp_path, lines, state)
    finally:
        state.close()
    assert summary.resumed_from_line == split
    assert (tmp_path / "out.jsonl").read_bytes() == reference[0]
    assert dead_without_time(tmp_path / "out.jsonl.dead.jsonl") == reference[1]


class Crash(Exception):
    pass


# (checkpoint, lines a batch): a crash after one line, or inside a batch of several
CRASHES = [(1, 1), (4, 1), (9, 1), (15, 1), (2, 3), (4, 4)]


@pytest.mark.parametrize(("crash_at", "batch"), CRASHES)
def test_crash_between_write_and_checkpoint(
    tmp_path: Path, prose: tuple[str, ...], reference, crash_at: int, batch: int
) -> None:
    """The process dies after the state updates and the output writes of the batch that ends
    with checkpoint `crash_at`, before that checkpoint; half a line of the next verdict also
    reached the disk."""
    lines = corpus_lines(prose)
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    die_at_checkpoint(state, crash_at)
    try:
        with pytest.raises(Crash):
            run(tmp_path, lines, state, batch=batch)
    finally:
        state.close()
    with (tmp_path / "out.jsonl").open("ab") as out:
        out.write(b'{"article_id": "torn wri')

    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run(tmp_path, lines, state)
    finally:
        state.close()
    assert (tmp_path / "out.jsonl").read_bytes() == reference[0]
    assert dead_without_time(tmp_path / "out.jsonl.dead.jsonl") == reference[1]


def test_crash_after_state_update_before_output(tmp_path: Path, prose: tuple[str, ...], reference) -> None:
    """Rewind output and checkpoint by one article whose state update was kept: the rerun sees a
    re-delivery and writes the same verdict again."""
    lines = corpus_lines(prose)
    done = lines[:4]  # the 4th line (a2) is a valid article
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run(tmp_path, done, state)
        key = embedded._PROGRESS_KEY + str((tmp_path / "in.jsonl").resolve()).encode()
        mark = orjson.loads(state.get_meta(key) or b"null")
        out = tmp_path / "out.jsonl"
        written = out.read_bytes()
        last = written.splitlines(keepends=True)[-1]
        assert orjson.loads(last)["article_id"] == "a2"
        out.write_bytes(written[: -len(last)])
        mark.update(input=mark["input"] - len(lines[3]), output=mark["output"] - len(last), line=3)
        state.set_meta({key: orjson.dumps(mark)})
        assert state.get("a2") is not None
    finally:
        state.close()
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run(tmp_path, lines, state)
    finally:
        state.close()
    assert (tmp_path / "out.jsonl").read_bytes() == reference[0]


def test_verdicts_to_a_device_need_a_file_for_the_dead_letters_and_resume(
    tmp_path: Path, prose: tuple[str, ...], reference, capsys
) -> None:
    """`-o /dev/null` (a benchmark's): no offset to resume at there, and no directory beside it
    for the dead letters, which are kept in a file of their own or refused in words."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(corpus_lines(prose)))
    with pytest.raises(ConfigError, match="not a file"):
        run_file(source, Path(os.devnull), MemoryState(), PARAMS)
    argv = ["dedup", str(source), "-o", os.devnull, "--state", str(tmp_path / "state"), "-q"]
    assert cli.main(argv) == 2
    assert "--dead-letters FILE" in capsys.readouterr().err
    dead = tmp_path / "dead.jsonl"
    for _ in range(2):  # the second run resumes past every line
        assert cli.main([*argv, "--dead-letters", str(dead)]) == 0
    assert dead_without_time(dead) == reference[1]


def test_cli_dedup_with_state(tmp_path: Path, prose: tuple[str, ...], reference, capsys) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(corpus_lines(prose)))
    out = tmp_path / "verdicts.jsonl"
    state_dir = tmp_path / "state"
    argv = ["dedup", str(source), "-o", str(out), "--state", str(state_dir), "-q"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "articles=16" in printed and "dead letters:" in printed and "invalid_utf8=1" in printed
    assert out.read_bytes() == reference[0]
    assert dead_without_time(tmp_path / "verdicts.jsonl.dead.jsonl") == reference[1]

    # other shingling on the same state is refused, naming the field
    assert cli.main([*argv, "-k", "7"]) == 2
    assert "k: stored 5, configured 7" in capsys.readouterr().err

    # a state directory in use by another process is refused
    held = RocksState(state_dir)
    try:
        assert cli.main(argv) == 2
        assert "cannot open state" in capsys.readouterr().err
    finally:
        held.close()


def test_cli_dedup_in_memory_with_dead_letter_path(tmp_path: Path, prose: tuple[str, ...], capsys) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(corpus_lines(prose)))
    out, dead = tmp_path / "v.jsonl", tmp_path / "dead.jsonl"
    argv = ["dedup", str(source), "-o", str(out), "--dead-letters", str(dead), "-q", "--threshold", "0.99"]
    assert cli.main(argv) == 0
    verdicts = read_jsonl(out)
    assert [v["article_id"] for v in verdicts] == VALID_IDS
    assert verdicts[2]["verdict"] != "duplicate"  # the footer copy is below 0.99
    assert verdicts[4]["exact"] is True  # exact copies still are
    assert [d["reason"] for d in read_jsonl(dead)] == DEAD_REASONS


def test_resume_refuses_an_output_shorter_than_the_state_says(tmp_path: Path) -> None:
    """Deleting the output but keeping the state must not pad the new output with NUL bytes."""
    from neardup.cli import main

    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b"".join(
            orjson.dumps({"id": f"a{i}", "text": f"article number {i} about a river and a bridge"}) + b"\n"
            for i in range(3)
        )
    )
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    assert main(["dedup", str(source), "-o", str(out), "--state", str(state), "-q"]) == 0
    out.unlink()
    with source.open("ab") as more:
        more.write(orjson.dumps({"id": "a3", "text": "one more article, about a harbour"}) + b"\n")
    assert main(["dedup", str(source), "-o", str(out), "--state", str(state), "-q"]) == 2
    assert not out.exists() or b"\x00" not in out.read_bytes()


def test_a_deleted_line_removes_the_article_and_writes_its_tombstone(
    tmp_path: Path, prose: tuple[str, ...], capsys
) -> None:
    source = tmp_path / "in.jsonl"
    lines = [
        article("a", prose[0]),
        article("b", prose[0] + FOOTER),
        orjson.dumps({"id": "a", "deleted": True}),
        orjson.dumps({"id": "nobody", "deleted": True}),
        article("c", prose[0] + " Reporting by the wire desk."),
        article("d", prose[0]),
    ]
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    assert cli.main(["dedup", str(source), "-o", str(out), "--state", str(state), "-q"]) == 0
    assert "deleted=1 unknown_deletes=1" in capsys.readouterr().out
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert records[2] == {"article_id": "a", "deleted": True}
    # an id the index never held gets its deletion line too, as the worker's tombstone
    assert records[3] == {"article_id": "nobody", "deleted": True}
    assert [r["article_id"] for r in records] == ["a", "b", "a", "nobody", "c", "d"]
    c, d = records[4], records[5]
    assert (c["verdict"], c["match_id"], c["canonical_id"]) == ("duplicate", "b", "b")
    # its exact copy is gone: the text matches the surviving near copies, never the deleted one
    assert (d["verdict"], d["exact"], d["canonical_id"]) == ("duplicate", False, "b")
    assert d["match_id"] in {"b", "c"}
    assert cli.main(["stats", "--state", str(state), "--json"]) == 0
    stats = orjson.loads(capsys.readouterr().out)
    assert (stats["articles"], stats["deleted"]) == (3, 1)


def test_a_re_added_id_continues_its_versions(tmp_path: Path, prose: tuple[str, ...]) -> None:
    source = tmp_path / "in.jsonl"
    lines = [
        article("a", prose[0]),
        orjson.dumps({"id": "a", "deleted": True}),
        article("a", prose[0]),
        orjson.dumps({"id": "a", "deleted": True}),
    ]
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    assert cli.main(["dedup", str(source), "-o", str(out), "--state", str(state), "-q"]) == 0
    with source.open("ab") as more:  # a later run over the same state goes on from the marker
        more.write(article("a", prose[1]) + b"\n")
    assert cli.main(["dedup", str(source), "-o", str(out), "--state", str(state), "-q"]) == 0
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r.get("version") for r in records] == [0, None, 1, None, 2]


def test_retention_expires_a_file_of_old_news_by_its_own_dates(
    tmp_path: Path, prose: tuple[str, ...], capsys
) -> None:
    source = tmp_path / "in.jsonl"
    lines = [
        article("old", prose[0], published_at="2025-01-01T08:00:00Z"),
        article("mid", prose[1], published_at="2025-01-20T08:00:00Z"),
        article("inside", prose[1] + FOOTER, published_at="2025-02-01T08:00:00Z"),
        article("outside", prose[0] + FOOTER, published_at="2025-02-10T08:00:00Z"),
        # refused, each takes the newest time held (2025-02-10): neither moves the index's time
        article("future", prose[2], published_at="2099-01-01T00:00:00Z"),
        article("garbled", prose[3], published_at="yesterday"),
    ]
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    args = ["dedup", str(source), "-o", str(out), "--state", str(state), "--retention", "30d", "-q"]
    assert cli.main(args) == 0
    summary = capsys.readouterr().out
    verdicts = {v["article_id"]: v for v in map(orjson.loads, out.read_bytes().splitlines())}
    assert (verdicts["inside"]["verdict"], verdicts["inside"]["match_id"]) == ("duplicate", "mid")
    assert verdicts["outside"]["verdict"] == "unique", "its original is 40 days older: expired"
    # only "old" expired, by the file's own dates; the refused dates moved nothing
    assert "expired=1" in summary and "refused_times=2" in summary
    assert cli.main(["stats", "--state", str(state), "--json"]) == 0
    stats = orjson.loads(capsys.readouterr().out)
    assert stats["articles"] == 5 and stats["newest_ms"] == parse_rfc3339_ms("2025-02-10T08:00:00Z")
    assert cli.main(["stats", "--state", str(state)]) == 0
    shown = capsys.readouterr().out
    assert "articles indexed   5" in shown and "expired            1" in shown
    assert "2099" not in shown and "2025-02-10" in shown


def test_state_is_compact_after_a_run(tmp_path: Path) -> None:
    """Everything under the state directory after a run over the sample, per article: the
    bound the state is kept under, fixed costs (RocksDB's log and options files) included."""
    sample = Path(embedded.__file__).parent / "data" / "sample_news.jsonl"
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    assert cli.main(["dedup", str(sample), "-o", str(out), "--state", str(state), "-q"]) == 0
    articles = len(sample.read_bytes().splitlines())
    size = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
    assert size / articles < 1600, f"{size / articles:.0f} bytes per article"


def feed_corpus(prose: tuple[str, ...]) -> tuple[list[bytes], list[str]]:
    """Lines of every kind the feed must tell apart, and what each is ("article": gets a verdict,
    "deletion": gets a deletion line, "bad": a dead letter). The last line has no newline: the feed
    still ends it with one."""
    lines_and_roles = [
        (article("orig", prose[0], title="Romo weds") + b"\n", "article"),
        (article("copy", prose[0]) + b"\n", "article"),  # exact copy
        (article("near", prose[0] + FOOTER) + b"\n", "article"),  # near-duplicate
        (article("head", prose[3][: len(prose[3]) * 6 // 10]) + b"\n", "article"),
        (article("whole", prose[3]) + b"\r\n", "article"),  # contains "head": partial; CRLF kept
        (orjson.dumps({"id": "orig", "deleted": True}) + b"\n", "deletion"),
        (orjson.dumps({"id": "nobody", "deleted": True}) + b"\n", "deletion"),  # an id never held
        (b'{"id": "cut", "text": "the json ends\n', "bad"),
        (article("head", prose[4]) + b"\n", "article"),  # an update: a new version, judged again
        (article("other", prose[1]), "article"),
    ]
    return [line for line, _ in lines_and_roles], [role for _, role in lines_and_roles]


def expected_feed(lines: list[bytes], roles: list[str], verdicts: list[dict], kinds: set[str]) -> bytes:
    """The feed a verdict file implies: the article lines whose verdict passes, and the deletion
    lines of ids whose last verdict passed or that were never held (the feed may carry them),
    newline-ended."""
    answers = iter(verdicts)
    last_kind: dict[str, str] = {}
    kept = []
    for line, role in zip(lines, roles, strict=True):
        if role == "bad":
            continue
        answer = next(answers)
        if role == "article":
            last_kind[answer["article_id"]] = answer["verdict"]
            passes = answer["verdict"] in kinds
        else:
            assert answer["deleted"] is True
            held = last_kind.pop(answer["article_id"], None)
            passes = held is None or held in kinds
        if passes:
            kept.append(line if line.endswith(b"\n") else line + b"\n")
    assert next(answers, None) is None
    return b"".join(kept)


@pytest.mark.parametrize("kinds", [{"unique"}, {"unique", "partial"}, {"duplicate"}])
def test_the_feed_holds_the_original_lines_whose_verdict_passes(
    tmp_path: Path, prose: tuple[str, ...], kinds: set[str]
) -> None:
    lines, roles = feed_corpus(prose)
    source, out, feed = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "feed.jsonl"
    source.write_bytes(b"".join(lines))
    summary = run_file(source, out, MemoryState(), PARAMS, feed_path=feed, feed_verdicts=frozenset(kinds))
    verdicts = read_jsonl(out)
    by_id = {v["article_id"]: v["verdict"] for v in verdicts if "verdict" in v}
    # the corpus does exercise every kind and the update
    assert (by_id["orig"], by_id["copy"], by_id["near"], by_id["whole"]) == (
        "unique",
        "duplicate",
        "duplicate",
        "partial",
    )
    assert {"article_id": "orig", "deleted": True} in verdicts
    assert summary.dead_letters["invalid_json"] == 1

    written = feed.read_bytes()
    assert written == expected_feed(lines, roles, verdicts, kinds)
    # the deletion of an id the index never held is fed whatever the filter: the feed may carry it
    assert lines[6] in written
    assert summary.fed == len(written.splitlines()) and f"fed={summary.fed}" in summary.render()
    fed_ids = [orjson.loads(line)["id"] for line in written.splitlines()]
    assert not any(line.startswith(b'{"id": "cut"') for line in written.splitlines())
    # a deletion of an article the feed carried is fed as it came, one it did not carry is not
    assert (lines[5] in written) == ("unique" in kinds)
    if kinds == {"unique"}:
        # both versions of "head" are unique; "orig" is removed from the feed as it was added
        assert fed_ids == ["orig", "head", "orig", "nobody", "head", "other"]
        assert lines[0] in written and lines[1] not in written and lines[2] not in written
        assert written.endswith(lines[-1] + b"\n")
    if "partial" in kinds:
        assert lines[4] in written  # byte for byte, its CRLF included


def test_without_a_feed_nothing_is_fed(tmp_path: Path, prose: tuple[str, ...]) -> None:
    lines, _ = feed_corpus(prose)
    summary = run(tmp_path, lines, MemoryState())
    assert summary.fed is None and "fed=" not in summary.render()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl", "out.jsonl.dead.jsonl"]


def run_fed(
    tmp: Path, lines: list[bytes], state: StateStore, kinds: frozenset[str], batch: int = 1
) -> embedded.RunSummary:
    source = tmp / "in.jsonl"
    source.write_bytes(b"".join(lines))
    feed = tmp / "feed.jsonl"
    return run_file(
        source, tmp / "out.jsonl", state, PARAMS, feed_path=feed, feed_verdicts=kinds, decide_batch=batch
    )


@pytest.mark.parametrize(("crash_at", "batch"), CRASHES)
def test_a_crash_before_the_checkpoint_feeds_no_line_twice(
    tmp_path: Path, prose: tuple[str, ...], reference, crash_at: int, batch: int
) -> None:
    """As test_crash_between_write_and_checkpoint, with a feed that also got half a line."""
    lines = corpus_lines(prose)
    kinds = frozenset({"unique", "partial"})
    whole = tmp_path / "whole"
    whole.mkdir()
    run_fed(whole, lines, MemoryState(), kinds)
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    die_at_checkpoint(state, crash_at)
    try:
        with pytest.raises(Crash):
            run_fed(tmp_path, lines, state, kinds, batch=batch)
    finally:
        state.close()
    with (tmp_path / "feed.jsonl").open("ab") as feed:
        feed.write(b'{"id": "torn')

    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run_fed(tmp_path, lines, state, kinds)
    finally:
        state.close()
    assert (tmp_path / "out.jsonl").read_bytes() == reference[0]
    assert (tmp_path / "feed.jsonl").read_bytes() == (whole / "feed.jsonl").read_bytes()
    fed_ids = [orjson.loads(line)["id"] for line in (tmp_path / "feed.jsonl").read_bytes().splitlines()]
    passing = [v["article_id"] for v in read_jsonl(tmp_path / "out.jsonl") if v.get("verdict") in kinds]
    assert fed_ids == passing  # one line per passing verdict: a0 twice, as the input re-delivers it


def test_a_resumed_feed_needs_the_same_filter_and_a_fed_start(tmp_path: Path, prose: tuple[str, ...]) -> None:
    lines = corpus_lines(prose)
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    try:
        run_fed(tmp_path, lines[:5], state, frozenset({"unique"}))
        with pytest.raises(embedded.ResumeMismatch, match="fed unique verdicts, this one partial,unique"):
            run_fed(tmp_path, lines, state, frozenset({"unique", "partial"}))
        run(tmp_path, lines[:8], state)  # a run without the feed: the feed misses lines 6..8
        with pytest.raises(embedded.ResumeMismatch, match=re.escape("would lack lines 1..8")):
            run_fed(tmp_path, lines, state, frozenset({"unique"}))
    finally:
        state.close()


def test_cli_dedup_unique_out(tmp_path: Path, prose: tuple[str, ...], capsys) -> None:
    lines, roles = feed_corpus(prose)
    source, out, feed = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "feed.jsonl"
    source.write_bytes(b"".join(lines))
    argv = ["dedup", str(source), "-o", str(out), "-q", "--unique-out", str(feed)]
    assert cli.main(argv) == 0
    assert f"fed={len(feed.read_bytes().splitlines())}" in capsys.readouterr().out
    assert feed.read_bytes() == expected_feed(lines, roles, read_jsonl(out), {"unique"})

    assert cli.main([*argv, "--unique-filter", "unique,partial"]) == 0
    with_partials = feed.read_bytes()
    assert with_partials == expected_feed(lines, roles, read_jsonl(out), {"unique", "partial"})
    assert lines[4] in with_partials and lines[1] not in with_partials


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--unique-out", "FEED", "--unique-filter", "unique,dupe"], "unknown verdict kind 'dupe'"),
        (["--unique-out", "FEED", "--unique-filter", ""], "names no verdict kind"),
        (["--unique-filter", "partial"], "--unique-filter needs --unique-out"),
    ],
)
def test_cli_dedup_refuses_a_bad_filter(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(article("a", "one article about a river") + b"\n")
    feed = tmp_path / "feed.jsonl"
    argv = ["dedup", str(source), "-o", str(tmp_path / "out.jsonl"), "-q"]
    assert cli.main([*argv, *(str(feed) if x == "FEED" else x for x in extra)]) == 2
    assert message in capsys.readouterr().err
    assert not feed.exists() and not (tmp_path / "out.jsonl").exists()


def test_an_unexpected_error_while_deciding_is_a_dead_letter_and_the_run_goes_on(
    tmp_path: Path, prose: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the worker's index stage: the article's line goes to the dead letters with the error. The
    state fails to read article b's id, which both the compiled run and the Python path read first."""
    from neardup.state.memory import MemoryKV

    real = MemoryKV.get_many

    def failing(self: MemoryKV, keys: list[bytes]) -> list[bytes | None]:
        if b"ab" in keys:
            raise RuntimeError("injected while deciding")
        return real(self, keys)

    monkeypatch.setattr(MemoryKV, "get_many", failing)
    lines = [article(article_id, text) + b"\n" for article_id, text in zip("abc", prose, strict=False)]
    run(tmp_path, lines, MemoryState())
    assert [v["article_id"] for v in read_jsonl(tmp_path / "out.jsonl")] == ["a", "c"]
    (dead,) = read_jsonl(tmp_path / "out.jsonl.dead.jsonl")
    assert dead["reason"] == "internal_error" and "injected while deciding" in dead["detail"]
    assert base64.b64decode(dead["value_b64"]) == lines[1].rstrip(b"\n") and dead["offset"] == 2


def test_retention_comes_from_the_environment_unless_the_flag_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEARDUP_RETENTION", "12h")
    monkeypatch.setenv("NEARDUP_BUCKET_CAP", "16")
    values = cli.DEDUP_FLAGS.resolve(cli.build_parser().parse_args(["dedup", "in.jsonl", "-o", "out.jsonl"]))
    assert (values["retention"], values["time_skew"], values["bucket_cap"]) == ("12h", "10m", 16)
    args = cli.build_parser().parse_args(["dedup", "in.jsonl", "-o", "out.jsonl", "--retention", "30d"])
    assert cli.DEDUP_FLAGS.resolve(args)["retention"] == "30d"
    worker = cli.build_parser().parse_args(["worker", "--retention", "2d", "--time-skew", "1m"])
    assert worker_settings(worker).retention_window() == Retention(2 * 86_400_000, 60_000)
    assert worker_settings(cli.build_parser().parse_args(["worker"])).retention == "12h"


def test_a_run_writes_each_batch_with_its_checkpoint_and_leaves_the_state_as_it_found_it(
    tmp_path: Path, prose: tuple[str, ...]
) -> None:
    """The run's writes go through a write overlay of its own, each batch committed with its
    checkpoint; after it the state writes at once again, and one holding writes of its own is
    refused rather than have them written with the run's first batch."""
    lines = corpus_lines(prose)
    state = RocksState(tmp_path / "state", AS_EMBEDDED)
    store = state.kv
    try:
        run(tmp_path, lines, state, batch=4)
        assert state.kv is store and state.counts.articles > 0
    finally:
        state.close()
    held = RocksState(tmp_path / "held", layered=True)
    try:
        held.kv.hold(1)  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="not committed"):
            run(tmp_path, lines, held)
    finally:
        held.close()
