"""Driving a Decider as the index agent does, over a list standing in for the changelog."""

from __future__ import annotations

import contextlib

from neardup.pipeline.decider import Decider, Write
from neardup.pipeline.pipes import Child
from neardup.pipeline.shard import BatchOutcome
from neardup.pipeline.wire import encode_signed, pack_signed
from tests.support.changelog import ListChangelog
from tests.support.signing import signed

Messages = list[tuple[int, bytes]]


def packed(items: list[tuple[str, str]], first_offset: int, per_message: int = 2) -> Messages:
    """The items as signatures messages of `per_message` records each, from `first_offset` on."""
    records = [encode_signed(signed(article_id, text)) for article_id, text in items]
    chunks = [records[i : i + per_message] for i in range(0, len(records), per_message)]
    return [(first_offset + n, pack_signed(chunk)) for n, chunk in enumerate(chunks)]


async def answer(decider: Decider, messages: Messages) -> tuple[BatchOutcome, list[Write]]:
    """One chunk of messages decided: its outcome and its writes for the changelog, not sent."""
    async with contextlib.aclosing(decider.decide_chunks([messages])) as answers:
        return await anext(answers)


async def decide(decider: Decider, messages: Messages) -> BatchOutcome:
    """What the index agent does: decide, then send the record-table writes to the changelog."""
    outcome, writes = await answer(decider, messages)
    apply(decider, writes)
    return outcome


def apply(decider: Decider, writes: list[Write]) -> None:
    """The writes sent to the changelog and acknowledged."""
    changelog = decider.changelog
    assert isinstance(changelog, ListChangelog)
    changelog.entries += writes
    decider.acknowledged(len(changelog.entries))


def child_pid(decider: Decider) -> int | None:
    """The pid of the decider's child process; None while it has none (or serves in process)."""
    link = decider._link
    return link.pid if isinstance(link, Child) else None
