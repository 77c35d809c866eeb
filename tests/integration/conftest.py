"""Real-broker fixtures: the local Kafka from deploy/kafka/kafka.sh, worker subprocesses, consumers.

The broker is reused when one answers on NEARDUP_TEST_KAFKA_PORT (CI starts it); otherwise the
first test that needs it starts it, and the run stops it at its end (the main process, once every
parallel worker is done with it).
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import hashlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from neardup.config import Settings
from neardup.stream.topics import ensure_topics

REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
PORT = int(os.environ.get("NEARDUP_TEST_KAFKA_PORT", "19092"))
BOOTSTRAP = f"127.0.0.1:{PORT}"


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pytest_configure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the run's main process; its workers inherit the id
        os.environ["NEARDUP_TEST_RUN"] = str(os.getpid())


def _started_here() -> Path:
    """Says that this run started the broker, for the main process to stop it."""
    return Path(tempfile.gettempdir()) / f"neardup-kafka-{PORT}.started-by-{os.environ['NEARDUP_TEST_RUN']}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ and _started_here().exists():
        env = {**os.environ, "NEARDUP_KAFKA_PORT": str(PORT)}
        subprocess.run([str(KAFKA_SH), "stop", "--wipe"], check=False, env=env, timeout=120)
        _started_here().unlink()


@pytest.fixture(scope="session")
def kafka() -> Iterator[str]:
    # one start for the parallel workers that all find no broker
    with open(Path(tempfile.gettempdir()) / f"neardup-kafka-{PORT}.start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _port_open(PORT):
            env = {**os.environ, "NEARDUP_KAFKA_PORT": str(PORT)}
            subprocess.run([str(KAFKA_SH), "start"], check=True, env=env, timeout=600)
            _started_here().touch()
    yield BOOTSTRAP


def free_port_pair() -> int:
    """A loopback port that is free, with the next one free too (a broker's controller takes it).
    Below the kernel's ephemeral range (32768 and up by default): a test that stops its broker
    starts it again on the same ports, which an outgoing connection could take meanwhile."""
    for _ in range(200):
        port = random.SystemRandom().randrange(21000, 32000)  # not the per-test seeded generator
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise AssertionError("no two adjacent free ports")


@dataclass
class OwnBroker:
    """A broker of one test's own, for a test that stops it: the shared one serves the tests that
    run beside it (and other runs on the machine)."""

    port: int
    data: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run(self, *command: str) -> None:
        env = {**os.environ, "NEARDUP_KAFKA_PORT": str(self.port), "NEARDUP_KAFKA_DIR": str(self.data)}
        subprocess.run([str(KAFKA_SH), *command], check=True, env=env, timeout=600)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    broker = OwnBroker(free_port_pair(), tmp_path / "kafka")
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop", "--wipe")


def health(url: str) -> tuple[int, dict[str, Any]] | None:
    """A worker's /health now: the status code and the body; None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status), orjson.loads(response.read())
    except urllib.error.HTTPError as error:  # 503: unhealthy, with the reason in the body
        with error:
            return int(error.code), orjson.loads(error.read())
    except (OSError, orjson.JSONDecodeError):  # not listening yet, or no more; cut short
        return None


def healthy(url: str) -> bool:
    """Whether a worker's /health answers 200 now (not yet listening counts as no)."""
    answer = health(url)
    return answer is not None and answer[0] == 200


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Deployment:
    """One isolated service instance: its own app id, topics and state directories."""

    bootstrap: str
    root: Path
    input_partitions: int = 1
    name: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:10]}")
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    metrics_ports: dict[int, int] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def topics(self) -> dict[str, str]:
        return {
            "input": f"{self.name}-articles",
            "signatures": f"{self.name}-signatures",
            "verdicts": f"{self.name}-verdicts",
            "dead": f"{self.name}-dead-letters",
        }

    def env(self, index: int) -> dict[str, str]:
        self.metrics_ports.setdefault(index, free_port())
        return {
            **os.environ,
            "NEARDUP_BROKER": f"kafka://{self.bootstrap}",
            "NEARDUP_APP_ID": self.name,
            "NEARDUP_INPUT_TOPIC": self.topics["input"],
            "NEARDUP_SIGNATURES_TOPIC": self.topics["signatures"],
            "NEARDUP_VERDICTS_TOPIC": self.topics["verdicts"],
            "NEARDUP_DEAD_LETTER_TOPIC": self.topics["dead"],
            "NEARDUP_INPUT_PARTITIONS": str(self.input_partitions),
            "NEARDUP_STATE_DIR": str(self.state_dir(index)),
            "NEARDUP_METRICS_PORT": str(self.metrics_ports[index]),
            # NEARDUP_TEST_LOG_LEVEL=info keeps the workers' recovery and rebuild logs, for a failure
            "NEARDUP_LOG_LEVEL": os.environ.get("NEARDUP_TEST_LOG_LEVEL", "warning"),
            **self.extra_env,
        }

    def create_topics(self) -> None:
        """What a worker does at start, for tests that fill the input topic before any worker runs."""
        settings = Settings.from_env(self.env(0))
        asyncio.run(ensure_topics(settings))

    def state_dir(self, index: int) -> Path:
        return self.root / f"worker{index}"

    def start_worker(self, index: int = 0, *, wait: bool = True) -> subprocess.Popen[bytes]:
        """A worker process, once it is ready (`wait`)."""
        log = (self.root / f"worker{index}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "neardup", "worker"],
            cwd=REPO,
            env=self.env(index),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        if wait:
            self.wait_ready(index, proc)
        return proc

    def wait_ready(self, index: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
        """Until /health says ok: topics exist and the Faust app is running."""
        url = self.health_url(index)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"worker {index} exited with {proc.returncode}:\n{self.logs()}")
            if healthy(url):
                return
            time.sleep(0.2)
        raise AssertionError(f"worker {index} not ready after {timeout}s:\n{self.logs()}")

    def health_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[index]}/health"

    def metrics(self, index: int) -> str:
        url = f"http://127.0.0.1:{self.metrics_ports[index]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def metric(self, index: int, name: str) -> float | None:
        """One sample of the worker's /metrics by its full name (labels included), None if absent."""
        for line in self.metrics(index).splitlines():
            if line.split(" ")[0] == name:
                return float(line.rsplit(" ", 1)[1])
        return None

    def settled_metric(self, index: int, name: str, expected: float, timeout: float = 20.0) -> float | None:
        """The metric once it equals `expected`, or its last value after `timeout`: counters move
        when the broker acknowledges the worker's sends, which a consumer may see a moment before."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(index, name)
            if value == expected or time.monotonic() > deadline:
                return value
            time.sleep(0.2)

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> bool:
        """Send `sig` to the worker's process group and wait until it has exited. Whether it was a
        live process that the signal stopped: False when it had exited already (a test that means to
        kill a running worker asserts the answer); for SIGKILL, only when SIGKILL is what ended it."""
        if proc.poll() is not None:
            return False
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        return proc.returncode == -signal.SIGKILL if sig == signal.SIGKILL else True

    def stop_all(self) -> None:
        for proc in self.workers:
            self.kill(proc, signal.SIGTERM)

    def discard(self) -> None:
        """SIGKILL what still runs: after the test, nothing needs a clean stop (which would flush,
        commit and compact, seconds a test)."""
        for proc in self.workers:
            self.kill(proc, signal.SIGKILL)

    def logs(self) -> str:
        """The tail of each worker's log, for a failure's message."""
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in sorted(self.root.glob("*.log")))

    def log_text(self) -> str:
        """Every worker's whole log, for what a test looks for in it: a stop's tracebacks can push
        the line it looks for out of the tail `logs` keeps."""
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("*.log")))


@pytest.fixture
def deployment(kafka: str, tmp_path: Path) -> Iterator[Deployment]:
    dep = Deployment(kafka, tmp_path)
    yield dep
    dep.discard()


async def create_topic(
    bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> None:
    """One topic with one replica, made as an operator would before the worker or a test writes it
    (a partition count or limit other than the worker's own, or a topic it never creates)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        await admin.close()


def content_stats(deployment: Deployment, *where: str) -> dict[str, Any]:
    """`neardup stats --json` of a state directory, or of the changelog (`--broker`: what a rebuild
    gives), without what depends on the storage rather than the content."""
    out = subprocess.run(
        [sys.executable, "-m", "neardup", "stats", *where, "--json"],
        cwd=REPO,
        env=deployment.env(0),
        check=True,
        capture_output=True,
        timeout=120,
    )
    stats = orjson.loads(out.stdout)
    return {k: v for k, v in stats.items() if k not in ("bytes_on_disk", "bucket_cap")}


def set_max_message_bytes(bootstrap: str, topic: str, limit: int) -> int:
    """Set `topic`'s max.message.bytes (its only setting: AlterConfigs replaces them all), once the
    broker reports it, as an operator would under a running worker; returns the limit before."""

    async def limit_of(admin: AIOKafkaAdminClient) -> int:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})
        [response] = await admin.describe_configs([resource])
        [(_error, _message, _type, _name, entries)] = response.resources
        return next(int(entry[1]) for entry in entries if entry[0] == "max.message.bytes")

    async def set_limit() -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            before = await limit_of(admin)
            resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(limit)})
            await admin.alter_configs([resource])
            for _ in range(50):
                if await limit_of(admin) == limit:
                    return before
                await asyncio.sleep(0.2)
            raise AssertionError(f"{topic}: max.message.bytes still not {limit}")
        finally:
            await admin.close()

    return asyncio.run(set_limit())


def decider_pid(worker_pid: int) -> int:
    """The worker's decider process (the index stage's child)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == worker_pid and b"neardup.pipeline.decider" in cmdline:
                return int(entry.name)
    raise AssertionError(f"no decider child of {worker_pid}")


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def produce_articles(bootstrap: str, topic: str, articles: list[dict[str, Any]]) -> None:
    asyncio.run(produce(bootstrap, topic, [(a["id"].encode(), orjson.dumps(a)) for a in articles]))


def source_header(article_id: str) -> list[tuple[str, bytes]]:
    """The header each article's input message carries in the filtered-feed tests."""
    return [("source", f"wire-{article_id}".encode())]


async def _produce_with_headers(bootstrap: str, topic: str, messages: dict[str, bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for article_id, value in messages.items():
            await producer.send(topic, value, key=article_id.encode(), headers=source_header(article_id))
        await producer.flush()
    finally:
        await producer.stop()


def produce_with_headers(bootstrap: str, topic: str, messages: dict[str, bytes]) -> None:
    """Each message keyed by its article id, with its `source_header`, in order."""
    asyncio.run(_produce_with_headers(bootstrap, topic, messages))


class TopicReader:
    """Reads a topic from the beginning, in the background of the test's own polling."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        isolation_level: str = "read_uncommitted",
        *,
        transactional: bool = False,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.records: list[Any] = []
        self.isolation_level = isolation_level  # read_committed: what a consumer of exactly-once reads
        # written in transactions: commit markers take offsets that hold no record
        self.transactional = transactional or isolation_level == "read_committed"

    async def _read(self, until: Any, timeout: float) -> None:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
            isolation_level=self.isolation_level,
        )
        await consumer.start()
        try:
            deadline = time.monotonic() + timeout
            seen = len(self.records)
            skip = seen
            while time.monotonic() < deadline and not until(self.records):
                batch = await consumer.getmany(timeout_ms=300)
                for records in batch.values():
                    for record in records:
                        if skip:
                            skip -= 1
                            continue
                        self.records.append(record)
        finally:
            await consumer.stop()

    def read_until(self, until: Any, timeout: float) -> list[Any]:
        """Re-read the topic from the start until `until(records)` holds or the timeout passes."""
        self.records = []
        asyncio.run(self._read(until, timeout))
        return self.records

    def reach(self, until: Any, timeout: float, logs: Callable[[], str] = str) -> list[Any]:
        """`read_until` that fails the test when the timeout passes first: for a wait that a fault
        injection or the next step relies on (a stall there would otherwise go unseen, and the
        fault land elsewhere than the test says). `logs` gives the workers' logs for the message."""
        records = self.read_until(until, timeout)
        assert until(records), f"{self.topic}: {len(records)} records, short within {timeout:g} s\n{logs()}"
        return records

    async def _read_all(self, timeout: float) -> list[Any]:
        # "earliest" from the start: a seek alone can lose the race with the reset to the default
        # ("latest") that starting the consumer set off, and then the read would find nothing
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level=self.isolation_level,
        )
        await consumer.start()  # without a group: every partition of the topic assigned at once
        try:
            tps = sorted(consumer.assignment())
            assert tps, f"{self.topic}: no partitions"
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            await consumer.seek_to_beginning(*tps)
            records: list[Any] = []
            deadline = time.monotonic() + timeout
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                assert time.monotonic() < deadline, f"{self.topic}: not read to its end in {timeout} s"
                for batch in (await consumer.getmany(timeout_ms=300)).values():
                    records += [r for r in batch if r.offset < ends[TopicPartition(r.topic, r.partition)]]
            # every offset once (the topics read so are neither compacted nor transactional)
            if not self.transactional:
                assert len(records) == sum(ends[tp] - starts[tp] for tp in tps), (self.topic, starts, ends)
            return records
        finally:
            await consumer.stop()

    def read_all(self, timeout: float = 120) -> list[Any]:
        """What the topic holds now: every record below its end offsets at the call, from the start
        (after a SIGKILL of the only worker: everything the broker took from it)."""
        return asyncio.run(self._read_all(timeout))


def repeated_after(before: list[Any], after: list[Any], key: Any) -> int:
    """Records of `after` (a later `read_all` of the same topic) that the topic got after `before`
    was read and that repeat one `before` holds (by `key(record)`): after a kill, what the next
    worker delivered again."""
    ends: dict[int, int] = {}
    for record in before:
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    held = {key(record) for record in before}
    return sum(1 for r in after if r.offset >= ends.get(r.partition, 0) and key(r) in held)


def read_feed(bootstrap: str, topic: str, wanted: set[str], timeout: float = 180) -> list[Any]:
    """The filtered feed once every id of `wanted` is on it, and whatever else came within 2 s more
    (anything that should not be there would come with the rest)."""
    reader = TopicReader(bootstrap, topic)
    records = reader.read_until(lambda r: {m.key.decode() for m in r} >= wanted, timeout=timeout)
    time.sleep(2)
    return reader.read_until(lambda r: len(r) > len(records), timeout=3) or records


def verdicts_by_version(records: list[Any]) -> collections.Counter[tuple[str, int]]:
    """How many times each (article id, version) verdict was read (tombstones left out)."""
    verdicts = (orjson.loads(r.value) for r in records if r.value is not None)
    return collections.Counter((v["article_id"], v["version"]) for v in verdicts)


def verdicts_by_id(records: list[Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        verdict = orjson.loads(record.value)
        out.setdefault(verdict["article_id"], []).append(verdict)
    return out


def without_latency(verdict: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in verdict.items() if k != "latency_ms"}


def load_sample(limit: int | None = None) -> list[dict[str, Any]]:
    lines = (REPO / "service" / "data" / "sample_news.jsonl").read_bytes().splitlines()
    articles = [orjson.loads(line) for line in lines if line.strip()]
    return articles[:limit] if limit else articles


def stream_of(count: int) -> list[dict[str, Any]]:
    """`count` articles cycling through the sample with seeded edits: duplicates, partial copies
    and unique texts all occur, and the index keeps growing."""
    sample = load_sample()
    out = []
    for i in range(count):
        base = sample[i % len(sample)]["text"]
        words = base.split()
        rng = random.Random(i)
        cycle = i // len(sample)
        if cycle % 3 == 1:
            words = words[int(len(words) * 0.3) :]
        elif cycle % 3 == 2:
            for _ in range(max(1, len(words) // 10)):
                words[rng.randrange(len(words))] = f"w{rng.randrange(10**6)}"
        out.append({"id": f"c{i:05d}", "text": " ".join(words) + f" Dispatch {cycle}."})
    return out


# The embedded run's output by the digest of its input, for this process (the same articles are
# the reference of several tests)
_EMBEDDED: dict[bytes, bytes] = {}


def run_embedded(articles: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    """Verdicts of `neardup dedup` for the same articles, as the reference."""
    source = tmp / "embedded-in.jsonl"
    out = tmp / "embedded-out.jsonl"
    data = b"".join(orjson.dumps(a) + b"\n" for a in articles)
    digest = hashlib.sha256(data).digest()
    if digest not in _EMBEDDED:
        source.write_bytes(data)
        subprocess.run(
            [sys.executable, "-m", "neardup", "dedup", str(source), "-o", str(out), "-q"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        _EMBEDDED[digest] = out.read_bytes()
    return [orjson.loads(line) for line in _EMBEDDED[digest].splitlines()]
