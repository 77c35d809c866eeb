"""Index-stage benchmark, in process (no broker): the cost of one article as the index grows.

The stream worker's event loop spends most of its time in the index stage once the index holds tens
of thousands of articles. This script signs N articles once (the generator of bench_stream.py: new
articles recombine corpus paragraphs, 30% are near-copies of recent ones), then runs the index stage
(decide, apply to the derived RocksDB index, write the record) over a fresh state for each
configuration, each in a process of its own (reading the signed articles from a file as it goes),
and prints the main-thread CPU time per article per block of articles and how much the process's
memory grew over the run (its peak resident set, less what it held before opening the state):

  baseline   no probe cache: every candidate's probe read from RocksDB (and a record cache of
             100,000 decoded records, the default before candidates were read as probes)
  current    the defaults: probe cache of 100,000 (NEARDUP_PROBE_CACHE), record cache of 20,000
  memtable   as current, with a 32 MB memtable for the small keys (the default before 8 MB)

and, after the current run, the time of a full garbage collection with everything the run left alive,
without and with the worker's collector policy (gc.freeze of the survivors, service/stream/collector.py).

Usage: python tests/benchmarks/bench_index.py [--articles 50000] [--block 5000] [--seed 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests" / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_stream import CORPUS, SAMPLE, Articles, load_corpus  # noqa: E402

from neardup.core.params import DedupParams  # noqa: E402
from neardup.pipeline.shard import IndexShard  # noqa: E402
from neardup.pipeline.sign import SignStage  # noqa: E402
from neardup.pipeline.wire import Provenance, Signed, decode_signed  # noqa: E402
from neardup.state.rocks import RocksOptions, RocksState  # noqa: E402

_LEN = struct.Struct(">I")
CURRENT = RocksOptions(write_ahead_log=False)
CONFIGURATIONS = {
    "baseline": dataclasses.replace(CURRENT, probe_cache=0, record_cache=100_000),
    "current": CURRENT,
    # the memtable of the small keys as it was: 32 MB instead of 8
    "memtable": dataclasses.replace(CURRENT, write_buffer_mb=32),
}


def sign_into(path: Path, count: int, seed: int) -> None:
    """Sign `count` articles once, into a file of length-prefixed signed records: each configuration
    reads them lazily in a process of its own, so that its memory is the index stage's alone."""
    corpus = load_corpus(CORPUS if CORPUS.exists() else SAMPLE)
    articles = Articles(corpus, "bench", seed, dup_fraction=0.3)
    stage = SignStage(DedupParams(), 1_000_000)
    with path.open("wb") as out:
        for offset in range(count):
            key, value = articles.next()
            result = stage.handle(value, key, Provenance("articles", 0, offset, 1_700_000_000_000))
            assert result.signed is not None, result.reason
            out.write(_LEN.pack(len(result.signed)) + result.signed)


def signed_articles(count: int, seed: int) -> list[Signed]:
    """`count` articles signed in memory (bench_rebuild.py), as sign_into writes them."""
    with tempfile.TemporaryDirectory(prefix="neardup-signed-") as directory:
        path = Path(directory) / "signed"
        sign_into(path, count, seed)
        return list(read_signed(path))


def read_signed(path: Path) -> Iterator[Signed]:
    with path.open("rb") as signed:
        while header := signed.read(_LEN.size):
            (size,) = _LEN.unpack(header)
            item = decode_signed(signed.read(size))
            assert isinstance(item, Signed)
            yield item


def run(
    items: Iterable[Signed], options: RocksOptions, block: int, state_dir: Path
) -> tuple[list[float], IndexShard]:
    """µs of main-thread CPU per article, per block (RocksDB's own threads are not counted)."""
    # the changelog's writes as the decider process holds them: handed on after each article, not
    # kept, so that the memory measured is the index stage's
    writes: list[tuple[bytes, bytes | None]] = []
    stage = IndexShard(RocksState(state_dir, options), DedupParams(), changelog=writes)
    stage.replay({})
    per_block: list[float] = []
    spent = 0.0
    for offset, item in enumerate(items):
        started = time.thread_time()
        stage.decide([item], offset)
        if offset % 100 == 99:
            stage.checkpoint()
        writes.clear()
        spent += time.thread_time() - started
        if (offset + 1) % block == 0:
            per_block.append(spent / block * 1e6)
            spent = 0.0
    return per_block, stage


def resident_kb(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of this process, in KB, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_configuration(name: str, signed: Path, block: int, state_dir: Path) -> dict:
    """One configuration's run (in its own process): its figures and how much its memory grew."""
    before = resident_kb("VmRSS")
    per_block, stage = run(read_signed(signed), CONFIGURATIONS[name], block, state_dir)
    figures: dict = {"per_block": per_block, "grown_mb": (resident_kb("VmHWM") - before) / 1024}
    if name == "current":
        gc.unfreeze()
        figures["plain_gc_ms"] = full_collection_ms()
        gc.collect(1)
        gc.freeze()
        figures["frozen_gc_ms"] = full_collection_ms()
        gc.unfreeze()
    stage.state.close()
    return figures


def measure(name: str, signed: Path, block: int, state_dir: Path) -> dict:
    """run_configuration in a fresh interpreter, which prints its figures as JSON."""
    command = [sys.executable, __file__, "--configuration", name, "--signed", str(signed)]
    command += ["--block", str(block), "--state", str(state_dir)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"configuration {name} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def full_collection_ms(repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, default=50_000)
    parser.add_argument("--block", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--configuration", choices=CONFIGURATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--signed", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.configuration:  # one run, in the process the main one started for it
        print(json.dumps(run_configuration(args.configuration, args.signed, args.block, args.state)))
        return 0

    print(f"signing {args.articles:,} articles ...", flush=True)
    results: dict[str, list[float]] = {}
    grown: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="neardup-bench-index-") as tmp:
        signed = Path(tmp) / "signed.bin"
        sign_into(signed, args.articles, args.seed)
        for name, options in CONFIGURATIONS.items():
            figures = measure(name, signed, args.block, Path(tmp) / name)
            results[name] = per_block = figures["per_block"]
            grown[name] = figures["grown_mb"]
            print(
                f"  {name:9} probe cache {options.probe_cache:>7,}, record cache {options.record_cache:>7,}, "
                f"memtable {options.write_buffer_mb} MB: memory +{grown[name]:.0f} MB; "
                f"µs/article per {args.block:,} articles:"
            )
            print("    " + " ".join(f"{value:.0f}" for value in per_block), flush=True)
            if name == "current":
                plain, frozen = figures["plain_gc_ms"], figures["frozen_gc_ms"]

    base, cur, big = results["baseline"], results["current"], results["memtable"]
    tail = max(1, len(cur) // 5)  # the last fifth of the run: the largest index
    base_tail, cur_tail = statistics.median(base[-tail:]), statistics.median(cur[-tail:])
    big_tail = statistics.median(big[-tail:])
    print(f"\nsummary: {args.articles:,} articles, index stage in process, main-thread CPU time")
    print(f"  first block            baseline {base[0]:.0f} µs/article, current {cur[0]:.0f} µs/article")
    print(
        f"  last {tail} block(s)        baseline {base_tail:.0f} µs/article, "
        f"current {cur_tail:.0f} µs/article"
    )
    print(f"  current / baseline     {cur_tail / base_tail:.2f} at the largest index")
    print(
        f"  current / memtable     {cur_tail / big_tail:.2f} at the largest index "
        f"({cur_tail:.0f} against {big_tail:.0f} µs/article with the 32 MB memtable)"
    )
    print(f"  growth, last / first   baseline {base_tail / base[0]:.2f}x, current {cur_tail / cur[0]:.2f}x")
    print(
        f"  memory grown by        baseline {grown['baseline']:.0f} MB, current {grown['current']:.0f} MB, "
        f"memtable {grown['memtable']:.0f} MB (peak resident set of each run's process)"
    )
    print(
        f"  full gc.collect()      {plain:.1f} ms with the run's objects live; "
        f"{frozen:.1f} ms after gc.freeze()"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
