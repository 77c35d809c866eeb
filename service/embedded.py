"""The embedded mode: a JSON-lines file through the same engine and state as the service, no broker.

Resumable: after each article the state records the input and output byte offsets reached. A rerun
with the same --state truncates the outputs to those offsets and continues from the input offset; an
article applied but not yet checkpointed comes back as a re-delivery and gets its stored verdict, so
the output file holds exactly one verdict per article, in input order.

The filtered feed (--unique-out) is a third output resumed the same way, for the same reason: its
offset is checkpointed with the others, so a rerun truncates it to what the checkpointed lines
wrote and the lines after come out once, from their (possibly re-delivered) verdicts.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from .core.params import DedupParams
from .core.retention import NO_RETENTION, Retention
from .core.signing import EmptyText
from .engine import Engine
from .messages import Deletion, InvalidMessage, dead_letter_dict, decode_article, dumps, verdict_dict
from .state.port import StateStore

DEFAULT_MAX_TEXT_BYTES = 1_000_000
# What a search indexer behind neardup wants by default: each story once.
DEFAULT_FEED_VERDICTS = frozenset({"unique"})


@dataclass
class RunSummary:
    """Counts for the summary line and for tests."""

    articles: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    resumed_from_line: int = 0
    seconds: float = 0.0
    deleted: int = 0
    unknown_deletes: int = 0
    expired: int = 0
    refused_times: int = 0
    fed: int | None = None  # lines written to the filtered feed; None without one

    def render(self) -> str:
        rate = self.articles / self.seconds if self.seconds > 0 else 0.0
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.verdicts.items())) or "none"
        dead = ", ".join(f"{k}={v}" for k, v in sorted(self.dead_letters.items())) or "none"
        resumed = f" (resumed at line {self.resumed_from_line + 1})" if self.resumed_from_line else ""
        removed = ""
        if self.deleted or self.unknown_deletes or self.expired or self.refused_times:
            removed = (
                f"; deleted={self.deleted} unknown_deletes={self.unknown_deletes} "
                f"expired={self.expired} refused_times={self.refused_times}"
            )
        fed = "" if self.fed is None else f"; fed={self.fed}"
        return (
            f"articles={self.articles}{resumed} verdicts: {kinds}; dead letters: {dead}{removed}{fed}; "
            f"{self.seconds:.2f}s, {rate:,.0f} articles/s"
        )


class Progress:
    """A one-line progress bar on stderr, redrawn at most 5 times a second; silent when piped."""

    def __init__(self, total_bytes: int, enabled: bool) -> None:
        self.total = max(total_bytes, 1)
        self.enabled = enabled
        self.started = time.monotonic()
        self.last = 0.0

    def update(self, done_bytes: int, articles: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 0.2):
            return
        self.last = now
        share = min(done_bytes / self.total, 1.0)
        bar = "#" * int(share * 30)
        rate = articles / max(now - self.started, 1e-9)
        sys.stderr.write(f"\r[{bar:<30}] {share:6.1%} {articles:,} articles {rate:,.0f}/s")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


_PROGRESS_KEY = b"embedded-progress:"


def run_file(
    input_path: Path,
    output_path: Path,
    state: StateStore,
    params: DedupParams,
    *,
    dead_letter_path: Path | None = None,
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    progress: bool = False,
    retention: Retention = NO_RETENTION,
    feed_path: Path | None = None,
    feed_verdicts: frozenset[str] = DEFAULT_FEED_VERDICTS,
) -> RunSummary:
    """Process a JSON-lines file of articles into a JSON-lines file of verdicts. A line
    `{"id": ..., "deleted": true}` deletes an article: the verdict file gets
    `{"article_id": ..., "deleted": true}` in its place (a deletion of an unknown id is counted).

    With `feed_path`, the input lines whose verdict kind is in `feed_verdicts` are also copied
    there byte for byte (newline-terminated), in input order: what an indexer behind neardup
    should take in. It follows the verdict file line for line, so a new version of an article is
    fed when its own verdict passes, and an input line repeating an article (same id and text) is
    fed again when its stored verdict passes, as the verdict file repeats it (an article a crash
    left unfinished comes back that way and must still reach the feed); deletions and dead
    letters never are."""
    engine = Engine(state, params, retention)
    summary = RunSummary()
    started = time.perf_counter()
    progress_key = _PROGRESS_KEY + str(input_path.resolve()).encode()
    saved = state.get_meta(progress_key)
    in_offset = out_offset = dead_offset = feed_offset = line_no = 0
    if saved is not None:
        mark = orjson.loads(saved)
        in_offset, out_offset = mark["input"], mark["output"]
        dead_offset, line_no = mark.get("dead", 0), mark["line"]
        if feed_path is not None:
            feed_offset = _resumed_feed_offset(mark, feed_path, feed_verdicts)
        summary.resumed_from_line = line_no
    dead_path = dead_letter_path or output_path.with_name(output_path.name + ".dead.jsonl")
    bar = Progress(input_path.stat().st_size, progress)
    with ExitStack() as files:
        source = files.enter_context(input_path.open("rb"))
        out = files.enter_context(_open_at(output_path, out_offset))
        dead = files.enter_context(_open_at(dead_path, dead_offset))
        feed = None
        if feed_path is not None:
            feed = files.enter_context(_open_at(feed_path, feed_offset))
            summary.fed = 0
        source.seek(in_offset)
        for raw_line in source:
            line_no += 1
            in_offset += len(raw_line)
            body = raw_line.rstrip(b"\r\n")
            if not body.strip():
                continue
            summary.articles += 1
            try:
                article = decode_article(body, max_text_bytes)
                if isinstance(article, Deletion):
                    _delete(engine, article.article_id, out, summary)
                    record = None
                else:
                    record = engine.process(
                        article.article_id, article.text, published_at=article.published_at
                    )
            except InvalidMessage as exc:
                _write_dead(dead, exc.reason, exc.detail, body, input_path, line_no, summary)
                record = None
            except EmptyText as exc:
                _write_dead(dead, "empty_text", str(exc), body, input_path, line_no, summary)
                record = None
            if record is not None:
                out.write(dumps(verdict_dict(record, params)) + b"\n")
                summary.verdicts[record.decision.kind] += 1
                if feed is not None and record.decision.kind in feed_verdicts:
                    feed.write(raw_line if raw_line.endswith(b"\n") else raw_line + b"\n")
                    summary.fed = (summary.fed or 0) + 1
            out.flush()
            dead.flush()
            mark = {"input": in_offset, "output": out.tell(), "dead": dead.tell(), "line": line_no}
            if feed is not None:
                feed.flush()
                mark |= {"feed": feed.tell(), "feed_verdicts": sorted(feed_verdicts)}
            state.set_meta({progress_key: orjson.dumps(mark)})
            bar.update(in_offset, summary.articles)
    bar.update(in_offset, summary.articles, final=True)
    state.compact()
    summary.seconds = time.perf_counter() - started
    summary.expired = sum(engine.counts.expired)
    summary.refused_times = engine.counts.refused_times
    return summary


def _delete(engine: Engine, article_id: str, out: BinaryIO, summary: RunSummary) -> None:
    """A deletion: its line in the verdict file (the tombstone of a compacted topic), or counted
    when the id is unknown."""
    if engine.delete(article_id) is None:
        summary.unknown_deletes += 1
        return
    out.write(dumps({"article_id": article_id, "deleted": True}) + b"\n")
    summary.deleted += 1


class ResumeMismatch(RuntimeError):
    """The state says more was written than the output file holds: they do not belong together."""


def _resumed_feed_offset(mark: dict[str, Any], feed_path: Path, feed_verdicts: frozenset[str]) -> int:
    """Where the feed continues. Refused when the checkpointed run fed nothing or fed other kinds:
    continuing would leave the feed without the earlier lines, or mix two filters in one file."""
    if "feed" not in mark:
        if mark["input"] == 0:
            return 0
        raise ResumeMismatch(
            f"the state's earlier run over this input wrote no --unique-out feed, so {feed_path} "
            f"would lack lines 1..{mark['line']}; start with a new --state directory"
        )
    if mark["feed_verdicts"] != sorted(feed_verdicts):
        raise ResumeMismatch(
            f"the state's earlier run fed {','.join(mark['feed_verdicts'])} verdicts, this one "
            f"{','.join(sorted(feed_verdicts))}: keep the same --unique-filter, or start with a "
            "new --state directory"
        )
    return int(mark["feed"])


def _open_at(path: Path, offset: int) -> BinaryIO:
    """Open for writing at `offset`, dropping anything a crashed run wrote after it."""
    size = path.stat().st_size if path.exists() else 0
    if offset > size:
        raise ResumeMismatch(
            f"{path} has {size} bytes but the state recorded {offset} written; "
            "restore that file or start with a new --state directory"
        )
    handle = path.open("r+b" if offset else "wb")
    handle.seek(offset)
    handle.truncate()
    return handle


def _write_dead(
    dead: BinaryIO,
    reason: str,
    detail: str,
    body: bytes,
    input_path: Path,
    line_no: int,
    summary: RunSummary,
) -> None:
    record = dead_letter_dict(reason, detail, body, topic=str(input_path), offset=line_no)
    dead.write(dumps(record) + b"\n")
    summary.dead_letters[reason] += 1
