"""What the containment index costs in RocksDB alone, against what the 0.90x speed bound allows.

The engine (one IndexShard over a RocksState, as embedded mode and the library run it) decides
`--articles` articles of bench_stream.py's generator twice, with the containment index off and on,
signed beforehand so that deciding is timed alone. The store calls of each run (multi-gets and write
batches, in order) are recorded, then replayed into a fresh state with the product's RocksDB options,
alternated `--repeats` times, timing the store calls and nothing else: the least the engine can
spend per article in RocksDB, whatever its Python does.

Prints per article: the decider's time off and on, the bound's allowance (the decider's time off
times 1/0.9 - 1: deciding is the serial stage in the worker and in `neardup dedup`, the signing
helpers run beside it), and the replayed store time off and on with its increase. When that increase
alone exceeds the allowance, no Python around the same store calls meets the bound. With
`--what-if-memory`, the index on is also timed with its posting lists in a dict instead of RocksDB
keys: what the rest of its work costs.

Usage:
  python tests/benchmarks/bench_index_floor.py [--articles 20000] [--repeats 3] [--seed 7]
      [--chunk 20]  (as the worker's decider: chunks of articles held in the write overlay, then
                     committed in one write batch)
      [--what-if-memory]  (also: the index on with its posting lists in a dict, no RocksDB key
                           for them, to see what the rest of its work costs)
      [--input FILE]  (its first --articles lines instead of the generator's: the news corpus,
                       whose texts are all distinct, writes a new posting list for nearly every anchor)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.config import engine_params, keyword_values, retention_window  # noqa: E402
from neardup.core.retention import Retention  # noqa: E402
from neardup.messages import decode_message  # noqa: E402
from neardup.pipeline.shard import IndexShard  # noqa: E402
from neardup.pipeline.sign import SignStage  # noqa: E402
from neardup.pipeline.wire import Provenance  # noqa: E402
from neardup.state.overlay import LayeredKV  # noqa: E402
from neardup.state.port import Batch, KeyValue  # noqa: E402
from neardup.state.rocks import RocksKV, RocksOptions, RocksState  # noqa: E402
from neardup.state.tables import POSTING  # noqa: E402
from tests.benchmarks.bench_state_size import write_input  # noqa: E402

BOUND = 0.90
Call = tuple[str, Any]  # ("get", keys) | ("records", keys) | ("write", (main, records))


@dataclass
class Recorder:
    """A KeyValue that passes every call on to `base` and keeps the reads and writes in order."""

    base: KeyValue
    calls: list[Call] = field(default_factory=list)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        self.calls.append(("get", list(keys)))
        return self.base.get_many(keys)

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        self.calls.append(("records", list(keys)))
        return self.base.records(keys)

    def write(self, batch: Batch) -> None:
        self.calls.append(("write", (dict(batch.main), dict(batch.records))))
        self.base.write(batch)

    def __getattr__(self, name: str) -> Any:  # scans, flush, close: not recorded
        return getattr(self.base, name)


@dataclass
class PostingsInMemory:
    """What if the posting lists were not RocksDB keys: a KeyValue that keeps them (the keys under
    POSTING) in a dict, and passes everything else on to `base`. The index reads posting lists in
    multi-gets of their own, so a multi-get is routed by its first key."""

    base: KeyValue
    held: dict[bytes, bytes] = field(default_factory=dict)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys or not keys[0].startswith(POSTING):
            return self.base.get_many(keys)
        return [self.held.get(key) for key in keys]

    def write(self, batch: Batch) -> None:
        rest = Batch()
        rest.records.update(batch.records)
        for key, value in batch.main.items():
            if not key.startswith(POSTING):
                rest.main[key] = value
            elif value is None:
                self.held.pop(key, None)
            else:
                self.held[key] = value
        self.base.write(rest)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as source:
        yield from (line.rstrip(b"\n") for line in source)


def decide_all(
    source: Path, work: Path, containment: bool, record: bool, chunk: int = 0, in_memory: bool = False
) -> tuple[float, list[Call]]:
    """Seconds per article spent deciding (signing excluded) into a new state under `work`, and
    the store calls if `record`. `chunk` 0: one article a call, its writes in the store at once
    (`neardup dedup`, the library); else as the worker's decider: `chunk` articles a call, their
    writes held in the write overlay and committed together (the calls recorded below it).
    `in_memory` (not with `record`): the posting lists in a dict (PostingsInMemory), not in RocksDB."""
    values = keyword_values({"containment_index": containment})
    params, retention = engine_params(values), retention_window(values)
    stage = SignStage(params, values["max_text_bytes"], Retention(skew_ms=retention.skew_ms))
    limit = values["max_text_bytes"]
    signed = [
        stage.sign(decode_message(line, None, limit), Provenance("bench", None, n, None))
        for n, line in enumerate(_lines(source))
    ]
    options = RocksOptions(bucket_cap=values["bucket_cap"])
    state = RocksState(work / f"state-{containment}", options, layered=chunk > 0)
    # the store under the overlay, if any, is what the recorder or the dict stands in front of
    overlay = state.kv if isinstance(state.kv, LayeredKV) else None
    store: KeyValue = state.kv if overlay is None else overlay.base
    recorder = Recorder(store) if record else None
    if recorder is not None or in_memory:
        store = recorder or PostingsInMemory(store)
        if overlay is not None:
            overlay.base = store
        else:
            state.kv = store
    shard = IndexShard(state, params, retention)
    started = time.perf_counter()
    if chunk == 0:
        for article in signed:
            shard.decide([article])
    else:
        for number, at in enumerate(range(0, len(signed), chunk)):
            shard.begin(number)
            shard.decide(signed[at : at + chunk], at)
            shard.commit(number, at + chunk)
    seconds = (time.perf_counter() - started) / len(signed)
    state.close()
    return seconds, recorder.calls if recorder is not None else []


def replay(calls: list[Call], path: Path) -> float:
    """Seconds the store calls take in a fresh state (with the product's options), summed."""
    kv = RocksKV(path, RocksOptions())
    spent = 0.0
    for kind, argument in calls:
        if kind == "write":
            batch = Batch()
            batch.main.update(argument[0])
            batch.records.update(argument[1])
        started = time.perf_counter()
        if kind == "get":
            kv.get_many(argument)
        elif kind == "records":
            kv.records(argument)
        else:
            kv.write(batch)
        spent += time.perf_counter() - started
    kv.close()
    return spent


def report(
    articles: int,
    repeats: int,
    decider: dict[bool, list[float]],
    stored: dict[bool, list[float]],
    calls: dict[bool, list[Call]],
) -> None:
    """The medians in µs per article, the bound's allowance and what the store calls take of it."""
    decide = {on: statistics.median(decider[on]) * 1e6 for on in (False, True)}
    store = {on: statistics.median(stored[on]) * 1e6 for on in (False, True)}
    allowance = decide[False] * (1 / BOUND - 1)
    extra = store[True] - store[False]
    print(f"articles: {articles}, medians of {repeats} alternated runs, µs per article")
    for on, name in ((False, "index off"), (True, "index on ")):
        read = sum(len(keys) for kind, keys in calls[on] if kind == "get") / articles
        written = sum(len(batch[0]) for kind, batch in calls[on] if kind == "write") / articles
        print(
            f"  {name}: decider {decide[on]:6.1f}   store calls alone {store[on]:5.1f}"
            f"   (keys read {read:.1f}, keys written {written:.1f})"
        )
    print(f"  decider, on - off: {decide[True] - decide[False]:.1f} ({decide[False] / decide[True]:.3f}x)")
    print(f"  the {BOUND:.2f}x bound allows: {allowance:.1f}")
    print(f"  store calls alone, on - off: {extra:.1f} = {extra / allowance:.2f} of the allowance")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--input", type=Path, default=None, help="a JSON-lines file of articles instead of the generator's"
    )
    parser.add_argument(
        "--chunk", type=int, default=0, help="articles a call, committed together, as the worker (0: one)"
    )
    parser.add_argument(
        "--what-if-memory",
        action="store_true",
        help="also time the index on with its posting lists in a dict instead of RocksDB keys",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="neardup-floor-") as temp:
        work = Path(temp)
        source = work / "articles.jsonl"
        if args.input is None:
            write_input(source, args.articles, args.seed)
        else:
            with args.input.open("rb") as given:
                source.write_bytes(b"".join(itertools.islice(given, args.articles)))
            args.articles = sum(1 for _ in _lines(source))
        decider: dict[bool, list[float]] = {False: [], True: []}
        in_memory: list[float] = []
        for round_ in range(args.repeats):
            for containment in (False, True):
                timed = decide_all(source, work / f"timed-{round_}", containment, False, args.chunk)
                decider[containment].append(timed[0])
            if args.what_if_memory:
                timed = decide_all(source, work / f"memory-{round_}", True, False, args.chunk, True)
                in_memory.append(timed[0])
        calls = {on: decide_all(source, work / "recorded", on, True, args.chunk)[1] for on in (False, True)}
        stored: dict[bool, list[float]] = {False: [], True: []}
        for round_ in range(args.repeats):
            for containment in (False, True):
                spent = replay(calls[containment], work / f"replay-{containment}-{round_}")
                stored[containment].append(spent / args.articles)
    report(args.articles, args.repeats, decider, stored, calls)
    if in_memory:
        off, held = statistics.median(decider[False]) * 1e6, statistics.median(in_memory) * 1e6
        print(f"  index on, its posting lists in a dict, not RocksDB: decider {held:.1f} ({off / held:.3f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
