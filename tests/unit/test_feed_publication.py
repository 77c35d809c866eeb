"""The filtered feed as the index stage publishes it (stream/outputs.py IndexPublisher), without a
broker: each copy's input message and headers come from the chunk's own signatures messages, found
by the decided record's place in them, never from the decision itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import orjson

from neardup.config import Settings
from neardup.pipeline.publication import undecided
from neardup.pipeline.shard import (
    WHOLE_MESSAGE,
    BatchOutcome,
    Culprit,
    Decided,
    IndexShard,
    SizeGauge,
    decide_messages,
)
from neardup.pipeline.wire import (
    Provenance,
    SignedDeletion,
    encode_deletion,
    encode_signed,
    pack_signed,
    with_original,
)
from neardup.state.memory import MemoryState
from neardup.stream.metrics import Metrics
from neardup.stream.outputs import IndexPublisher, Outputs
from tests.support.prose import PROSE
from tests.support.signing import INPUT_OFFSETS, PARAMS, SRC, signed

FEED = "feed"
Messages = list[tuple[int, bytes]]


class FakeOutputs:
    """What IndexPublisher sends through, recorded per topic: (messages, their headers)."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.sent: dict[str, list[tuple[list[Any], Any]]] = {}

    async def send(self, topic: str, messages: Sequence[Any], **options: Any) -> list[Any]:
        if messages:
            self.sent.setdefault(topic, []).append((list(messages), options.get("headers")))
        return []

    async def dead_letters(self, letters: list[Any]) -> list[Any]:
        return await self.send("dead-letters", [record for _, record, _ in letters])

    def count_dead_letters(self, letters: list[Any]) -> None:
        pass


def fed(article_id: str, text: str) -> bytes:
    """A feed record, as the sign stage wraps one: the input message and a header naming it."""
    original = orjson.dumps({"id": article_id, "text": text})
    return with_original(encode_signed(signed(article_id, text)), original, [("id", article_id.encode())])


def input_of(article_id: str, text: str) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    return orjson.dumps({"id": article_id, "text": text}), (("id", article_id.encode()),)


async def published(settings: Settings, messages: Messages, outcome: BatchOutcome) -> FakeOutputs:
    outputs = FakeOutputs()
    await IndexPublisher(settings, cast(Outputs, outputs)).publish(outcome, messages)
    return outputs


async def test_each_copy_carries_its_own_input_message_and_headers() -> None:
    """Two versions of one id in one message, the first a duplicate (not fed), the second new: the
    copy is the second's input; a record signed without its input (before the feed) is not fed; a
    deletion of a fed article takes it off the feed."""
    messages: Messages = [
        (10, pack_signed([fed("a", PROSE[0]), fed("b", PROSE[1])])),
        (11, pack_signed([fed("c", PROSE[0]), fed("c", PROSE[2])])),
        (12, pack_signed([encode_signed(signed("d", PROSE[3]))])),
        # the input's next message: an offset at or before the records' would be a replay
        (
            13,
            encode_deletion(
                SignedDeletion("b", Provenance(SRC.topic, SRC.partition, next(INPUT_OFFSETS), None))
            ),
        ),
    ]
    outcome = decide_messages(IndexShard(MemoryState(), PARAMS), messages, SizeGauge())
    kinds = [(e.offset, e.article_id, e.kind) for e in outcome.entries]
    assert kinds == [
        (10, "a", "unique"),
        (10, "b", "unique"),
        (11, "c", "duplicate"),
        (11, "c", "unique"),
        (12, "d", "unique"),
        (13, "b", "unique"),
    ]
    outputs = await published(Settings(unique_topic=FEED), messages, outcome)
    [(feed, headers)] = outputs.sent[FEED]
    copies = [input_of("a", PROSE[0]), input_of("b", PROSE[1]), input_of("c", PROSE[2])]
    assert feed == [(b"a", copies[0][0]), (b"b", copies[1][0]), (b"c", copies[2][0]), (b"b", None)]
    assert headers == [copies[0][1], copies[1][1], copies[2][1], ()]
    [(verdicts, _)] = outputs.sent["neardup-verdicts"]
    assert [key for key, _ in verdicts] == [b"a", b"b", b"c", b"c", b"d", b"b"]


async def test_without_a_feed_the_signatures_messages_are_not_read() -> None:
    entry = Decided(10, "a", "new", b"{}", "unique", 1.0, record=0)
    outcome = BatchOutcome([entry], indexed=1, handled=1)
    outputs = await published(Settings(), [(10, b"not a signatures message")], outcome)
    assert list(outputs.sent) == ["neardup-verdicts"]


async def test_a_message_without_a_copy_to_make_is_not_read() -> None:
    duplicate = Decided(10, "a", "new", b"{}", "duplicate", 1.0, record=0)
    outcome = BatchOutcome([duplicate], indexed=1, handled=1)
    outputs = await published(Settings(unique_topic=FEED), [(10, b"not a signatures message")], outcome)
    assert FEED not in outputs.sent


def test_a_feed_record_isolated_in_its_decision_dead_letters_its_input_message() -> None:
    record = fed("a", PROSE[0])
    message = pack_signed([record])
    entry = Decided.isolated(10, 0, Culprit(deciding=True, detail="killed deciding"), "a")
    letter = undecided(entry, message)
    assert letter.payload == input_of("a", PROSE[0])[0] and letter.source is not None
    # failed in its decoding (no id): the record as it came, under the signatures message
    unread = Decided.isolated(10, 0, Culprit(deciding=False, detail="killed"), None)
    assert undecided(unread, message) == (record, None)
    # a message that could not be unpacked: all of it
    whole = Decided.failed(10, ValueError("not one"), WHOLE_MESSAGE)
    assert undecided(whole, b"not a signatures message") == (b"not a signatures message", None)
