"""Deduplicate in process: the engine of the stream worker and of `neardup dedup`, without a broker.

    import neardup

    with neardup.open("state/") as dedup:      # neardup.open() keeps the index in memory
        verdict = dedup.check({"id": "a1", "text": "..."})
        verdict["verdict"]                      # "unique", "duplicate", "partial" or "revised"

A verdict is the dict the worker publishes on the verdicts topic (schemas/verdict.schema.json),
`latency_ms` being None as in `neardup dedup`'s output. The same articles in the same order get the
same verdicts as `neardup dedup` gives them with the same settings, and a state directory written
here can be continued by `neardup dedup --state` and read by `neardup stats --state`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import orjson

from .config import Mode, engine_params, for_mode, keyword_values, retention_window
from .core.params import DedupParams
from .core.retention import Retention
from .core.signing import SketchBatch
from .embedded import DECIDE_BATCH, DEFAULT_MAX_TEXT_BYTES, published
from .errors import Error
from .messages import Article, Deletion, InvalidMessage, article_from_dict, decode_message
from .pipeline.shard import Decided, IndexShard
from .pipeline.sign import SignStage, refusal_reason
from .pipeline.wire import Provenance, Signed, SignedDeletion
from .state.index import IndexState, runs_of, started_ahead
from .state.memory import MemoryState
from .state.rocks import RocksOptions, RocksState

Verdict = dict[str, Any]


class _Signing(NamedTuple):
    """A batch of check_many's articles being signed: the articles read, up to `invalid`, the
    first bad one (None: none was), and their sketches under way."""

    articles: list[Article]
    sketches: SketchBatch
    invalid: InvalidMessage | None

    def has_bad_article(self) -> bool:
        """Refused as read, or as normalized (empty, too long)."""
        return self.invalid is not None or self.sketches.refused


class DecisionFailed(Error, RuntimeError):
    """The index failed on one article (a corrupt record, a full disk): it is not indexed, the
    articles around it are; the worker dead-letters such an article as `internal_error`."""


ArticleInput = Article | Mapping[str, Any] | bytes | str
_CALLER = Provenance("neardup.api", None, 0, None)  # where a call's article came from, for dead letters


class Deduplicator:
    """One index and the engine deciding against it. Not thread-safe: one caller at a time, as a
    state directory has one writer at a time (RocksDB's lock file enforces it)."""

    def __init__(
        self,
        state: IndexState,
        params: DedupParams,
        retention: Retention,
        max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    ) -> None:
        """Usually made by `neardup.open`. Raises IncompatibleState when `state` was written with
        other signing parameters (its signatures and band keys would be meaningless)."""
        self.params = params
        self.max_text_bytes = max_text_bytes
        self._stage = SignStage.under(params, max_text_bytes, retention)
        self._shard = IndexShard(state, params, retention)
        self._closed = False

    def check(self, article: ArticleInput) -> Verdict:
        """Decide about one article and add it to the index; returns its verdict.

        `article`: a dict as on the input topic (`{"id": ..., "text": ..., "published_at": ...}`,
        see schemas/article.schema.json), a `neardup.Article`, or the JSON of one as bytes or str.
        An id checked again with the same text gets its stored verdict back; with another text, a
        new version. Raises InvalidMessage (`.reason` as in the dead letters: schema_violation,
        oversized, empty_text, invalid_json, invalid_utf8) for input the worker would not accept."""
        return next(self.check_many([article]))

    def check_many(self, articles: Iterable[ArticleInput]) -> Iterator[Verdict]:
        """`check` each article in turn, DECIDE_BATCH of them in one call of the engine (what
        `neardup dedup` does), lazily: a long input is never held in memory, and one batch is read
        and signed ahead (core/signing.py: SketchBatch) while the one before is decided. Stops with
        InvalidMessage at the first bad article, the ones before it decided; an article the
        engine fails on raises at its place, the rest of its batch decided and indexed."""
        # nothing after a bad article is read
        runs = started_ahead(runs_of(articles, DECIDE_BATCH), self._start, _Signing.has_bad_article)
        for signing in runs:
            yield from self._decided(signing)

    def _start(self, run: list[ArticleInput]) -> _Signing:
        """The run's articles up to the first bad one, their sketches under way."""
        parsed: list[Article] = []
        invalid = None
        try:
            parsed.extend(map(self._article, run))
        except InvalidMessage as exc:
            invalid = exc
        return _Signing(
            parsed, SketchBatch([a.text for a in parsed], self.params, self.max_text_bytes), invalid
        )

    def _decided(self, signing: _Signing) -> Iterator[Verdict]:
        """A run's verdicts, then its bad article's InvalidMessage, if any."""
        self._check_open()  # closed between two batches: no further one is decided
        signed: list[Signed] = []
        invalid = signing.invalid
        for article, sketch in zip(signing.articles, signing.sketches.results(), strict=True):
            if isinstance(sketch, Exception):
                if (reason := refusal_reason(sketch)) is None:
                    raise sketch
                invalid = InvalidMessage(reason, f"{sketch} (article {article.article_id!r})")
                break
            signed.append(self._stage.signed(article, sketch, _CALLER))
        yield from map(self._verdict, self._shard.decide(signed))
        if invalid is not None:
            raise invalid

    @staticmethod
    def _verdict(decided: Decided) -> Verdict:
        # rendered as the library's answers: the verdict returned, a dead letter raised
        what = published(decided, None)
        if what.dead_letter:
            raise DecisionFailed(f"the index failed on this article: {decided.error}")
        assert what.verdict and decided.verdict is not None
        return orjson.loads(decided.verdict)  # type: ignore[no-any-return]

    def delete(self, article_id: str) -> bool:
        """Remove an article from the index (a retraction): later articles are no longer matched
        with it. False when the index does not hold it. Raises InvalidMessage for an id the worker
        would not accept (not a string of 1 to 512 characters: schema_violation; a lone surrogate:
        invalid_utf8)."""
        self._check_open()
        article_from_dict({"id": article_id, "deleted": True}, self.max_text_bytes)  # the id checked
        decided = self._shard.decide([SignedDeletion(article_id, _CALLER)])[0]
        if decided.error is not None:
            raise DecisionFailed(f"the index failed on this deletion: {decided.error}")
        return decided.status == "deleted"

    def stats(self) -> dict[str, Any]:
        """What the index holds, as `neardup stats --json` reports it: articles, clusters, buckets,
        oldest_ms and newest_ms (article times), expired, deleted, bytes_on_disk and so on."""
        self._check_open()
        return self._shard.state.stats().as_dict()

    def close(self) -> None:
        """Release the state (a state directory's lock); closing again does nothing."""
        if not self._closed:
            self._closed = True
            self._shard.state.close()

    def __enter__(self) -> Deduplicator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the deduplicator is closed")

    def _article(self, article: ArticleInput) -> Article:
        """The input as a validated Article, by the same checks the worker applies to a message."""
        if isinstance(article, bytes | str):
            raw = article.encode("utf-8", errors="surrogatepass") if isinstance(article, str) else article
            parsed = decode_message(raw.rstrip(b"\r\n"), None, self.max_text_bytes)
        elif isinstance(article, Article):
            # an Article can be built with anything in its fields: check it as the dict it stands for
            # (its fields, the id under its input name too)
            parsed = article_from_dict(dict(vars(article), id=article.article_id), self.max_text_bytes)
        elif isinstance(article, Mapping):
            parsed = article_from_dict(dict(article), self.max_text_bytes)
        else:
            raise InvalidMessage(
                "schema_violation",
                f"an article is a dict, a neardup.Article or JSON, got {type(article).__name__}",
            )
        if isinstance(parsed, Deletion):
            raise InvalidMessage(
                "schema_violation",
                f"article {parsed.article_id!r} is a deletion: call delete() to remove an article",
            )
        return parsed


def open(state_dir: str | os.PathLike[str] | None = None, **settings: Any) -> Deduplicator:
    """A Deduplicator over the RocksDB state in `state_dir` (created when missing, continued when
    it holds one), or over memory when `state_dir` is None.

    The keywords are the settings listed below (deploy/docs/configuration.md has them all), with
    the defaults of `neardup dedup` and the worker; NEARDUP_* variables play no part here. A
    keyword that is not one of them is a TypeError, a value out of bounds a ConfigError (a
    ValueError) in the words the worker and `neardup dedup` use. Reopening a state directory needs
    the same signing parameters: IncompatibleState otherwise. A directory another process holds
    open raises StateError."""
    values = keyword_values(settings)
    params, window = engine_params(values), retention_window(values)  # refused before a directory is made
    state = open_state(state_dir, values["bucket_cap"])
    try:
        return Deduplicator(state, params, window, values["max_text_bytes"])
    except BaseException:
        state.close()
        raise


def open_state(
    state_dir: str | os.PathLike[str] | None, bucket_cap: int, *, checkpointed: bool = False
) -> IndexState:
    """The RocksDB state in `state_dir` (created when missing), or memory when it is None: the
    library's, and `neardup dedup --state`'s. `checkpointed`: the caller stores where it stands
    with each write and resumes from there (`neardup dedup`), so its writes skip RocksDB's
    write-ahead log; a crash takes the state back to its last flush, checkpoint included."""
    if state_dir is None:
        return MemoryState(bucket_cap)
    options = RocksOptions(bucket_cap=bucket_cap, hold_families=True, write_ahead_log=not checkpointed)
    return RocksState(os.fspath(state_dir), options)


def _keywords_documented(function: Callable[..., Any]) -> None:
    """Its signature and docstring list the library's settings from the table (help() shows them)."""
    settings = for_mode(Mode.LIBRARY)
    signature = inspect.signature(function)
    leading = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    keywords = [
        inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=s.default, annotation=s.annotation)
        for s in settings
    ]
    function.__signature__ = signature.replace(parameters=[*leading, *keywords])  # type: ignore[attr-defined]
    lines = [f"    {s.name}={s.default!r}: {s.help}" for s in settings]
    function.__doc__ = f"{function.__doc__}\n\n    Settings:\n\n" + "\n".join(lines)


_keywords_documented(open)
