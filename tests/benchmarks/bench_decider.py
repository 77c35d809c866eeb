"""The worker's decider alone against another build's, alternated in one run: CPU per article.

Each run is a process of its own that signs the input's first `--articles` lines (not timed), then
decides them as the worker's decider does (an IndexShard over RocksDB under the write overlay,
`--chunk` articles a call, each chunk committed) into a new state, timing the CPU of the deciding
alone. This checkout's interpreter and `--baseline`'s (another checkout's venv) take turns,
`--repeats` times; both import their own `neardup`, through the calls every build since the held
families has (IndexShard, RocksState, SignStage). Prints each run's µs per article, the medians and
their ratio.

Usage:
  python tests/benchmarks/bench_decider.py --baseline ../previous/.venv/bin/python
      [--input FILE] (default: the news corpus of tests/data/build_news_corpus.py)
      [--articles 4082] [--chunk 20] [--layout keyed|held] [--repeats 4]
      [--baseline-layout keyed|held] [--baseline-containment on|off] [--versions 0.0] [--messages]

This build decides with the containment index on; the baseline too unless `--baseline-containment
off`, which with `--baseline-layout keyed` measures the design aim (this build's decider
with the index on against the baseline's with it off, as the baseline's worker ran by default).

`--messages` decides as the decider process does: each chunk packed into one signatures message
(encode_signed, pack_signed, not timed) and decided through `decide_messages`, which decodes it;
without, the chunks' signed records go to `IndexShard.decide` as they are, undecoded.

`--versions F` sends a share F of the articles again, each some lines later (at most 200), as a
new version: its text with a paragraph of another article added (seeded), the input then growing
by that share.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

CORPUS = Path.home() / ".cache" / "neardup" / "news" / "corpus.jsonl"

# What one run does, in the interpreter it is given (this build's or the baseline's).
ONE_RUN = """
import sys, tempfile, time
from pathlib import Path
from neardup.config import engine_params, keyword_values, retention_window
from neardup.core.retention import Retention
from neardup.messages import decode_message
from neardup.pipeline.shard import IndexShard, SizeGauge, decide_messages
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import Provenance, encode_signed, pack_signed
from neardup.state.rocks import RocksOptions, RocksState

source, count, chunk, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "held"
messages = sys.argv[6] == "messages"
values = keyword_values({} if sys.argv[5] == "on" else {"containment_index": False})
params, retention = engine_params(values), retention_window(values)
stage = SignStage(params, values["max_text_bytes"], Retention(skew_ms=retention.skew_ms))
with open(source, "rb") as lines:
    texts = [line.rstrip(b"\\n") for _, line in zip(range(count), lines)]
signed = [
    stage.sign(decode_message(text, None, values["max_text_bytes"]), Provenance("bench", None, n, None))
    for n, text in enumerate(texts)
]
chunks = [signed[at : at + chunk] for at in range(0, len(signed), chunk)]
if messages:
    chunks = [pack_signed([encode_signed(item) for item in items]) for items in chunks]
with tempfile.TemporaryDirectory() as work:
    options = RocksOptions(bucket_cap=values["bucket_cap"], hold_families=held)
    state = RocksState(Path(work) / "state", options, layered=True)
    shard, gauge = IndexShard(state, params, retention), SizeGauge()
    started = time.process_time()
    for number, items in enumerate(chunks):
        shard.begin(number)
        if messages:
            decide_messages(shard, [(number * chunk, items)], gauge)
        else:
            shard.decide(items, number * chunk)
        shard.commit(number, (number + 1) * chunk)
    spent = time.process_time() - started
    state.close()
print(spent / len(signed) * 1e6)
"""


def one_run(
    python: str, source: Path, articles: int, chunk: int, layout: str, containment: str, messages: bool
) -> float:
    """µs of CPU per article, deciding alone, in a process of `python`."""
    form = "messages" if messages else "items"
    argv = [python, "-c", ONE_RUN, str(source), str(articles), str(chunk), layout, containment, form]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def with_versions(source: Path, articles: int, share: float, out: Path) -> int:
    """`source`'s first `articles` lines, with a share of them sent again later as new versions,
    written to `out`; returns the lines written."""
    rng = random.Random(41)
    with source.open("rb") as lines:
        texts = [orjson.loads(line) for _, line in zip(range(articles), lines, strict=False)]
    rows: list[dict[str, str] | None] = [*texts]
    for n, article in enumerate(texts):
        if rng.random() < share:
            other = rng.choice(texts)["text"].split("\n\n")
            version = {"id": article["id"], "text": article["text"] + "\n\n" + rng.choice(other)}
            rows.insert(min(n + rng.randint(1, 200), len(rows)), version)
    out.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows if row is not None))
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="another checkout's venv python")
    parser.add_argument("--input", type=Path, default=CORPUS)
    parser.add_argument("--articles", type=int, default=4082)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--layout", choices=("keyed", "held"), default="keyed")
    parser.add_argument("--baseline-layout", choices=("keyed", "held"), help="default: --layout")
    parser.add_argument("--baseline-containment", choices=("on", "off"), default="on")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--versions", type=float, default=0.0, help="share sent again as versions")
    parser.add_argument("--messages", action="store_true", help="decide signatures messages, decoded")
    args = parser.parse_args(argv)
    if args.versions:
        work = Path(tempfile.mkdtemp(prefix="bench-decider-"))
        args.articles = with_versions(args.input, args.articles, args.versions, work / "versions.jsonl")
        args.input = work / "versions.jsonl"
    runs: dict[str, list[float]] = {"this": [], "baseline": []}
    sides = {
        "baseline": (args.baseline, args.baseline_layout or args.layout, args.baseline_containment),
        "this": (sys.executable, args.layout, "on"),
    }
    for repeat in range(args.repeats):
        for name, (python, layout, containment) in sides.items():
            run = one_run(python, args.input, args.articles, args.chunk, layout, containment, args.messages)
            runs[name].append(run)
            print(f"  run {repeat + 1} {name:8} {runs[name][-1]:7.1f} µs an article", flush=True)
    this, baseline = statistics.median(runs["this"]), statistics.median(runs["baseline"])
    described = {
        name: f"{layout}, containment {containment}" for name, (_, layout, containment) in sides.items()
    }
    form = "signatures messages" if args.messages else "chunks"
    print(f"this {described['this']}; baseline {described['baseline']}; {form} of {args.chunk},")
    print(f"  {args.articles} articles, medians of {args.repeats}:")
    print(f"  this {this:.1f} µs, baseline {baseline:.1f} µs an article: {this / baseline:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
