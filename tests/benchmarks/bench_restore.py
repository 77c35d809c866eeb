"""Restart and takeover benchmark: with N articles held, how long until verdicts flow again.

restart   one worker's process group SIGKILLed and started again at once: seconds from the restart
          to its next verdict, its index restored (the changelog after its committed offset
          replayed) against rebuilt from the whole changelog (its state directory removed first).
takeover  two workers; the process group of the one that owns the index shard SIGKILLed for good:
          seconds from the kill to the other's first verdict, and from its assignment of the shard
          (its log's index_shard_assigned) to that verdict, with NEARDUP_STANDBY_REPLICAS=1 (its
          warm copy replays only its lag) against 0 (its state directory empty: it rebuilds from
          the whole changelog). The group's session timeout comes first: the dead owner's
          partitions move only once it expires (--session-timeout-ms, the worker's default).

Each mode alternates its two cases --repeats times in one run; a trickle of new articles (--rate
per second) runs throughout. Medians and ratios at the end.

Per size: N articles (the generator of bench_stream.py, 30% near-copies) are signed in a child
process while this one decides them with the index stage, which writes the derived index and the
changelog as the worker does. Both are cached under ~/.cache/neardup/bench_restore, keyed by size,
seed and the source of the code that writes them, so a rerun does not rebuild. The changelog is
produced to the worker's changelog topic and a copy of the index marked with its end, as a worker
that had decided them would have left both.

Usage (broker from deploy/kafka/kafka.sh):
  python tests/benchmarks/bench_restore.py --broker kafka://127.0.0.1:39092
      [--sizes 300000,1000000] [--modes restart,takeover] [--repeats 2] [--rate 20] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests" / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_stream import CORPUS, SAMPLE, Articles, consumer_for, free_port, load_corpus, producer_for  # noqa: E402

from neardup.config import BY_NAME, Settings  # noqa: E402
from neardup.core.params import DedupParams  # noqa: E402
from neardup.pipeline.shard import IndexShard  # noqa: E402
from neardup.pipeline.sign import SignStage  # noqa: E402
from neardup.pipeline.wire import Provenance, Signed, decode_signed  # noqa: E402
from neardup.state.rocks import RocksOptions, RocksState  # noqa: E402
from neardup.stream.topics import changelog_topic, ensure_topics  # noqa: E402
from tests.support.state import flush  # noqa: E402

_LEN = struct.Struct(">II")
NO_VALUE = 0xFFFFFFFF
CACHE = Path.home() / ".cache" / "neardup" / "bench_restore"
CHUNK = 1000  # articles signed, handed over and decided at a time; the index checkpoints per chunk
# the time of a log line, as the worker's format writes it and as Faust's (once it runs) does
ASSIGNED = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]? .*index_shard_assigned", re.MULTILINE)


class _Spool(list[tuple[bytes, bytes | None]]):
    """The changelog as the index stage writes it, spooled to a file in order (tombstones too)
    at each `flush`."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.out = path.open("wb")
        self.count = 0

    def flush(self) -> None:
        for key, value in self:
            size = NO_VALUE if value is None else len(value)
            self.out.write(_LEN.pack(len(key), size) + key + (value or b""))
        self.count += len(self)
        self.clear()


def spooled(path: Path) -> Iterator[tuple[bytes, bytes | None]]:
    with path.open("rb") as spool:
        while header := spool.read(_LEN.size):
            key_size, value_size = _LEN.unpack(header)
            key = spool.read(key_size)
            yield key, None if value_size == NO_VALUE else spool.read(value_size)


# -- the articles held: built once per size and seed ----------------------------------------------


def _corpus() -> Path:
    return CORPUS if CORPUS.exists() else SAMPLE


def cache_key(count: int, seed: int) -> str:
    """Size, seed, and what the index and changelog depend on: the corpus and the source of the code
    that generates, signs and decides (a change to any of it builds again)."""
    digest = hashlib.sha256(repr(DedupParams().header()).encode())
    corpus = _corpus()
    digest.update(f"{corpus}:{corpus.stat().st_size}".encode())
    sources = [ROOT / "tests" / "benchmarks" / "bench_stream.py", Path(__file__)]
    for package in ("core", "state", "pipeline"):
        sources += sorted((ROOT / "service" / package).glob("*.[pc]*"))
    for source in sources:
        if source.suffix in (".py", ".c"):
            digest.update(source.read_bytes())
    return f"n{count}-s{seed}-{digest.hexdigest()[:12]}"


def _sign_chunks(count: int, seed: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """In a child process: generate and sign the articles, a chunk of encoded records at a time."""
    articles = Articles(load_corpus(_corpus()), "bench", seed, dup_fraction=0.3)
    stage = SignStage(DedupParams(), 1_000_000)
    chunk: list[bytes] = []
    for offset in range(count):
        key, value = articles.next()
        result = stage.handle(value, key, Provenance("articles", 0, offset, 1_700_000_000_000))
        assert result.signed is not None, result.reason
        chunk.append(result.signed)
        if len(chunk) == CHUNK or offset == count - 1:
            out.put(chunk)
            chunk = []
    out.put(None)


def build(directory: Path, count: int, seed: int) -> int:
    """The derived index (directory/index) and the changelog (directory/changelog, a spool) of
    `count` articles; returns the changelog's records. The signing child runs a few chunks ahead
    of the deciding, so the two take a core each."""
    started = time.perf_counter()
    chunks: multiprocessing.Queue = multiprocessing.get_context("fork").Queue(maxsize=8)  # type: ignore[type-arg]
    signer = multiprocessing.get_context("fork").Process(target=_sign_chunks, args=(count, seed, chunks))
    signer.start()
    spool = _Spool(directory / "changelog")
    # flushed at the end: nothing to survive a crash; a cache for most of what is read back, which
    # changes what is held in memory, not what is written; the layout the worker creates by default
    held = BY_NAME["index_in_memory"].default
    options = RocksOptions(write_ahead_log=False, block_cache_mb=1024, hold_families=held)
    state = RocksState(directory / "index", options)
    shard = IndexShard(state, DedupParams(), changelog=spool)
    shard.replay({})
    decided, lap = 0, started
    while (chunk := chunks.get()) is not None:
        items = [decode_signed(record) for record in chunk]
        assert all(isinstance(item, Signed) for item in items)
        shard.decide(items)  # no signatures offsets: the worker's own topics start empty
        shard.checkpoint()
        spool.flush()
        decided += len(items)
        if decided % 100_000 == 0:
            lap, seconds = time.perf_counter(), time.perf_counter() - lap
            print(f"  {decided:,} decided, the last 100,000 at {100_000 / seconds:.0f}/s", flush=True)
    signer.join()
    spool.out.close()
    flush(state.rocks)  # the store under the held families, if any
    shard.state.close()
    seconds = time.perf_counter() - started
    print(f"  built {count:,} articles, {spool.count:,} changelog records in {seconds:.0f} s", flush=True)
    return spool.count


def prepare(count: int, seed: int) -> Path:
    """The cached build of `count` articles (index/, changelog), built first if absent."""
    cached = CACHE / cache_key(count, seed)
    if (cached / "done").exists():
        print(f"  {count:,} articles from {cached}", flush=True)
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{cached.name}-", dir=CACHE))
    try:
        records = build(scratch, count, seed)
        (scratch / "done").write_text(f"{records}\n")
        shutil.rmtree(cached, ignore_errors=True)
        scratch.rename(cached)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return cached


async def produce_changelog(settings: Settings, spool: Path) -> int:
    """The changelog records to the topic; returns where it ends."""
    producer = producer_for(settings, linger_ms=20)
    await producer.start()
    topic, pending, last = changelog_topic(settings), [], None
    try:
        for key, value in spooled(spool):
            pending.append(await producer.send(topic, value, key=key, partition=0))
            if len(pending) >= 5000:
                last = (await asyncio.gather(*pending))[-1]
                pending.clear()
        if pending:
            last = (await asyncio.gather(*pending))[-1]
    finally:
        await producer.stop()
    return 0 if last is None else int(last.offset) + 1


def mark_position(index: Path, end: int) -> None:
    """What the worker's index records once it reflects the changelog up to `end`."""
    shard = IndexShard(RocksState(index), DedupParams(), changelog=[])
    shard.mark_position(end, round(time.time() * 1000))
    shard.state.close()


# -- the workers and what they say ----------------------------------------------------------------


class Trickle:
    """New articles at `rate` per second, and the verdicts' timestamps as they come."""

    def __init__(self, settings: Settings, articles: Articles, rate: float) -> None:
        self.settings, self.articles, self.rate = settings, articles, rate
        self.verdict_ms: list[int] = []

    async def produce(self) -> None:
        producer = producer_for(self.settings, linger_ms=0)
        await producer.start()
        try:
            while True:
                key, value = self.articles.next()
                await producer.send(self.settings.input_topic, value, key=key)
                await asyncio.sleep(1 / self.rate)
        finally:
            await producer.stop()

    async def consume(self) -> None:
        consumer = consumer_for(self.settings, self.settings.verdicts_topic)
        await consumer.start()
        try:
            while True:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    self.verdict_ms += [record.timestamp for record in records]
        finally:
            await consumer.stop()

    async def first_after(self, since_s: float, timeout_s: float) -> float:
        """Seconds from `since_s` to the first verdict stamped after it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [ms for ms in self.verdict_ms if ms >= since_s * 1000]
            if later:
                return min(later) / 1000 - since_s
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no verdict within {timeout_s:.0f} s")


@dataclass
class Run:
    """One size's topics, workers' state directories and logs, and the trickle."""

    workdir: Path
    env: dict[str, str]
    session_timeout_ms: int
    trickle: Trickle | None = None
    ports: dict[int, int] = field(default_factory=dict)

    def worker_env(self, worker: int, standby_replicas: int = 0) -> dict[str, str]:
        port = self.ports.setdefault(worker, free_port())
        return {
            **self.env,
            "NEARDUP_STATE_DIR": str(self.state(worker)),
            "NEARDUP_METRICS_PORT": str(port),
            "NEARDUP_SESSION_TIMEOUT_MS": str(self.session_timeout_ms),
            "NEARDUP_STANDBY_REPLICAS": str(standby_replicas),
        }

    def state(self, worker: int) -> Path:
        return self.workdir / f"worker{worker}"

    def index(self, worker: int) -> Path:
        return self.state(worker) / "index"

    def log(self, worker: int) -> Path:
        return self.workdir / f"worker{worker}.log"

    def metric(self, worker: int, name: str) -> float | None:
        url = f"http://127.0.0.1:{self.ports[worker]}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            return None
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else None

    async def first_after(self, since_s: float, timeout_s: float) -> float:
        assert self.trickle is not None
        return await self.trickle.first_after(since_s, timeout_s)


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "neardup", "worker"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, helpers included: killed as one
        )


async def kill_group(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGKILL)
    while worker.poll() is None:
        await asyncio.sleep(0.05)


def last_open(log: Path) -> str:
    """What the worker logged of its last index open."""
    found = re.findall(
        r"index_(restored|rebuilt) (\S+=\d+) seconds=([\d.]+)", log.read_text(errors="replace")
    )
    return "not logged" if not found else f"{found[-1][0]}, {found[-1][1]}, open {found[-1][2]} s"


def assignments(log: Path) -> list[float]:
    """When the worker was given the index shard, each time (its log's index_shard_assigned)."""
    found = ASSIGNED.findall(log.read_text(errors="replace") if log.exists() else "")
    return [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() for stamp in found]


# -- the two modes --------------------------------------------------------------------------------


async def restart_rounds(run: Run, args: argparse.Namespace) -> dict[str, list[float]]:
    """One worker killed and started again: restored, then rebuilt (its state removed)."""
    worker = start_worker(run.worker_env(0), run.log(0))
    await run.first_after(time.time(), 600)
    print(f"  restart mode, first start: {last_open(run.log(0))}", flush=True)
    times: dict[str, list[float]] = {"restore": [], "rebuild": []}
    for _ in range(args.repeats):
        for how in ("restore", "rebuild"):
            await asyncio.sleep(args.settle)  # deciding the trickle, as in service
            await kill_group(worker)
            if how == "rebuild":
                shutil.rmtree(run.index(0))  # the state directory lost
            restarted = time.time()
            worker = start_worker(run.worker_env(0), run.log(0))
            seconds = await run.first_after(restarted, 3600)
            times[how].append(seconds)
            print(
                f"  {how}: next verdict {seconds:.1f} s after the restart ({last_open(run.log(0))})",
                flush=True,
            )
    await kill_group(worker)
    return times


async def wait_standing_by(run: Run, worker: int, replicas: int, timeout_s: float = 3600) -> None:
    """Until the joining worker is in the group without the shard: with a standby, its copy has
    caught up once (the gauge says so only where the shard is not held)."""
    deadline = time.monotonic() + timeout_s
    name = "neardup_index_standby" if replicas else "neardup_index_standby_lag_records"
    while time.monotonic() < deadline:
        value = run.metric(worker, name)
        if value is not None and (value == 1 or not replicas):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"worker {worker} not standing by after {timeout_s:.0f} s")


async def takeover_round(
    run: Run, args: argparse.Namespace, owner: tuple[int, subprocess.Popen[bytes]], how: str
) -> tuple[tuple[int, subprocess.Popen[bytes]], tuple[float, float] | None]:
    """The other worker joins (a warm copy, or no state), then the owner is killed for good.
    Returns the new owner and (kill → first verdict, assignment → it), None if the shard moved
    at the join instead (no takeover to time)."""
    taker, replicas = 1 - owner[0], 1 if how == "standby" else 0
    if not replicas:
        shutil.rmtree(run.state(taker), ignore_errors=True)  # a new node: nothing of the index
    before = len(assignments(run.log(taker)))
    joined = time.time()
    process = start_worker(run.worker_env(taker, replicas), run.log(taker))
    await wait_standing_by(run, taker, replicas)
    await run.first_after(max(joined, time.time() - 1), 600)  # the join's rebalance is over
    await asyncio.sleep(args.settle)
    if len(assignments(run.log(taker))) > before:
        print(f"  {how}: the shard moved to worker {taker} as it joined; no takeover timed", flush=True)
        await kill_group(owner[1])
        return (taker, process), None
    await kill_group(owner[1])
    killed = time.time()
    seconds = await run.first_after(killed, 3600)
    taken = [t for t in assignments(run.log(taker)) if t > killed - 1]
    assert taken, f"worker {taker} decided without an index_shard_assigned after the kill"
    to_verdict = killed + seconds - taken[-1]
    print(
        f"  {how}: first verdict {seconds:.1f} s after the kill, {to_verdict:.1f} s after worker {taker} "
        f"got the shard {taken[-1] - killed:.1f} s after the kill ({last_open(run.log(taker))})",
        flush=True,
    )
    return (taker, process), (seconds, to_verdict)


async def takeover_rounds(run: Run, args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    """Two workers, the owner killed for good: taken over by a warm standby, then by a worker with
    no state, alternated. The first standby's copy is the owner's index as it stood (copied while
    the owner is down); later standbys keep the copy they had as owner and catch up at start."""
    print(
        f"  takeover mode: session timeout {run.session_timeout_ms / 1000:g} s "
        f"(NEARDUP_SESSION_TIMEOUT_MS), standby interval {Settings.from_env(run.env).standby_interval:g} s",
        flush=True,
    )
    shutil.rmtree(run.state(1), ignore_errors=True)
    shutil.copytree(run.state(0), run.state(1))
    process = start_worker(run.worker_env(0, 1), run.log(0))
    await run.first_after(time.time(), 3600)
    owner = (0, process)
    times: dict[str, list[tuple[float, float]]] = {"standby": [], "none": []}
    for _ in range(args.repeats):
        for how in ("standby", "none"):
            await asyncio.sleep(args.settle)
            owner, measured = await takeover_round(run, args, owner, how)
            if measured is not None:
                times[how].append(measured)
    await kill_group(owner[1])
    return times


async def run_size(args: argparse.Namespace, count: int, cached: Path) -> dict[str, dict]:
    name = f"restore{os.getpid()}n{count}t{int(time.time())}"
    workdir = Path(tempfile.mkdtemp(prefix=f"neardup-{name}-"))
    env = {
        "NEARDUP_BROKER": args.broker,
        "NEARDUP_APP_ID": name,
        "NEARDUP_INPUT_TOPIC": f"{name}-articles",
        "NEARDUP_SIGNATURES_TOPIC": f"{name}-signatures",
        "NEARDUP_VERDICTS_TOPIC": f"{name}-verdicts",
        "NEARDUP_DEAD_LETTER_TOPIC": f"{name}-dead-letters",
        "NEARDUP_LOG_LEVEL": "info",
    }
    run = Run(workdir, env, args.session_timeout_ms)
    settings = Settings.from_env({**env, "NEARDUP_STATE_DIR": str(run.state(0))})
    print(f"{count:,} articles held", flush=True)
    tasks = []
    try:
        shutil.copytree(cached / "index", run.index(0))
        await asyncio.wait_for(ensure_topics(settings), timeout=60)
        started = time.perf_counter()
        end = await produce_changelog(settings, cached / "changelog")
        print(f"  changelog of {end:,} records produced in {time.perf_counter() - started:.0f} s", flush=True)
        mark_position(run.index(0), end)
        corpus = load_corpus(_corpus())
        run.trickle = Trickle(settings, Articles(corpus, f"{name}-new", args.seed + 1, 0.3), args.rate)
        tasks = [asyncio.create_task(run.trickle.produce()), asyncio.create_task(run.trickle.consume())]
        results: dict[str, dict] = {}
        if "restart" in args.modes:
            results["restart"] = await restart_rounds(run, args)
        if "takeover" in args.modes:
            results["takeover"] = await takeover_rounds(run, args)
        return results
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: dict[int, dict[str, dict]]) -> None:
    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} s" if values else "-"

    def ratio(slow: list[float], fast: list[float]) -> str:
        return f"{statistics.median(slow) / statistics.median(fast):.1f}x" if slow and fast else "-"

    for count, modes in results.items():
        if restart := modes.get("restart"):
            restore, rebuild = restart["restore"], restart["rebuild"]
            print(
                f"{count:>9,}  restart → next verdict: restore {median(restore)}, rebuild {median(rebuild)} "
                f"(rebuild / restore {ratio(rebuild, restore)})"
            )
        if takeover := modes.get("takeover"):
            killed = {how: [t[0] for t in takeover[how]] for how in ("standby", "none")}
            taken = {how: [t[1] for t in takeover[how]] for how in ("standby", "none")}
            print(
                f"{count:>9,}  takeover, kill → first verdict: standby {median(killed['standby'])}, none "
                f"{median(killed['none'])} ({ratio(killed['none'], killed['standby'])}); shard assigned → "
                f"first verdict: standby {median(taken['standby'])}, none {median(taken['none'])} "
                f"({ratio(taken['none'], taken['standby'])})"
            )


async def main(args: argparse.Namespace, cached: dict[int, Path]) -> None:
    results = {count: await run_size(args, count, path) for count, path in cached.items()}
    print("\nmedians")
    report(results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default=os.environ.get("NEARDUP_BROKER", "kafka://127.0.0.1:39092"))
    parser.add_argument("--sizes", default="300000,1000000")
    parser.add_argument("--modes", default="restart,takeover", help="restart, takeover or both")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rate", type=float, default=20.0, help="new articles per second throughout")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between a verdict and a kill")
    parser.add_argument(
        "--session-timeout-ms",
        type=int,
        default=Settings.from_env({}).session_timeout_ms,
        help="the workers' NEARDUP_SESSION_TIMEOUT_MS (default: the worker's)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parsed = parser.parse_args()
    parsed.modes = set(parsed.modes.split(","))
    # built before any event loop or broker client: the signing child is forked
    sizes = [int(size) for size in parsed.sizes.split(",")]
    asyncio.run(main(parsed, {count: prepare(count, parsed.seed) for count in sizes}))
