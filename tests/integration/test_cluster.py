"""A real three-broker cluster (deploy/kafka/kafka.sh start --brokers 3, on ports of its own): a node
killed and started again; the worker's topics replicated as the cluster's defaults ask, an existing
topic with fewer replicas refused by name; and a worker deciding every article with one broker of
three SIGKILLed (replication 3, min.insync 2).

The tests share one cluster, on one parallel worker: its start takes ~10 s on this machine (three
JVMs of 512 MB heap each), and three such clusters at once would not fit two cores; each test
starts with all three nodes up and in sync (`cluster`). The last one is exactly-once through kills
of the index owner, a broker and a worker."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from neardup.config import Settings
from neardup.core.params import DedupParams
from neardup.core.signing import sketch_of
from neardup.stream.topics import TopicMismatch, ensure_topics
from tests.support.broker import KAFKA_SH, TopicReader, create_topic, produce_articles
from tests.support.deployment import Deployment, stream_of, verdicts_by_id, verdicts_by_version

pytestmark = [pytest.mark.xdist_group("cluster")]
NODES = 3
CONTROLLER_OFFSET = 100  # kafka.sh's default for a cluster: controller i on port + 100 + i


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _cluster_port() -> int:
    """NEARDUP_TEST_KAFKA_CLUSTER_PORT, or a base port whose three brokers' and three controllers'
    ports are all free."""
    if "NEARDUP_TEST_KAFKA_CLUSTER_PORT" in os.environ:
        return int(os.environ["NEARDUP_TEST_KAFKA_CLUSTER_PORT"])
    for base in range(21000, 29000, 7):
        ports = [base + i for i in range(NODES)] + [base + CONTROLLER_OFFSET + i for i in range(NODES)]
        if all(_free(port) for port in ports):
            return base
    raise AssertionError("no free ports for a cluster")


class KafkaShFailed(AssertionError):
    """kafka.sh exited non-zero (its stderr in the message)."""


@dataclass
class Cluster:
    port: int
    data: Path

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(NODES))

    @property
    def broker_url(self) -> str:
        """NEARDUP_BROKER for the worker: every node, as Faust lists several."""
        return ";".join(f"kafka://127.0.0.1:{self.port + i}" for i in range(NODES))

    def run(self, *command: str) -> str:
        env = {**os.environ, "NEARDUP_KAFKA_PORT": str(self.port), "NEARDUP_KAFKA_DIR": str(self.data)}
        done = subprocess.run(
            [str(KAFKA_SH), *command], check=False, env=env, timeout=300, capture_output=True, text=True
        )
        if done.returncode:
            failed = f"kafka.sh {' '.join(command)}: exit {done.returncode}"
            raise KafkaShFailed(f"{failed}\n{done.stderr[-3000:]}")
        return done.stdout


@pytest.fixture(scope="module")
def started_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module's tests, which run on one parallel worker (xdist_group)."""
    found = Cluster(_cluster_port(), tmp_path_factory.mktemp("cluster") / "kafka")
    found.run("start", "--brokers", str(NODES))
    try:
        yield found
    finally:
        found.run("stop", "--wipe")


@pytest.fixture
def cluster(started_cluster: Cluster) -> Cluster:
    """The module's cluster with every node up and in sync, whatever the test before killed: a
    test that kills a node then kills one of three, not the second of the two left (which stops
    the controllers' quorum and every partition's min.insync, and with them any progress)."""
    for node in range(NODES):
        started_cluster.run("start-broker", str(node))  # a node running: waits for it to be in sync
    return started_cluster


async def _live_brokers(bootstrap: str) -> set[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {broker["node_id"] for broker in (await admin.describe_cluster())["brokers"]}
    finally:
        await admin.close()


def _wait_brokers(bootstrap: str, count: int, timeout: float = 20) -> set[int]:
    """The live brokers, once there are `count` of them. A request that the client sends to the
    dead node (still in the metadata it was given) fails: asked again."""
    deadline = time.monotonic() + timeout
    live: set[int] = set()
    while True:
        with contextlib.suppress(KafkaError):
            live = asyncio.run(_live_brokers(bootstrap))
        if len(live) == count:
            return live
        assert time.monotonic() < deadline, f"brokers {live}, expected {count}"
        time.sleep(0.3)


def _a_node_killed_and_started_again_rejoins_the_cluster(cluster: Cluster) -> None:
    assert _wait_brokers(cluster.bootstrap, NODES) == {0, 1, 2}
    status = cluster.run("status")
    assert status.count(" running on 127.0.0.1:") == NODES, status
    cluster.run("kill-broker", "1")
    # node 0 still answers metadata, without the dead node once the controller fenced it
    assert _wait_brokers(f"127.0.0.1:{cluster.port}", NODES - 1) == {0, 2}
    with pytest.raises(KafkaShFailed):  # status: exit 1 while a node is down
        cluster.run("status")
    assert "in sync" in cluster.run("start-broker", "1")
    assert _wait_brokers(f"127.0.0.1:{cluster.port + 1}", NODES) == {0, 1, 2}
    cluster.run("status")


async def _topic_state(bootstrap: str, topic: str) -> tuple[list[int], dict[str, str]]:
    """Replicas per partition, and the topic's min.insync and retention. A broker learns of a topic
    just created a moment after the controller does (a node just restarted later still), and
    describes it without partitions meanwhile: asked again until it lists them, for 15 s."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + 15
        (described,) = await admin.describe_topics([topic])
        while not described["partitions"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            (described,) = await admin.describe_topics([topic])
        replicas = [len(p["replicas"]) for p in described["partitions"]]
        names = {"min.insync.replicas": None, "retention.ms": None, "retention.bytes": None}
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, names)])
        configs = {entry[0]: entry[1] for entry in response.resources[0][4]}
        return replicas, configs
    finally:
        await admin.close()


def _deployment(cluster: Cluster, root: Path, **env: str) -> Deployment:
    root.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(cluster.bootstrap, root)
    deployment.extra_env.update({"NEARDUP_BROKER": cluster.broker_url, **env})
    return deployment


def _topics_take_the_clusters_replication_and_one_with_fewer_replicas_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    deployment = _deployment(cluster, tmp_path)
    deployment.create_topics()
    for topic in ("signatures", "verdicts", "dead"):
        replicas, configs = asyncio.run(_topic_state(cluster.bootstrap, deployment.topics[topic]))
        assert set(replicas) == {3}, (topic, replicas)
        assert configs["min.insync.replicas"] == "2", (topic, configs)
    _, signatures = asyncio.run(_topic_state(cluster.bootstrap, deployment.topics["signatures"]))
    assert (signatures["retention.ms"], signatures["retention.bytes"]) == ("-1", "-1")

    # a verdicts topic made with one replica (as the worker once made every topic) is refused
    other = _deployment(cluster, tmp_path / "other")
    settings = Settings.from_env(other.env(0))

    asyncio.run(create_topic(cluster.bootstrap, settings.verdicts_topic, partitions=3))  # one replica
    with pytest.raises(TopicMismatch, match=rf"{settings.verdicts_topic}.*1 replicas.*asks for 3") as refused:
        asyncio.run(ensure_topics(settings))
    assert "kafka-reassign-partitions.sh" in str(refused.value)
    # asked for one replica, min.insync above it is refused, and with min.insync 1 it is accepted
    one = {**other.env(0), "NEARDUP_REPLICATION_FACTOR": "1"}
    with pytest.raises(TopicMismatch, match=r"min\.insync\.replicas 2 is above the replication factor 1"):
        asyncio.run(ensure_topics(Settings.from_env(one)))
    asyncio.run(ensure_topics(Settings.from_env({**one, "NEARDUP_MIN_INSYNC_REPLICAS": "1"})))


async def _ask_leader(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return int(described["partitions"][0]["leader"])
    finally:
        await admin.close()


def _leader(bootstrap: str, topic: str) -> int:
    """The partition's leader; asked again when the request went to a dead node."""
    for _ in range(20):
        with contextlib.suppress(KafkaError):
            return asyncio.run(_ask_leader(bootstrap, topic))
        time.sleep(0.3)
    raise AssertionError(f"no broker told the leader of {topic}")


def _a_worker_decides_every_article_with_one_broker_of_three_killed(cluster: Cluster, tmp_path: Path) -> None:
    deployment = _deployment(cluster, tmp_path)
    articles = stream_of(300)
    first, second = articles[:150], articles[150:]
    reader = TopicReader(cluster.bootstrap, deployment.topics["verdicts"])
    try:
        deployment.start_worker()
        produce_articles(cluster.bootstrap, deployment.topics["input"], first)
        reader.reach(lambda r: len(verdicts_by_id(r)) >= len(first), timeout=60, logs=deployment.logs)
        # the node that leads the signatures partition: the index shard's input moves to another
        killed = _leader(cluster.bootstrap, deployment.topics["signatures"])
        cluster.run("kill-broker", str(killed))
        produce_articles(cluster.bootstrap, deployment.topics["input"], second)
        verdicts = verdicts_by_id(
            reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=90)
        )
        assert set(verdicts) == {a["id"] for a in articles}, deployment.logs()
        assert all(proc.poll() is None for proc in deployment.workers), deployment.logs()
        assert _leader(cluster.bootstrap, deployment.topics["signatures"]) != killed
    finally:
        deployment.discard()


@pytest.mark.budget(60)  # a node killed and started again (it catches up), then a worker's start on
# three brokers and a leader's failover after a kill: what three JVMs on two cores take
def test_a_three_broker_cluster_loses_a_node_and_the_worker_decides_everything_through_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    _a_node_killed_and_started_again_rejoins_the_cluster(cluster)
    _topics_take_the_clusters_replication_and_one_with_fewer_replicas_is_refused(cluster, tmp_path / "topics")
    _a_worker_decides_every_article_with_one_broker_of_three_killed(cluster, tmp_path / "worker")


def _indexed(deployment: Deployment, index: int) -> float:
    """The worker's neardup_indexed_articles: above 0 only where the index shard was decided."""
    try:
        return deployment.metric(index, "neardup_indexed_articles") or 0.0
    except OSError:  # not serving yet
        return 0.0


def _exact_groups_agree(articles: list[dict[str, Any]], verdicts: dict[str, list[dict[str, Any]]]) -> None:
    """With several input partitions the order across them is the broker's: of each group of
    articles with equal canonical text, exactly one is not an exact duplicate, and every other one
    names a member of the group."""
    groups: dict[bytes, list[str]] = {}
    for article in articles:
        groups.setdefault(sketch_of(article["text"], DedupParams()).content_hash, []).append(article["id"])
    multi = [ids for ids in groups.values() if len(ids) > 1]
    assert multi
    for ids in multi:
        exact = [verdicts[i][0] for i in ids if verdicts[i][0]["exact"]]
        assert len(exact) == len(ids) - 1, [verdicts[i][0] for i in ids]
        assert all(v["match_id"] in ids for v in exact)


class _SteadyProducer(threading.Thread):
    """Produces the articles at a steady pace in the background, so that each kill lands while
    batches are in flight: one idempotent producer for the whole stream, as an upstream service
    would run it, waiting out a broker's loss for as long as Kafka's producers do by default
    (delivery.timeout.ms, 120 s) rather than aiokafka's 40 s."""

    def __init__(self, bootstrap: str, topic: str, articles: list[dict[str, Any]], per_s: float) -> None:
        super().__init__(daemon=True)
        self.args = (bootstrap, topic, articles, per_s)
        self.failed: BaseException | None = None
        self.trace = ""
        self.sent = 0

    def run(self) -> None:
        began = time.monotonic()
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the test, with where it was raised
            self.failed = exc
            elapsed = time.monotonic() - began
            self.trace = f"after {self.sent} articles, {elapsed:.1f} s in:\n{traceback.format_exc()}"

    async def _produce(self) -> None:
        bootstrap, topic, articles, per_s = self.args
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            linger_ms=5,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=120_000,
        )
        await producer.start()
        try:
            for article in articles:
                await producer.send(topic, orjson.dumps(article), key=article["id"].encode())
                self.sent += 1
                await asyncio.sleep(1 / per_s)
            await producer.flush()
        finally:
            await producer.stop()


@pytest.mark.budget(120)  # three kills under a stream on three JVMs and two workers: rebuilds,
# a session timeout per worker kill and a broker's catch-up, on two cores
def test_exactly_once_on_three_brokers_through_kills_of_the_owner_a_broker_and_a_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Replication 3, min.insync 2, exactly-once, three input partitions, two workers: while a
    stream comes in, the index owner is SIGKILLed (and restarted, as a supervisor would), a broker
    is SIGKILLed and started again, a worker is SIGKILLed again. A read_committed consumer then
    finds every (id, version) verdict once, none missing, none disagreeing; the unique feed holds
    each article it carried once."""
    deployment = _deployment(
        cluster,
        tmp_path,
        NEARDUP_PROCESSING_GUARANTEE="exactly_once",
        NEARDUP_SESSION_TIMEOUT_MS="6000",
        NEARDUP_HEARTBEAT_INTERVAL_MS="1000",
        NEARDUP_UNIQUE_TOPIC=f"{tmp_path.name}-unique",
    )
    deployment.input_partitions = 3
    feed_topic = deployment.extra_env["NEARDUP_UNIQUE_TOPIC"]
    articles = stream_of(1500)
    committed = TopicReader(cluster.bootstrap, deployment.topics["verdicts"], "read_committed")
    try:
        deployment.create_topics()
        workers = {0: deployment.start_worker(0), 1: deployment.start_worker(1)}
        producer = _SteadyProducer(cluster.bootstrap, deployment.topics["input"], articles, per_s=100)
        producer.start()
        committed.reach(lambda r: len(r) >= 200, timeout=90, logs=deployment.logs)
        owner = max(workers, key=lambda i: _indexed(deployment, i))
        assert deployment.kill(workers[owner], signal.SIGKILL), deployment.logs()
        workers[owner] = deployment.start_worker(owner)
        committed.reach(lambda r: len(r) >= 500, timeout=90, logs=deployment.logs)
        killed = _leader(cluster.bootstrap, deployment.topics["signatures"])
        cluster.run("kill-broker", str(killed))
        committed.reach(lambda r: len(r) >= 700, timeout=90, logs=deployment.logs)  # decided with a node down
        cluster.run("start-broker", str(killed))
        assert all(worker.poll() is None for worker in workers.values()), deployment.logs()  # none stopped
        assert deployment.kill(workers[1], signal.SIGKILL), deployment.logs()
        workers[1] = deployment.start_worker(1)
        producer.join(timeout=60)
        assert producer.failed is None, producer.trace
        committed.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=120)
        records = committed.read_all(timeout=30)
        verdicts = verdicts_by_id(records)
        counts = verdicts_by_version(records)
        assert [key for key, n in counts.items() if n > 1] == []
        assert set(verdicts) == {a["id"] for a in articles}, deployment.logs()
        _exact_groups_agree(articles, verdicts)
        fed = TopicReader(cluster.bootstrap, feed_topic, "read_committed").read_all(timeout=30)
        fed_ids = collections.Counter(m.key.decode() for m in fed)
        assert [key for key, n in fed_ids.items() if n > 1] == []
        # the feed's default filter: unique and revised (a rewrite is a new text for an index)
        assert set(fed_ids) == {i for i, vs in verdicts.items() if vs[0]["verdict"] in {"unique", "revised"}}
    finally:
        deployment.discard()
