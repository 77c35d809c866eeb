"""Article / Verdict / DeadLetter codecs (orjson). Validation mirrors schemas/*.schema.json, which the
tests check against; it is hand-written because it runs on every message."""

from __future__ import annotations

import base64
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

import orjson

from .core.anchors import Passage
from .core.dedup import PASSAGES, Candidate, Decision, IndexedArticle, VerdictKind
from .core.params import DedupParams
from .core.signing import Sketch
from .errors import Error

DeadLetterReason = Literal[
    "invalid_utf8",
    "invalid_json",
    "schema_violation",
    "oversized",
    "empty_text",
    "key_mismatch",
    "unkeyed",  # a Kafka record without a key: its id's versions could take different partitions
    "internal_error",
    "processing_failed",  # the message made a helper process die or hang, alone
]
DEAD_LETTER_REASONS: tuple[str, ...] = get_args(DeadLetterReason)
OPTIONAL_STRING_FIELDS = ("title", "url", "source", "published_at", "language")
MAX_ID_LENGTH = 512
# The dead-letter topic's max.message.bytes (stream/topics.py creates it so), and the producer's
# largest request.
DEAD_LETTER_MAX_BYTES = 8 * 1024 * 1024
# What a dead letter leaves of that limit for the Kafka record's own framing and headers.
DEAD_LETTER_HEADROOM = 64 * 1024
# What an input message may hold besides its text (its other fields, JSON's quoting): a message
# larger than the text limit and this is refused before it is parsed.
INPUT_HEADROOM = 64 * 1024


VERDICT_KINDS: tuple[str, ...] = get_args(VerdictKind)


def parse_verdict_filter(text: str) -> frozenset[str]:
    """The verdict kinds a filtered feed passes on, from a comma-separated list ("unique,partial").

    Strict, because a misspelt kind would otherwise pass nothing on and the feed would look like a
    quiet news day: every listed kind must be one the engine gives, and the list must name one."""
    kinds = [part.strip() for part in text.split(",")]
    expected = ", ".join(VERDICT_KINDS)
    if not any(kinds):
        raise ValueError(f"the verdict filter {text!r} names no verdict kind: list some of {expected}")
    if "" in kinds:
        raise ValueError(f"the verdict filter {text!r} has an empty entry: list some of {expected}")
    if (unknown := next((kind for kind in kinds if kind not in VERDICT_KINDS), None)) is not None:
        raise ValueError(f"unknown verdict kind {unknown!r} in the filter {text!r}: the kinds are {expected}")
    return frozenset(kinds)


class InvalidMessage(Error, ValueError):
    """A message that cannot become an article; `reason` is the dead-letter reason."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: DeadLetterReason = reason
        self.detail = detail


@dataclass(frozen=True)
class Article:
    """An input article: id and text required, the rest carried through for consumers."""

    article_id: str
    text: str
    title: str | None = None
    url: str | None = None
    source: str | None = None
    published_at: str | None = None
    language: str | None = None


@dataclass(frozen=True)
class Deletion:
    """A request to delete an article: a tombstone on the input topic (key = id, no value), or
    `{"id": "...", "deleted": true}`."""

    article_id: str


def decode_message(
    raw: bytes | None, key: bytes | None, max_text_bytes: int, *, keyed: bool = False
) -> Article | Deletion:
    """An input message: an article, or a deletion. InvalidMessage names what is wrong.

    A message with a key must be keyed by its id (`key_mismatch` otherwise, once its value passes
    its own checks): an article's versions and its deletion are applied in the order of the
    input's partitions, which keeps them in order only when they share a partition, as messages
    of one key do. A message keyed otherwise could be applied after its own tombstone. For the
    same reason a message that must have a key (`keyed`: a Kafka record) and has none is refused
    (`unkeyed`, once its value passes its own checks): the producer's partitioner spreads such
    messages, one id's among them, over the partitions. Embedded mode and the library have no
    partitions: their messages have no key to compare."""
    if raw is None:
        if not key:
            raise InvalidMessage("invalid_json", "tombstone without a key: no article id to delete")
        try:
            article_id = key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidMessage("invalid_utf8", f"tombstone key, byte {exc.start}: {exc.reason}") from exc
        if len(article_id) > MAX_ID_LENGTH:
            raise InvalidMessage("schema_violation", f"tombstone key is longer than {MAX_ID_LENGTH}")
        return Deletion(article_id)
    decoded = decode_article(raw, max_text_bytes)
    article_id = decoded.article_id
    if key is None and keyed:
        raise InvalidMessage("unkeyed", f"the message for {article_id!r} has no key: produce it {_BY_ID}")
    if key is not None and key != article_id.encode("utf-8"):
        raise InvalidMessage(
            "key_mismatch",
            f"the key {_shown_key(key)} is not the id {article_id!r}: produce the message {_BY_ID}",
        )
    return decoded


# How a message must be keyed, and why: the end of an unkeyed or mismatched message's detail.
_BY_ID = "keyed by its id, so that the article's versions and deletion stay in one partition, in order"


def _shown_key(key: bytes) -> str:
    """A key for a detail: its text, or its bytes when it is not UTF-8; cut at an id's length (the
    dead letter carries it whole)."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        cut = key[: 4 * MAX_ID_LENGTH]
        shown, whole = f"{cut!r} (not UTF-8)", cut == key
    else:
        shown, whole = repr(text[:MAX_ID_LENGTH]), len(text) <= MAX_ID_LENGTH
    return shown if whole else f"{shown}… ({len(key)} bytes)"


def decode_article(raw: bytes | None, max_text_bytes: int) -> Article | Deletion:
    """Bytes → Article (or Deletion for `{"id": ..., "deleted": true}`), or InvalidMessage naming
    the reason and the offending field."""
    if raw is None:
        raise InvalidMessage("invalid_json", "message has no value (tombstone)")
    if len(raw) > input_max_bytes(max_text_bytes):
        raise InvalidMessage("oversized", f"message is {len(raw)} bytes, limit {max_text_bytes}")
    try:
        raw.decode("utf-8")
        data = orjson.loads(raw)
    except UnicodeDecodeError as exc:
        raise InvalidMessage("invalid_utf8", f"byte {exc.start}: {exc.reason}") from exc
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage("invalid_json", str(exc)) from exc
    return article_from_dict(data, max_text_bytes)


def input_max_bytes(max_text_bytes: int) -> int:
    """The largest input message (its value) decode_article accepts under a text limit: what the
    filtered feed may forward."""
    return max_text_bytes + INPUT_HEADROOM


def article_from_dict(data: Any, max_text_bytes: int) -> Article | Deletion:
    if not isinstance(data, dict):
        raise InvalidMessage("schema_violation", f"article must be an object, got {type(data).__name__}")
    article_id = data.get("id")
    if not isinstance(article_id, str) or not article_id or len(article_id) > MAX_ID_LENGTH:
        raise InvalidMessage(
            "schema_violation", f"field 'id' must be a string of 1..{MAX_ID_LENGTH} characters"
        )
    _utf8(article_id, "id", article_id)
    deleted = data.get("deleted")
    if deleted is True:
        return Deletion(article_id)
    if deleted is not None and deleted is not False:
        raise _refused("schema_violation", "field 'deleted' must be true or false", article_id)
    if not isinstance(text := data.get("text"), str):
        raise _refused("schema_violation", "field 'text' must be a string", article_id)
    if (size := len(_utf8(text, "text", article_id))) > max_text_bytes:
        raise _refused("oversized", f"field 'text' is {size} bytes, limit {max_text_bytes}", article_id)
    extras = {name: data.get(name) for name in OPTIONAL_STRING_FIELDS}
    for name, value in extras.items():
        if value is not None and not isinstance(value, str):
            raise _refused("schema_violation", f"field {name!r} must be a string or null", article_id)
    return Article(article_id, text, **extras)


def _refused(reason: DeadLetterReason, detail: str, article_id: str) -> InvalidMessage:
    """An article's field refused: the detail names the article."""
    return InvalidMessage(reason, f"{detail} (article {article_id!r})")


def _utf8(value: str, name: str, article_id: str) -> bytes:
    """A field as UTF-8. Only a caller in process can pass a lone surrogate (a message on the topic
    is decoded from UTF-8): refused as the worker refuses bytes that are not UTF-8."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = article_id.encode("utf-8", errors="backslashreplace").decode()
        raise _refused("invalid_utf8", f"field {name!r}, character {exc.start}: {exc.reason}", shown) from exc


def verdict_dict(
    article: IndexedArticle, params: DedupParams, latency_ms: float | None = None
) -> dict[str, Any]:
    """The verdict record, identical in the stream and the embedded mode (latency aside)."""
    decision: Decision = article.decision
    return {
        "article_id": article.article_id,
        "verdict": decision.kind,
        "match_id": decision.match_id,
        "jaccard": decision.jaccard,
        "containment": decision.containment,
        "contains": decision.contains,
        "canonical_id": decision.canonical_id,
        "exact": decision.exact,
        "version": article.version,
        "candidates": [
            dict(article_id=c.article_id, jaccard=c.jaccard, containment=c.containment, contains=c.contains)
            for c in decision.candidates
        ],
        "params": params.audit(),
        **_passages(decision),
        "latency_ms": latency_ms,
    }


def _passages(decision: Decision) -> dict[str, Any]:
    """The shared passages, for a verdict that has them: offsets in both canonical texts."""
    if not decision.passages:
        return {}
    spans = [
        dict(start=p.start, end=p.end, match_start=p.other_start, match_end=p.other_end, anchors=p.anchors)
        for p in decision.passages
    ]
    return {"passages": {"offsets": "canonical", "spans": spans}}


# The JSON numbers of the most characters: an unsigned 64-bit integer (20 digits), and a float as
# orjson writes the longest (24 characters).
_LONGEST_INT = 2**64 - 1
_LONGEST_FLOAT = -2.2250738585072014e-308


def verdict_max_bytes(params: DedupParams) -> int:
    """An upper bound on an encoded verdict's size under `params`: verdict_dict of a duplicate whose
    ids, candidates and numbers all take the most room they can."""
    # A control character is escaped as \u00XX: 6 bytes, more than any other character takes.
    worst_id = "\x00" * MAX_ID_LENGTH
    score = _LONGEST_FLOAT
    kind = cast(VerdictKind, max(VERDICT_KINDS, key=len))
    candidates = (Candidate(worst_id, score, score, score),) * params.top_candidates
    passages = (Passage(_LONGEST_INT, _LONGEST_INT, _LONGEST_INT, _LONGEST_INT, _LONGEST_INT),) * PASSAGES
    decision = Decision(kind, worst_id, score, score, score, worst_id, False, candidates, passages)
    # verdict_dict reads only the id, version and decision of the article
    article = IndexedArticle(worst_id, _LONGEST_INT, 0, cast(Sketch, None), decision)
    return len(orjson.dumps(verdict_dict(article, params, score)))


def dead_letter_dict(
    reason: str,
    detail: str,
    original: bytes | None,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    key: bytes | None = None,
    max_bytes: int = DEAD_LETTER_MAX_BYTES,
) -> dict[str, Any]:
    """Everything needed to inspect and replay a rejected message; the bytes as base64.

    The encoded record and its key (the Kafka record's key too) fit in `max_bytes` less the
    headroom: a value too large for that (base64 is 4/3 larger) is cut to its first bytes, marked
    `value_truncated`, with the original's `value_size` and `value_sha256` to check it against the
    message its topic, partition and offset point to."""
    record: dict[str, Any] = {
        "reason": reason,
        "detail": detail,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key_b64": None if key is None else base64.b64encode(key).decode(),
        "value_b64": None,
        "failed_at": time.time(),
    }
    if original is None:
        return record
    room = max_bytes - DEAD_LETTER_HEADROOM - len(key or b"")
    encoded_size = (len(original) + 2) // 3 * 4  # base64: 4 characters per 3 bytes, the last padded
    if len(orjson.dumps(record)) + encoded_size > room:
        import hashlib  # imported here: only a dead letter too large to carry its message needs it

        digest = hashlib.sha256(original).hexdigest()
        record.update(value_truncated=True, value_size=len(original), value_sha256=digest)
        keep = max(0, room - len(orjson.dumps(record))) // 4 * 3
        original = original[:keep]
    record["value_b64"] = base64.b64encode(original).decode()
    return record


def id_key(body: bytes) -> bytes | None:
    """The key an input line is produced under: its id, when it is an object that has one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    key = data.get("id") if isinstance(data, dict) else None
    return key.encode() if isinstance(key, str) else None


def verdicts_summary(verdicts: list[dict[str, Any]]) -> str:
    """`neardup tail --summary`: counts by kind, the largest clusters, and the median latency of
    the verdicts seen."""
    kinds = Counter(v["verdict"] for v in verdicts)
    clusters = Counter(v["canonical_id"] for v in verdicts if v["verdict"] != "unique")
    latencies = sorted(v["latency_ms"] for v in verdicts if v.get("latency_ms") is not None)
    counts = ", ".join(f"{kind}={kinds.get(kind, 0)}" for kind in VERDICT_KINDS)
    exact = sum(1 for v in verdicts if v.get("exact"))
    lines = [f"verdicts: {len(verdicts)} ({counts}; exact re-posts={exact})"]
    if latencies:
        median = latencies[len(latencies) // 2]
        lines.append(f"produce-to-verdict latency: median {median:.1f} ms, max {latencies[-1]:.1f} ms")
    if clusters:
        top = ", ".join(f"{cid} (+{n})" for cid, n in clusters.most_common(5))
        lines.append(f"largest clusters: {top}")
    return "\n".join(lines)


def verdict_line(verdict: dict[str, Any]) -> str:
    """A verdict as `neardup tail` shows it: one readable line."""
    kind = verdict["verdict"]
    head = f"{verdict['article_id']:<28} {kind:<9}"
    if kind == "unique":
        return head
    exact = " exact" if verdict.get("exact") else ""
    spans = verdict.get("passages", {}).get("spans", [])
    # canonical-text offsets here ~ there
    shared = "".join(f" [{s['start']}:{s['end']}]~[{s['match_start']}:{s['match_end']}]" for s in spans)
    return (
        f"{head} of {verdict['match_id']} (J={verdict['jaccard']:.2f}, "
        f"in={verdict['containment']:.2f}, covers={verdict['contains']:.2f}{exact}) "
        f"cluster {verdict['canonical_id']}{' passages' + shared if shared else ''}"
    )


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record)
