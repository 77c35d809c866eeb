"""Workers of an isolated service instance as subprocesses, their health and metrics, and what
their verdicts are compared with: the sample articles and an embedded run of them."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import http.client
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from neardup.config import Settings
from neardup.stream.topics import ensure_topics
from tests.support.broker import free_port

REPO = Path(__file__).resolve().parents[2]


# Not listening yet, or no more; an answer cut short (a worker that exits as it answers: the
# body's bytes never come, http.client.IncompleteRead).
_NO_ANSWER = (OSError, http.client.HTTPException, orjson.JSONDecodeError)


def health(url: str) -> tuple[int, dict[str, Any]] | None:
    """A worker's /health now: the status code and the body; None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status), orjson.loads(response.read())
    except urllib.error.HTTPError as error:  # 503: unhealthy, with the reason in the body
        with error:
            try:
                return int(error.code), orjson.loads(error.read())
            except _NO_ANSWER:
                return None
    except _NO_ANSWER:
        return None


def healthy(url: str) -> bool:
    """Whether a worker's /health answers 200 now (not yet listening counts as no)."""
    answer = health(url)
    return answer is not None and answer[0] == 200


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
