"""The Faust app: its topics, its two agents (sign_agent.py, index_agent.py) and what they share,
built whole before the app starts. Thin: the pipeline (neardup.pipeline) does the work."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import faust

from ..config import Settings
from ..pipeline.decider import Decider
from ..pipeline.delivery import Deliveries
from ..pipeline.health import Failure, broker_away, busy, unready
from ..pipeline.pipes import CallTimeout, ChildFailed
from ..pipeline.sign import SignStage
from ..pipeline.signer import Signer
from ..state.rocks import RocksOptions
from . import framework
from .index_agent import CommitPoint, IndexAgent, index_opened
from .metrics import Metrics
from .outputs import Outputs
from .progress import Progress
from .purge import SignaturesPurge
from .sign_agent import SignAgent
from .standby import Standby
from .topics import ChangelogReader, LogReader, max_request_bytes
from .transactions import Fenced, InputTransactions, ShardTransactions

log = logging.getLogger("neardup.stream")
WATCH_INTERVAL_S = 1.0  # how often the event loop reports on itself and its agents (/health, /ready)
# How long the worker waits for a broker to answer its metadata check: one that does not answer
# within this counts as away (readiness), and the next check starts after it.
BROKER_CHECK_S = 5.0


@dataclass(frozen=True)
class Runtime:
    """Everything the agents share, built whole by create_app before the app starts."""

    settings: Settings
    metrics: Metrics
    failure: Failure
    sign: SignAgent
    index: IndexAgent

    def stages(self) -> list[Deliveries]:
        """Each stage's batches, acknowledged once what they caused is: the sign stage's, the
        index stage's."""
        return [self.sign.deliveries, self.index.deliveries]

    def stalled(self) -> str | None:
        """Why the worker is wedged, if it is (Progress.stalled), but for the topics whose agents
        are busy (health.busy), and never while no broker answers (health.broker_away)."""
        if broker_away(time.monotonic() - self.metrics.broker_seen, self.settings.ready_timeout):
            for topic in list(self.sign.progress.taken_at):
                self.sign.progress.took(topic)
            return None
        topics = (self.settings.input_topic, self.settings.signatures_topic)
        exempt = busy(topics, self.stages(), self.index.decider.opening, self.sign.signer.isolating)
        return self.sign.progress.stalled(self.settings.stall_timeout, exempt)

    def unready(self) -> str | None:
        """Why the worker does not deliver now, if it does not (health.unready)."""
        unseen = time.monotonic() - self.metrics.broker_seen
        return unready(self.stages(), unseen, self.index.decider.opening, self.settings.ready_timeout)


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


# keys and values as the broker holds them: the agents decode what they take themselves
_RAW: dict[str, Any] = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def _raw_topic(app: faust.App, name: str, partitions: int) -> faust.TopicT:
    return app.topic(name, partitions=partitions, **_RAW)


def _credentials(settings: Settings) -> Any:
    ssl = settings.client_security().get("ssl_context")  # under SSL and SASL_SSL only
    if not settings.security_protocol.startswith("SASL"):
        return ssl
    return faust.SASLCredentials(
        username=settings.sasl_username,
        password=settings.sasl_password,
        mechanism=settings.sasl_mechanism,
        ssl_context=ssl,
    )


def create_app(
    settings: Settings,
    metrics: Metrics,
    *,
    exit_later: Callable[[float], None] = lambda seconds: None,
) -> tuple[faust.App, Runtime]:
    """The app and what its agents share. `exit_later`: what bounds a stop for a failure (the
    worker's command passes exit_after); such a stop starts with SIGTERM to this process, as a
    supervisor would send."""
    failure = Failure(metrics, settings.failure_exit_timeout, exit_later=exit_later)
    app = _faust_app(settings, failure)
    articles = _raw_topic(app, settings.input_topic, settings.input_partitions)
    signatures = _raw_topic(app, settings.signatures_topic, 1)
    runtime = _runtime(app, settings, metrics, failure, signatures)
    _wire(app, runtime, articles, signatures)
    return app, runtime


def _faust_app(settings: Settings, failure: Failure) -> faust.App:
    """The Faust app, configured for the worker, and stopping it for `failure`."""

    def agent_failed(agent: Any, exc: BaseException) -> None:
        # Faust would go on with a new agent, past the batch that raised; that batch is not
        # acknowledged (LeanStream), nor any after it (Progress.hold_if_failed), so not
        # committed: a restart brings it back.
        failure.fail(f"agent_failed agent={agent.name} error={exc!r}; stopping the worker")

    app_class = framework.app_class(
        settings.fetch_wait_ms,
        settings.fetch_min_bytes,
        settings.isolation_level,
        # under exactly-once, the stages' transactions commit the offsets, Faust's consumer never
        commits=not settings.exactly_once,
        failed=lambda: failure.failed,
        agent_failed=agent_failed,
    )
    return app_class(
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
        # and the worker with it (pipeline/delivery.py): a supervisor restarts it from its last commit.
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


def _runtime(
    app: faust.App, settings: Settings, metrics: Metrics, failure: Failure, signatures: faust.TopicT
) -> Runtime:
    """Everything the agents share, each part given what it needs."""
    params = settings.params()
    timeout = CallTimeout(settings.helper_timeout, settings.helper_item_timeout_ms / 1000)
    sign_stage = SignStage.under(params, settings.max_text_bytes, settings.retention_window(), keyed=True)
    signer = Signer(sign_stage, settings.sign_processes, settings.sign_nice, timeout)
    progress = Progress(app, metrics, LogReader(settings), failure)
    signed, indexed = Deliveries("sign", failure.fail), Deliveries("index", failure.fail)

    decider = Decider(
        params,
        settings.state_path / "index",
        # the write-ahead log keeps each commit, changelog offset included, through a SIGKILL
        RocksOptions(
            write_ahead_log=True,
            hold_families=settings.index_in_memory,
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
        # A replaced decider child restores from the changelog: first, everything decided before it there
        before_rebuild=indexed.drain,
        on_opened=lambda count, seconds: index_opened(metrics, decider, count, seconds),
    )
    outputs = Outputs(metrics, settings.dead_letter_topic, lambda: framework.aiokafka_producer(app))
    commit_point, shard, inputs = _transactions(settings, metrics, failure, decider)
    # under exactly-once the index stage sends through the shard's transactional producer
    index_outputs = outputs if shard is None else replace(outputs, producer=shard.started_producer)
    index = IndexAgent(settings, decider, index_outputs, progress, failure, indexed, shard, commit_point)
    sign = SignAgent(settings, signer, outputs, signatures, progress, failure, signed, inputs)
    return Runtime(settings, metrics, failure, sign, index)


def _transactions(
    settings: Settings, metrics: Metrics, failure: Failure, decider: Decider
) -> tuple[CommitPoint | None, ShardTransactions | None, InputTransactions | None]:
    """Exactly once: the index's commit point and the stages' writers (none at least once). A writer
    fenced (another worker owns what it writes for) stops the worker; so does one that aborted or
    failed after a commit: nothing after it may commit, and the restart resumes the stage from what
    was committed."""
    if not settings.exactly_once:
        return None, None, None

    def fenced(owned: str) -> Callable[[Fenced], None]:
        return lambda exc: failure.fail(f"producer_fenced: {exc}; another worker owns {owned}, stopping")

    def ended(stage: str) -> Callable[[str], None]:
        resumes = "stopping the worker, which resumes from the last commit"
        return lambda reason: failure.fail(f"{reason} stage={stage}; {resumes}")

    commit_point = CommitPoint(decider)
    shard = ShardTransactions(
        settings,
        fenced=fenced("the index shard"),
        counted=lambda outcome: metrics.transactions.labels(outcome).inc(),
        failed=ended("index"),
        after_commit=commit_point.committed,
    )
    return commit_point, shard, InputTransactions(settings, fenced("the input partition"), ended("sign"))


def _wire(app: faust.App, runtime: Runtime, articles: faust.TopicT, signatures: faust.TopicT) -> None:
    """The agents on their topics, the shard's assignment hooks, and the app's tasks."""
    signer, failure, metrics = runtime.sign.signer, runtime.failure, runtime.metrics
    sign, index = runtime.sign, runtime.index
    shutdown: list[Callable[[], Awaitable[None]]] = cast(Any, app).at_shutdown
    # The signing helpers end with the worker, inside its event loop (the decider is closed on
    # the way: IndexAgent.close); commands.py still stops any that are left once the loop has ended.
    shutdown.append(signer.aclose)
    app.agent(articles, name="sign")(sign.run)
    app.agent(signatures, name="index")(index.run)
    app.on_partitions_assigned.connect(index.on_assigned)  # type: ignore[arg-type]  # mode wants `signal=`
    app.on_partitions_revoked.connect(index.on_revoked)  # type: ignore[arg-type]
    app.on_partitions_revoked.connect(sign.on_revoked)  # type: ignore[arg-type]
    if (inputs := sign.transactions) is not None:
        # every input partition's writer stopped: its open transaction committed, or aborted after a
        # failure
        shutdown.append(lambda: inputs.revoked(list(inputs.writers), commit=not failure.failed))
    app.on_before_shutdown.connect(index.close)  # type: ignore[arg-type]

    @app.task
    async def mark_ready() -> None:
        try:
            await signer.warm_up()
        except ChildFailed as exc:
            failure.fail(f"signing_unavailable: signing helpers cannot start: {exc}; stopping the worker")
            return
        metrics.ready.set()

    @app.task
    async def hand_offs() -> None:
        await sign.hand_off.run(index.decide_handed_off)

    for stage in runtime.stages():
        app.task(stage.run)  # each stage's settling

    @app.timer(interval=WATCH_INTERVAL_S)
    async def watch() -> None:
        """What /health and /ready report about the agents, from the event loop (whose own beat
        it is)."""
        metrics.loop_beat = time.monotonic()
        metrics.stalled = runtime.stalled()
        metrics.unready = runtime.unready()

    @app.task
    async def watch_broker() -> None:
        """Whether a broker answers, for /ready when nothing is sent (an idle worker's outage)."""
        interval = min(BROKER_CHECK_S, runtime.settings.ready_timeout / 2)
        while True:
            if await framework.broker_answers(app, BROKER_CHECK_S):
                metrics.broker_seen = time.monotonic()
            await asyncio.sleep(interval)

    if runtime.settings.standby_replicas >= 1:
        app.task(Standby(runtime.settings, index).run)
    purge = SignaturesPurge(runtime.settings, metrics)
    shutdown.append(purge.close)

    @app.timer(interval=runtime.settings.signatures_purge_interval)
    async def purge_signatures() -> None:
        """The signatures messages whose verdicts the broker holds, deleted: the topic keeps no
        time or size retention (it must not lose pending messages), so this is what bounds it."""
        if index.shard in app.consumer.assignment():
            await purge.purge(framework.committed_offset(app, index.shard))
