"""neardup.pipeline.decider: the index stage in a child process decides exactly as in the worker, on a
real RocksDB, survives the child being killed, and restores (or, with no state, rebuilds) its index
like the stage does.
A list stands in for the record table's changelog (a compacted Kafka topic in the worker)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup.pipeline.decider import Decider, DeciderFailed, Write
from neardup.pipeline.pipes import CallTimeout, Child
from neardup.pipeline.publication import undecided
from neardup.pipeline.shard import ARTICLE_PREFIX, OFFSET_KEY, WHOLE_MESSAGE, BatchOutcome, IndexShard
from neardup.pipeline.wire import encode_signed, pack_signed, runs_within, signed_count
from neardup.state.rocks import RocksKV, RocksOptions, RocksState
from tests.support.changelog import ListChangelog
from tests.support.decider import Messages, answer, apply, child_pid, decide, packed
from tests.support.faults import HELPER_FAULT, inject
from tests.support.prose import PROSE
from tests.support.signing import FUTURE, HISTORY, PARAMS, signed
from tests.support.state import family_property


def comparable(outcome: BatchOutcome) -> list[tuple[Any, ...]]:
    """The outcome without the latencies (they depend on when each side decided)."""
    rows = []
    for entry in outcome.entries:
        verdict = None if entry.verdict is None else orjson.loads(entry.verdict)
        if verdict is not None:
            verdict.pop("latency_ms")
        rows.append((entry.offset, entry.article_id, entry.status, entry.kind, verdict, entry.error))
    return rows


@pytest.fixture(params=["keyed", "held"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Callable[..., Decider]]:
    """Deciders over an index of either layout: its buckets and posting lists as keys, or held in
    memory (NEARDUP_INDEX_IN_MEMORY)."""
    made: list[Decider] = []
    options = RocksOptions(hold_families=request.param == "held")

    def build(name: str, changelog: ListChangelog, *, in_process: bool, **more: Any) -> Decider:
        decider = Decider(PARAMS, tmp_path / name, options, changelog, in_process=in_process, **more)
        made.append(decider)
        return decider

    yield build
    for decider in made:
        process = decider._link.process if isinstance(decider._link, Child) else None
        decider.kill()
        if process is not None:  # reaped before the test's event loop closes
            await asyncio.wait_for(process.wait(), 10)
        if decider.shard is not None:
            decider.shard.state.close()


async def test_the_child_decides_and_writes_exactly_as_the_worker(make: Any) -> None:
    here_records = ListChangelog()
    child_records = ListChangelog()
    here = make("here", here_records, in_process=True)
    child = make("child", child_records, in_process=False)
    assert await here.open() == 0 and await child.open() == 0
    messages = [*packed(HISTORY, 0), (4, b"not a signatures message"), *packed(FUTURE, 5)]
    errors = []
    for start in range(0, len(messages), 3):
        batch = messages[start : start + 3]
        expected = await decide(here, batch)
        got = await decide(child, batch)
        assert comparable(got) == comparable(expected)
        assert (got.indexed, got.handled) == (expected.indexed, expected.handled)
        errors += [entry for entry in got.entries if entry.status == "error"]
    assert child_records.entries == here_records.entries
    assert child_records.table()[OFFSET_KEY] == str(messages[-1][0]).encode()
    assert [(entry.offset, entry.record) for entry in errors] == [(4, WHOLE_MESSAGE)]
    assert errors[0].error is not None and errors[0].error.startswith("ValueError: not a signatures")
    kinds = [entry.kind for entry in got.entries]
    assert "duplicate" in kinds and "unique" in kinds  # the comparison covered both kinds


async def test_a_killed_child_is_replaced_and_the_batch_decided_again(make: Any) -> None:
    records = ListChangelog()
    here = make("here", ListChangelog(), in_process=True)
    child = make("child", records, in_process=False)
    await here.open()
    await child.open()
    history, future = packed(HISTORY, 0), packed(FUTURE, 10)
    await decide(here, history)
    await decide(child, history)
    before = child_pid(child)
    assert before is not None
    opens: list[int | None] = []
    child.on_opened = lambda count, _seconds: opens.append(count)
    os.kill(before, signal.SIGKILL)
    got = await decide(child, future)  # a replacement, restored from its committed offset
    assert child_pid(child) not in (None, before)
    assert opens == [None] and child.opened == "restored"
    assert comparable(got) == comparable(await decide(here, future))
    # a re-delivered batch gets the stored verdicts and writes nothing new
    again, writes = await answer(child, future)
    assert {entry.status for entry in again.entries} == {"replayed"}
    assert comparable(again) == [(o, a, "replayed", k, v, e) for o, a, _, k, v, e in comparable(got)]
    assert [key for key, _ in writes if key.startswith(ARTICLE_PREFIX)] == []


async def test_a_child_index_is_restored_after_a_clean_close_and_after_a_kill(make: Any) -> None:
    records = ListChangelog()
    first = make("index", records, in_process=False)
    assert await first.open() == 0  # nothing to restore: built from the (empty) changelog
    await decide(first, packed(HISTORY, 0))
    await first.close(clean=True)
    assert child_pid(first) is None

    second = make("index", records, in_process=False)
    assert await second.open() is None and second.replayed == 0  # everything was committed
    outcome, writes = await answer(second, packed([("z", PROSE[4])], 10))
    records.entries += writes  # in the changelog, but killed before the acknowledgement came
    second.kill()

    third = make("index", records, in_process=False)
    indexed = len([key for key in records.table() if key.startswith(ARTICLE_PREFIX)])
    assert await third.open() is None  # restored: only what followed its committed offset
    assert third.replayed == len(writes) and third.opened == "restored"
    again = await decide(third, packed([("z", PROSE[4])], 10))
    assert [e.status for e in again.entries] == ["replayed"]
    assert comparable(again)[0][3:] == comparable(outcome)[0][3:]
    await third.close(clean=True)
    state = RocksState(third.index_path)
    try:
        assert state.counts.articles == indexed
    finally:
        state.close()


async def test_the_in_process_decider_returns_its_writes_and_forgets_lost_ones(make: Any) -> None:
    records = ListChangelog()
    here = make("here", records, in_process=True)
    await here.open()
    outcome, writes = await answer(here, packed(HISTORY[:2], 0))
    assert [entry.kind for entry in outcome.entries] == ["unique", "duplicate"]
    assert records.entries == []  # the agent sends the writes, a whole chunk at once
    assert dict(writes)[OFFSET_KEY] == b"0" and ARTICLE_PREFIX + b"b" in dict(writes)
    assert isinstance(here.shard, IndexShard)
    apply(here, writes)
    # A batch decided but its writes never sent (the agent failed half-way): opened again, the
    # stage forgets it (never committed), and the re-delivered batch is new again, not a re-delivery.
    lost, _ = await answer(here, packed(HISTORY[2:3], 1))
    assert await here.open() is None and here.replayed == 0
    again, writes = await answer(here, packed(HISTORY[2:3], 1))
    assert [entry.status for entry in again.entries] == ["new"]
    assert comparable(again) == comparable(lost)
    assert ARTICLE_PREFIX + HISTORY[2][0].encode() in dict(writes)


async def test_a_rebuild_streams_the_changelog_a_chunk_at_a_time(make: Any) -> None:
    records = ListChangelog(chunk=2)  # frames of 2 messages
    first = make("first", records, in_process=False)
    await first.open()
    await decide(first, packed(HISTORY, 0))
    first.kill()
    indexed = len([key for key in records.table() if key.startswith(ARTICLE_PREFIX)])
    assert indexed > 2 * records.chunk
    rebuilt = make("rebuilt", records, in_process=False)  # a new directory: nothing to reopen
    assert await rebuilt.open() == indexed
    here = make("here", ListChangelog(), in_process=True)
    await here.open()
    await decide(here, packed(HISTORY, 0))
    future = packed(FUTURE, 10)
    got = await decide(rebuilt, future)
    assert comparable(got) == comparable(await decide(here, future))
    assert "duplicate" in {entry.kind for entry in got.entries}  # judged against the rebuilt index


def chunked(messages: list[tuple[int, bytes]], max_bytes: int) -> list[list[tuple[int, bytes]]]:
    """How the index agent splits a batch of signatures messages (service/stream/app.py)."""
    return runs_within(messages, lambda message: len(message[1]), max_bytes)


def test_a_batch_is_decided_in_chunks_of_bounded_size() -> None:
    messages = [(offset, b"x" * size) for offset, size in enumerate([100, 100, 300, 50, 500, 10])]
    chunks = chunked(messages, 250)
    assert chunks == [messages[0:2], messages[2:3], messages[3:4], messages[4:5], messages[5:6]]
    assert chunked(messages[:1], 10) == [messages[:1]]  # an oversized message still gets a chunk
    assert [m for chunk in chunked(messages, 1000) for m in chunk] == messages


async def test_the_child_outlives_a_sigterm_to_its_group_and_closes_cleanly(make: Any) -> None:
    records = ListChangelog()
    first = make("index", records, in_process=False)
    await first.open()
    await decide(first, packed(HISTORY[:3], 0))
    assert child_pid(first) is not None
    os.kill(child_pid(first), signal.SIGTERM)  # what stopping the worker's process group sends it
    await first.close(clean=True)
    second = make("index", records, in_process=False)
    assert await second.open() is None  # closed cleanly: kept


async def decided_chunks(
    decider: Decider, chunks: list[Messages], kill_after: int | None = None
) -> list[Any]:
    """What the index agent does with decide_chunks: apply each chunk's writes before asking for the
    next answer. `kill_after`: SIGKILL the child once that many answers are in."""
    got = []
    async with contextlib.aclosing(decider.decide_chunks(chunks)) as answers:
        async for outcome, writes in answers:
            apply(decider, writes)
            got.append(comparable(outcome))
            if len(got) == kill_after:
                assert child_pid(decider) is not None
                os.kill(child_pid(decider), signal.SIGKILL)
    return got


async def test_chunks_queued_in_the_child_are_decided_in_order_as_in_process(make: Any) -> None:
    here_records = ListChangelog()
    records = ListChangelog()
    here = make("here", here_records, in_process=True)
    child = make("child", records, in_process=False)
    await here.open()
    await child.open()
    chunks = [[message] for message in packed(HISTORY + FUTURE, 0, per_message=1)]
    assert len(chunks) > 4
    expected = await decided_chunks(here, chunks)
    pid = child_pid(child)
    assert await decided_chunks(child, chunks) == expected
    assert child_pid(child) == pid and records.entries == here_records.entries
    kinds = {row[3] for chunk in expected for row in chunk}
    assert {"unique", "duplicate"} <= kinds  # later chunks were judged against earlier ones


async def test_a_child_killed_with_chunks_queued_is_replaced_and_the_rest_decided_again(make: Any) -> None:
    here = make("here", ListChangelog(), in_process=True)
    child = make("child", ListChangelog(), in_process=False)
    await here.open()
    await child.open()
    chunks = [[message] for message in packed(HISTORY + FUTURE, 0, per_message=1)]
    expected = await decided_chunks(here, chunks)
    before = child_pid(child)
    # killed with the next chunk queued: the replacement rebuilds from the writes applied so far
    got = await decided_chunks(child, chunks, kill_after=2)
    assert got == expected
    assert child_pid(child) not in (None, before)
    assert child.changelog.table() == here.changelog.table()


async def test_leaving_the_chunks_early_stops_the_child_with_a_request_in_flight(make: Any) -> None:
    here = make("here", ListChangelog(), in_process=True)
    child = make("child", ListChangelog(), in_process=False)
    await here.open()
    await child.open()
    chunks = [[message] for message in packed(HISTORY, 0, per_message=1)]
    pid = child_pid(child)
    assert isinstance(child._link, Child)
    process = child._link.process
    async with contextlib.aclosing(child.decide_chunks(chunks)) as answers:
        async for _, writes in answers:
            apply(child, writes)
            break  # the agent failed while publishing: the second chunk is still queued
    assert child_pid(child) is None  # its answer would have been read as the next request's
    assert await asyncio.wait_for(process.wait(), 10) == -signal.SIGKILL
    # the agent then opens the index again (restored from the table) and decides again
    assert await child.open() is None
    assert child_pid(child) not in (None, pid)
    await decided_chunks(here, chunks[:1])
    assert await decided_chunks(child, chunks[1:]) == await decided_chunks(here, chunks[1:])


@pytest.mark.slow  # waits out children that crash or hang
async def test_a_hung_child_is_killed_and_replaced_within_its_timeout(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    inject(monkeypatch, HELPER_FAULT, "hang:decider:2")  # each child hangs on its second batch
    here = make("here", ListChangelog(), in_process=True)
    child = make("child", ListChangelog(), in_process=False, timeout=CallTimeout(base_s=2.0, per_item_s=0.01))
    await here.open()
    await child.open()
    history, future = packed(HISTORY, 0), packed(FUTURE, 10)
    assert comparable(await decide(child, history)) == comparable(await decide(here, history))
    hung = child_pid(child)
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await decide(child, future)  # a replacement, rebuilt from the record table
    assert 2.0 <= loop.time() - started < 30
    assert child_pid(child) not in (None, hung)
    assert comparable(got) == comparable(await decide(here, future))
    assert child.changelog.table() == here.changelog.table()


async def test_a_child_hanging_twice_on_a_batch_is_fatal(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    inject(monkeypatch, HELPER_FAULT, "hang:decider:1")  # every child hangs on its first batch
    child = make("child", ListChangelog(), in_process=False, timeout=CallTimeout(base_s=1.0, per_item_s=0.0))
    await child.open()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DeciderFailed, match="twice"):
        await answer(child, packed(HISTORY, 0))
    assert loop.time() - started < 30
    assert child_pid(child) is None  # none left hanging


def test_a_message_counts_its_articles_for_the_timeout() -> None:
    records = [encode_signed(signed(article_id, text)) for article_id, text in HISTORY]
    assert signed_count(pack_signed(records)) == len(records)
    assert signed_count(records[0]) == 1
    assert signed_count(b"SP\xff\xff\xff\xff") == 1  # a corrupt count: at most one per 4 bytes


async def test_a_changelog_written_since_the_clean_close_is_replayed_with_its_tombstones(
    make: Any,
) -> None:
    records = ListChangelog()
    first = make("index", records, in_process=False)
    await first.open()
    await decide(first, packed(HISTORY, 0))
    await first.close(clean=True)

    # another worker owned the shard meanwhile and deleted an article: the changelog moved on
    def articles() -> int:
        return len([key for key in records.table() if key.startswith(ARTICLE_PREFIX)])

    before = articles()
    gone = ARTICLE_PREFIX + HISTORY[0][0].encode()
    records.entries.append((gone, None))
    second = make("index", records, in_process=False)
    indexed = articles()
    assert gone not in records.table() and indexed == before - 1
    assert await second.open() is None and second.replayed == 1  # the tombstone only
    assert second.shard is None and second.applied_offset == len(packed(HISTORY, 0)) - 1
    outcome = await decide(second, packed([("copy", HISTORY[0][1])], 50))
    assert outcome.indexed == indexed + 1  # the deleted article is gone from the restored index
    assert orjson.loads(outcome.entries[0].verdict or b"{}")["match_id"] != HISTORY[0][0]
    replayed, _ = await answer(second, packed(HISTORY[1:2], 1))  # applied before: its stored verdict
    assert [entry.status for entry in replayed.entries] == ["replayed"]


def files_at_level0(path: Path) -> int:
    """RocksDB's level-0 files (flushed memtables, not compacted yet) in every column family."""
    kv = RocksKV(path, RocksOptions(), read_only=True)
    try:
        return sum(family_property(kv, "rocksdb.num-files-at-level0").values())
    finally:
        kv.close()


@pytest.mark.parametrize("clean", [True, False])
async def test_a_child_closed_cleanly_compacts_its_index_either_way_it_is_kept(
    make: Any, clean: bool
) -> None:
    records = ListChangelog()
    first = make("index", records, in_process=False)
    await first.open()
    for start in range(0, len(HISTORY), 2):  # flushed at close: level 0 unless compacted
        await decide(first, packed(HISTORY[start : start + 2], start))
    await first.close(clean=clean)
    assert (files_at_level0(first.index_path) == 0) is clean
    second = make("index", records, in_process=False)
    assert await second.open() is None and second.replayed == 0  # every chunk was committed
    outcome = await decide(second, packed([("copy", HISTORY[0][1])], 100))
    assert [entry.kind for entry in outcome.entries] == ["duplicate"]


@pytest.mark.parametrize("in_process", [True, False])
async def test_writes_the_changelog_never_acknowledged_never_reach_the_index(
    make: Any, in_process: bool
) -> None:
    records = ListChangelog()
    first = make("index", records, in_process=in_process)
    await first.open()
    await decide(first, packed(HISTORY[:2], 0))
    await answer(first, packed(HISTORY[2:4], 10))  # decided, its writes never sent: a failed batch
    await first.close(clean=True)  # a shutdown without a failure of its own
    first.shard = None
    second = make("index", records, in_process=in_process)
    assert await second.open() is None and second.replayed == 0
    outcome = await decide(second, packed(HISTORY[2:4], 10))
    assert [entry.status for entry in outcome.entries] == ["new", "new"]  # not replayed: not held


@pytest.mark.slow  # waits out children that crash or hang
@pytest.mark.parametrize("action", ["crash", "hang"])
async def test_a_record_that_breaks_the_child_is_isolated_and_the_rest_decided(
    make: Any, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    """Two articles that make any decider child die (or hang) as it comes to them, in the middle
    of a batch: each costs two replacements (the first failure on a record only makes it a
    suspect), is answered as an isolated error (processing_failed,
    under its input message), and every other record is decided as it is without them."""
    inject(monkeypatch, HELPER_FAULT, f"{action}:decider:poison")
    here = make("here", ListChangelog(), in_process=True)
    child = make("child", ListChangelog(), in_process=False, timeout=CallTimeout(base_s=2.0, per_item_s=0.0))
    await here.open()
    await child.open()
    history = packed(HISTORY, 0)
    assert comparable(await decide(child, history)) == comparable(await decide(here, history))
    poisoned = [
        *FUTURE[:2],
        ("x-POISON-PILL", PROSE[3]),
        *FUTURE[2:5],
        ("y-POISON-PILL", PROSE[1]),
        *FUTURE[5:],
    ]
    records = [encode_signed(signed(article_id, text)) for article_id, text in poisoned]
    batch = [(10, pack_signed(records[:4])), (11, pack_signed(records[4:]))]
    first = child_pid(child)
    got = await decide(child, batch)
    assert child_pid(child) not in (None, first)
    isolated = [entry for entry in got.entries if entry.status == "error"]
    assert [(e.offset, e.article_id, e.reason) for e in isolated] == [
        (10, "x-POISON-PILL", "processing_failed"),
        (11, "y-POISON-PILL", "processing_failed"),
    ]
    how = "hung" if action == "hang" else "died"
    assert all(e.error is not None and f"{how} deciding" in e.error for e in isolated)
    letters = [undecided(e, dict(batch)[e.offset]) for e in isolated]
    assert all(letter.source is not None and letter.source.topic == "neardup-articles" for letter in letters)
    clean = [
        record
        for record, (article_id, _) in zip(records, poisoned, strict=True)
        if "POISON" not in article_id
    ]
    expected = await decide(here, [(10, pack_signed(clean[:3])), (11, pack_signed(clean[3:]))])
    assert [row for row in comparable(got) if row[2] != "error"] == comparable(expected)
    assert child.changelog.table() == here.changelog.table()
    # delivered again, the batch leaves the same records out, without failing the child again
    pid = child_pid(child)
    again, _ = await answer(child, batch)
    assert child_pid(child) == pid
    assert [e.article_id for e in again.entries if e.status == "error"] == ["x-POISON-PILL", "y-POISON-PILL"]


async def test_a_child_failing_between_records_is_not_blamed_on_one(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that fails before it comes to any record (here: as each batch starts) names no
    culprit: twice, and the batch fails, nothing dead-lettered in its place."""
    inject(monkeypatch, HELPER_FAULT, "crash:decider:1")
    child = make("child", ListChangelog(), in_process=False)
    await child.open()
    with pytest.raises(DeciderFailed, match="twice"):
        await answer(child, packed(HISTORY, 0))
    assert child.culprits == {}


async def test_a_replaced_child_holds_again_the_chunks_of_the_open_transaction(make: Any) -> None:
    """Under exactly-once a batch's chunks are acknowledged only when its transaction commits, and
    a reader of committed records does not see them before: a child killed in the middle of the
    batch is replaced, restored from the changelog, and holds the answered chunks' writes again, so
    the rest of the batch is decided as if nothing had happened; the commit then lands them all."""
    here = make("here", ListChangelog(), in_process=True)
    child = make("child", ListChangelog(), in_process=False)
    await here.open()
    await child.open()
    history = packed(HISTORY, 0)
    assert comparable(await decide(child, history)) == comparable(await decide(here, history))
    chunks = [[message] for message in packed(FUTURE, 10, per_message=1)]
    expected = await decided_chunks(here, chunks)
    held: list[Write] = []  # sent in the open transaction, not committed: not in the changelog yet
    got = []
    async with contextlib.aclosing(child.decide_chunks(chunks)) as answers:
        async for outcome, writes in answers:
            held += writes
            got.append(comparable(outcome))
            if len(got) == 2:
                assert child_pid(child) is not None
                os.kill(child_pid(child), signal.SIGKILL)
    assert got == expected
    changelog = child.changelog
    assert isinstance(changelog, ListChangelog)
    changelog.entries += held  # the transaction commits
    child.acknowledged(len(changelog.entries))
    assert changelog.table() == here.changelog.table()
    # reopened from what it committed, the child's index answers as the other does
    await child.close(clean=True)
    await child.open()
    again = packed([("k", PROSE[0]), ("l", PROSE[3])], 30)
    assert comparable(await decide(child, again)) == comparable(await decide(here, again))


@pytest.mark.parametrize("in_process", [True, False], ids=["in_process", "child"])
async def test_a_standby_catches_up_step_by_step_and_its_takeover_replays_only_the_rest(
    make: Any, in_process: bool
) -> None:
    records = ListChangelog()
    owner = make("owner", records, in_process=True)
    standby = make("standby", records, in_process=in_process)
    opens: list[int | None] = []
    standby.on_opened = lambda count, _seconds: opens.append(count)
    await owner.open()
    history = packed(HISTORY, 0)
    await decide(owner, history[:2])
    articles = len([key for key in records.table() if key.startswith(ARTICLE_PREFIX)])
    assert await standby.catch_up() == articles > 0  # a new copy: rebuilt
    assert standby.behind == len(records.entries) and not standby.opening
    caught = len(records.entries)
    await decide(owner, history[2:])
    assert await standby.catch_up() is None  # restored: only what followed its last catch-up
    assert standby.replayed == standby.behind == len(records.entries) - caught
    assert await standby.catch_up() is None and standby.replayed == standby.behind == 0
    assert opens == [], "a catch-up is not an open of the shard"

    # the owner decides once more, then the shard comes to the standby: its open replays that only
    before = len(records.entries)
    await decide(owner, packed([("late", PROSE[4])], 20))
    assert await standby.open() is None and opens == [None]
    assert standby.replayed == len(records.entries) - before > 0
    copy = packed([("copy", HISTORY[0][1]), ("late-copy", PROSE[4])], 30)
    expected = comparable(await decide(owner, copy))
    got = await decide(standby, copy)
    assert comparable(got) == expected
    # both copies found: what was caught up on, and what only the takeover's open replayed
    assert [entry.kind for entry in got.entries] == ["duplicate", "duplicate"]
    assert orjson.loads(got.entries[1].verdict or b"{}")["match_id"] == "late"
