"""Embedded mode's speed against another build, alternated in one run.

Writes `--articles` articles of bench_stream.py's generator to a JSON-lines file, then runs
`neardup dedup IN -o OUT --state DIR -q` with this checkout's interpreter and with `--baseline`'s
(another checkout's venv, e.g. the previous commit's), alternately, `--repeats` times each, a new
state each time. Prints each run's articles/s, the medians and their ratio, and whether the two
builds wrote the same verdicts.

Usage:
  python tests/benchmarks/bench_embedded.py --baseline ../previous/.venv/bin/python [--articles 20000]
      [--this-flag=--no-containment-index]  (flags of this build's `neardup dedup` alone)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_state_size import write_input  # noqa: E402


def run(
    python: str, source: Path, work: Path, name: str, sign_processes: int | None, flags: list[str]
) -> tuple[float, bytes]:
    """Articles/s of one run (wall time of the whole command), and the verdicts it wrote."""
    out, state = work / f"{name}.jsonl", work / f"{name}-state"
    argv = [python, "-m", "neardup", "dedup", str(source), "-o", str(out), "--state", str(state), "-q"]
    if sign_processes is not None:  # else each build's default
        argv += ["--sign-processes", str(sign_processes)]
    argv += flags
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    lines = sum(1 for _ in source.open("rb"))
    return lines / seconds, out.read_bytes()


def _comparable(written: bytes) -> list[dict[str, object]]:
    """The verdicts without their parameters: a format change bumps one, a new build may name more."""
    verdicts = [orjson.loads(line) for line in written.splitlines()]
    for verdict in verdicts:
        verdict.pop("params", None)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="the other build's python (its venv's bin/python)")
    parser.add_argument("--articles", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sign-processes", type=int, default=None, help="default: each build's own")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--this-flag",
        action="append",
        default=[],
        help="a flag for this build's runs alone (repeatable), e.g. --this-flag=--no-containment-index",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="neardup-embedded-") as directory:
        work = Path(directory)
        source = work / "in.jsonl"
        write_input(source, args.articles, args.seed)
        rates: dict[str, list[float]] = {"this": [], "baseline": []}
        verdicts: dict[str, bytes] = {}
        for repeat in range(args.repeats):
            order = [("this", sys.executable, args.this_flag), ("baseline", args.baseline, [])]
            for name, python, flags in order if repeat % 2 == 0 else order[::-1]:
                rate, written = run(python, source, work, f"{name}-{repeat}", args.sign_processes, flags)
                rates[name].append(rate)
                verdicts[name] = written
                print(f"  {name:<8} run {repeat + 1}: {rate:>8,.0f} articles/s", flush=True)
        this, base = statistics.median(rates["this"]), statistics.median(rates["baseline"])
        print(f"median: this {this:,.0f} articles/s, baseline {base:,.0f}; ratio {this / base:.3f}")
        same = _comparable(verdicts["this"]) == _comparable(verdicts["baseline"])
        print(f"verdicts identical (but the parameters each names): {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
