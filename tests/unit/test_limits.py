"""The size bounds behind the topics' max.message.bytes and the producer's max_request_size: each is
at least what the worker can send (a worst case built through the real encoders), and a topic that
takes less is refused at start with the command that raises its limit."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from neardup.config import Settings
from neardup.core.anchors import MAX_ANCHORS, Passage
from neardup.core.dedup import PASSAGES, Decision
from neardup.core.params import DedupParams
from neardup.messages import (
    DEAD_LETTER_MAX_BYTES,
    INPUT_HEADROOM,
    MAX_ID_LENGTH,
    Article,
    _passages,
    decode_article,
    input_max_bytes,
    verdict_max_bytes,
)
from neardup.pipeline.shard import IndexShard
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import (
    PACK_MAX_BYTES,
    Provenance,
    encode_signed,
    pack_in_chunks,
    packed_max_bytes,
    signed_max_bytes,
    with_original,
    wrapped_max_bytes,
)
from neardup.state.memory import MemoryState
from neardup.stream.metrics import Metrics
from neardup.stream.topics import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    PRODUCER_BATCH_BYTES,
    Replication,
    TopicMismatch,
    _check_configs,
    _config_problems,
    _configs,
    changelog_topic,
    feed_max_bytes,
    max_request_bytes,
    signatures_max_bytes,
    topic_specs,
    verdicts_max_bytes,
)
from tests.support.changelog import ChangelogTable
from tests.support.prose import PROSE

# The largest params the settings allow: signature and verifier slots, and one band per slot.
LARGEST = DedupParams(num_perm=4096, verify_perm=4096, bands=4096, rows=1)
SOURCE = Provenance("t" * 249, 2**31 - 1, 2**62, 2**62)


def worst_ids(count: int) -> list[str]:
    """Distinct ids of the most characters, each escaped in JSON as \\u00XX (6 bytes)."""
    return ["\x01" * (MAX_ID_LENGTH - 1) + chr(2 + i) for i in range(count)]


def record_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> int:
    """aiokafka's upper estimate of a message alone in its batch: what the broker holds to the
    topic's max.message.bytes (and the producer to its max_request_size)."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers))


def decide(params: DedupParams, texts: list[str]) -> tuple[list[dict[str, Any]], dict[bytes, bytes]]:
    """The verdicts of `texts` under ids of the most room, and the changelog records they wrote."""
    records = ChangelogTable()
    shard = IndexShard(MemoryState(), params, changelog=records)
    shard.replay(records)
    stage = SignStage(params, 1 << 30)
    articles = [Article(i, t) for i, t in zip(worst_ids(len(texts)), texts, strict=True)]
    signed = [stage.sign(a, SOURCE._replace(offset=SOURCE.offset + n)) for n, a in enumerate(articles)]
    decided = shard.decide(signed, offset=0)
    shard.checkpoint()
    assert all(d.verdict is not None for d in decided), decided
    return [orjson.loads(d.verdict) for d in decided if d.verdict is not None], records


NEAR_COPIES = [f"{PROSE[0]} Note {n}." for n in range(12)]


@pytest.mark.parametrize("params", [DedupParams(), DedupParams(top_candidates=10)], ids=["top-3", "top-10"])
def test_the_verdict_bound_holds_a_verdict_with_full_candidates_and_the_longest_ids(
    params: DedupParams,
) -> None:
    verdicts, _ = decide(params, NEAR_COPIES)
    last = verdicts[-1]
    assert last["verdict"] == "duplicate" and len(last["candidates"]) == params.top_candidates
    largest = max(len(orjson.dumps({**v, "latency_ms": 1234567.125})) for v in verdicts)
    bound = verdict_max_bytes(params)
    # only the numbers can be shorter than in the bound, and a duplicate names no passages
    passages = (Passage(2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1, 2**64 - 1),) * PASSAGES
    room = len(orjson.dumps(_passages(Decision("partial", "m", 0.5, 1.0, 0.5, "m", False, (), passages))))
    assert largest <= bound < largest + 30 * (4 + 4 * params.top_candidates) + room


def test_the_signed_bound_holds_the_largest_signed_record() -> None:
    for params in (DedupParams(), LARGEST):
        [worst] = worst_ids(1)
        signed = SignStage(params, 1 << 30).sign(Article(worst, PROSE[1]), SOURCE)
        record = encode_signed(signed)
        # the bound has room for the most anchors a text keeps; this one has fewer
        room = 5 * (MAX_ANCHORS - len(signed.sketch.anchors))
        assert len(record) <= signed_max_bytes(params) < len(record) + 200 + room


def test_the_wrapped_bound_holds_an_input_message_with_the_costliest_headers() -> None:
    record, original = b"S5" + b"r" * 1000, b"o" * 5000
    for headers in (
        [("", b"")] * 1000,  # 2 bytes each in Kafka (two lengths), 8 in JSON
        [("\x00", b"")] * 1000,  # escaped names
        [("h", bytes(3000))],  # a value in base64
    ):
        kafka = sum(2 + len(name.encode()) + len(value) for name, value in headers)
        wrapped = with_original(record, original, headers)
        assert len(wrapped) <= wrapped_max_bytes(len(record), len(original), kafka)


def test_the_packed_bound_holds_full_runs_and_a_record_alone() -> None:
    small = [bytes(1000)] * (2 * PACK_MAX_BYTES // 1000)
    assert max(map(len, pack_in_chunks(small))) <= packed_max_bytes(1000)
    alone = [bytes(10), bytes(PACK_MAX_BYTES + 5), bytes(10)]
    assert max(map(len, pack_in_chunks(alone))) == packed_max_bytes(PACK_MAX_BYTES + 5)


def test_the_feed_takes_the_largest_input_message_the_decoder_accepts_with_its_key_and_headers() -> None:
    settings = Settings(unique_topic="feed", max_text_bytes=100_000)
    value = b'{"id": "a", "text": "' + b"x" * 100_000 + b'", "notes": "'
    value += b"n" * (input_max_bytes(100_000) - len(value) - 2) + b'"}'
    assert len(value) == 100_000 + INPUT_HEADROOM and decode_article(value, 100_000).text == "x" * 100_000
    with pytest.raises(ValueError, match="oversized"):
        decode_article(value + b" ", 100_000)
    key = ("\U0001f600" * MAX_ID_LENGTH).encode()  # 4 bytes a character
    headers: list[tuple[str, bytes | None]] = [("source", bytes(40_000)), ("trace", bytes(10_000))]
    assert record_size(key, value, headers) <= feed_max_bytes(settings)
    # the default text limit takes more than Kafka's default: a feed topic left at it is refused
    assert feed_max_bytes(Settings()) > KAFKA_DEFAULT_MAX_MESSAGE_BYTES


def test_the_verdicts_topic_takes_a_batch_and_the_largest_verdict() -> None:
    settings = Settings()
    [key] = (i.encode() for i in worst_ids(1))
    verdict = bytes(verdict_max_bytes(settings.params()))
    assert record_size(key, verdict, []) <= verdicts_max_bytes(settings)
    assert verdicts_max_bytes(settings) >= PRODUCER_BATCH_BYTES


def test_the_changelog_takes_a_batch_and_records_of_the_largest_params() -> None:
    verdicts, records = decide(LARGEST, NEAR_COPIES)
    assert verdicts[-1]["candidates"]
    largest = max(record_size(key, value, []) for key, value in records.items())
    spec = next(s for s in topic_specs(Settings()) if s.name == changelog_topic(Settings()))
    assert spec.max_message_bytes is not None and largest < spec.max_message_bytes == PRODUCER_BATCH_BYTES


def test_the_signatures_topic_grows_with_the_text_limit_when_it_carries_the_input() -> None:
    assert signatures_max_bytes(Settings()) == DEAD_LETTER_MAX_BYTES
    assert signatures_max_bytes(Settings(unique_topic="feed")) == DEAD_LETTER_MAX_BYTES
    large = Settings(unique_topic="feed", max_text_bytes=20_000_000)
    original = bytes(input_max_bytes(large.max_text_bytes))
    stage = SignStage(large.params(), 1 << 30)
    signed = encode_signed(stage.sign(Article(worst_ids(1)[0], PROSE[1]), SOURCE))
    [message] = pack_in_chunks([with_original(signed, original, [("source", bytes(40_000))])])
    assert record_size(b"0", message, []) <= signatures_max_bytes(large)
    assert signatures_max_bytes(Settings(max_text_bytes=20_000_000)) == DEAD_LETTER_MAX_BYTES


@pytest.mark.parametrize("feed", ["", "feed"], ids=["no-feed", "feed"])
def test_every_topic_the_worker_writes_has_a_limit_and_the_producer_takes_the_largest(feed: str) -> None:
    settings = Settings(unique_topic=feed, max_text_bytes=20_000_000)
    specs = {s.name: s.max_message_bytes for s in topic_specs(settings)}
    written = [
        settings.signatures_topic,
        settings.verdicts_topic,
        settings.dead_letter_topic,
        changelog_topic(settings),
        *([feed] if feed else []),
    ]
    assert all(specs[name] is not None for name in written), specs
    assert specs[settings.input_topic] is None  # read, never written
    assert max_request_bytes(settings) == max(size for size in specs.values() if size is not None)
    # only the filtered feed forwards the input, and its messages grow with the text limit
    assert (max_request_bytes(settings) > input_max_bytes(settings.max_text_bytes)) == bool(feed)


def test_a_topic_is_created_to_take_what_it_needs_and_never_less_than_kafkas_default() -> None:
    settings = Settings(unique_topic="feed")
    by_name = {s.name: s for s in topic_specs(settings)}
    replication = Replication(3, 2)
    assert _configs(by_name["feed"], replication)["max.message.bytes"] == str(feed_max_bytes(settings))
    verdicts = _configs(by_name["neardup-verdicts"], replication)
    assert verdicts["max.message.bytes"] == str(KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    assert _configs(by_name["neardup-records-changelog"], replication) == {
        "cleanup.policy": "compact",
        "max.message.bytes": str(KAFKA_DEFAULT_MAX_MESSAGE_BYTES),
        "min.insync.replicas": "2",
    }
    assert "max.message.bytes" not in _configs(by_name["neardup-articles"], replication)
    # the signatures topic alone keeps its messages until they are purged
    for spec in by_name.values():
        configs = _configs(spec, replication)
        kept = configs.get("retention.ms") == configs.get("retention.bytes") == "-1"
        assert kept == (spec.name == settings.signatures_topic), (spec.name, configs)


def test_a_topic_with_a_lower_min_insync_or_an_internal_topic_with_a_retention_is_refused() -> None:
    specs = {s.name: s for s in topic_specs(Settings())}
    verdicts, signatures = specs["neardup-verdicts"], specs["neardup-signatures"]
    replication = Replication(3, 2)
    fine = {"max.message.bytes": str(10**8), "min.insync.replicas": "2", "retention.ms": "604800000"}
    assert _config_problems(verdicts, fine, replication) == []
    (problem,) = _config_problems(verdicts, {**fine, "min.insync.replicas": "1"}, replication)
    assert "topic 'neardup-verdicts' has min.insync.replicas=1, the service asks for 2" in problem
    assert "--entity-name neardup-verdicts --add-config min.insync.replicas=2" in problem
    (problem,) = _config_problems(signatures, fine, replication)
    assert "topic 'neardup-signatures' is internal" in problem
    assert "--add-config retention.ms=-1,retention.bytes=-1" in problem
    kept = {**fine, "retention.ms": "-1", "retention.bytes": "-1"}
    assert _config_problems(signatures, kept, replication) == []


class Admin:
    """Answers describe_configs as aiokafka's admin client does, with each topic's limit."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        found = [(0, None, 2, r.name, [("max.message.bytes", str(self.limits[r.name]))]) for r in resources]
        return [SimpleNamespace(resources=found)]


@pytest.mark.parametrize("topic", ["feed", "neardup-verdicts", "neardup-records-changelog"])
def test_an_existing_topic_below_its_need_is_refused_by_name_with_the_command_that_raises_it(
    topic: str,
) -> None:
    specs = topic_specs(Settings(unique_topic="feed"))
    limits = {s.name: KAFKA_DEFAULT_MAX_MESSAGE_BYTES * 10 for s in specs}
    limits[topic] = 1000
    checked = [s for s in specs if s.max_message_bytes is not None]
    need = next(s.max_message_bytes for s in specs if s.name == topic)
    with pytest.raises(TopicMismatch) as info:
        asyncio.run(_check_configs(Admin(limits), checked, Replication(1, 1)))  # type: ignore[arg-type]
    assert f"topic {topic!r} takes messages of up to 1000 bytes" in str(info.value)
    command = f"kafka-configs.sh --alter --entity-type topics --entity-name {topic} "
    assert f"{command}--add-config max.message.bytes={need}" in str(info.value)
    limits[topic] = need  # exactly what it needs: fine
    asyncio.run(_check_configs(Admin(limits), checked, Replication(1, 1)))  # type: ignore[arg-type]


def test_the_app_sends_within_the_bounds(tmp_path: Path) -> None:
    """The producer's batch is the one the limits count on, and it takes the largest message."""
    from neardup.stream.app import create_app

    settings = dataclasses.replace(
        Settings(state_dir=str(tmp_path), sign_processes=0, index_process=0),
        unique_topic="feed",
        max_text_bytes=20_000_000,
    )
    app, _ = create_app(settings, Metrics())
    assert app.conf.producer_max_batch_size == PRODUCER_BATCH_BYTES
    assert app.conf.producer_max_request_size == max_request_bytes(settings) > DEAD_LETTER_MAX_BYTES
