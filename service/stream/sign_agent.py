"""The `sign` agent: input events → signing helpers → one signatures message per sign batch on the
index shard's topic (with dead letters for what cannot be signed)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import faust
from aiokafka import TopicPartition

from ..config import Settings
from ..pipeline.delivery import Deliveries
from ..pipeline.health import Failure
from ..pipeline.order import HandOff
from ..pipeline.signer import Signer, SignerFailed, SignItem
from ..pipeline.wire import Provenance, pack_in_chunks, with_original
from .outputs import SHARD_KEY, Letter, Outputs
from .progress import Progress
from .topics import StoredMessage
from .transactions import InputTransactions

log = logging.getLogger("neardup.stream")
BatchSends = tuple[list[Any], Callable[[], Awaitable[None]]]  # a batch's sends, and its acknowledgement


@dataclass(eq=False, repr=False)  # compared and shown as itself, not by what it holds
class SignAgent:
    """A batch is acknowledged once its signatures and dead letters are (`deliveries`); signatures
    this worker sends are handed to the index agent as soon as they are acknowledged (`hand_off`)."""

    settings: Settings
    signer: Signer
    outputs: Outputs
    signatures: faust.TopicT
    progress: Progress
    failure: Failure
    deliveries: Deliveries
    # exactly-once: each input partition's sends and offsets in transactions of its own
    transactions: InputTransactions | None = None
    hand_off: HandOff = field(default_factory=HandOff)

    async def run(self, stream: Any) -> None:  # faust.Stream; StreamT does not declare take_events
        async for batch in stream.take_events(self.settings.sign_batch):
            await self.progress.hold_if_failed()
            sends, acknowledge = await self.handle(stream, batch)
            await self.deliveries.settle(sends, acknowledge)

    async def handle(self, stream: Any, batch: list[faust.EventT]) -> BatchSends:
        """Sign a batch and send what it causes; returns the sends and what acknowledges the batch
        once the broker has all of them."""
        settings, progress = self.settings, self.progress
        progress.took(settings.input_topic)
        progress.expect_committed(batch)
        # The index must see the articles of each input partition in their order: one signed after
        # a later one would be decided without it. Transaction markers take an offset each: on the
        # input a gap is often just that. Each with its headers, forwarded by the filtered feed.
        gaps, entries = await progress.in_log_order(batch, logging.INFO, _entry, _read_back)
        try:
            results = await self.signer.sign([item for _, _, (item, _) in entries])
        except SignerFailed as exc:
            self.failure.fail(f"signing_unavailable: {exc}; stopping the worker")
            # Neither this batch (never acknowledged) nor any after it: a replaced agent
            # would sign the next batches ahead of this one.
            await progress.hold_if_failed()
            raise
        signed: dict[Any, list[bytes]] = collections.defaultdict(list)  # by input partition
        letters: dict[Any, list[Letter]] = collections.defaultdict(list)
        for (tp, _, ((raw, key, src), headers)), result in zip(entries, results, strict=True):
            if result.signed is None:
                assert result.dead_letter is not None and result.reason is not None
                where = (src.topic, src.partition, src.offset)
                log.info("dead_letter reason=%s topic=%s partition=%d offset=%d", result.reason, *where)
                letters[tp].append((result.reason, result.dead_letter, key))
            elif settings.unique_topic:  # the filtered feed forwards the input message as it came
                signed[tp].append(with_original(result.signed, raw or b"", headers))
            else:
                signed[tp].append(result.signed)
        every_letter = [letter for tp_letters in letters.values() for letter in tp_letters]
        if self.transactions is not None:
            ends: dict[Any, int] = {}
            for tp, offset, _ in entries:
                ends[tp] = max(ends.get(tp, 0), offset + 1)
            # Joined and committed while the next batch is signed. A partition's records must
            # reach the index in their order: each partition's task is started here, in the
            # batches' order, and takes its writer's lock (an asyncio.Lock is fair) before any
            # task of a later batch can.
            sends: list[Any] = [
                asyncio.ensure_future(self._send_in_transaction(tp, end, signed[tp], letters[tp]))
                for tp, end in ends.items()
            ]
        else:
            sends = await self._send(signed, every_letter)

        async def delivered() -> None:
            await progress.acknowledge(stream, batch, gaps)
            self.outputs.count_dead_letters(every_letter)
            progress.metrics.articles_in.inc(len(entries))
            progress.metrics.refused_times.inc(sum(result.refused_time for result in results))

        return sends, delivered

    async def _send(self, signed: dict[Any, list[bytes]], letters: list[Letter]) -> list[Any]:
        """At least once: the batch's dead letters, and its signed records packed into messages
        handed off as the broker acknowledges them."""
        sends = await self.outputs.dead_letters(letters)
        for pack in pack_in_chunks([record for records in signed.values() for record in records]):
            sent = await self.signatures.send(key=SHARD_KEY, value=pack)
            sends.append(sent)
            if self.settings.index_handoff:
                self.hand_off.submit(sent, pack)
        return sends

    async def _send_in_transaction(
        self, tp: Any, end: int, signed: list[bytes], letters: list[Letter]
    ) -> None:
        """Exactly once: an input partition's signatures messages and dead letters in the open
        transaction of its own writer, committed with the partition's next offset (`end`); returns
        once they are committed. Nothing is handed off: past a commit marker the hand-off never
        decides (order.following_run), so the consumer brings them."""
        assert self.transactions is not None
        writer = self.transactions.writer(tp.topic, tp.partition)
        async with writer.joined({TopicPartition(tp.topic, tp.partition): end}) as transaction:
            outputs = replace(self.outputs, producer=lambda: transaction.producer)
            transaction.sends += await outputs.dead_letters(letters)
            packs = [(SHARD_KEY, pack) for pack in pack_in_chunks(signed)]
            transaction.sends += await outputs.send(self.settings.signatures_topic, packs, partition=0)
        await transaction.committed

    async def on_revoked(self, sender: Any, revoked: Any = None, **_: Any) -> None:
        if self.transactions is not None:
            topic = self.settings.input_topic
            inputs = [(tp.topic, tp.partition) for tp in revoked or () if tp.topic == topic]
            await self.transactions.revoked(inputs)


def _entry(event: faust.EventT) -> tuple[SignItem, Any]:
    """An input event as the sign stage takes it, and its headers."""
    msg = event.message
    stamp = int(msg.timestamp * 1000) if msg.timestamp else None
    src = Provenance(msg.topic, msg.partition, msg.offset, stamp)
    return (event.value, event.key, src), msg.headers or ()


def _read_back(tp: Any, found: StoredMessage) -> tuple[SignItem, Any]:
    """An input message read back for a gap, as the sign stage takes it, and its headers."""
    src = Provenance(tp.topic, tp.partition, found.offset, found.timestamp_ms)
    return (found.value, found.key, src), found.headers
