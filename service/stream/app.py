"""The Faust app: topics and the two agents. Thin: decode, call a stage, send."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import faust
import orjson
from faust.types import TP

from ..config import Settings
from ..messages import dead_letter_dict
from ..pipeline.collector import CollectorPolicy
from ..pipeline.decider import Decider, DeciderFailed
from ..pipeline.pipes import CallTimeout
from ..pipeline.shard import BatchOutcome, EntryOutcome
from ..pipeline.sign import SignStage
from ..pipeline.signer import Signer, SignerFailed, SignItem
from ..pipeline.wire import Provenance, pack_in_chunks, runs_within, with_original
from ..state.rocks import RocksOptions
from . import framework
from .batches import SentBatch, send_in_batches
from .delivery import Deliveries
from .faults import AgentFault
from .gaps import OffsetGap, following_run, in_log_order, offset_gaps
from .metrics import Metrics
from .topics import ChangelogReader, LogReader, StoredMessage, changelog_topic, max_request_bytes

log = logging.getLogger("neardup.stream")
SHARD_KEY = b"0"
# Bytes of signatures messages per decision request: a backlog batch (up to 100 messages) is decided
# in chunks of whole messages, so that deciding and publishing overlap. A full sign batch (200
# articles, ~390 KB) is one message, and so a chunk of its own.
DECIDE_CHUNK_BYTES = 256 * 1024
# How long a batch waits for more events after its first (LeanStream.take_events): the consumer hands
# over a fetch's messages together, in far less.
TAKE_WITHIN_S = 0.001
CLOSE_WAIT_S = 30.0  # for a decision in progress at shutdown
# Signatures messages waiting for their acknowledgement to be handed off (each up to a sign batch).
# A hand-off that falls this far behind is no quicker than the consumer, which delivers them anyway.
HANDOFF_QUEUE = 16
WATCH_INTERVAL_S = 1.0  # how often the event loop reports on itself and its agents (/health)


class _HandOff:
    """Signatures messages this worker sent, decided as soon as the broker acknowledges them.

    Through the consumer, a signatures message reaches the index agent one fetch round trip after
    its send: about as long again as the input's own fetch. The acknowledgement gives its offset, so while
    this worker owns the shard it can be decided at once, in the shard's order: only when it follows
    the last message decided (`gaps.following_run`); otherwise (another worker's messages first,
    the shard elsewhere, a failed send) the consumer brings it, as it brings every message anyway.

    The queue holds `maxsize` messages: when it is full, the message is not handed off (nor are
    those after it, which no longer follow the last one decided) and the consumer brings it. The
    hand-off only saves latency; making the sign stage wait for it instead would tie the input's
    pace to the decisions', which the consumer's path keeps apart."""

    def __init__(
        self, decide: Callable[[list[tuple[int, bytes]]], Any], maxsize: int = HANDOFF_QUEUE
    ) -> None:
        self._decide = decide
        self._sent: asyncio.Queue[tuple[Any, bytes]] = asyncio.Queue(maxsize)
        self.dropped = 0  # messages left to the consumer because the queue was full

    def submit(self, sent: Any, pack: bytes) -> None:
        """`sent`: what Topic.send returned, awaitable for the message's metadata."""
        if asyncio.isfuture(sent):
            try:
                self._sent.put_nowait((sent, pack))
            except asyncio.QueueFull:
                self.dropped += 1

    async def run(self) -> None:
        """In send order; whatever is acknowledged meanwhile is decided together (one pipelined
        request to the decider, as a batch from the consumer would be)."""
        while True:
            waiting = [await self._sent.get()]
            while not self._sent.empty():
                waiting.append(self._sent.get_nowait())
            messages: list[tuple[int, bytes]] = []
            for sent, pack in waiting:
                try:
                    metadata = await sent
                except Exception:  # the send failed: the sign agent's own await reports it
                    break
                messages.append((metadata.offset, pack))
            if messages:
                await self._decide(messages)


@dataclass
class Runtime:
    """What the agents share; `needs_open` is raised whenever the index shard is (re)assigned."""

    settings: Settings
    metrics: Metrics
    signer: Signer
    collector: CollectorPolicy
    decider: Decider
    log_reader: LogReader  # reads back what the consumer went past
    needs_open: bool = True
    hand_off: _HandOff | None = None  # set by create_app; run by the app's hand_offs task
    # the last offset delivered to the agents in each partition, to notice a consumer that skips
    # messages (faust-streaming has open reports of events skipped around restarts)
    delivered: dict[Any, int] = field(default_factory=dict)
    # One decision at a time, whether from the index agent or from a hand-off (`_HandOff`)
    index_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The last signatures offset decided by a hand-off since the shard's assignment: the consumer
    # delivers those messages too, and the index agent lets them pass
    handed_off: int = -1
    # What to do when the index or signing cannot go on (the decider or a signing helper failed
    # twice on a batch, an agent raised): stop the worker the way a supervisor would, so that it
    # restarts and the unacknowledged batch is re-delivered, rather than keep consuming with a
    # crashed agent and a gap that blocks every later commit.
    stop_worker: Callable[[], None] = field(default=lambda: signal.raise_signal(signal.SIGTERM))
    failed: bool = False  # stopped for such a failure: the worker exits non-zero
    # What bounds that stop: the worker's command sets `exit_after` (the in-memory tests do not)
    exit_later: Callable[[float], None] = field(default=lambda seconds: None)
    # Each stage's batches, acknowledged once what they caused is (create_app sets them)
    signed: Deliveries | None = None
    indexed: Deliveries | None = None
    # When each stage last took a batch (monotonic), for the stall check (`stalled_stage`)
    taken_at: dict[str, float] = field(default_factory=dict)

    def fail(self, message: str, *, exc_info: bool = False) -> None:
        """Stop the worker for a failure it cannot go on from (logged once): /health turns 503 at
        once, and a stop that takes longer than the settings allow ends the process (non-zero)."""
        if not self.failed:
            log.critical(message, exc_info=exc_info)
            self.failed = True
            self.metrics.failure = message
            self.exit_later(self.settings.failure_exit_timeout)
            self.stop_worker()

    def stages(self) -> list[Deliveries]:
        return [stage for stage in (self.signed, self.indexed) if stage is not None]


def exit_after(seconds: float) -> None:
    """A stop for a failure waits on the broker (Faust's commit, the producer's flush), which may
    be the very thing that failed: past `seconds`, exit without it. Nothing is lost: what was not
    committed comes back after the restart."""

    def exit_now() -> None:
        log.critical("stop_timeout: still stopping after %.0f s; exiting", seconds)
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True
    timer.start()


def _raw_topic(app: faust.App, name: str, partitions: int, **kwargs: Any) -> faust.TopicT:
    return app.topic(
        name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
        **kwargs,
    )


def _credentials(settings: Settings) -> Any:
    if settings.security_protocol.startswith("SASL"):
        ssl = settings.client_security().get("ssl_context")
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl,
        )
    if settings.security_protocol == "SSL":
        return settings.client_security()["ssl_context"]
    return None


def create_app(settings: Settings, metrics: Metrics) -> tuple[faust.App, Runtime]:
    """The app and what its agents share."""
    params = settings.params()
    app = framework.app_class(settings.fetch_wait_ms, settings.fetch_min_bytes)(
        settings.app_id,
        broker=settings.broker,
        broker_credentials=_credentials(settings),
        datadir=str(settings.state_path / "faust"),
        topic_partitions=1,
        topic_allow_declare=False,  # topics are created up front by topics.ensure_topics
        web_enabled=False,  # Faust's web server can show tables; our own serves metrics/health only
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        # A batch the producer could not deliver this long (retrying what is retriable) fails,
        # and the worker with it (delivery.py): a supervisor restarts it from its last commit.
        producer_request_timeout=settings.delivery_timeout,
        producer_max_request_size=max_request_bytes(settings),
        producer_linger_ms=2,
        # aiokafka waits for a partition's batch to be sent (one request in flight per broker) before
        # it starts the next: with the default 16 KB, the changelog would move only a
        # handful of articles per round trip.
        producer_max_batch_size=512 * 1024,
        broker_commit_interval=1.0,
        # A restarted worker takes its place in the group at once (Settings.group_instance_id); a
        # dead one's partitions go to the others once its session expires: deploy/docs/operations.md,
        # "Membership".
        consumer_group_instance_id=settings.group_instance_id(),
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
        stream_buffer_maxsize=8192,
        broker_max_poll_records=2000,
    )
    changelog_name = changelog_topic(settings)
    articles = _raw_topic(app, settings.input_topic, settings.input_partitions)
    signatures = _raw_topic(app, settings.signatures_topic, 1)
    _raw_topic(app, settings.dead_letter_topic, 1)  # declared: sent to in batches of our own
    _raw_topic(app, changelog_name, 1, compacting=True)  # the index's changelog, likewise
    timeout = CallTimeout(settings.helper_timeout, settings.helper_item_timeout_ms / 1000)
    runtime = Runtime(
        settings,
        metrics,
        Signer(
            SignStage(params, settings.max_text_bytes, settings.retention_window().skew_ms),
            settings.sign_processes,
            settings.sign_nice,
            timeout,
        ),
        CollectorPolicy(settings.gc_freeze_every),
        Decider(
            params,
            settings.state_path / "index",
            # rebuilt from the changelog after a crash: no write-ahead log needed
            RocksOptions(
                write_ahead_log=False,
                record_cache=settings.record_cache,
                probe_cache=settings.probe_cache,
                bucket_cap=settings.bucket_cap,
                background_nice=settings.rocksdb_nice,
            ),
            ChangelogReader(settings),
            in_process=not settings.index_process,
            gc_freeze_every=settings.gc_freeze_every,
            retention=settings.retention_window(),
            timeout=timeout,
        ),
        LogReader(settings),
    )
    # The signing helpers end with the worker, inside its event loop (the decider is closed on
    # the way: IndexPipeline.close); commands.py still stops any that are left once the loop has ended.
    cast(Any, app).at_shutdown.append(runtime.signer.aclose)
    cast(Any, app).failed = lambda: runtime.failed
    metrics.stall_timeout = settings.stall_timeout

    def agent_failed(agent: Any, exc: BaseException) -> None:
        # Faust would go on with a new agent, past the batch that raised; that batch is not
        # acknowledged (LeanStream), so not committed: a restart brings it back.
        runtime.fail(f"agent_failed agent={agent.name} error={exc!r}; stopping the worker")

    cast(Any, app).agent_failed = agent_failed
    runtime.signed = Deliveries("sign", runtime.fail)
    runtime.indexed = Deliveries("index", runtime.fail)
    # A replaced decider child rebuilds from the changelog: first, everything decided before it there
    runtime.decider.before_rebuild = runtime.indexed.drain
    outputs = Outputs(app, runtime)
    fault = AgentFault()
    index = IndexPipeline(app, runtime, outputs, fault)
    sign = SignPipeline(app, runtime, outputs, signatures, fault)
    runtime.hand_off = sign.hand_off = _HandOff(index.decide_handed_off)

    app.agent(articles, name="sign")(sign.run)
    app.agent(signatures, name="index")(index.run)
    app.on_partitions_assigned.connect(index.on_assigned)  # type: ignore[arg-type]  # mode wants `signal=`
    app.on_partitions_revoked.connect(index.on_revoked)  # type: ignore[arg-type]
    app.on_before_shutdown.connect(index.close)  # type: ignore[arg-type]

    @app.task
    async def mark_ready() -> None:
        await runtime.signer.warm_up()
        metrics.ready.set()

    @app.task
    async def hand_offs() -> None:
        await sign.hand_off.run()

    @app.task
    async def settle_signed() -> None:
        await sign.deliveries.run()

    @app.task
    async def settle_indexed() -> None:
        await index.deliveries.run()

    @app.timer(interval=WATCH_INTERVAL_S)
    async def watch() -> None:
        """What /health reports about the agents, from the event loop (whose own beat it is)."""
        metrics.loop_beat = time.monotonic()
        metrics.stalled = stalled_stage(app, runtime)

    return app, runtime


Letter = tuple[str, bytes, bytes | None]  # (reason, dead-letter record, key)


class Outputs:
    """What both pipelines send besides their own topic, through aiokafka's producer in batches
    built here (batches.py): dead letters, counted once the broker has them."""

    def __init__(self, app: faust.App, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    def producer(self) -> Any:
        return framework.aiokafka_producer(self.app)

    async def send(
        self, topic: str, messages: list[tuple[bytes | None, bytes | None]], **options: Any
    ) -> list[Any]:
        """The sends' futures, each resolving once the broker acknowledges its batch."""
        return [batch.sent for batch in await send_in_batches(self.producer(), topic, messages, **options)]

    async def dead_letters(self, letters: list[Letter]) -> list[Any]:
        if not letters:
            return []
        return await self.send(
            self.runtime.settings.dead_letter_topic, [(key, record) for _, record, key in letters]
        )

    def count_dead_letters(self, letters: list[Letter]) -> None:
        for reason, count in collections.Counter(reason for reason, _, _ in letters).items():
            self.runtime.metrics.dead_letters.labels(reason).inc(count)


class SignPipeline:
    """The `sign` agent: input events → signing helpers → one signatures message per sign batch on
    the index shard's topic (with dead letters for what cannot be signed). A batch is acknowledged
    once its signatures and dead letters are (`deliveries`)."""

    def __init__(
        self, app: faust.App, runtime: Runtime, outputs: Outputs, signatures: faust.TopicT, fault: AgentFault
    ) -> None:
        self.app = app
        self.runtime = runtime
        self.settings = runtime.settings
        self.outputs = outputs
        self.signatures = signatures
        self.fault = fault
        assert runtime.signed is not None
        self.deliveries = runtime.signed
        self.hand_off: _HandOff  # set by create_app: the index pipeline decides through it

    async def run(self, stream: Any) -> None:  # faust.Stream; StreamT does not declare take_events
        async for batch in stream.take_events(self.settings.sign_batch, within=TAKE_WITHIN_S):
            await self.handle(stream, batch)

    async def handle(self, stream: Any, batch: list[faust.EventT]) -> None:
        runtime, settings = self.runtime, self.settings
        runtime.taken_at[settings.input_topic] = time.monotonic()
        _expect_committed(self.app, runtime, batch)
        # transaction markers take an offset each: on the input a gap is often just that
        gaps = _check_gaps(runtime, batch, logging.INFO)
        entries = [_entry(event) for event in batch]
        # the input's headers, forwarded with it by the filtered feed
        headers: dict[tuple[Any, int], Any] = {}
        if settings.unique_topic:
            headers = {(e.message.tp, e.message.offset): e.message.headers or () for e in batch}
        if gaps:
            # The index must see the articles of each input partition in their order: one
            # signed after a later one would be decided without it.
            read_back = await _read_gaps(runtime, gaps)
            fills = [(tp, found.offset, _sign_item(tp, found)) for tp, found in read_back]
            entries = in_log_order(entries, gaps, fills)
            headers.update(((tp, found.offset), found.headers) for tp, found in read_back)
        items = [item for _, _, item in entries]
        try:
            results = await runtime.signer.sign(items)
        except SignerFailed as exc:
            runtime.fail(f"signing_unavailable: {exc}; stopping the worker")
            # Neither this batch (never acknowledged) nor any after it: a replaced agent
            # would sign the next batches ahead of this one. The worker's stop cancels this.
            await asyncio.Event().wait()
            raise
        packs: list[bytes] = []
        letters: list[Letter] = []
        refused_times = 0
        for (tp, offset, (raw, key, src)), result in zip(entries, results, strict=True):
            if result.signed is None:
                assert result.dead_letter is not None and result.reason is not None
                log.info(
                    "dead_letter reason=%s topic=%s partition=%d offset=%d",
                    result.reason,
                    src.topic,
                    src.partition,
                    src.offset,
                )
                letters.append((result.reason, result.dead_letter, key))
            elif settings.unique_topic:  # the filtered feed forwards the input message as it came
                packs.append(with_original(result.signed, raw or b"", headers.get((tp, offset), ())))
            else:
                packs.append(result.signed)
            refused_times += result.refused_time
        sends = await self.outputs.dead_letters(letters)
        for pack in pack_in_chunks(packs):
            sent = await self.signatures.send(key=SHARD_KEY, value=pack)
            sends.append(sent)
            if settings.index_handoff:
                self.hand_off.submit(sent, pack)
        self.fault.after_batch("sign")

        async def delivered() -> None:
            await _allow_commits_past(self.app, gaps)
            await stream.acknowledge(batch)
            self.outputs.count_dead_letters(letters)
            runtime.metrics.articles_in.inc(len(items))
            if refused_times:
                runtime.metrics.refused_times.inc(refused_times)
            _record_lag(self.app, runtime.metrics, batch)

        await self.deliveries.settle(sends, delivered)


def _entry(event: faust.EventT) -> tuple[Any, int, SignItem]:
    """An input event as the sign stage takes it, with its partition and offset."""
    msg = event.message
    stamp = int(msg.timestamp * 1000) if msg.timestamp else None
    src = Provenance(msg.topic, msg.partition, msg.offset, stamp)
    return msg.tp, msg.offset, (event.value, event.key, src)


class IndexPipeline:
    """The `index` agent and the hand-off: signatures messages, in the shard's order → the decider →
    verdicts (and the filtered feed, and dead letters) published, the index's writes sent to its
    changelog, settled once the broker has all of them (`deliveries`)."""

    def __init__(self, app: faust.App, runtime: Runtime, outputs: Outputs, fault: AgentFault) -> None:
        self.app = app
        self.runtime = runtime
        self.settings = runtime.settings
        self.metrics = runtime.metrics
        self.outputs = outputs
        self.fault = fault
        self.changelog = changelog_topic(runtime.settings)
        self.shard = TP(runtime.settings.signatures_topic, 0)  # the index shard: one partition
        self.feed_kinds = runtime.settings.feed_kinds()
        assert runtime.indexed is not None
        self.deliveries = runtime.indexed

    async def run(self, stream: Any) -> None:  # faust.Stream; StreamT does not declare take_events
        runtime = self.runtime
        async for fetched in stream.take_events(100, within=TAKE_WITHIN_S):
            runtime.taken_at[self.settings.signatures_topic] = time.monotonic()
            async with runtime.index_lock:
                decider = await _open_decider(runtime)
                # decided already, as soon as this worker's send of them was acknowledged
                batch = [e for e in fetched if e.message.offset > runtime.handed_off]
                gaps = _check_gaps(runtime, batch) if batch else []
                if batch:
                    await self.decide_and_publish(decider, await self._in_log_order(batch, gaps))
                    self.fault.after_batch("index")

            async def acknowledge(fetched: list[Any] = fetched, gaps: list[OffsetGap] = gaps) -> None:
                # after the settling of every chunk of the batch (and of the hand-offs before it)
                await _allow_commits_past(self.app, gaps)
                await stream.acknowledge(fetched)
                _record_lag(self.app, self.metrics, fetched)

            await self.deliveries.settle((), acknowledge)

    async def _in_log_order(
        self, batch: list[faust.EventT], gaps: list[OffsetGap]
    ) -> list[tuple[int, bytes]]:
        """The batch's messages (offset, value), with those of `gaps` read back in their place."""
        messages = [(event.message.offset, cast(bytes, event.value)) for event in batch]
        if not gaps:
            return messages
        delivered = [(self.shard, offset, value) for offset, value in messages]
        fills = [
            (self.shard, found.offset, found.value)
            for _, found in await _read_gaps(self.runtime, gaps)
            if found.value is not None
        ]
        return [(offset, value) for _, offset, value in in_log_order(delivered, gaps, fills)]

    async def decide_and_publish(self, decider: Decider, messages: list[tuple[int, bytes]]) -> None:
        """Decide signatures messages (in the shard's order, following the last one decided), send
        each chunk's writes to the changelog and its verdicts, and hand them to the
        index stage's deliveries. The index has the writes already: it is kept at the next start
        only when closed with all of them acknowledged (Decider.close)."""
        chunks = runs_within(messages, lambda message: len(message[1]), DECIDE_CHUNK_BYTES)
        # Pipelined: the decider works on the next chunk while the loop publishes this one.
        try:
            async with contextlib.aclosing(decider.decide_chunks(chunks)) as answers:
                async for outcome, writes in answers:
                    await self.fault.before_changelog()
                    changelog = await send_in_batches(
                        self.outputs.producer(), self.changelog, writes, partition=0
                    )
                    sends, counted = await self.publish(outcome)
                    sends += [batch.sent for batch in changelog]
                    await self.deliveries.settle(sends, self._applied(changelog, counted))
        except BaseException as exc:
            # Half a batch applied: the index may be ahead of the changelog. Rebuild it from the
            # changelog before the next batch (the re-delivered batch then replays what was applied).
            self.runtime.needs_open = True
            decider.mark_ahead()
            if isinstance(exc, DeciderFailed):
                self.runtime.fail(f"index_unavailable: {exc}; stopping the worker")
            raise

    def _applied(self, changelog: list[SentBatch], counted: Callable[[], None]) -> Callable[[], None]:
        """What a chunk's acknowledgement means: the changelog holds its writes (the decider learns
        where it ends), and its counters count."""

        def apply() -> None:
            if changelog:
                last = changelog[-1]  # one partition: the last batch holds the last write
                self.runtime.decider.acknowledged(last.sent.result().offset + last.messages)
            counted()

        return apply

    async def decide_handed_off(self, messages: list[tuple[int, bytes]]) -> None:
        """Signatures messages this worker sent, decided on their acknowledgement (`_HandOff`)."""
        runtime = self.runtime
        async with runtime.index_lock:
            last = runtime.delivered.get(self.shard)
            if runtime.needs_open or last is None:
                return  # the shard is not (or not yet) this worker's: the consumer brings them
            run = following_run(last, messages)
            if not run:
                return  # another worker's messages come first, or these were decided already
            try:
                await self.decide_and_publish(runtime.decider, run)
            except Exception:
                log.exception("handoff_failed: the consumer delivers these messages again")
                return
            # what the index agent's gap check (offset_gaps) records for the batches it decides
            runtime.delivered[self.shard] = runtime.handed_off = run[-1][0]
            self.metrics.handed_off.inc(len(run))

    async def publish(self, outcome: BatchOutcome) -> tuple[list[Any], Callable[[], None]]:
        """Send a chunk's verdicts, feed messages and dead letters; returns the sends and what
        counts them once they are acknowledged."""
        metrics = self.metrics
        verdicts: list[tuple[bytes | None, bytes | None]] = []
        letters: list[Letter] = []
        # counted per chunk, not per verdict: a labelled counter's increment costs the event loop
        counts: collections.Counter[tuple[Any, str | None]] = collections.Counter()
        latencies: list[float] = []
        feed: list[tuple[bytes | None, bytes | None]] = []  # (key, input message) for the filtered feed
        feed_headers: list[Any] = []
        expired = 0
        for entry in outcome.entries:
            if entry.status == "error":
                letters.append(self._index_error(entry))
                continue
            if entry.status in ("replayed", "stale"):
                counts[(metrics.replays, entry.status)] += 1
            expired += entry.expired
            if entry.status in ("deleted", "unknown_delete"):
                counts[(metrics.deletes, entry.status)] += 1
                if entry.status == "deleted" and entry.article_id is not None:
                    # a tombstone: consumers with a compacted view of the verdicts drop it too
                    verdicts.append((entry.article_id.encode(), None))
                continue
            if entry.verdict is None or entry.article_id is None:
                continue
            if entry.status != "replayed":
                counts[(metrics.verdicts, entry.kind)] += 1
                if entry.latency_ms is not None:
                    latencies.append(entry.latency_ms / 1000.0)
            verdicts.append((entry.article_id.encode(), entry.verdict))
            if entry.original is not None and entry.kind in self.feed_kinds:
                feed.append((entry.article_id.encode(), entry.original))
                feed_headers.append(entry.headers)
        # Keyed by article id, so that every verdict of an article lands in the same partition.
        sends = await self.outputs.send(self.settings.verdicts_topic, verdicts)
        sends += await self.outputs.dead_letters(letters)
        if feed:
            sends += await self.outputs.send(self.settings.unique_topic, feed, headers=feed_headers)
        self.runtime.collector.after(outcome.handled)

        def counted() -> None:
            for (counter, label), count in counts.items():
                counter.labels(label).inc(count)
            for latency in latencies:
                metrics.latency.observe(latency)
            if expired:
                metrics.expired.inc(expired)
            self.outputs.count_dead_letters(letters)
            if feed:
                metrics.fed.inc(len(feed))
            metrics.indexed.set(outcome.indexed)
            metrics.clusters.set(outcome.clusters)
            metrics.buckets.set(outcome.buckets)
            metrics.largest_bucket.set(outcome.largest_bucket)
            if outcome.bytes_on_disk is not None:
                metrics.index_bytes.set(outcome.bytes_on_disk)
            if outcome.oldest_ms is not None:
                metrics.oldest.set(outcome.oldest_ms / 1000.0)
            if outcome.newest_ms is not None:
                metrics.newest.set(outcome.newest_ms / 1000.0)

        return sends, counted

    def _index_error(self, entry: EntryOutcome) -> Letter:
        """A record the index stage could not handle, as a dead letter (signatures messages all
        come from the shard's one partition, under its key)."""
        topic, partition = self.settings.signatures_topic, 0
        log.error(
            "index_error topic=%s partition=%d offset=%d error=%s",
            topic,
            partition,
            entry.offset,
            entry.error,
        )
        assert entry.payload is not None and entry.error is not None
        record = dead_letter_dict(
            "internal_error", entry.error, entry.payload, topic, partition, entry.offset, SHARD_KEY
        )
        return "internal_error", orjson.dumps(record), SHARD_KEY

    async def on_assigned(self, sender: Any, assigned: Any = None, **_: Any) -> None:
        # Faust starts every partition again from its committed offset: what was delivered before
        # says nothing about what comes next (the shard's is set again from the applied offset).
        runtime = self.runtime
        runtime.delivered.clear()
        runtime.handed_off = -1
        now = time.monotonic()
        for tp in assigned or ():
            runtime.taken_at[tp.topic] = now  # no batch yet: none was due
        if any(tp.topic == self.settings.signatures_topic for tp in assigned or ()):
            runtime.needs_open = True

    async def on_revoked(self, sender: Any, revoked: Any = None, **_: Any) -> None:
        # No hand-off once the shard may be another worker's: it waits for the next assignment.
        self.runtime.delivered.pop(self.shard, None)

    async def close(self, sender: Any, **_: Any) -> None:
        """At shutdown, once the consumer has stopped: no batch comes from it any more, and no
        hand-off starts (the shard is no longer this worker's); one in progress ends first. The
        index is then flushed (it has no write-ahead log) and marked reusable when the changelog
        acknowledged everything it holds."""
        runtime = self.runtime
        runtime.delivered.pop(self.shard, None)
        clean = False
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await runtime.index_lock.acquire()  # held to the end: nothing decides after this
            if not runtime.failed:  # after a failure, what is unsettled stays so
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self.deliveries.drain()
                clean = not runtime.failed
        except TimeoutError:
            log.error("index_close: a decision still runs after %.0f s; closing anyway", CLOSE_WAIT_S)
        await runtime.decider.close(clean=clean)
        await runtime.log_reader.close()


def stalled_stage(app: faust.App, runtime: Runtime) -> str | None:
    """Why the worker is stuck, if it is: a stage whose batches have waited for the broker's
    acknowledgement longer than the stall timeout, or a partition with messages waiting that its
    agent has not taken a batch from for that long."""
    limit = runtime.settings.stall_timeout
    now = time.monotonic()
    for stage in runtime.stages():
        if stage.unsettled and now - stage.settled_at > limit:
            waited = now - stage.settled_at
            return f"stage {stage.stage}: {stage.unsettled} batches unacknowledged for {waited:.0f} s"
    for tp in app.consumer.assignment():
        if tp.topic == runtime.settings.signatures_topic and runtime.decider.opening:
            continue  # the index is being rebuilt before the shard's next batch
        highwater = app.consumer.highwater(tp)
        last = runtime.delivered.get(tp)
        taken = runtime.taken_at.get(tp.topic, now)
        if highwater is not None and last is not None and highwater - 1 > last and now - taken > limit:
            waiting = highwater - 1 - last
            return f"{tp.topic}:{tp.partition}: {waiting} waiting, none taken for {now - taken:.0f} s"
    return None


def _record_lag(app: faust.App, metrics: Metrics, batch: list[faust.EventT]) -> None:
    """Consumer lag per partition, from the last event of each partition in the batch."""
    last: dict[Any, int] = {}
    for event in batch:
        last[event.message.tp] = event.message.offset
    for tp, offset in last.items():
        highwater = app.consumer.highwater(tp)
        if highwater is not None:
            metrics.lag.labels(tp.topic, str(tp.partition)).set(max(highwater - offset - 1, 0))


def _check_gaps(runtime: Runtime, batch: list[faust.EventT], level: int = logging.ERROR) -> list[OffsetGap]:
    """Log and count the messages the consumer went past without delivering them."""
    delivered = ((event.message.tp, event.message.offset) for event in batch)
    gaps = offset_gaps(runtime.delivered, delivered)
    for gap in gaps:
        runtime.metrics.offset_gaps.labels(gap.partition.topic).inc()
        log.log(
            level,
            "offset_gap topic=%s partition=%d expected=%d got=%d",
            gap.partition.topic,
            gap.partition.partition,
            gap.expected,
            gap.got,
        )
    return gaps


def _expect_committed(app: faust.App, runtime: Runtime, batch: list[faust.EventT]) -> None:
    """The first message of an input partition after an assignment must be the one at the group's
    committed offset, where Faust seeks to: one beyond it (an event fetched before the rebalance and
    delivered after it, in faust-streaming's open reports) is a gap like any other."""
    for event in batch:
        tp = event.message.tp
        if tp not in runtime.delivered:
            # None when nothing (or offset 0: Faust stores it as None) was committed, and then
            # nothing is expected.
            committed = framework.committed_offset(app, tp)
            if committed is not None:
                runtime.delivered[tp] = committed - 1


async def _read_gaps(runtime: Runtime, gaps: list[OffsetGap]) -> list[tuple[Any, StoredMessage]]:
    """The messages of `gaps` read back from Kafka, with their partitions. A gap that
    cannot be read back (the broker does not answer) stops the worker, so that it restarts from its
    last commit rather than go on without those messages."""
    fills: list[tuple[Any, StoredMessage]] = []
    for gap in gaps:
        tp = gap.partition
        try:
            found = await runtime.log_reader.read(tp.topic, tp.partition, gap.expected, gap.got)
        except Exception:
            runtime.fail("offset_gap_unreadable: stopping the worker", exc_info=True)
            raise
        # messages in a gap were skipped by the consumer; none: a transaction marker, or removed
        runtime.metrics.offset_gap_messages.labels(tp.topic).inc(len(found))
        log.log(
            logging.WARNING if found else logging.INFO,
            "offset_gap_filled topic=%s partition=%d expected=%d got=%d read=%d",
            tp.topic,
            tp.partition,
            gap.expected,
            gap.got,
            len(found),
        )
        fills += [(tp, message) for message in found]
    return fills


def _sign_item(tp: Any, found: StoredMessage) -> SignItem:
    """An input message read back for a gap, as the sign stage takes it."""
    return found.value, found.key, Provenance(tp.topic, tp.partition, found.offset, found.timestamp_ms)


async def _allow_commits_past(app: faust.App, gaps: list[OffsetGap]) -> None:
    """Faust never delivered the offsets of `gaps`, so never acknowledges them: let its commits go
    past them, now that what they held is handled."""
    for gap in gaps:
        await framework.allow_commits_past(app, gap.partition, gap.expected, gap.got - 1)


async def _open_decider(runtime: Runtime) -> Decider:
    """The index stage: at every assignment of the shard, reopened (after a clean shutdown) or
    rebuilt from the changelog."""
    if runtime.needs_open:
        if runtime.indexed is not None:
            await runtime.indexed.drain()  # the changelog holds everything decided so far
        count = await runtime.decider.open()
        runtime.needs_open = False
        # The shard's next message follows the last one the index says was applied: a first
        # message beyond it is a gap too.
        shard = TP(runtime.settings.signatures_topic, 0)
        runtime.delivered[shard] = runtime.decider.applied_offset
        runtime.metrics.index_opens.labels("reopened" if count is None else "rebuilt").inc()
        if count is None:
            log.info("index_reopened")
        else:
            log.info("index_rebuilt articles=%d", count)
    return runtime.decider
