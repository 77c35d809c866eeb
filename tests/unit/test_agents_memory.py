"""The sign and index agents in Faust's in-memory test context: no broker, the topics' `send`
replaced by recorders, the changelog read back from its recorder. A fast check of the agents'
wiring, not of Kafka delivery."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import faust
import orjson
import pytest
from faust.types import TP
from prometheus_client import generate_latest

from neardup.config import Settings
from neardup.core.signing import sketch_of
from neardup.pipeline.decider import DeciderFailed
from neardup.pipeline.shard import ARTICLE_PREFIX, INPUTS_KEY, OFFSET_KEY
from neardup.pipeline.sign import SignStage
from neardup.pipeline.signer import SignerFailed
from neardup.pipeline.wire import Provenance, decode_signed, pack_signed, unpack_signed
from neardup.stream import batches, framework
from neardup.stream.app import Runtime, create_app
from neardup.stream.framework import LeanMonitor, LeanStream
from neardup.stream.metrics import Metrics
from neardup.stream.outputs import SHARD_KEY
from neardup.stream.topics import StoredMessage, changelog_topic
from tests.support.changelog import ListChangelog
from tests.support.prose import PROSE

HIGHWATER = 10


class Recorder:
    """Stands in for TopicT.send: records (key, value) and wakes up waiters."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, Any]] = []
        self._changed = asyncio.Event()

    async def __call__(self, *, key: Any = None, value: Any = None, **_: Any) -> None:
        self.sent.append((key, value))
        self._changed.set()

    # Waits end when their condition holds: the bound only matters for a failing test, and a
    # decider child started on a loaded machine can take seconds to answer its first batch.
    async def wait_for(
        self, count: int, timeout: float = 30.0, size: Callable[[list[tuple[Any, Any]]], int] = len
    ) -> list[tuple[Any, Any]]:
        async def enough() -> None:
            while size(self.sent) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(enough(), timeout)
        return self.sent


@pytest.fixture(params=[0, 1], ids=["index-in-process", "index-in-child"])
def settings(tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    # signing in-process here (tests/unit/test_signer.py covers the helper processes); the index
    # stage both in the worker and in its decider process
    return Settings.from_env(
        {}, state_dir=str(tmp_path / "state"), sign_batch=10, sign_processes=0, index_process=request.param
    )


@pytest.fixture
def wired(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> tuple[faust.App, Runtime, dict[str, Recorder]]:
    """The app finalized and flowing, every topic's send() recorded by name, the changelog that the
    index rebuilds from read back from its recorder.

    The output topics are local to create_app, so send is replaced on the Topic class: a real send
    would start a producer and look for a broker."""
    app, runtime = create_app(settings, Metrics())
    app.finalize()
    app.flow_control.resume()
    recorders = {
        "signatures": Recorder(),
        "dead_letters": Recorder(),
        "verdicts": Recorder(),
        "changelog": Recorder(),
    }
    by_topic = {
        settings.signatures_topic: recorders["signatures"],
        settings.dead_letter_topic: recorders["dead_letters"],
        settings.verdicts_topic: recorders["verdicts"],
        changelog_topic(settings): recorders["changelog"],
    }

    async def send(self: faust.topics.Topic, *args: Any, **kwargs: Any) -> None:
        await by_topic[self.get_topic_name()](*args, **kwargs)

    class Producer:
        """Stands in for aiokafka's producer: the verdicts and the table's changelog go to it in
        batches (service/stream/batches.py), recorded message by message as they are submitted."""

        async def partitions_for(self, topic: str) -> set[int]:
            return {0}

        def create_batch(self) -> Any:
            batch: list[tuple[bytes | None, bytes]] = []
            return SimpleNamespace(
                append=lambda key, value, timestamp: batch.append((key, value)) or 1, items=batch
            )

        async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
            recorder = by_topic[topic]
            first = len(recorder.sent)
            for key, value in batch.items:
                await recorder(key=key, value=value)
            sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            sent.set_result(SimpleNamespace(topic_partition=TP(topic, partition), offset=first))
            return sent

    monkeypatch.setattr(faust.topics.Topic, "send", send)
    runtime.index.decider.changelog = ListChangelog(recorders["changelog"].sent)
    fake = Producer()
    # verdicts and table writes, through the adapter's seams rather than Faust's and aiokafka's insides
    monkeypatch.setattr(framework, "aiokafka_producer", lambda app: fake)
    monkeypatch.setattr(batches, "default_partitions", lambda producer, topic, keys: [0] * len(keys))
    # the test context never starts the consumer; the index agent asks it for the high-water mark
    monkeypatch.setattr(app.consumer, "highwater", lambda tp: HIGHWATER)
    return app, runtime, recorders


def _table(recorders: dict[str, Recorder]) -> dict[bytes, bytes | None]:
    """The record table as its changelog says: the last value per key."""
    return dict(recorders["changelog"].sent)


@contextlib.asynccontextmanager
async def _settling(runtime: Runtime) -> AsyncIterator[None]:
    """The app's settling tasks (delivery.py), which the agents' test context does not start."""
    tasks = [asyncio.ensure_future(stage.run()) for stage in runtime.stages()]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()


async def _all_settled(runtime: Runtime) -> None:
    """Until every batch handed to the settling tasks is settled (acknowledged, counted)."""
    for stage in runtime.stages():
        await asyncio.wait_for(stage.drain(), 5.0)


def _records(sent: list[tuple[Any, Any]]) -> list[bytes]:
    """The signed records in the signatures messages sent (each message packs a batch)."""
    return [record for _, value in sent for record in unpack_signed(value)]


def _record_count(sent: list[tuple[Any, Any]]) -> int:
    return len(_records(sent))


@pytest.fixture
async def sign_agent(wired: tuple[faust.App, Runtime, dict[str, Recorder]]) -> AsyncIterator[Any]:
    app, runtime, _ = wired
    async with _settling(runtime), app.agents["sign"].test_context() as agent:
        yield agent


async def test_valid_article_is_signed(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], sign_agent: Any
) -> None:
    _, runtime, recorders = wired
    raw = orjson.dumps({"id": "wire-1", "text": PROSE[0], "title": "Romo"})
    await sign_agent.put(raw, key=b"wire-1")
    (key, value), *_ = await recorders["signatures"].wait_for(1)
    assert key == SHARD_KEY
    (record,) = unpack_signed(value)
    signed = decode_signed(record)
    assert signed.article_id == "wire-1"
    assert signed.sketch == sketch_of(PROSE[0], runtime.settings.params())
    assert signed.provenance.topic == runtime.settings.input_topic
    assert recorders["dead_letters"].sent == []
    await _all_settled(runtime)
    assert runtime.metrics.registry.get_sample_value("neardup_articles_in_total") == 1.0


async def test_invalid_json_is_dead_lettered(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], sign_agent: Any
) -> None:
    _, runtime, recorders = wired
    raw = b'{"id": "wire-2", "text": '
    await sign_agent.put(raw, key=b"wire-2")
    (key, value), *_ = await recorders["dead_letters"].wait_for(1)
    assert key == b"wire-2"
    record = orjson.loads(value)
    assert record["reason"] == "invalid_json"
    assert base64.b64decode(record["value_b64"]) == raw
    assert record["topic"] == runtime.settings.input_topic
    assert recorders["signatures"].sent == []
    metrics = runtime.metrics.registry
    await _all_settled(runtime)
    assert metrics.get_sample_value("neardup_dead_letters_total", {"reason": "invalid_json"}) == 1.0


async def test_a_batch_keeps_order_and_splits_outputs(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], sign_agent: Any
) -> None:
    _, _, recorders = wired
    inputs = [
        orjson.dumps({"id": "a", "text": PROSE[1]}),
        b"\xff\xfe",
        orjson.dumps({"id": "b", "text": PROSE[2]}),
        orjson.dumps({"id": "c", "text": "   "}),
        orjson.dumps({"id": "d", "text": PROSE[3]}),
    ]
    for key, raw in zip([b"a", b"k1", b"b", b"c", b"d"], inputs, strict=True):
        await sign_agent.put(raw, key=key)
    signed = _records(await recorders["signatures"].wait_for(3, size=_record_count))
    dead = await recorders["dead_letters"].wait_for(2)
    assert [decode_signed(r).article_id for r in signed] == ["a", "b", "d"]
    assert [decode_signed(r).provenance.offset for r in signed] == [0, 2, 4]
    assert [(k, orjson.loads(v)["reason"], orjson.loads(v)["offset"]) for k, v in dead] == [
        (b"k1", "invalid_utf8", 1),
        (b"c", "empty_text", 3),
    ]


async def test_input_messages_the_consumer_went_past_are_read_back_and_signed_in_order(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], sign_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, runtime, recorders = wired
    topic = runtime.settings.input_topic
    tp = TP(topic, 0)
    # the group's committed offset, where Faust seeks at assignment: 2
    monkeypatch.setattr(framework, "committed_offset", lambda app, asked: 2 if asked == tp else None)
    allowed: list[tuple[Any, int, int]] = []

    async def allow_commits_past(app: Any, partition: Any, first: int, last: int) -> None:
        allowed.append((partition, first, last))

    monkeypatch.setattr(framework, "allow_commits_past", allow_commits_past)
    stored = {o: StoredMessage(o, f"m{o}".encode(), _article(f"m{o}", o), 1_000 + o) for o in range(2, 9)}
    asked: list[tuple[str, int, int, int]] = []

    async def read(name: str, partition: int, start: int, stop: int) -> Any:
        asked.append((name, partition, start, stop))
        return [stored[o] for o in range(start, stop)]

    monkeypatch.setattr(runtime.sign.progress.log_reader, "read", read)
    # delivered: 4, 5, then 8 (2-3 before the first, 6-7 between)
    for offset in (4, 5, 8):
        sign_agent.sent_offset = offset
        await sign_agent.put(stored[offset].value, key=stored[offset].key)
    signed = _records(await recorders["signatures"].wait_for(7, size=_record_count))
    # one read per gap, never the messages delivered between them
    assert asked == [(topic, 0, 2, 4), (topic, 0, 6, 8)]
    assert [decode_signed(r).article_id for r in signed] == [f"m{o}" for o in range(2, 9)]
    # read back with their provenance: dead letters and latency need it
    assert decode_signed(signed[0]).provenance == Provenance(topic, 0, 2, 1_002)
    await _all_settled(runtime)
    metrics = generate_latest(runtime.metrics.registry).decode()
    assert f'neardup_offset_gaps_total{{topic="{topic}"}} 2.0' in metrics
    assert f'neardup_offset_gap_messages_total{{topic="{topic}"}} 4.0' in metrics
    # Faust's commits may go past exactly the offsets it never delivered (what that does to Faust's
    # commits: tests/unit/test_framework.py)
    assert allowed == [(tp, 2, 3), (tp, 6, 7)]


def _article(article_id: str, seed: int) -> bytes:
    return orjson.dumps({"id": article_id, "text": f"{PROSE[seed % len(PROSE)]} Item {seed}."})


# --- the index agent ------------------------------------------------------------------------------


_INPUT_OFFSETS = itertools.count()


def _signed(settings: Settings, article_id: str, text: str) -> bytes:
    """Signed as the sign stage would: each at the next offset of an input partition of its own
    (the sign agent of these tests reads partition 0)."""
    src = Provenance(settings.input_topic, 9, next(_INPUT_OFFSETS), None)
    raw = orjson.dumps({"id": article_id, "text": text})
    result = SignStage(settings.params(), settings.max_text_bytes).handle(raw, None, src)
    assert result.signed is not None
    return result.signed


async def _settled(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for the end of the agent's batch (gauges are set after the last verdict is sent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


@pytest.fixture
async def index_agent(wired: tuple[faust.App, Runtime, dict[str, Recorder]]) -> AsyncIterator[Any]:
    app, runtime, _ = wired
    async with _settling(runtime), app.agents["index"].test_context() as agent:
        yield agent
    await runtime.index.decider.close(clean=False)


async def test_index_agent_publishes_verdicts_keyed_by_article(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], index_agent: Any
) -> None:
    _, runtime, recorders = wired
    settings = runtime.settings
    first = _signed(settings, "a", PROSE[0])
    await index_agent.put(first, key=SHARD_KEY)
    await index_agent.put(_signed(settings, "b", PROSE[0] + " Reporting by the wire desk."), key=SHARD_KEY)
    await index_agent.put(first, key=SHARD_KEY)  # produced twice upstream: a later offset
    sent = await recorders["verdicts"].wait_for(3)
    assert [key for key, _ in sent] == [b"a", b"b", b"a"]
    verdicts = [orjson.loads(value) for _, value in sent]
    assert [(v["verdict"], v["match_id"]) for v in verdicts] == [
        ("unique", None),
        ("duplicate", "a"),
        ("unique", None),
    ]
    assert {k: v for k, v in verdicts[2].items() if k != "latency_ms"} == {
        k: v for k, v in verdicts[0].items() if k != "latency_ms"
    }
    assert _table(recorders)[OFFSET_KEY] == b"2"  # checkpointed: offsets 0-2 applied
    changelog = recorders["changelog"].sent
    assert [key for key, _ in changelog].count(ARTICLE_PREFIX + b"a") == 1  # the re-delivery wrote nothing
    assert {key for key, _ in changelog} == {
        ARTICLE_PREFIX + b"a",
        ARTICLE_PREFIX + b"b",
        OFFSET_KEY,
        INPUTS_KEY,
    }
    assert recorders["dead_letters"].sent == []
    registry = runtime.metrics.registry
    # the second "a" is the same input message produced twice: its stored verdict, not a new one
    await _all_settled(runtime)
    assert registry.get_sample_value("neardup_verdicts_total", {"kind": "unique"}) == 1.0
    assert registry.get_sample_value("neardup_verdicts_total", {"kind": "duplicate"}) == 1.0
    assert registry.get_sample_value("neardup_index_replays_total", {"status": "replayed"}) == 1.0
    lag = {"topic": settings.signatures_topic, "partition": "0"}
    await _settled(lambda: registry.get_sample_value("neardup_consumer_lag", lag) == HIGHWATER - 2 - 1)
    assert registry.get_sample_value("neardup_indexed_articles") == 2.0
    # offset 0 again, as after a restart: its stored verdict again, counted as a replay, not a verdict
    index_agent.sent_offset = 0
    await index_agent.put(first, key=SHARD_KEY)
    replayed = await recorders["verdicts"].wait_for(4)
    assert replayed[3] == sent[0]
    assert registry.get_sample_value("neardup_index_replays_total", {"status": "replayed"}) == 2.0
    assert registry.get_sample_value("neardup_verdicts_total", {"kind": "unique"}) == 1.0
    assert index_agent.crash_reason is None


async def test_index_agent_dead_letters_a_corrupt_record(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], index_agent: Any
) -> None:
    _, runtime, recorders = wired
    await index_agent.put(b"not a signed record", key=SHARD_KEY)
    await index_agent.put(_signed(runtime.settings, "a", PROSE[1]), key=SHARD_KEY)
    (_, verdict), *_ = await recorders["verdicts"].wait_for(1)
    assert orjson.loads(verdict)["article_id"] == "a"  # the shard goes on after a bad record
    (key, value), *_ = await recorders["dead_letters"].wait_for(1)
    record = orjson.loads(value)
    assert key == SHARD_KEY and record["reason"] == "internal_error"
    assert record["topic"] == runtime.settings.signatures_topic and record["offset"] == 0
    assert base64.b64decode(record["value_b64"]) == b"not a signed record"
    registry = runtime.metrics.registry
    await _all_settled(runtime)
    await _settled(lambda: registry.get_sample_value("neardup_indexed_articles") == 1.0)
    assert registry.get_sample_value("neardup_dead_letters_total", {"reason": "internal_error"}) == 1.0
    assert index_agent.crash_reason is None


async def test_index_agent_handles_a_packed_message_and_dead_letters_a_corrupt_entry(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], index_agent: Any
) -> None:
    _, runtime, recorders = wired
    settings = runtime.settings
    first, copy = _signed(settings, "a", PROSE[0]), _signed(settings, "b", PROSE[0] + " By the wire desk.")
    await index_agent.put(
        pack_signed([first, b"S1 corrupt", copy, _signed(settings, "c", PROSE[2])]), key=SHARD_KEY
    )
    sent = await recorders["verdicts"].wait_for(3)
    assert [(key, orjson.loads(value)["verdict"]) for key, value in sent] == [
        (b"a", "unique"),
        (b"b", "duplicate"),  # an earlier record of the same message counts as earlier
        (b"c", "unique"),
    ]
    (_, value), *_ = await recorders["dead_letters"].wait_for(1)
    record = orjson.loads(value)
    assert record["reason"] == "internal_error" and record["offset"] == 0
    assert base64.b64decode(record["value_b64"]) == b"S1 corrupt"  # the entry, not the whole pack
    registry = runtime.metrics.registry
    await _all_settled(runtime)
    await _settled(lambda: registry.get_sample_value("neardup_indexed_articles") == 3.0)
    assert _table(recorders)[OFFSET_KEY] == b"0"


async def test_index_agent_stops_the_worker_when_the_decider_cannot_go_on(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], index_agent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, runtime, recorders = wired
    stops: list[bool] = []

    async def broken(chunks: list[list[tuple[int, bytes]]]) -> AsyncGenerator[Any, None]:
        raise DeciderFailed("failed twice")
        yield  # an async generator, as Decider.decide_chunks

    monkeypatch.setattr(runtime.index.decider, "decide_chunks", broken)
    runtime.failure.stop_worker = lambda: stops.append(True)
    await index_agent.put(_signed(runtime.settings, "a", PROSE[0]), key=SHARD_KEY)
    await _settled(lambda: stops == [True])
    assert recorders["verdicts"].sent == []  # nothing published for the failed batch
    assert runtime.failure.failed  # the worker exits non-zero


async def test_the_sign_agent_stops_the_worker_when_signing_cannot_go_on(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Helpers failing twice on a batch: the worker is stopped (to exit non-zero), nothing of the
    batch is published or acknowledged, and no later batch is signed meanwhile."""
    app, runtime, recorders = wired
    stops: list[bool] = []
    acked: list[Any] = []
    signed: list[int] = []

    async def broken(items: list[Any]) -> Any:
        signed.append(len(items))
        raise SignerFailed("signing helpers failed twice")

    async def ack(self: Any, event: Any) -> bool:
        acked.append(event.value)
        return True

    monkeypatch.setattr(runtime.sign.signer, "sign", broken)
    monkeypatch.setattr(LeanStream, "ack", ack)
    runtime.failure.stop_worker = lambda: stops.append(True)
    async with app.agents["sign"].test_context() as agent:
        await agent.put(_article("a", 0), key=b"a")
        await _settled(lambda: stops == [True])
        await agent.put(_article("b", 1), key=b"b")
        await asyncio.sleep(0.1)
    assert runtime.failure.failed and signed == [1]  # the next batch was not taken
    assert recorders["signatures"].sent == [] and recorders["dead_letters"].sent == []
    assert acked == []


async def test_an_agent_that_raises_stops_the_worker_and_no_agent_takes_another_batch(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust's default would replace the agent and go on past the batch; the worker stops instead,
    and from then on no agent takes a batch (the index agent's input here is never decided). Each
    agent's test context is given the error handler the app gave the agent (Agent.info), which
    Faust calls for an agent of the running app."""
    app, runtime, _ = wired
    stops: list[bool] = []
    runtime.failure.stop_worker = lambda: stops.append(True)
    decided: list[Any] = []

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broker gone")

    async def deciding(*args: Any, **kwargs: Any) -> Any:
        decided.append(args)
        raise RuntimeError("broker gone")

    monkeypatch.setattr(runtime.sign.signer, "sign", broken)
    monkeypatch.setattr(runtime.index.decider, "decide_chunks", deciding)
    handled: list[str] = []
    handle = cast(Any, app).agent_failed

    def agent_failed(agent: Any, exc: BaseException) -> None:
        handled.append(agent.name)
        handle(agent, exc)

    cast(Any, app).agent_failed = agent_failed
    assert not cast(Any, app).failed()
    made = app.agents["sign"]
    async with _settling(runtime), made.test_context(on_error=made.info()["on_error"]) as agent:
        await agent.put(_article("a", 0), key=b"a", wait=False)
        await _settled(lambda: handled == ["sign"], timeout=30)
    assert stops == [True] and runtime.failure.failed and cast(Any, app).failed()
    made = app.agents["index"]
    signed = _signed(runtime.settings, "a", PROSE[0])
    async with _settling(runtime), made.test_context(on_error=made.info()["on_error"]) as agent:
        await agent.put(signed, key=SHARD_KEY, wait=False)
        await asyncio.sleep(0.5)
    await runtime.index.decider.close(clean=False)
    assert handled == ["sign"] and decided == [] and stops == [True]


async def test_a_signatures_message_this_worker_sent_is_decided_once_acknowledged(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]],
    sign_agent: Any,
    index_agent: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, runtime, recorders = wired
    settings = runtime.settings
    signatures_send = faust.topics.Topic.send

    async def acknowledged(self: faust.topics.Topic, *args: Any, **kwargs: Any) -> Any:
        # as a broker would: the signatures message's offset comes back with the acknowledgement
        await signatures_send(self, *args, **kwargs)
        sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        sent.set_result(SimpleNamespace(offset=len(recorders["signatures"].sent)))  # 0: put below
        return sent

    monkeypatch.setattr(faust.topics.Topic, "send", acknowledged)
    hand_offs = asyncio.create_task(runtime.sign.hand_off.run(runtime.index.decide_handed_off))
    try:
        # offset 0 through the consumer: the index is opened, the shard is this worker's
        await index_agent.put(_signed(settings, "a", PROSE[0]), key=SHARD_KEY)
        await recorders["verdicts"].wait_for(1)
        # signed here and sent to offset 1: decided without the consumer delivering it
        await sign_agent.put(orjson.dumps({"id": "b", "text": PROSE[0] + " By the wire desk."}), key=b"b")
        verdicts = await recorders["verdicts"].wait_for(2)
        assert [(key, orjson.loads(value)["verdict"]) for key, value in verdicts] == [
            (b"a", "unique"),
            (b"b", "duplicate"),
        ]
        registry = runtime.metrics.registry
        assert registry.get_sample_value("neardup_index_handed_off_total") == 1.0
        assert _table(recorders)[OFFSET_KEY] == b"1"
        # the consumer delivers it too, later: decided already, it is let pass
        (_, pack), *_ = recorders["signatures"].sent
        index_agent.sent_offset = 1
        await index_agent.put(pack, key=SHARD_KEY)
        await index_agent.put(_signed(settings, "c", PROSE[2]), key=SHARD_KEY)  # offset 2
        verdicts = await recorders["verdicts"].wait_for(3)
        assert [key for key, _ in verdicts] == [b"a", b"b", b"c"]
        await _settled(lambda: _table(recorders)[OFFSET_KEY] == b"2")
        assert registry.get_sample_value("neardup_index_replays_total", {"status": "replayed"}) is None
    finally:
        hand_offs.cancel()


def test_the_worker_monitor_keeps_only_the_stall_check_time(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]],
) -> None:
    """Faust's consumer reports a stream that stalls from the time its partition's stream last took
    an event; the rest of Faust's monitor (per-event counters and timings) is left out."""
    app, _, _ = wired
    monitor = app.monitor
    assert isinstance(monitor, LeanMonitor)
    tp = TP("articles", 2)
    before = time.monotonic()
    assert monitor.on_stream_event_in(tp, 7, cast(Any, None), cast(Any, None)) is None
    assert before <= monitor.stream_inbound_time[tp] <= time.monotonic()
    monitor.on_stream_event_out(tp, 7, cast(Any, None), cast(Any, None), None)
    assert monitor.events_total == 0 and monitor.events_active == 0 and not monitor.events_by_stream


def test_the_runtime_is_built_whole_and_stays_as_built(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]],
) -> None:
    """What the agents share is complete before the app starts and cannot be swapped under them."""
    _, runtime, _ = wired
    fields = dataclasses.fields(runtime)
    assert fields and all(getattr(runtime, field.name) is not None for field in fields)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.sign = runtime.sign  # type: ignore[misc]


async def test_a_stream_whose_take_has_closed_acknowledges_nothing(
    wired: tuple[faust.App, Runtime, dict[str, Recorder]],
) -> None:
    """When an agent raises, its batches' generator closes while Faust's drainer goes on passing the
    stream's events on: were Faust's acks back on, each would be acknowledged unhandled, and its
    offset committed."""
    app, _, _ = wired
    channel = app.channel()
    stream = app.stream(channel)
    seen: list[Any] = []
    batches = stream.take_events(10)
    await channel.send(value=b"first")
    first = await asyncio.wait_for(batches.__anext__(), 5)
    await batches.aclose()  # as when its agent raised
    stream.add_processor(lambda value: seen.append(stream.current_event) or value)
    # the drainer read whether to acknowledge before the first of them came: the second shows it
    for value in (b"second", b"third"):
        await channel.send(value=value)
    await _settled(lambda: len(seen) == 2, timeout=5)
    await asyncio.sleep(0.1)
    assert [event.value for event in first] == [b"first"] and not first[0].message.acked
    assert [event.message.acked for event in seen] == [False, False]
    await stream.stop()
