"""Restart benchmark: a worker's process group SIGKILLed with N articles held, then started again:
how long from the restart to its next verdict, when its index is restored (the changelog after its
committed offset replayed) and when it is rebuilt from the whole changelog (its state directory
lost), both measured in the same run, alternated.

Per size: N articles (the generator of bench_stream.py, 30% near-copies) are signed and decided
once in this process by the index stage, which writes the derived index and the changelog as the
worker does; the changelog is produced to the worker's changelog topic and the index marked with
its end, as a worker that had decided them would have left both. A worker is started on them, a
trickle of new articles (--rate per second) runs throughout, and then, --repeats times:

  restore   SIGKILL of the worker's process group; started again at once
  rebuild   SIGKILL of the worker's process group; its index directory removed; started again

Each prints the seconds from the restart to the first verdict after it (the verdict record's
timestamp, set by the worker's producer), and what the worker logged of the open (records
replayed, or articles rebuilt, and the open's own seconds). Medians and the ratio at the end.

Usage (broker from deploy/kafka/kafka.sh):
  python tests/benchmarks/bench_restore.py --broker kafka://127.0.0.1:39092
      [--sizes 300000,1000000] [--repeats 2] [--rate 20] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests" / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_index import read_signed, sign_into  # noqa: E402
from bench_stream import CORPUS, SAMPLE, Articles, consumer_for, free_port, load_corpus, producer_for  # noqa: E402

from neardup.config import Settings  # noqa: E402
from neardup.core.params import DedupParams  # noqa: E402
from neardup.pipeline.shard import IndexShard  # noqa: E402
from neardup.state.rocks import RocksOptions, RocksState  # noqa: E402
from neardup.stream.topics import changelog_topic, ensure_topics  # noqa: E402

_LEN = struct.Struct(">II")
NO_VALUE = 0xFFFFFFFF


class _Spool(dict[bytes, bytes]):
    """The changelog as the index stage writes it, spooled to a file in order (tombstones too)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.out = path.open("wb")
        self.count = 0

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.out.write(_LEN.pack(len(key), len(value)) + key + value)
        self.count += 1

    def __delitem__(self, key: bytes) -> None:
        self.out.write(_LEN.pack(len(key), NO_VALUE) + key)
        self.count += 1


def spooled(path: Path) -> Iterator[tuple[bytes, bytes | None]]:
    with path.open("rb") as spool:
        while header := spool.read(_LEN.size):
            key_size, value_size = _LEN.unpack(header)
            key = spool.read(key_size)
            yield key, None if value_size == NO_VALUE else spool.read(value_size)


def build(workdir: Path, count: int, seed: int) -> tuple[Path, Path, int]:
    """The derived index (state/index) and the changelog (a spool file) of `count` articles."""
    signed, spool_path = workdir / "signed", workdir / "changelog"
    started = time.perf_counter()
    sign_into(signed, count, seed)
    index = workdir / "state" / "index"
    spool = _Spool(spool_path)
    shard = IndexShard(RocksState(index, RocksOptions(write_ahead_log=False)), DedupParams(), changelog=spool)
    shard.replay({})
    for n, item in enumerate(read_signed(signed)):
        shard.decide([item])  # no signatures offsets: the worker's own topics start empty
        if n % 1000 == 999:
            shard.checkpoint()
    shard.checkpoint()
    spool.out.close()
    shard.state.kv.flush()
    shard.close()
    signed.unlink()
    seconds = time.perf_counter() - started
    print(f"  built {count:,} articles, {spool.count:,} changelog records in {seconds:.0f} s", flush=True)
    return index, spool_path, spool.count


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
    shard = IndexShard(RocksState(index), DedupParams(), changelog={})
    shard.mark_position(end, round(time.time() * 1000))
    shard.close()


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


async def run_size(args: argparse.Namespace, count: int) -> dict[str, list[float]]:
    run = f"restore{os.getpid()}n{count}t{int(time.time())}"
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
    settings = Settings.from_env(env)
    print(f"{count:,} articles held", flush=True)
    try:
        index, spool, _ = build(workdir, count, args.seed)
        await asyncio.wait_for(ensure_topics(settings), timeout=60)
        end = await produce_changelog(settings, spool)
        spool.unlink()
        mark_position(index, end)
        corpus = load_corpus(CORPUS if CORPUS.exists() else SAMPLE)
        trickle = Trickle(settings, Articles(corpus, f"{run}-new", args.seed + 1, 0.3), args.rate)
        tasks = [asyncio.create_task(trickle.produce()), asyncio.create_task(trickle.consume())]
        log = workdir / "worker.log"
        worker = start_worker(env, log)
        await trickle.first_after(time.time(), 600)
        print(f"  first start: {last_open(log)}", flush=True)
        times: dict[str, list[float]] = {"restore": [], "rebuild": []}
        for _ in range(args.repeats):
            for how in ("restore", "rebuild"):
                await asyncio.sleep(args.settle)  # deciding the trickle, as in service
                await kill_group(worker)
                if how == "rebuild":
                    shutil.rmtree(index)  # the state directory lost
                restarted = time.time()
                worker = start_worker(env, log)
                seconds = await trickle.first_after(restarted, 1800)
                times[how].append(seconds)
                print(
                    f"  {how}: next verdict {seconds:.1f} s after the restart ({last_open(log)})", flush=True
                )
        await kill_group(worker)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return times
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def main(args: argparse.Namespace) -> None:
    results = {}
    for count in (int(size) for size in args.sizes.split(",")):
        results[count] = await run_size(args, count)
    print("\nsize       restore (median)   rebuild (median)   rebuild / restore")
    for count, times in results.items():
        restore, rebuild = statistics.median(times["restore"]), statistics.median(times["rebuild"])
        print(f"{count:>9,}  {restore:>14.1f} s  {rebuild:>15.1f} s  {rebuild / restore:>15.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default=os.environ.get("NEARDUP_BROKER", "kafka://127.0.0.1:39092"))
    parser.add_argument("--sizes", default="300000,1000000")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rate", type=float, default=20.0, help="new articles per second throughout")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between a verdict and a kill")
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
