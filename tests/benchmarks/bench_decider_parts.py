"""Where the worker's decider spends its time, by part: wall µs an article in each.

Signs the input's first `--articles` lines (not timed), packs them into signatures messages of
`--chunk` records as the sign stage does, then decides them as the decider process does
(`decide_messages` over an IndexShard on RocksDB under the write overlay, each message committed)
into a new state, with a timer around each part: a message's records unpacked and decoded in one
compiled call (`_sketch.signed_records`; `decode_signed`: the records it leaves, and every record
in a version that decoded them one at a time), the compiled run (`IndexState.add_fresh`), the
shard's run outside it (its rows and results, the expiry), the commit (the write batch, the held
log applied), and the rest (the message loop, the checkpoint and the outcome). `--repeats` runs,
each in this process; prints every run's figures and their medians. A part's timer costs well
under a µs a call.

Usage:
  python tests/benchmarks/bench_decider_parts.py [--input FILE] [--articles 4082] [--chunk 20]
      [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.config import engine_params, keyword_values, retention_window  # noqa: E402
from neardup.core import compiled  # noqa: E402
from neardup.core.retention import Retention  # noqa: E402
from neardup.messages import decode_message  # noqa: E402
from neardup.pipeline import shard as shard_module  # noqa: E402
from neardup.pipeline.shard import IndexShard, SizeGauge, decide_messages  # noqa: E402
from neardup.pipeline.sign import SignStage  # noqa: E402
from neardup.pipeline.wire import Provenance, encode_signed, pack_signed  # noqa: E402
from neardup.state.index import IndexState  # noqa: E402
from neardup.state.rocks import RocksOptions, RocksState  # noqa: E402

CORPUS = Path.home() / ".cache" / "neardup" / "news" / "corpus.jsonl"
PARTS = {
    # a message's records unpacked and decoded (wire.decode_signed: what the compiled call leaves)
    "decode": (compiled._sketch, "signed_records"),
    "decode_signed": (shard_module, "decode_signed"),
    "add_fresh": (IndexState, "add_fresh"),
    "run": (IndexShard, "_run"),
    "commit": (IndexShard, "commit"),
}


def timed(spent: dict[str, float], part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - started

    return wrapper


def one_run(messages: list[tuple[int, bytes]], articles: int, values: dict[str, Any]) -> dict[str, float]:
    """µs an article in each part, and in the whole, deciding `messages` into a new state under the
    settings `values`."""
    params, retention = engine_params(values), retention_window(values)
    spent = dict.fromkeys([*PARTS, "whole"], 0.0)
    originals = {part: getattr(owner, name) for part, (owner, name) in PARTS.items()}
    for part, (owner, name) in PARTS.items():
        setattr(owner, name, timed(spent, part, originals[part]))
    try:
        with tempfile.TemporaryDirectory() as work:
            options = RocksOptions(bucket_cap=values["bucket_cap"], hold_families=True)
            state = RocksState(Path(work) / "state", options, layered=True)
            shard, gauge = IndexShard(state, params, retention), SizeGauge()
            started = time.perf_counter()
            for number, message in enumerate(messages):
                shard.begin(number)
                decide_messages(shard, [message], gauge)
                shard.commit(number, number + 1)
            spent["whole"] = time.perf_counter() - started
            state.close()
    finally:
        for part, (owner, name) in PARTS.items():
            setattr(owner, name, originals[part])
    spent["run"] -= spent["add_fresh"]  # the run outside the compiled call
    # the message loop and the outcome: what no part's timer holds
    spent["rest"] = spent["whole"] - sum(spent[part] for part in PARTS)
    return {part: seconds / articles * 1e6 for part, seconds in spent.items()}


def main() -> None:
    layout = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=layout)
    parser.add_argument("--input", type=Path, default=CORPUS)
    parser.add_argument("--articles", type=int, default=4082)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    values = keyword_values({})
    retention = retention_window(values)
    stage = SignStage(engine_params(values), values["max_text_bytes"], Retention(skew_ms=retention.skew_ms))
    with args.input.open("rb") as lines:
        texts = [line.rstrip(b"\n") for _, line in zip(range(args.articles), lines, strict=False)]
    records = [
        encode_signed(
            stage.sign(decode_message(text, None, values["max_text_bytes"]), Provenance("bench", 0, n, None))
        )
        for n, text in enumerate(texts)
    ]
    messages = [
        (number, pack_signed(records[at : at + args.chunk]))
        for number, at in enumerate(range(0, len(records), args.chunk))
    ]
    runs = [one_run(messages, len(records), values) for _ in range(args.repeats)]
    names = [*PARTS, "rest", "whole"]
    for run in runs:
        print("  ".join(f"{name} {run[name]:7.1f}" for name in names))
    medians = {name: statistics.median(run[name] for run in runs) for name in names}
    print("median µs an article: " + ", ".join(f"{name} {medians[name]:.1f}" for name in names))
    print(
        "shares of the whole: "
        + ", ".join(f"{name} {medians[name] / medians['whole']:.0%}" for name in [*PARTS, "rest"])
    )


if __name__ == "__main__":
    main()
