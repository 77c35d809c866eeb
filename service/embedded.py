"""The embedded mode: a JSON-lines file through the same engine and state as the service, no broker.

Resumable: the lines are decided in batches (DECIDE_BATCH, one call of the shard each); a batch's
writes are held in a write overlay and reach the store in one write batch with its checkpoint, the
input and output byte offsets reached, so that a crash leaves the state at the end of a batch,
agreeing with its checkpoint (the last batch its memtables flushed: the state skips RocksDB's
write-ahead log, api.open_state). A rerun with the same --state truncates the outputs to those offsets
and continues from the input offset, so the output file holds exactly one verdict per article, in
input order.

The filtered feed (--unique-out) is a third output resumed the same way, for the same reason: its
offset is checkpointed with the others, so a rerun truncates it to what the checkpointed lines
wrote and the lines after come out once, from their (possibly re-delivered) verdicts.

Signing (normalize, shingle, MinHash) runs a batch ahead of deciding: in this process, the compiled
passes of a batch's sketches on a thread of their own (pipeline/sign.py: SigningBatch), or, over a
large input, in the signing helpers (pipeline/signer.py), while this process decides the batch
before: deciding stays one serial process, in input order. The helpers are driven through their
asyncio pipes, the worker's code as it is, so the file loop runs in an event loop (asyncio.run);
the decisions yield to it every few articles, or the pipes would not move while a batch is decided.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson

from .config import BY_NAME, ConfigError
from .core.params import DedupParams
from .core.retention import NO_RETENTION, Retention
from .errors import Error
from .messages import dumps, parse_verdict_filter
from .pipeline.publication import Publication, publication
from .pipeline.shard import Decided, IndexShard, ShardCounts
from .pipeline.sign import SigningBatch, SignResult, SignStage
from .pipeline.wire import Provenance, Signed, SignedDeletion, decode_signed
from .state.index import IndexState, started_ahead
from .state.overlay import LayeredKV

DEFAULT_MAX_TEXT_BYTES: int = BY_NAME["max_text_bytes"].default
# Lines per batch sent to the signing helpers, and their most bytes: large enough that the pipes'
# per-batch costs vanish, small enough that the first batch, signed before anything is decided,
# does not keep the deciding process waiting long.
SIGN_BATCH = 256
SIGN_BATCH_BYTES = 8 * 1024 * 1024
# Lines decided in one call of the shard, and checkpointed together; between two, the event loop
# turns, so that the helpers' pipes move while a signed batch is decided.
DECIDE_BATCH = 32
# What a search indexer behind neardup wants by default: each story once.
DEFAULT_FEED_VERDICTS = parse_verdict_filter(BY_NAME["unique_filter"].default)


@dataclass
class RunSummary(ShardCounts):
    """Counts for the summary line and for tests: the run's, and the shard's own (ShardCounts),
    which it counts here."""

    articles: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    resumed_from_line: int = 0
    seconds: float = 0.0
    deleted: int = 0
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


class ProgressBar:
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
        line = f"\r[{bar:<30}] {share:6.1%} {articles:,} articles {rate:,.0f}/s"
        print(line, end="\n" if final else "", file=sys.stderr, flush=True)


_PROGRESS_KEY = b"embedded-progress:"


# Below this input size `neardup dedup` signs in its own process (a batch ahead, its compiled passes
# on a thread): a helper's start (an interpreter and its imports, on the critical path) and the
# round trip of every signed record through its pipe are paid back in wall time only over a longer
# input; below it signing here is as fast, for less CPU (tests/benchmarks/BATCH.md).
HELPERS_FROM_BYTES = 16 * 1024 * 1024


def default_sign_processes(input_bytes: int) -> int:
    """Signing helpers for `neardup dedup` over an input of `input_bytes`: none under
    HELPERS_FROM_BYTES, else one per CPU this process may run on, less the one that decides;
    at least one."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if input_bytes < HELPERS_FROM_BYTES else max(1, cpus - 1)


class SigningFailed(Error, RuntimeError):
    """Signing helpers cannot start: the run stopped after the last line it decided."""


class _Line(NamedTuple):
    """A non-blank input line and where it ends."""

    number: int
    end: int  # input offset after it
    raw: bytes  # as read, line end included
    body: bytes  # without its line end


_Signed = Signed | SignedDeletion | SignResult  # a SignResult: the line's dead letter


def run_file(
    input_path: Path,
    output_path: Path,
    state: IndexState,
    params: DedupParams,
    *,
    dead_letter_path: Path | None = None,
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    progress: bool = False,
    retention: Retention = NO_RETENTION,
    feed_path: Path | None = None,
    feed_verdicts: frozenset[str] = DEFAULT_FEED_VERDICTS,
    sign_processes: int | None = None,
    decide_batch: int = DECIDE_BATCH,
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
    letters never are.

    An output that is a device or a pipe needs `dead_letter_path` (ConfigError otherwise).

    `sign_processes`: signing helpers (0: sign in this process; None: default_sign_processes of the
    input's size), given SIGN_BATCH lines at a time; the outputs are the same either way.
    `decide_batch`: lines decided in one call of the shard and checkpointed together. An article
    whose signing fails unexpectedly is dead-lettered (internal_error), one that breaks its helper
    (processing_failed), as in the worker; helpers that cannot start raise SigningFailed, everything
    before that batch decided and checkpointed. With helpers the file loop runs in an event loop of
    its own: call it outside any running loop."""
    if dead_letter_path is None and _written_as_it_comes(output_path):
        # the dead letters go beside the verdicts by default: not beside a device or a pipe
        raise ConfigError(f"{output_path} is not a file: give the dead letters one (--dead-letters FILE)")
    summary = RunSummary(fed=None if feed_path is None else 0)
    shard = IndexShard(state, params, retention, counts=summary)
    started = time.perf_counter()
    progress_key = _PROGRESS_KEY + str(input_path.resolve()).encode()
    mark = _resumed_mark(state.get_meta(progress_key), feed_path, feed_verdicts)
    summary.resumed_from_line = mark.line
    dead_path = dead_letter_path or output_path.with_name(output_path.name + ".dead.jsonl")
    size = input_path.stat().st_size
    bar = ProgressBar(size, progress)
    sign_processes = default_sign_processes(size) if sign_processes is None else sign_processes
    stage = SignStage.under(params, max_text_bytes, retention)
    topic = str(input_path)
    with ExitStack() as files:
        layers = files.enter_context(_held_by_batch(state))
        source = files.enter_context(input_path.open("rb"))
        out = files.enter_context(_open_at(output_path, mark.output))
        dead = files.enter_context(_open_at(dead_path, mark.dead))
        feed = None if feed_path is None else files.enter_context(_open_at(feed_path, mark.feed))
        run = _FileRun(shard, layers, summary, topic, progress_key, bar, out, dead, feed, feed_verdicts)
        lines = _lines(source, mark.input, mark.line)
        if sign_processes == 0:
            _decide_while_signing_here(_batches(lines, decide_batch, SIGN_BATCH_BYTES), stage, run)
        else:
            import asyncio  # imported here: only helpers need an event loop, not a run that signs in process

            batches = _batches(lines, SIGN_BATCH, SIGN_BATCH_BYTES)
            asyncio.run(_decide_while_signing(batches, stage, sign_processes, decide_batch, run))
        bar.update(source.tell(), summary.articles, final=True)
    state.compact()
    summary.seconds = time.perf_counter() - started
    return summary


@contextmanager
def _held_by_batch(state: IndexState) -> Iterator[LayeredKV]:
    """The state's writes held in a write overlay, each batch's written to the store in one write
    batch with its checkpoint (a crash leaves both or neither); writes not committed when the run
    ends (it failed) are dropped, and the state is read again from the store."""
    if isinstance(state.kv, LayeredKV) and state.kv.held:
        # they would be written with the run's first batch, or dropped with a failed run
        raise ValueError("the state holds writes not committed: commit or discard them first")
    state.kv = layers = LayeredKV(state.kv)
    state.reload()
    try:
        yield layers
    finally:  # writes not committed (a failed run) go with the overlay
        state.kv = layers.base
        state.reload()


class _Mark(NamedTuple):
    """Where a run over a file stands: its files' offsets after the last line decided, and that
    line's number (all 0: from the start)."""

    input: int = 0
    output: int = 0
    dead: int = 0
    feed: int = 0
    line: int = 0


def _resumed_mark(saved: bytes | None, feed_path: Path | None, feed_verdicts: frozenset[str]) -> _Mark:
    """Where the last run over this input stopped, from its checkpoint in the state. A run with a
    feed is refused when the checkpointed run fed nothing or fed other kinds: continuing would leave
    the feed without the earlier lines, or mix two filters in one file."""
    if saved is None:
        return _Mark()
    mark = orjson.loads(saved)
    # a checkpoint is written after a line: a run without "feed" in it read some and fed none
    if feed_path is not None and "feed" not in mark:
        raise ResumeMismatch(
            f"the state's earlier run over this input wrote no --unique-out feed, so {feed_path} "
            f"would lack lines 1..{mark['line']}; start with a new --state directory"
        )
    if feed_path is not None and mark["feed_verdicts"] != sorted(feed_verdicts):
        raise ResumeMismatch(
            f"the state's earlier run fed {','.join(mark['feed_verdicts'])} verdicts, this one "
            f"{','.join(sorted(feed_verdicts))}: keep the same --unique-filter, or start with a "
            "new --state directory"
        )
    # without a feed, the feed's offset is never used
    return _Mark(mark["input"], mark["output"], mark.get("dead", 0), mark.get("feed", 0), mark["line"])


@dataclass
class _FileRun:
    """A run's outputs: each line decided is written to them, then checkpointed in the state."""

    shard: IndexShard
    layers: LayeredKV  # under the state: a batch's writes are held, then written with its checkpoint
    summary: RunSummary
    topic: str
    progress_key: bytes
    bar: ProgressBar
    out: BinaryIO
    dead: BinaryIO
    feed: BinaryIO | None
    feed_verdicts: frozenset[str]

    def decide(self, lines: list[_Line], signed: list[_Signed]) -> None:
        """Decide a batch of signed lines in one call of the shard; write each line's verdict (and
        its feed copy), deletion or dead letter, in input order; checkpoint after the last."""
        self.summary.articles += len(lines)
        self.layers.hold(0)  # one batch held at a time: each is committed before the next is decided
        decided = iter(self.shard.decide([item for item in signed if not isinstance(item, SignResult)]))
        for line, item in zip(lines, signed, strict=True):
            if not isinstance(item, SignResult):
                result = next(decided)
                if result.error is None:
                    self._publish(line, result)
                    continue
                # as the worker's index stage: a dead letter, not a stopped run
                item = SignStage.dead(result.reason, result.error, line.body, None, self.source(line))
            assert item.dead_letter is not None and item.reason is not None
            self.dead.write(item.dead_letter + b"\n")
            self.summary.dead_letters[item.reason] += 1
        self._checkpoint(lines[-1])  # a batch is never empty

    def source(self, line: _Line) -> Provenance:
        """Where a line came from, as dead letters name it: the file and the line's number."""
        return Provenance(self.topic, None, line.number, None)

    def _publish(self, line: _Line, decided: Decided) -> None:
        """A decision as lines of the run's files (pipeline/publication.py): a verdict, or a
        deletion line for a removal, in the verdict file; the input line as it came, a deletion's
        included, in the feed."""
        what = published(decided, self.feed_verdicts if self.feed is not None else None)
        if what.removal:
            self.out.write(dumps({"article_id": decided.article_id, "deleted": True}) + b"\n")
            self.summary.deleted += decided.status == "deleted"
        elif what.verdict and decided.verdict is not None and decided.kind is not None:
            self.out.write(decided.verdict + b"\n")
            self.summary.verdicts[decided.kind] += 1
        if what.feed is not None and self.feed is not None:
            self.feed.write(line.raw if line.raw.endswith(b"\n") else line.raw + b"\n")
            self.summary.fed = (self.summary.fed or 0) + 1

    def _checkpoint(self, line: _Line) -> None:
        """The outputs flushed and where they end stored with the state: a rerun resumes there."""
        self.out.flush()
        self.dead.flush()
        mark: dict[str, Any] = dict(
            input=line.end, output=self.out.tell(), dead=self.dead.tell(), line=line.number
        )
        if self.feed is not None:
            self.feed.flush()
            mark |= dict(feed=self.feed.tell(), feed_verdicts=sorted(self.feed_verdicts))
        self.shard.state.set_meta({self.progress_key: orjson.dumps(mark)})
        self.layers.commit_through(0)  # the batch's writes and its checkpoint at once
        self.bar.update(line.end, self.summary.articles)


def published(decided: Decided, feed_kinds: frozenset[str] | None) -> Publication:
    """What a decision publishes in embedded mode and the library (pipeline/publication.py): no
    transactions there, so an input already applied is answered again."""
    return publication(
        decided.status,
        decided.kind,
        deletion=decided.deletion,
        has_verdict=decided.verdict is not None,
        feed_kinds=feed_kinds,
        replays_republished=True,
    )


def _lines(source: BinaryIO, offset: int, after: int) -> Iterator[_Line]:
    """The non-blank lines from `offset`, which is where line `after` ends."""
    source.seek(offset)
    for number, raw in enumerate(source, after + 1):
        offset += len(raw)
        body = raw.rstrip(b"\r\n")
        if body.strip():
            yield _Line(number, offset, raw, body)


def _batches(lines: Iterator[_Line], count: int, max_bytes: int) -> Iterator[list[_Line]]:
    """Consecutive lines, at most `count` and (beyond the first) `max_bytes` of them at a time."""
    batch: list[_Line] = []
    size = 0
    for line in lines:
        if batch and (len(batch) >= count or size + len(line.body) > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(line)
        size += len(line.body)
    if batch:
        yield batch


def _decide_while_signing_here(batches: Iterator[list[_Line]], stage: SignStage, run: _FileRun) -> None:
    """Decide each batch while the next one's sketches are made on a thread of their own
    (SigningBatch): signing in this process, what a helper signs, without the signed record's
    encoding, nor a pipe."""

    def start(batch: list[_Line]) -> tuple[list[_Line], SigningBatch]:
        return batch, SigningBatch(stage, [(line.body, None, run.source(line)) for line in batch])

    for batch, signing in started_ahead(batches, start):
        run.decide(batch, signing.results())


async def _decide_while_signing(
    batches: Iterator[list[_Line]], stage: SignStage, processes: int, decide_batch: int, run: _FileRun
) -> None:
    """Decide each batch, `decide_batch` lines a call, while `processes` signing helpers sign the
    next one; helpers failing twice on a batch raise SigningFailed, naming the last line
    checkpointed."""
    import asyncio

    # imported here: the helpers run that module as __main__, and they import this one
    from .pipeline.signer import Signer, SignerFailed

    signer = Signer(stage, processes)

    def start(batch: list[_Line] | None) -> asyncio.Future[list[SignResult]] | None:
        if batch is None:
            return None
        return asyncio.ensure_future(signer.sign([(line.body, None, run.source(line)) for line in batch]))

    signing = None
    try:
        batch = next(batches, None)
        signing = start(batch)
        while batch is not None and signing is not None:
            # each line's signed record, or its helper's answer when it is dead-lettered
            signed = [r if r.signed is None else decode_signed(r.signed) for r in await signing]
            following = next(batches, None)
            signing = start(following)
            for at in range(0, len(batch), decide_batch):
                part = slice(at, at + decide_batch)
                run.decide(batch[part], signed[part])
                await asyncio.sleep(0)
            batch = following
    except SignerFailed as exc:
        done = _resumed_mark(run.shard.state.get_meta(run.progress_key), None, run.feed_verdicts).line
        raise SigningFailed(
            f"{exc}; the state is checkpointed after line {done} of {run.topic}, where a "
            "rerun with the same state resumes"
        ) from exc
    finally:
        if signing is not None:
            signing.cancel()
            await asyncio.gather(signing, return_exceptions=True)
        await signer.aclose()


class ResumeMismatch(Error, RuntimeError):
    """The state says more was written than the output file holds: they do not belong together."""


def _written_as_it_comes(path: Path) -> bool:
    """A device or a pipe (`-o /dev/null`): no offset to resume at, no directory beside it."""
    return path.exists() and not path.is_file()


def _open_at(path: Path, offset: int) -> BinaryIO:
    """Open for writing at `offset`, dropping anything a crashed run wrote after it; a device or a
    pipe is written as it comes."""
    if _written_as_it_comes(path):
        return path.open("wb")
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
