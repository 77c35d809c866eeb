"""The index stage's chunks settled and its changelog's end acknowledged (stream/outputs.py
ChangelogSends, stream/transactions.py AtLeastOnce and ExactlyOnce), without a broker: what a
chunk's acknowledgement commits to the index, and how the two guarantees settle a chunk."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

from aiokafka import TopicPartition
from faust.types import TP

from neardup.pipeline.delivery import Deliveries
from neardup.stream.batches import SentBatch
from neardup.stream.outputs import ChangelogSends
from neardup.stream.transactions import AtLeastOnce, ExactlyOnce, Transaction

CHANGELOG = "app-records-changelog"


def acknowledged_at(offset: int) -> asyncio.Future[Any]:
    sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    sent.set_result(SimpleNamespace(offset=offset))  # the first message's, as the broker answers
    return sent


class RecordedOutputs:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], dict[str, Any]]] = []

    async def send_batches(self, topic: str, messages: list[Any], **options: Any) -> list[SentBatch]:
        self.sent.append((topic, messages, options))
        return [SentBatch(acknowledged_at(40), 2), SentBatch(acknowledged_at(42), len(messages) - 2)]


async def test_a_chunks_acknowledgement_commits_its_writes_up_to_the_changelogs_end() -> None:
    outputs, acknowledged, counted = RecordedOutputs(), list[tuple[int | None, int]](), list[str]()
    changelog = ChangelogSends(
        cast(Any, outputs), CHANGELOG, lambda end, chunk: acknowledged.append((end, chunk))
    )
    writes = [(b"k", b"v")] * 5
    sent = await changelog.send(writes)
    assert outputs.sent == [(CHANGELOG, writes, {"partition": 0})]
    changelog.applied(sent, 7, lambda: counted.append("counted"))()
    assert (acknowledged, counted) == ([(45, 7)], ["counted"])  # past the last batch's 3 records
    changelog.applied([], 8, lambda: counted.append("again"))()  # a chunk that wrote nothing
    assert (acknowledged[-1], counted[-1]) == ((None, 8), "again")


async def test_at_least_once_a_chunk_is_settled_by_the_stages_deliveries() -> None:
    deliveries = Deliveries("index", lambda message: None)
    guarantee = AtLeastOnce(deliveries)
    assert guarantee.gap_level == logging.ERROR  # no commit markers in the shard
    async with guarantee.chunk([(3, b"m")]) as settle:
        assert settle == deliveries.settle
    await guarantee.restart()
    await guarantee.stop(commit=True)


class OpenTransaction:
    """The shard's writer, as ExactlyOnce joins it: one open transaction, and what it was asked."""

    def __init__(self) -> None:
        self.transaction = Transaction(cast(Any, None), asyncio.get_running_loop().create_future())
        self.calls: list[Any] = []

    @contextlib.asynccontextmanager
    async def joined(self, offsets: dict[TopicPartition, int]) -> AsyncIterator[Transaction]:
        self.calls.append(offsets)
        yield self.transaction

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self, commit: bool = True) -> None:
        self.calls.append(("stop", commit))


async def test_exactly_once_a_chunk_joins_the_transaction_with_the_offset_after_it() -> None:
    writer, settled = OpenTransaction(), list[Any]()

    async def settle(sends: list[Any], then: Any) -> None:
        settled.append((sends, await then()))

    deliveries = SimpleNamespace(settle=settle)
    guarantee = ExactlyOnce(cast(Any, writer), cast(Any, deliveries), TP("signatures", 0))
    assert guarantee.gap_level == logging.INFO  # each sign transaction's commit marker makes one

    def applied() -> None:
        """What the chunk's commit means (run by the writer once committed)."""

    async with guarantee.chunk([(3, b"m"), (4, b"n")]) as settle_chunk:
        await settle_chunk(["send"], applied)
    transaction = writer.transaction
    assert writer.calls == [{TopicPartition("signatures", 0): 5}]
    assert (transaction.sends, transaction.on_commit) == (["send"], [applied])
    assert settled == [([transaction.committed], None)]  # the batch waits, in order, for the commit
    await guarantee.restart()  # a new producer epoch fences the shard's earlier owner
    await guarantee.stop(commit=False)
    assert writer.calls[1:] == [("stop", True), "start", ("stop", False)]
