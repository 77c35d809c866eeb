"""Stream benchmark: one `neardup worker` process against a real Kafka broker.

Per repetition (fresh app id, topic names and state dir each time):

0. speed       the CPU time this process takes to sign 200 corpus texts (median of five passes): the
               machine's speed at the time, printed beside the figures, because it varied by up to
               1.5x from one day to the next; the worker's CPU per article is printed too.
1. ceiling     the input topic is pre-loaded with N news-sized articles; a plain aiokafka loop in this
               process consumes them and produces each message to another topic (acks=all, as the
               worker): articles/s, the most one Python process can move through Kafka on this machine.
2. throughput  `neardup worker` is started as a subprocess on the pre-loaded topic; the rate is the
               number of verdicts over the time between the first and the last, using the verdict
               records' timestamps (set by the worker's producer). Also the CPU the worker used, in
               cores: its event loop and its child processes (signing helpers, decider), and how
               busy the whole machine was (broker and this script included): whether it ran out.
3. latency     with the same (warm) worker, articles are produced at a fixed rate (default 500/s),
               those due within each --tick-ms (default 10) together, for a warm-up and then a
               measured window; p50/p99 of the verdict's `latency_ms` (worker clock at the verdict
               minus the input record's timestamp) and of the end-to-end latency (this process
               receiving the verdict minus the input record's timestamp). Each measured article's
               latency split in two legs by record timestamps, read back from the signatures topic:
               input stamped → its signatures message sent (fetch, batching, signing), and that →
               its verdict sent (the signatures' way to the index stage, deciding, publishing).
   --sweep R1,R2,... then repeats this phase at each of those rates (same worker, same warm-up and
               window), printing p50/p99 and how busy the machine was at each: where the latency
               target holds on this machine, and where it breaks.
4. idle        the same worker with no input for --idle seconds (default 10): its CPU, in cores.

Every CPU figure names this script too ("this script"): it is the load, on the same two cores.

Articles (1.2-5 KB of real prose, unique ids) are built from the paragraphs of the news corpus made by
tests/data/build_news_corpus.py (~/.cache/neardup/news/corpus.jsonl), or of service/data/sample_news.jsonl
when that is absent: new articles are random paragraphs recombined; a share (--dup-fraction, default 0.3)
are copies of recent articles with 1-3 words replaced (one in five exact).

Usage (broker from deploy/kafka/kafka.sh):
  python tests/benchmarks/bench_stream.py --broker kafka://127.0.0.1:39092 [--articles 50000]
      [--rate 500] [--warmup 10] [--window 30] [--idle 10] [--repeats 3] [--dup-fraction 0.3]
      [--sweep 100,200,300,400] [--worker-env NAME=VALUE ...]
      [--profile DIR [--profile-phase latency]] [--json out.json]

--profile DIR records the worker and its helper processes with py-spy (`pip install py-spy`), from
the first verdict for --profile-seconds, as collapsed stacks (worker-N.txt); with --profile-phase
latency, from the start of the latency phase instead (worker-N-latency.txt).
Targets: >=3,000 articles/s, p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mmh3
import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.config import Settings  # noqa: E402
from neardup.core.normalize import canonical_code_points  # noqa: E402
from neardup.core.params import DedupParams  # noqa: E402
from neardup.core.shingle import shingle_hashes_of_units  # noqa: E402
from neardup.pipeline.wire import decode_signed, unpack_signed  # noqa: E402
from neardup.stream.topics import ensure_topics  # noqa: E402
from tests.support import reference_sketch  # noqa: E402

SAMPLE = ROOT / "service" / "data" / "sample_news.jsonl"
CORPUS = Path.home() / ".cache" / "neardup" / "news" / "corpus.jsonl"  # tests/data/build_news_corpus.py
TARGET_RATE = 3000.0  # articles/s per worker
TARGET_P99_MS = 50.0  # at the fixed rate
STALL_S = 120.0  # give up when no verdict arrives for this long


# ---------------------------------------------------------------------------------------------
# articles
# ---------------------------------------------------------------------------------------------


def load_corpus(path: Path) -> list[dict[str, Any]]:
    records = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"no articles in {path}")
    return records


class Articles:
    """A stream of news-sized articles with unique ids.

    With probability `dup_fraction` an article is a copy of one of the last 2,000 articles, with 1-3
    words replaced (one copy in five is exact); otherwise it is new: whole paragraphs drawn at random
    from the corpus until the text reaches a length drawn from 1.2-4.5 KB.
    """

    def __init__(self, corpus: list[dict[str, Any]], prefix: str, seed: int, dup_fraction: float) -> None:
        self.paragraphs = [p for r in corpus for p in r["text"].split("\n\n") if len(p) >= 80]
        self.vocabulary = sorted({w for p in self.paragraphs[:2000] for w in p.split() if w.isalpha()})
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.dup_fraction = dup_fraction
        self.recent: deque[str] = deque(maxlen=2000)
        self.count = 0

    def _new_text(self) -> str:
        target = self.rng.uniform(1200, 4500)
        parts: list[str] = []
        size = 0
        while size < target:
            paragraph = self.rng.choice(self.paragraphs)[:5000]
            if parts and size + len(paragraph) > 5000:
                break
            parts.append(paragraph)
            size += len(paragraph) + 2
        return "\n\n".join(parts)

    def _copy(self, text: str) -> str:
        if self.rng.random() < 0.2:
            return text
        words = text.split(" ")
        for _ in range(self.rng.randint(1, 3)):
            words[self.rng.randrange(len(words))] = self.rng.choice(self.vocabulary)
        return " ".join(words)

    def next(self) -> tuple[bytes, bytes]:
        article_id = f"{self.prefix}-{self.count:07d}"
        self.count += 1
        if self.recent and self.rng.random() < self.dup_fraction:
            text = self._copy(self.rng.choice(self.recent))
        else:
            text = self._new_text()
            self.recent.append(text)
        record = {"id": article_id, "title": text[:60], "text": text, "source": "bench"}
        return article_id.encode(), orjson.dumps(record)


# ---------------------------------------------------------------------------------------------
# Kafka helpers
# ---------------------------------------------------------------------------------------------


def producer_for(settings: Settings, linger_ms: int) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        linger_ms=linger_ms,
        max_batch_size=256 * 1024,
        **settings.client_security(),
    )


def consumer_for(settings: Settings, topic: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=5000,
        fetch_max_wait_ms=100,
        # what a consumer of exactly-once verdicts reads (the same records otherwise)
        isolation_level="read_committed",
        **settings.client_security(),
    )


async def preload(settings: Settings, articles: Articles, count: int) -> tuple[float, int]:
    """Send `count` articles as fast as aiokafka allows; returns (articles/s, bytes sent)."""
    producer = producer_for(settings, linger_ms=20)
    await producer.start()
    size = 0
    try:
        started = time.perf_counter()
        pending = []
        for _ in range(count):
            key, value = articles.next()
            size += len(value)
            pending.append(await producer.send(settings.input_topic, value, key=key))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return count / (time.perf_counter() - started), size
    finally:
        await producer.stop()


async def ceiling(settings: Settings, count: int, out_topic: str) -> float:
    """A plain consume→produce loop over the first `count` input records; articles/s."""
    consumer = consumer_for(settings, settings.input_topic)
    producer = producer_for(settings, linger_ms=2)
    await consumer.start()
    await producer.start()
    try:
        seen = 0
        started = None
        pending = []
        while seen < count:
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            if started is None and batch:
                started = time.perf_counter()
            for records in batch.values():
                for record in records:
                    pending.append(await producer.send(out_topic, record.value, key=record.key))
                    seen += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        assert started is not None
        return seen / (time.perf_counter() - started)
    finally:
        await producer.stop()
        await consumer.stop()


# ---------------------------------------------------------------------------------------------
# the worker subprocess
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / os.sysconf("SC_CLK_TCK")


CHILD_ROLES = {"neardup.pipeline.signer": "signing", "neardup.pipeline.decider": "decider"}
LOAD_ROLE = "this script"
IDLE_SETTLE_S = 3.0  # after the last verdict, before the idle measurement


def cpu_between(
    start: tuple[float, dict[str, float], tuple[float, float]],
    end: tuple[float, dict[str, float], tuple[float, float]],
) -> tuple[dict[str, float], float]:
    """(cores used by each of the worker's processes, share of the machine busy) between two marks."""
    elapsed = end[0] - start[0]
    used = {role: (end[1][role] - start[1][role]) / elapsed for role in end[1] if role in start[1]}
    (busy_end, total_end), (busy_start, total_start) = end[2], start[2]
    return used, (busy_end - busy_start) / max(total_end - total_start, 1e-9)


def cpu_mark_now(pid: int) -> tuple[float, dict[str, float], tuple[float, float]]:
    """CPU seconds so far of the worker's processes, the broker and this script (the load: it
    produces and reads back on the same two cores)."""
    return (
        time.monotonic(),
        {**worker_cpu_seconds(pid), LOAD_ROLE: time.process_time()},
        machine_busy_seconds(),
    )


def describe_cpu(used: dict[str, float], busy: float) -> str:
    return (
        ", ".join(f"{role} {cores:.2f}" for role, cores in used.items())
        + f"; the whole machine {busy:.0%} busy ({os.cpu_count()} cores)"
    )


def worker_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of the worker's event-loop process and of its child processes, by role, and of
    a local Kafka broker (a `kafka.Kafka` JVM on this machine, when there is exactly one)."""
    seconds = {"loop": cpu_seconds(pid), **dict.fromkeys(CHILD_ROLES.values(), 0.0)}
    brokers: list[float] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if " kafka.Kafka " in command:
                brokers.append(cpu_seconds(int(stat.parent.name)))
            if parent != pid:
                continue
            role = next((r for module, r in CHILD_ROLES.items() if module in command), None)
            if role is not None:
                seconds[role] += cpu_seconds(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    if len(brokers) == 1:
        seconds["broker"] = brokers[0]
    return seconds


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


class Worker:
    def __init__(self, settings: Settings, env: dict[str, str], log_path: Path) -> None:
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "neardup", "worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.profiler: subprocess.Popen[bytes] | None = None

    def profile(self, out: Path, seconds: float) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            print("  (py-spy not installed: no profile)", flush=True)
            return
        self.profiler = subprocess.Popen(
            [
                spy,
                "record",
                "-p",
                str(self.proc.pid),
                "-d",
                str(int(seconds)),
                "-r",
                "200",
                "-f",
                "raw" if out.suffix == ".txt" else "flamegraph",
                "-o",
                str(out),
                "--threads",
                "--subprocesses",
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> int:
        if self.profiler is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.profiler.wait(timeout=60)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


# ---------------------------------------------------------------------------------------------
# one repetition
# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    preload_rate: float = 0.0
    article_kb: float = 0.0
    ceiling_rate: float = 0.0
    worker_rate: float = 0.0
    worker_rate_slope: float = 0.0
    worker_cpu: float = 0.0  # the event-loop process, in cores
    helpers_cpu: dict[str, float] = field(default_factory=dict)  # its child processes, in cores
    idle_loop_cores: float = 0.0  # the event loop's process with no input
    machine_busy: float = 0.0  # share of all the machine's cores busy (broker and this script too)
    verdict_kinds: dict[str, int] = field(default_factory=dict)
    latency_rate: float = 0.0
    latency_count: int = 0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    e2e_p50_ms: float = 0.0
    e2e_p99_ms: float = 0.0
    # how the slowest 1% of the measured verdicts spread over the window: in a few seconds (stalls of
    # the worker) or throughout (a busy machine); seconds since the window began → how many
    slowest_by_second: dict[int, int] = field(default_factory=dict)
    send_p99_ms: float = 0.0  # this process stamping an article → the broker acknowledging it
    # the two legs of the latency (record timestamps): stamped → signatures message sent → verdict sent
    sign_leg_p50_ms: float = 0.0
    sign_leg_p99_ms: float = 0.0
    index_leg_p50_ms: float = 0.0
    index_leg_p99_ms: float = 0.0
    window_started_at: float = 0.0  # epoch seconds: to line the slowest seconds up with logs
    # --sweep: per rate, {"rate", "p50_ms", "p99_ms", "machine_busy"}
    sweep: list[dict[str, float]] = field(default_factory=list)
    gc_full_pauses: int = 0
    gc_full_total_ms: float = 0.0
    gc_full_longest_ms: float = 0.0  # the upper bound of the highest histogram bucket reached
    # the machine's speed at the time: µs to sign one corpus text in this process (see calibrate)
    signing_us_per_text: float = 0.0
    worker_us_per_article: float = 0.0  # CPU of the worker's processes (broker excluded) per verdict

    @property
    def ratio(self) -> float:
        return self.worker_rate / self.ceiling_rate if self.ceiling_rate else 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def collect_verdicts(
    consumer: AIOKafkaConsumer, ids: set[str], on_poll: Any = None
) -> dict[str, tuple[int, float, dict[str, Any]]]:
    """Read verdicts until every id in `ids` has one: id → (record timestamp ms, receive time s, verdict).
    `on_poll(count so far)` is called before every poll."""
    got: dict[str, tuple[int, float, dict[str, Any]]] = {}
    last = time.monotonic()
    while len(got) < len(ids):
        if on_poll is not None:
            on_poll(len(got))
        batch = await consumer.getmany(timeout_ms=200)
        now = time.time()
        if not batch:
            if time.monotonic() - last > STALL_S:
                raise RuntimeError(f"stalled: {len(got)} of {len(ids)} verdicts after {STALL_S:.0f} s")
            continue
        last = time.monotonic()
        for records in batch.values():
            for record in records:
                verdict = orjson.loads(record.value)
                if verdict["article_id"] in ids:
                    got.setdefault(verdict["article_id"], (record.timestamp, now, verdict))
    return got


def _signed_as_before_anchors(text: str, params: DedupParams) -> None:
    """sketch_of's character path but its anchors, in numpy (the references of the compiled
    loops): the figure stays comparable with the runs before them (the numpy reference of the
    anchors alone takes several times the rest)."""
    points = canonical_code_points(text, params.normalize)
    mmh3.hash_bytes(points.tobytes())
    hashes = shingle_hashes_of_units(points.astype(np.uint64), params.shingle.k)
    reference_sketch.sketches(params.hasher, hashes, params.verify_perm)


def calibrate(corpus: list[dict[str, Any]], texts: int = 200, passes: int = 5) -> float:
    """µs of CPU to sign one corpus text here: the same work on the same texts every run, so that runs
    on different days can be compared (this machine's speed varied by up to 1.5x from one day to
    the next). Median of `passes`. Always the numpy path (not the compiled loops of _sketch.c, which
    came later): the same code as the figures measured before them."""
    sample = [str(record["text"]) for record in corpus[:texts]]
    params = DedupParams()
    timings = []
    for _ in range(passes):
        started = time.process_time()
        for text in sample:
            _signed_as_before_anchors(text, params)
        timings.append((time.process_time() - started) / len(sample) * 1e6)
    return statistics.median(timings)


async def run_once(args: argparse.Namespace, corpus: list[dict[str, Any]], rep: int) -> Result:
    run = f"bench{os.getpid()}r{rep}t{int(time.time())}"
    workdir = Path(tempfile.mkdtemp(prefix=f"neardup-{run}-"))
    env = {
        "NEARDUP_BROKER": args.broker,
        "NEARDUP_APP_ID": run,
        "NEARDUP_INPUT_TOPIC": f"{run}-articles",
        "NEARDUP_SIGNATURES_TOPIC": f"{run}-signatures",
        "NEARDUP_VERDICTS_TOPIC": f"{run}-verdicts",
        "NEARDUP_DEAD_LETTER_TOPIC": f"{run}-dead-letters",
        "NEARDUP_STATE_DIR": str(workdir / "state"),
        "NEARDUP_METRICS_PORT": str(free_port()),
        "NEARDUP_LOG_LEVEL": "info",
    }
    env.update(dict(item.split("=", 1) for item in args.worker_env))
    settings = Settings.from_env(env)
    await asyncio.wait_for(ensure_topics(settings), timeout=60)
    ceiling_topic = f"{run}-ceiling"
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers, **settings.client_security())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(ceiling_topic, 1, 1)])
    finally:
        await admin.close()

    result = Result()
    result.signing_us_per_text = calibrate(corpus)
    print(f"  machine speed: {result.signing_us_per_text:.1f} µs to sign a corpus text here", flush=True)
    articles = Articles(corpus, args.id_prefix or run, seed=rep, dup_fraction=args.dup_fraction)
    n = args.articles
    result.preload_rate, size = await preload(settings, articles, n)
    result.article_kb = size / n / 1024
    print(
        f"  preloaded {n} articles ({result.article_kb:.2f} KB mean) at {result.preload_rate:,.0f}/s",
        flush=True,
    )

    result.ceiling_rate = await ceiling(settings, n, ceiling_topic)
    print(f"  ceiling (aiokafka consume→produce): {result.ceiling_rate:,.0f} articles/s", flush=True)

    verdicts = consumer_for(settings, settings.verdicts_topic)
    await verdicts.start()
    worker = Worker(settings, env, workdir / "worker.log")
    try:
        ids = {f"{articles.prefix}-{i:07d}" for i in range(n)}
        cpu_mark: list[tuple[float, dict[str, float], tuple[float, float]]] = []

        def on_poll(got: int) -> None:
            if got and not cpu_mark:
                cpu_mark.append(cpu_mark_now(worker.proc.pid))
                if args.profile and args.profile_phase == "throughput":
                    out = Path(args.profile) / f"worker-{rep}.txt"
                    worker.profile(out, args.profile_seconds)
            if worker.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {worker.proc.returncode}; see {worker.log.name}")

        got = await collect_verdicts(verdicts, ids, on_poll)
        cpu_end = cpu_mark_now(worker.proc.pid)
        stamps = sorted(ts for ts, _, _ in got.values())
        result.worker_rate = (len(stamps) - 1) / max((stamps[-1] - stamps[0]) / 1000.0, 1e-9)
        lo, hi = stamps[len(stamps) // 10], stamps[len(stamps) * 9 // 10]
        result.worker_rate_slope = (len(stamps) * 8 // 10) / max((hi - lo) / 1000.0, 1e-9)
        used, result.machine_busy = cpu_between(cpu_mark[0], cpu_end)
        result.worker_cpu = used["loop"]
        result.helpers_cpu = {role: cores for role, cores in used.items() if role != "loop"}
        worker_cores = sum(cores for role, cores in used.items() if role not in ("broker", LOAD_ROLE))
        result.worker_us_per_article = worker_cores / max(result.worker_rate, 1e-9) * 1e6
        kinds: dict[str, int] = {}
        for _, _, verdict in got.values():
            kinds[verdict["verdict"]] = kinds.get(verdict["verdict"], 0) + 1
        result.verdict_kinds = kinds
        print(
            f"  worker: {result.worker_rate:,.0f} articles/s first→last verdict "
            f"({result.worker_rate_slope:,.0f}/s over the middle 80%), verdicts {kinds}\n"
            f"  CPU (cores): {describe_cpu(used, result.machine_busy)}; "
            f"the worker's processes {result.worker_us_per_article:.0f} µs per article",
            flush=True,
        )

        prepared = prepare(args, articles)  # before the profile: it records the phase from its start
        if args.profile and args.profile_phase == "latency":
            worker.profile(Path(args.profile) / f"worker-{rep}-latency.txt", args.profile_seconds)
        latency_start = cpu_mark_now(worker.proc.pid)
        await latency_phase(args, settings, prepared, verdicts, result)
        latency_used, latency_busy = cpu_between(latency_start, cpu_mark_now(worker.proc.pid))
        print(
            f"  latency at {result.latency_rate:,.0f}/s over {result.latency_count} articles: "
            f"verdict latency_ms p50 {result.latency_p50_ms:.1f} p99 {result.latency_p99_ms:.1f}; "
            f"end-to-end p50 {result.e2e_p50_ms:.1f} p99 {result.e2e_p99_ms:.1f} ms\n"
            f"  CPU (cores) meanwhile: {describe_cpu(latency_used, latency_busy)}\n"
            f"  the slowest 1% by second of the window (from "
            f"{time.strftime('%H:%M:%S', time.gmtime(result.window_started_at))} UTC): "
            f"{result.slowest_by_second}; "
            f"stamp to broker ack p99 {result.send_p99_ms:.1f} ms\n"
            f"  legs: stamped to signatures sent p50 {result.sign_leg_p50_ms:.0f} p99 "
            f"{result.sign_leg_p99_ms:.0f} ms; signatures sent to verdict sent p50 "
            f"{result.index_leg_p50_ms:.0f} p99 {result.index_leg_p99_ms:.0f} ms (record timestamps)",
            flush=True,
        )
        for rate in args.sweep:
            result.sweep.append(await sweep_point(args, rate, settings, articles, verdicts, worker.proc.pid))
        gc_pauses(env["NEARDUP_METRICS_PORT"], result)
        print(
            f"  full garbage collections in the worker: {result.gc_full_pauses}, "
            f"{result.gc_full_total_ms:.0f} ms in all, the longest ≤ {result.gc_full_longest_ms:.0f} ms",
            flush=True,
        )
        if args.idle > 0:
            # no input: what the worker spends on polling, timers and its own loops
            await asyncio.sleep(IDLE_SETTLE_S)
            idle_start = cpu_mark_now(worker.proc.pid)
            await asyncio.sleep(args.idle)
            idle_used, idle_busy = cpu_between(idle_start, cpu_mark_now(worker.proc.pid))
            result.idle_loop_cores = idle_used["loop"]
            print(
                f"  idle for {args.idle:.0f} s, CPU (cores): {describe_cpu(idle_used, idle_busy)}", flush=True
            )
    finally:
        await verdicts.stop()
        code = worker.stop()
        if code not in (0, -signal.SIGTERM):
            print(f"  worker exit code {code}; log: {workdir / 'worker.log'}", flush=True)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


async def sweep_point(
    args: argparse.Namespace,
    rate: float,
    settings: Settings,
    articles: Articles,
    verdicts: AIOKafkaConsumer,
    worker_pid: int,
) -> dict[str, float]:
    """The latency phase again at `rate` (--sweep), with the same worker."""
    point = Result()
    at_rate = argparse.Namespace(**{**vars(args), "rate": rate})
    prepared = prepare(at_rate, articles)
    started = cpu_mark_now(worker_pid)
    await latency_phase(at_rate, settings, prepared, verdicts, point)
    used, busy = cpu_between(started, cpu_mark_now(worker_pid))
    print(
        f"  sweep: at {point.latency_rate:,.0f}/s verdict latency_ms p50 {point.latency_p50_ms:.1f} "
        f"p99 {point.latency_p99_ms:.1f} ms; CPU (cores): {describe_cpu(used, busy)}",
        flush=True,
    )
    return {
        "rate": rate,
        "p50_ms": point.latency_p50_ms,
        "p99_ms": point.latency_p99_ms,
        "machine_busy": busy,
    }


def gc_pauses(port: str, result: Result) -> None:
    """Full (generation 2) collections so far, from the worker's neardup_gc_pause_seconds histogram."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        if family.name != "neardup_gc_pause_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("generation") != "2":
                continue
            if sample.name.endswith("_count"):
                result.gc_full_pauses = int(sample.value)
            elif sample.name.endswith("_sum"):
                result.gc_full_total_ms = sample.value * 1000
            elif sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
    below = [bound for bound, count in sorted(buckets) if count < result.gc_full_pauses]
    reached = sorted(bound for bound, _ in buckets if bound > max(below, default=0.0))
    result.gc_full_longest_ms = (reached[0] if reached else 0.0) * 1000 if result.gc_full_pauses else 0.0


def prepare(args: argparse.Namespace, articles: Articles) -> list[tuple[bytes, bytes]]:
    """The (key, value) of every article the latency phase at args.rate sends, built before it
    starts, so that the sends keep to their ticks (building one, drawing paragraphs and encoding
    JSON, takes ~30 µs)."""
    return [articles.next() for _ in range(int(args.rate * (args.warmup + args.window)))]


async def latency_phase(
    args: argparse.Namespace,
    settings: Settings,
    prepared: list[tuple[bytes, bytes]],
    verdicts: AIOKafkaConsumer,
    result: Result,
) -> None:
    """Produce `prepared` at a fixed rate; measure the articles sent after the warm-up."""
    producer = producer_for(settings, linger_ms=0)
    await producer.start()
    total = len(prepared)
    skip = int(args.rate * args.warmup)
    sent_at: dict[str, int] = {}
    acked_at: dict[str, float] = {}
    measured: set[str] = set()

    async def send_all() -> float:
        started = time.time()
        tick = args.tick_ms / 1000.0
        for i in range(total):
            # each article at its due time, rounded up to the next tick: the articles due within
            # one tick leave together, in one produce request
            due = started + math.ceil(i / args.rate / tick) * tick if tick > 0 else started + i / args.rate
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            key, value = prepared[i]
            stamp = int(time.time() * 1000)
            article_id = key.decode()
            sent_at[article_id] = stamp
            if i >= skip:
                measured.add(article_id)
            sent = await producer.send(settings.input_topic, value, key=key, timestamp_ms=stamp)
            sent.add_done_callback(
                lambda _, article_id=article_id: acked_at.__setitem__(article_id, time.time())
            )
        await producer.flush()
        return (total - 1) / (time.time() - started)

    # This process holds every verdict of the run: its own full collections would delay the
    # articles it sends and count as the worker's latency.
    gc.collect()
    gc.freeze()
    try:
        ids = {key.decode() for key, _ in prepared}
        sender = asyncio.create_task(send_all())
        got = await collect_verdicts(verdicts, ids)
        result.latency_rate = await sender
    finally:
        await producer.stop()
    latency = [got[a][2]["latency_ms"] for a in measured]
    e2e = [got[a][1] * 1000.0 - sent_at[a] for a in measured]
    result.latency_count = len(measured)
    result.latency_p50_ms, result.latency_p99_ms = percentile(latency, 0.5), percentile(latency, 0.99)
    result.e2e_p50_ms, result.e2e_p99_ms = percentile(e2e, 0.5), percentile(e2e, 0.99)
    window_start = min(sent_at[a] for a in measured)
    slowest = sorted(measured, key=lambda a: got[a][2]["latency_ms"])[-max(1, len(measured) // 100) :]
    seconds = Counter((sent_at[a] - window_start) // 1000 for a in slowest)
    result.slowest_by_second = dict(sorted(seconds.items()))
    result.window_started_at = window_start / 1000.0
    # the time from stamping an article to the broker's acknowledgement: a stall on this side
    result.send_p99_ms = percentile([acked_at[a] * 1000.0 - sent_at[a] for a in measured], 0.99)
    signed_at = await signatures_sent_at(settings, window_start - 1000, measured)
    sign_leg = [signed_at[a] - sent_at[a] for a in measured if a in signed_at]
    index_leg = [got[a][0] - signed_at[a] for a in measured if a in signed_at]
    if sign_leg:
        result.sign_leg_p50_ms, result.sign_leg_p99_ms = percentile(sign_leg, 0.5), percentile(sign_leg, 0.99)
        result.index_leg_p50_ms, result.index_leg_p99_ms = (
            percentile(index_leg, 0.5),
            percentile(index_leg, 0.99),
        )


async def signatures_sent_at(settings: Settings, since_ms: int, ids: set[str]) -> dict[str, int]:
    """When the signatures message of each article in `ids` was sent (its record timestamp, set by
    the worker's producer), read back from the signatures topic from `since_ms` on."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        max_poll_records=5000,
        isolation_level="read_committed",
        **settings.client_security(),
    )
    await consumer.start()
    try:
        shard = TopicPartition(settings.signatures_topic, 0)
        consumer.assign([shard])
        end = (await consumer.end_offsets([shard]))[shard]
        found = (await consumer.offsets_for_times({shard: since_ms}))[shard]
        consumer.seek(shard, found.offset if found is not None else end)
        sent: dict[str, int] = {}
        while await consumer.position(shard) < end:
            batch = await consumer.getmany(shard, timeout_ms=1000)
            for record in batch.get(shard, []):
                for signed in unpack_signed(record.value):
                    article_id = decode_signed(signed).article_id
                    if article_id in ids:
                        sent.setdefault(article_id, record.timestamp)
        return sent
    finally:
        await consumer.stop()


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default=os.environ.get("NEARDUP_BROKER", "kafka://127.0.0.1:39092"))
    parser.add_argument("--articles", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=500.0, help="articles/s of the latency phase")
    parser.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of the latency phase not measured"
    )
    parser.add_argument("--window", type=float, default=30.0, help="seconds of the latency phase measured")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--tick-ms",
        type=float,
        default=10.0,
        help="the latency phase sends the articles due within each tick together (0: one at a time)",
    )
    parser.add_argument(
        "--sweep",
        type=lambda text: [float(rate) for rate in text.split(",") if rate],
        default=[],
        metavar="R1,R2,...",
        help="after the latency phase at --rate, the same at each of these rates (articles/s)",
    )
    parser.add_argument(
        "--idle", type=float, default=10.0, help="seconds without input measured at the end (0: skip)"
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        help=f"JSON-lines articles to draw paragraphs from (default {CORPUS}, else {SAMPLE})",
    )
    parser.add_argument("--dup-fraction", type=float, default=0.3, help="share of near-duplicate copies")
    parser.add_argument(
        "--id-prefix",
        default="",
        help="article ids' prefix (default: the run's name); 'bench' gives bench_state_size.py's ids",
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the worker (repeatable)",
    )
    parser.add_argument("--profile", metavar="DIR", help="py-spy flame graph of the worker per repetition")
    parser.add_argument("--profile-seconds", type=float, default=10.0)
    parser.add_argument(
        "--profile-phase",
        choices=["throughput", "latency"],
        default="throughput",
        help="the phase --profile records, from its start",
    )
    parser.add_argument("--keep", action="store_true", help="keep the worker's state dir and log")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)

    corpus_path = args.corpus or (CORPUS if CORPUS.exists() else SAMPLE)
    corpus = load_corpus(corpus_path)
    print(f"corpus {corpus_path} ({len(corpus)} records), near-duplicate share {args.dup_fraction}")
    results: list[Result] = []
    for rep in range(args.repeats):
        print(f"repetition {rep + 1}/{args.repeats}", flush=True)
        results.append(asyncio.run(run_once(args, corpus, rep)))

    def med(name: str) -> float:
        return statistics.median(getattr(r, name) for r in results)

    worker_rate, ceiling_rate, p99 = med("worker_rate"), med("ceiling_rate"), med("latency_p99_ms")
    print()
    print(
        f"summary: median of {len(results)} repetition(s), {args.articles} articles of "
        f"{med('article_kb'):.2f} KB, one worker process, broker {args.broker}"
    )
    print(
        f"  worker throughput     {worker_rate:9,.0f} articles/s   "
        f"(middle 80%: {med('worker_rate_slope'):,.0f}/s, event loop {med('worker_cpu'):.2f} cores, "
        f"machine {med('machine_busy'):.0%} busy)"
    )
    print(
        f"  worker CPU            {med('worker_us_per_article'):9,.0f} µs per article (its processes, "
        f"broker excluded), on a machine signing a corpus text in {med('signing_us_per_text'):.1f} µs"
    )
    print(f"  ceiling (aiokafka)    {ceiling_rate:9,.0f} articles/s")
    print(f"  worker / ceiling      {statistics.median(r.ratio for r in results):9.2f}")
    print(
        f"  latency at {args.rate:.0f}/s      p50 {med('latency_p50_ms'):.1f} ms, p99 {p99:.1f} ms (verdict "
        f"latency_ms); end-to-end p50 {med('e2e_p50_ms'):.1f} ms, p99 {med('e2e_p99_ms'):.1f} ms"
    )
    for index, rate in enumerate(args.sweep):
        points = [r.sweep[index] for r in results]
        p50s, p99s = (statistics.median(point[name] for point in points) for name in ("p50_ms", "p99_ms"))
        print(f"  sweep at {rate:5.0f}/s      p50 {p50s:.1f} ms, p99 {p99s:.1f} ms")
    print(
        f"  full GC pauses        {med('gc_full_pauses'):.0f} per run, "
        f"longest ≤ {med('gc_full_longest_ms'):.0f} ms"
    )
    print(f"  target ≥{TARGET_RATE:,.0f} articles/s per worker: {verdict(worker_rate >= TARGET_RATE)}")
    print(f"  target p99 ≤{TARGET_P99_MS:.0f} ms at {args.rate:.0f}/s: {verdict(p99 <= TARGET_P99_MS)}")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "ratio": r.ratio} for r in results], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
