"""The longest writes of a held state (state/held.py): folding its log into a snapshot, and draining
its entries back to keys.

Fills a held state on RocksDB (write-ahead log on, as the worker's) with `--entries` band-bucket
entries of random keys, `--changes` a write, the log folded whenever it outgrows the snapshot and
`--fold-floor-mb`; then lowers HELD_ENTRIES below them: from there each write moves DRAIN_STEP
entries (or twice its changes, where that is more) to keys beside its own changes, until none is
held, and the state goes on keyed. Prints the wall time of a write in each phase (median, p99,
max): held, held with a fold step in it, draining, keyed; the longest is the pause a decision
waits for at most. Also the time a reopening takes to read the held state back, before it drains.
`--fold-step` and `--drain-step` past `--entries` fold or drain in one write, as the state did
before either went a step at a time: the baseline.

Usage:
  python tests/benchmarks/bench_held_writes.py [--entries 2000000] [--changes 1000]
      [--fold-floor-mb 16] [--fold-step 65536] [--drain-step 4096]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.state import held  # noqa: E402
from neardup.state.port import Batch  # noqa: E402
from neardup.state.rocks import HELD, RocksKV, RocksOptions  # noqa: E402
from neardup.state.tables import BAND  # noqa: E402


def main() -> None:
    layout = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=layout)
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--changes", type=int, default=1000, help="entries a write adds")
    parser.add_argument("--fold-floor-mb", type=int, default=16)
    parser.add_argument("--fold-step", type=int, default=held._FOLD_STEP)
    parser.add_argument("--drain-step", type=int, default=held.DRAIN_STEP)
    args = parser.parse_args()
    held._SNAPSHOT_FLOOR, held._FOLD_STEP = args.fold_floor_mb * 1024 * 1024, args.fold_step
    rng = random.Random(0)
    phases: dict[str, list[float]] = {"held": [], "folding": [], "draining": [], "keyed": []}

    def timed_write(state: held.HeldFamilies, phase: str) -> None:
        chunks = state._chunks
        changes = {BAND + rng.randbytes(9): rng.randbytes(8) for _ in range(args.changes)}
        started = time.perf_counter()
        state.write(Batch(main=changes))
        folded = phase == "held" and state._chunks != chunks
        phases["folding" if folded else phase].append(time.perf_counter() - started)

    with tempfile.TemporaryDirectory() as work:
        state = held.HeldFamilies(RocksKV(Path(work) / "state", RocksOptions()), HELD)
        while len(state.held) < args.entries:
            timed_write(state, "held")
        started = time.perf_counter()
        reopened = held.HeldFamilies(state.inner, HELD)  # reads what the live one wrote
        print(f"reopened: {len(reopened.held):,} entries in {time.perf_counter() - started:.2f} s")
        del reopened
        held.HELD_ENTRIES, held.DRAIN_STEP = args.changes, args.drain_step
        while state.prefixes:
            timed_write(state, "draining")
        for _ in range(len(phases["draining"])):
            timed_write(state, "keyed")
        state.close()
    for name, times in phases.items():
        ms = sorted(time * 1e3 for time in times) or [0.0]
        p99, middle = ms[int(len(ms) * 0.99)], statistics.median(ms)
        print(f"{name:9s} writes {len(times):6d}  median {middle:7.2f} ms  p99 {p99:7.2f}  max {ms[-1]:7.2f}")
    print(f"{args.entries:,} entries; fold step {args.fold_step}, drain step {args.drain_step}")


if __name__ == "__main__":
    main()
