"""A fuzz test of the broker-free pipeline: seeded random and mutated messages through embedded mode
(`run_file`, over memory and RocksDB) and the library (`neardup.open`, in memory and on a directory).

Each message's outcome is predicted by an oracle written from the schemas (the standard library's
JSON parser, not the service's), and the index by a model of which ids it holds; afterwards the
counts `neardup stats` reports are checked against a scan of the state's keys.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from random import Random
from types import MappingProxyType
from typing import Any

import orjson
import pytest

import neardup
from neardup import cli, embedded
from neardup.core.normalize import is_default_ignorable, normalize
from neardup.core.params import DedupParams
from neardup.core.retention import Retention, parse_duration_ms
from neardup.embedded import run_file
from neardup.messages import DEAD_LETTER_REASONS, MAX_ID_LENGTH, OPTIONAL_STRING_FIELDS
from neardup.state import held
from neardup.state.index import IndexState
from neardup.state.memory import MemoryState
from neardup.state.records import decode_record
from neardup.state.rocks import RocksOptions, RocksState
from neardup.state.tables import ARTICLE, BAND, CONTENT, COPY, HEAD, MEMBER, POSTING, SEQ, TIME, time_key
from tests.support.prose import PROSE
from tests.support.reference_decide import decided_both_ways, signed_lines
from tests.support.schemas import schema_errors
from tests.support.state import contents

SEEDS = (7, 1931, 65537)
# The first seed covers each store in tests/run --unit; the others add cases in the full run
SEEDED = [pytest.param(seed, marks=[pytest.mark.slow] if n else []) for n, seed in enumerate(SEEDS)]
EMBEDDED_LINES = 1_200  # per seed and store
LIBRARY_CALLS = 800  # per seed and store
MAX_TEXT = 20_000  # small, so that texts near the limit are cheap
RAW_LIMIT = MAX_TEXT + 64 * 1024  # decode_article's limit on a whole message
PARAMS = DedupParams()
WORDS = re.findall(r"\S+", " ".join(PROSE))

# Unicode the normalization and the shingles must take: combining marks, bidirectional text and
# controls, emoji sequences, characters NFKC expands (U+FDFA becomes 18), full-width forms, line and
# paragraph separators, NULs, BOMs, noncharacters, the last code point.
ODD_PIECES = (
    "e\u0301",
    "Z\u0351\u0364\u0336a\u0317\u0359l\u035cg\u0316o",
    "\u0301\u0302\u0303",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u202eabc\u202c",
    "\u200f\u2066x\u2069",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1fa\U0001f1f8",
    "\u200d\u200b\u2060",
    "\ufdfa",
    "\ufb03",
    "\u2162\u216b\u337b",
    "\uff21\uff22\uff23\uff11\uff12",
    "\r\n",
    "\u2028",
    "\u2029",
    "\x85",
    "\x00",
    "\ufeff",
    "\uffff\ufffe",
    "\U0010ffff",
    "\ue000",
    "\U000e0001\U000e0041",
    "\u3000",
    "\xa0",
    "\x1c\x1d\x1e\x1f",
    "\t",
)
WHITESPACE_ONLY = ("", " ", "\t\n\r ", "\u3000\xa0\u2028\u2029\x85", "\x1c\x1f \x0b\x0c")
TINY = ("a", "ab", "abcd", "abcde", "e\u0301", "\ufdfa", "\U0001f600", "\x00", "\u200b")
# published_at: valid, offsets, far past and future (refused), leap seconds, impossible dates,
# digits other than ASCII ones (which a regular expression's \d takes), trailing newlines, garbage
PUBLISHED = (
    "2024-05-01T12:00:00Z",
    "2024-05-01T12:00:00.123456789+05:30",
    "2024-05-01 12:00:00z",
    "2024-05-01t12:00:00-00:00",
    "1969-12-31T23:59:59Z",
    "0001-01-01T00:00:00+23:59",
    "9999-12-31T23:59:59-23:59",
    "2999-01-01T00:00:00Z",
    "2016-12-31T23:59:60Z",
    "2024-02-30T00:00:00Z",
    "2024-05-01T25:61:61Z",
    "2024-05-01T12:00:00+24:00",
    "2024-05-01T12:00:00",
    "2024-05-01",
    "\u0662\u0660\u0662\u0664-\u0660\u0665-\u0660\u0661T\u0661\u0662:\u0660\u0660:\u0660\u0660Z",
    "\uff12\uff10\uff12\uff14-05-01T12:00:00Z",
    "2024-05-01T12:00:00Z\n",
    "yesterday",
    "",
    None,
)
TIMELINE_START = datetime(2020, 1, 1, tzinfo=UTC)
BAD_UTF8 = (b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80")
FOOTERS = (" Copyright 2011 The Associated Press. All rights reserved.", " (Reuters)", " -- AP")


# -- the generator ------------------------------------------------------------------------------


@dataclass
class Fuzzer:
    """Random messages from one seed: new articles, near and exact copies of earlier ones, re-sends
    and deletions of their ids, odd texts and fields, and bytes that are no article at all."""

    seed: int
    # every article timed by the timeline: no arrival time (the wall clock) moves the newest time
    # past it, so the retention cutoff follows the messages and expiry passes run
    timed: bool = False
    rng: Random = field(init=False)
    sent: list[tuple[str, str]] = field(default_factory=list)  # (id, text) of the articles built
    counter: int = 0

    def __post_init__(self) -> None:
        self.rng = Random(self.seed)

    # texts

    def fresh_text(self) -> str:
        """A new article's text: a window of real prose, the prose's words shuffled, or made-up words."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.5:  # a window of real prose: windows of one paragraph overlap, so copies occur
            source = rng.choice(PROSE)
            start = rng.randrange(len(source) // 2)
            text = source[start : start + rng.randrange(150, len(source))]
        elif roll < 0.8:
            text = " ".join(rng.choices(WORDS, k=rng.randrange(20, 250)))
        else:
            letters = "abcdefghijklmnopqrstuvwxyz"
            text = " ".join(
                "".join(rng.choices(letters, k=rng.randrange(1, 12))) for _ in range(rng.randrange(5, 200))
            )
        return f"{text} Ref {rng.randrange(10**6)}."

    def near_copy(self, text: str) -> str:
        """Another version of `text`: edited a little, or changed only where normalization undoes it."""
        rng = self.rng
        words = text.split(" ")
        how = rng.randrange(12)
        if how == 0:
            return text + rng.choice(FOOTERS)
        if how == 1:
            return "By Staff Writer. " + text
        if how == 2:
            for _ in range(rng.randrange(1, 4)):
                words[rng.randrange(len(words))] = rng.choice(WORDS)
            return " ".join(words)
        if how == 3:
            return text[: max(1, len(text) * rng.randrange(50, 96) // 100)]
        if how == 4:
            return text + "\n\n" + text
        if how == 5:
            return text.upper()  # the same canonical text: an exact copy
        if how == 6:
            return text.replace(" ", rng.choice(("  ", "\r\n", "\u2028", "\u3000", "\t \xa0")))
        if how == 7:
            return unicodedata.normalize("NFD", text)
        if how == 8:  # full-width forms, which NFKC folds back
            return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)
        if how == 9:
            at = rng.randrange(len(text) + 1)
            return text[:at] + rng.choice(ODD_PIECES) + text[at:]
        if how == 10:
            cut = rng.randrange(len(words))
            return " ".join(words[cut:] + words[:cut])
        return text  # unchanged: an exact copy under another id

    def odd_text(self, *, library: bool = False) -> str:
        """Whitespace, a few characters, odd Unicode, a size near or past the limit; `library`:
        lone surrogates too."""
        rng = self.rng
        roll = rng.randrange(8)
        if roll == 0:
            return rng.choice(WHITESPACE_ONLY)
        if roll == 1:
            return rng.choice(TINY)
        if roll == 2:
            return "".join(rng.choices(ODD_PIECES, k=rng.randrange(1, 40)))
        if roll == 3:  # prose with odd pieces in it
            pieces = self.fresh_text().split(" ")
            for _ in range(rng.randrange(1, 10)):
                pieces.insert(rng.randrange(len(pieces) + 1), rng.choice(ODD_PIECES))
            return " ".join(pieces)
        if roll == 4:  # near the byte limit, in characters of 1 to 4 bytes
            char = rng.choice(("a", "\xe9", "\u20ac", "\U0001f600", "\ufdfa"))
            size = MAX_TEXT + rng.choice((-4, -1, 0, 1, 3))
            return char * (size // len(char.encode())) + "b" * (size % len(char.encode()))
        if roll == 5:  # well past it, in bytes or only once JSON escapes it (6 bytes a control)
            return rng.choice(("x" * (RAW_LIMIT + 10), "\x01" * (MAX_TEXT - 100), "y" * (3 * MAX_TEXT)))
        if roll == 6 and library:  # lone surrogates: only a caller in process can pass one
            return rng.choice(("\ud800", "abc\udfffdef", "\ud83d\ude00", self.fresh_text() + "\udc80"))
        return self.fresh_text() * rng.randrange(1, 12)

    # ids and values

    def new_id(self) -> str:
        """An id not used before, some with characters other than ASCII letters."""
        self.counter += 1
        prefix = self.rng.choice(("a", "a", "a", "\xe9", "\u05e9", "\U0001f468\u200d\U0001f469", "\x00", " "))
        return f"{prefix}{self.seed}-{self.counter}" + self.rng.choice(("", "", "\u2028", "/x y", "\r"))

    def odd_id(self) -> Any:
        """An id at or past the length limit, empty, of another type, or one used before."""
        rng = self.rng
        return rng.choice(
            (
                "",
                "x" * MAX_ID_LENGTH,
                "y" * (MAX_ID_LENGTH + 1),
                "\xe9" * MAX_ID_LENGTH,
                "\U0001f600" * MAX_ID_LENGTH,
                "\U0001f600" * (MAX_ID_LENGTH + 1),
                " ",
                "\x00",
                "\ud800x",
                None,
                17,
                1.5,
                True,
                [],
                {"id": "x"},
                *([] if not self.sent else [rng.choice(self.sent)[0]]),
            )
        )

    def timeline(self) -> str:
        """A time that moves on with the messages (about an hour each), so that articles expire."""
        stamp = TIMELINE_START + timedelta(minutes=self.counter * 61 - self.rng.randrange(3000))
        return stamp.isoformat()

    def value(self, depth: int = 0) -> Any:
        """Any JSON value."""
        rng = self.rng
        roll = rng.randrange(12 if depth < 3 else 9)
        simple = (
            None,
            True,
            False,
            rng.randrange(-(2**70), 2**70),
            rng.choice((0, -1, 2**63, -(2**63) - 1, 2**64)),
            rng.uniform(-1e300, 1e300),
            rng.choice((0.0, -0.0, 1e-320, 5e-324)),
            rng.choice(("", "x", rng.choice(ODD_PIECES))),
            rng.choice(PUBLISHED) or "null",
        )
        if roll < len(simple):
            return simple[roll]
        if roll == 9:
            return [self.value(depth + 1) for _ in range(rng.randrange(4))]
        if roll == 10:
            return {
                rng.choice(("id", "text", "a", "")): self.value(depth + 1) for _ in range(rng.randrange(4))
            }
        return self.fresh_text()

    def python_value(self) -> Any:
        """What no JSON holds, that a caller in process may pass."""
        return self.rng.choice(
            (
                b"bytes",
                (1, 2),
                {1, 2},
                float("nan"),
                float("inf"),
                object(),
                10**400,
                "\ud800",
                bytearray(b"x"),
            )
        )

    # articles

    def article(self, article_id: str, text: str) -> dict[str, Any]:
        """An article with some of its optional fields, odd ones among them, in some key order."""
        rng = self.rng
        record: dict[str, Any] = {"id": article_id, "text": text}
        for name in OPTIONAL_STRING_FIELDS:
            if rng.random() < 0.3:
                record[name] = rng.choice((None, "", "Wire", rng.choice(ODD_PIECES), "https://e.x/a?b=1"))
        if self.timed:
            record["published_at"] = self.timeline()
        elif rng.random() < 0.5:
            record["published_at"] = rng.choice(PUBLISHED) if rng.random() < 0.5 else self.timeline()
        if rng.random() < 0.1:
            record["deleted"] = rng.choice((False, None))
        if rng.random() < 0.1:
            record[rng.choice(("extra", "tags", "ID", "Text"))] = self.value()
        if rng.random() < 0.2:  # another key order
            items = list(record.items())
            rng.shuffle(items)
            record = dict(items)
        return record

    def message(self, *, library: bool = False) -> dict[str, Any]:
        """One article or deletion as a dict; `library`: with what only a caller in process can pass."""
        rng = self.rng
        kind = rng.choices(
            ("fresh", "near", "resend", "renew", "delete", "odd", "field"), (24, 18, 7, 6, 8, 12, 12)
        )[0]
        if kind != "fresh" and not self.sent:
            kind = "fresh"
        if kind == "fresh":
            return self.remember(self.article(self.new_id(), self.fresh_text()))
        if kind == "near":
            return self.remember(self.article(self.new_id(), self.near_copy(rng.choice(self.sent)[1])))
        if kind == "resend":
            return self.article(*rng.choice(self.sent))
        if kind == "renew":
            article_id, text = rng.choice(self.sent)
            text = self.near_copy(text) if rng.random() < 0.7 else self.fresh_text()
            return self.remember(self.article(article_id, text))
        if kind == "delete":
            article_id = rng.choice(self.sent)[0] if rng.random() < 0.8 else self.new_id()
            return {"id": article_id, "deleted": True} | ({"text": "ignored"} if rng.random() < 0.1 else {})
        if kind == "odd":
            return self.remember(self.article(self.new_id(), self.odd_text(library=library)))
        record = self.article(self.new_id(), self.fresh_text())
        names = [name for name in OPTIONAL_STRING_FIELDS if name != "published_at" or not self.timed]
        name = rng.choice(("id", "text", "deleted", *names))
        if name == "id":
            record["id"] = self.odd_id()
        elif library and rng.random() < 0.3:
            record[name] = self.python_value()
        else:
            record[name] = self.value()
        if rng.random() < 0.1:
            del record[name]
        return record

    def remember(self, record: dict[str, Any]) -> dict[str, Any]:
        """Keep an article's id and text to copy, re-send and delete later."""
        if isinstance(record.get("id"), str) and isinstance(record.get("text"), str):
            self.sent.append((record["id"], record["text"]))
        return record

    # bytes

    def encoded(self, record: Any) -> bytes:
        """JSON of `record`, in one of several spellings."""
        rng = self.rng
        spaced = rng.random() < 0.3
        text = json.dumps(
            record,
            ensure_ascii=rng.random() < 0.3,
            separators=(", ", ": ") if spaced else (",", ":"),
        )
        return text.encode("utf-8", errors="surrogatepass")

    def raw(self) -> bytes:
        """Bytes that are mostly no article: random, cut, mutated, mis-encoded, other JSON types."""
        rng = self.rng
        valid = self.encoded(self.article(self.new_id(), self.fresh_text()))
        when = b', "published_at": "%s"' % self.timeline().encode() if self.timed else b""
        roll = rng.randrange(12)
        if roll == 0:
            return rng.randbytes(rng.randrange(1, 300))
        if roll == 1:
            return valid[: rng.randrange(len(valid))]
        if roll == 2:
            at = rng.randrange(len(valid))
            return valid[:at] + rng.choice(BAD_UTF8) + valid[at:]
        if roll == 3:
            return rng.choice((b"\xef\xbb\xbf", b"\x00", b" ", b"\r", b"\xfe\xff")) + valid
        if roll == 4:
            return valid + rng.choice((b"\x00", b" x", b"}", b"\t", b"\x0c", b" \r", b","))
        if roll == 5:
            return self.encoded(
                rng.choice((None, True, 1, -0.5, "text", [], [self.value()], [valid.decode()]))
            )
        if roll == 6:  # a few bytes of a valid article changed, inserted or dropped
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 6)):
                at = rng.randrange(len(data))
                step = rng.randrange(3)
                if step == 0:
                    data[at] = rng.randrange(256)
                elif step == 1:
                    data.insert(at, rng.randrange(256))
                else:
                    del data[at]
            return bytes(data)
        if roll == 7:  # escapes: lone surrogates, NUL, a surrogate pair
            escape = rng.choice((r"\ud800", r"\udfff\ud800", r"\u0000", r"\ud83d\ude00", r"\x41", "\\"))
            return b'{"id": "e%d", "text": "abc %s def"%s}' % (rng.randrange(10**6), escape.encode(), when)
        if roll == 8:  # a key twice: the last one counts
            return b'{"id": "dup-%d", "text": "first text here", "id": "dup-%d", "text": %s%s}' % (
                rng.randrange(10**6),
                rng.randrange(10**6),
                json.dumps(self.fresh_text()).encode(),
                when,
            )
        if roll == 9:  # nesting deep enough that orjson refuses it, or shallow
            depth = rng.choice((5, 40, 3000))
            return b'{"id": "deep", "text": "t", "title": %s%s}' % (b"[" * depth + b"]" * depth, when)
        if roll == 10:
            return rng.choice((b"NaN", b"[Infinity]", b'{"id": "n", "text": "t", "title": 1e400}', b"-"))
        return bytes(rng.choices(b' \t{}[]",:0123456789abcdefnulltrue\\', k=rng.randrange(1, 60)))

    def line(self) -> bytes:
        """One line of a JSON-lines file without its line end (and no newline inside); a blank one
        now and then."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.03:
            return rng.choice((b"", b"   ", b"\t", b"\r", b"\x0b\x0c "))
        body = self.raw() if roll < 0.2 else self.encoded(self.message())
        return body.replace(b"\n", b"")

    def library_input(self) -> Any:
        """What `check` is given: a dict, its JSON as str or bytes, an Article, or something else."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            return rng.choice(
                (self.raw(), self.raw().decode("latin-1"), bytearray(self.raw()), None, 17, ["x"], b"", "")
            )
        record = self.message(library=True)
        form = rng.randrange(6)
        if form == 0:
            try:
                return self.encoded(record) + rng.choice((b"", b"\n", b"\r\n"))
            except (TypeError, ValueError):  # a value JSON cannot hold: passed as it is
                return record
        if form == 1:
            try:
                return self.encoded(record).decode("utf-8", errors="surrogatepass")
            except (TypeError, ValueError):
                return record
        if form == 2:
            fields = {"text": record.get("text")} | {k: record.get(k) for k in OPTIONAL_STRING_FIELDS}
            return neardup.Article(record.get("id"), **fields)  # type: ignore[arg-type]
        if form == 3:
            return MappingProxyType(record)
        return record


# -- the oracle ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What a message should come to: an article (id, canonical text), a deletion, or a dead letter."""

    kind: str  # "article", "deletion" or "dead"
    reason: str | None = None
    article_id: str = ""
    canonical: str = ""


def _int(text: str) -> int | float:
    """orjson's integers: 64 bits, beyond that a double (refused when infinite)."""
    value = int(text)
    return value if -(2**63) <= value < 2**64 else _float(text)


def _float(text: str) -> float:
    """orjson's doubles: an infinite one is refused."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:20]} is infinite as a double")
    return value


def _refuse(name: str) -> None:
    """NaN and Infinity, which Python's parser takes and JSON has not."""
    raise ValueError(f"{name} is not JSON")


def _has_surrogate(value: Any) -> bool:
    """Whether a lone surrogate is anywhere in a decoded JSON value."""
    if isinstance(value, str):
        return any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    return False


def expect_bytes(body: bytes, params: DedupParams = PARAMS) -> Expect:
    """A message's bytes as schemas/article.schema.json and the dead letters' reasons judge them."""
    if len(body) > RAW_LIMIT:
        return Expect("dead", "oversized")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return Expect("dead", "invalid_utf8")
    try:
        data = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return Expect("dead", "invalid_json")
    if _has_surrogate(data):  # a lone surrogate escaped: not a character, so no JSON text
        return Expect("dead", "invalid_json")
    return expect_fields(data, params)


def expect_fields(data: Any, params: DedupParams = PARAMS) -> Expect:
    """A decoded message: the checks in the order their reasons are reported."""
    if not isinstance(data, dict):
        return Expect("dead", "schema_violation")
    article_id = data.get("id")
    if not isinstance(article_id, str) or not 1 <= len(article_id) <= MAX_ID_LENGTH:
        return Expect("dead", "schema_violation")
    if _has_surrogate(article_id):
        return Expect("dead", "invalid_utf8")
    deleted = data.get("deleted")
    if deleted is True:
        return Expect("deletion", article_id=article_id)
    if deleted is not None and deleted is not False:
        return Expect("dead", "schema_violation")
    text = data.get("text")
    if not isinstance(text, str):
        return Expect("dead", "schema_violation")
    if _has_surrogate(text):
        return Expect("dead", "invalid_utf8")
    if len(text.encode()) > MAX_TEXT:
        return Expect("dead", "oversized")
    if any(
        data.get(name) is not None and not isinstance(data.get(name), str) for name in OPTIONAL_STRING_FIELDS
    ):
        return Expect("dead", "schema_violation")
    # at most one character per byte allowed, once NFKC has expanded the text
    if len(unicodedata.normalize("NFKC", text) if params.normalize.nfkc else text) > MAX_TEXT:
        return Expect("dead", "oversized")
    canonical = normalize(text, params.normalize)
    # nothing to compare: no character left, under word shingles no word, or none that shows
    if not (canonical.split() if params.shingle.unit == "word" else canonical):
        return Expect("dead", "empty_text")
    if not any(_shows(char) for char in canonical):
        return Expect("dead", "empty_text")
    return Expect("article", article_id=article_id, canonical=canonical)


def _shows(char: str) -> bool:
    """Neither a control, format, surrogate, private-use, unassigned, separator or mark character,
    nor a default-ignorable one."""
    invisible = unicodedata.category(char)[0] in "ZM" or unicodedata.category(char) in (
        "Cc",
        "Cf",
        "Cs",
        "Co",
        "Cn",
    )
    return not invisible and not is_default_ignorable(ord(char))


def expect_input(given: Any, params: DedupParams = PARAMS) -> Expect:
    """What `Deduplicator.check` should make of `given`."""
    if isinstance(given, str):
        given = given.encode("utf-8", errors="surrogatepass")
    if isinstance(given, bytes):
        expected = expect_bytes(given.rstrip(b"\r\n"), params)
    elif isinstance(given, neardup.Article):
        fields = {name: getattr(given, name) for name in OPTIONAL_STRING_FIELDS}
        expected = expect_fields({"id": given.article_id, "text": given.text, **fields}, params)
    elif isinstance(given, Mapping):
        expected = expect_fields(dict(given), params)
    else:
        expected = Expect("dead", "schema_violation")
    if expected.kind == "deletion":  # check() refuses a deletion: delete() is for that
        return Expect("dead", "schema_violation")
    return expected


# -- the model ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """An id's current version: its canonical text and its verdict."""

    canonical: str
    verdict: dict[str, Any]


@dataclass
class Model:
    """The ids the index should hold, and their verdicts. `exact` False (with retention, where
    articles expire unseen): the ids held are among those checked and not deleted, no more."""

    exact: bool = True
    held: dict[str, Held] = field(default_factory=dict)
    deleted: int = 0
    # a deleted id's last version: added again, it continues from there
    last_versions: dict[str, int] = field(default_factory=dict)
    seen: Counter[str] = field(default_factory=Counter)  # verdict kinds and events, to show they occur

    def decided(self, expected: Expect, verdict: dict[str, Any]) -> None:
        """Check a verdict against the ids held before it, and hold its id."""
        assert not schema_errors("verdict", verdict), (schema_errors("verdict", verdict), verdict)
        article_id = expected.article_id
        assert verdict["article_id"] == article_id
        assert verdict["latency_ms"] is None
        self.seen[verdict["verdict"]] += 1
        if not self.exact:  # held until deleted or expired; its verdict is not foreseen
            self.held[article_id] = Held(expected.canonical, verdict)
            return
        before = self.held.get(article_id)
        if before is not None and before.canonical == expected.canonical:
            assert verdict == before.verdict, "a re-sent article gets its stored verdict"
            self.seen["redelivered"] += 1
            return
        self.seen["new version" if before else "new id"] += 1
        self.seen["exact"] += verdict["exact"]
        last = before.verdict["version"] if before is not None else self.last_versions.pop(article_id, -1)
        assert verdict["version"] == last + 1
        others = set(self.held) - {article_id}
        same = {other for other in others if self.held[other].canonical == expected.canonical}
        if same:
            assert verdict["exact"] and verdict["match_id"] in same, (verdict, same)
        else:
            assert not verdict["exact"], verdict
        if verdict["verdict"] == "unique":
            assert verdict["canonical_id"] == article_id
        else:
            assert verdict["match_id"] in others
            assert verdict["canonical_id"] in others | {article_id}
        assert {c["article_id"] for c in verdict["candidates"]} <= others
        self.held[article_id] = Held(expected.canonical, verdict)

    def delete(self, article_id: str) -> bool:
        """Whether the index holds `article_id` (and so deletes it)."""
        gone = self.held.pop(article_id, None)
        held = gone is not None
        if gone is not None:
            self.last_versions[article_id] = gone.verdict["version"]
        self.deleted += held
        self.seen["deleted" if held else "unknown delete"] += 1
        return held

    def showed_everything(self) -> None:
        """The fuzzer made every kind of verdict and event, so that the run tested them."""
        events = ("unique", "duplicate", "partial", "redelivered", "new version", "exact", "deleted")
        missing = [event for event in (*events, "unknown delete") if not self.seen[event]]
        assert not missing, f"no {missing} in {dict(self.seen)}"


# -- the state's invariants ---------------------------------------------------------------------


def check_state(state: IndexState, stats: dict[str, Any], model: Model, cutoff: int | None = None) -> None:
    """The counts kept (`stats`, as `neardup stats` reports them) against a scan of every key, the
    structures against each other, and the ids against the model's. `cutoff`: the retention
    cutoff, before which articles wait for the next expiry pass."""
    kv = state.kv
    records = {SEQ.unpack(key)[0]: decode_record(value) for key, value in kv.scan_records()}
    by_id = {SEQ.unpack(seq)[0]: key[1:].decode() for key, seq in kv.scan(ARTICLE)}
    assert sorted(by_id.values()) == sorted({a.article_id for a in records.values()})
    assert all(records[seq].article_id == article_id for seq, article_id in by_id.items())
    assert stats["articles"] == len(records) == len(by_id)
    assert {key for key, _ in kv.scan(TIME)} == {time_key(a.time_ms, a.seq) for a in records.values()}
    clusters = {a.cluster for a in records.values()}
    assert stats["clusters"] == len(clusters)
    members = {key[1:] for key, _ in kv.scan(MEMBER)}
    assert members == {SEQ.pack(a.cluster) + SEQ.pack(a.seq) for a in records.values() if a.cluster != a.seq}
    heads = {SEQ.unpack(key[1:])[0]: value for key, value in kv.scan(HEAD)}
    for cluster in clusters:
        if cluster in records:
            assert cluster not in heads
        else:  # its first article gone: the earliest member still held stands for it
            first = min(a.seq for a in records.values() if a.cluster == cluster)
            assert heads.pop(cluster) == SEQ.pack(first) + records[first].article_id.encode()
    assert not heads, "heads of clusters no article is in"
    holders = {key[1:]: SEQ.unpack(seq)[0] for key, seq in kv.scan(CONTENT)}
    copies = {(key[1:-8], SEQ.unpack(key[-8:])[0]) for key, _ in kv.scan(COPY)}
    for article in records.values():
        content = article.sketch.content_hash
        assert (holders.get(content) == article.seq) != ((content, article.seq) in copies)
    assert len(holders) + len(copies) == len(records)
    sizes = [0] * (state.bucket_cap + 1)
    for key, stored in kv.scan(BAND):
        seqs = [SEQ.unpack_from(stored, at)[0] for at in range(0, len(stored), SEQ.size)]
        assert seqs and len(set(seqs)) == len(seqs) <= state.bucket_cap
        for seq in seqs:  # a member holds its content, and has the bucket among its keys
            article = records[seq]
            assert key[1:] in article.keys
            if holders[article.sketch.content_hash] != seq:
                # A holder past the retention cutoff hands its content on to a newer article with
                # it, and leaves its buckets at the next expiry pass.
                assert cutoff is not None and article.time_ms < cutoff, (seq, article.time_ms, cutoff)
        sizes[len(seqs)] += 1
    assert stats["buckets"] == sum(sizes)
    assert stats["largest_bucket"] == max((n for n, count in enumerate(sizes) if count), default=0)
    kept = state.counts.bucket_sizes or []
    assert kept + [0] * (len(sizes) - len(kept)) == sizes
    assert stats["oldest_ms"] == min((a.time_ms for a in records.values()), default=None)
    assert all(a.time_ms <= stats["newest_ms"] for a in records.values())
    # inexact, an id the model holds may have expired unseen: its deletion found nothing
    assert stats["deleted"] == model.deleted if model.exact else stats["deleted"] <= model.deleted
    assert set(by_id.values()) <= set(model.held)
    if model.exact:
        assert sorted(by_id.values()) == sorted(model.held)
        assert {a.article_id: a.version for a in records.values()} == {
            article_id: held.verdict["version"] for article_id, held in model.held.items()
        }
        assert stats["expired"] == 0


def stats_command(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`neardup stats --state DIR --json`."""
    capsys.readouterr()
    assert cli.main(["stats", "--state", str(state_dir), "--json"]) == 0
    return dict(orjson.loads(capsys.readouterr().out))


# -- embedded mode ------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of an output file (none when the run wrote no such file)."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


@dataclass
class Lines:
    """A JSON-lines input file and what its lines should come to."""

    path: Path
    raw: list[bytes]  # each line as written, its line end included (the last one may lack it)

    @classmethod
    def write(cls, path: Path, fuzzer: Fuzzer, count: int) -> Lines:
        """`count` lines from `fuzzer`, written to `path`."""
        raw = [fuzzer.line() + b"\n" for _ in range(count)]
        if fuzzer.rng.random() < 0.5:
            raw[-1] = raw[-1][:-1]
        path.write_bytes(b"".join(raw))
        return cls(path, raw)

    def account(
        self, verdicts: list[dict[str, Any]], dead: list[dict[str, Any]], model: Model
    ) -> tuple[int, int, bytes]:
        """Every line's one outcome, in input order: its verdict, its deletion line (whatever the
        index held), its dead letter (naming the line, with its bytes), or nothing (a blank line).
        Returns the deletions of ids not held, those that may not have been (an id the model holds
        that may have expired unseen: 0 when the model is exact), and what the --unique-out feed
        should hold (a deletion line when the feed carried the article, or may have)."""
        letters = {letter["offset"]: letter for letter in dead}
        assert len(letters) == len(dead), "one dead letter per line"
        out = iter(verdicts)
        pending = next(out, None)
        unknown, unsure, feed = 0, 0, b""
        for number, raw in enumerate(self.raw, 1):
            body = raw.rstrip(b"\r\n")  # a CR before the newline is part of the line end
            if not body.strip():
                assert number not in letters
                continue
            expected = expect_bytes(body)
            letter = letters.pop(number, None)
            if expected.kind == "dead":
                assert letter is not None, f"line {number} ({body[:80]!r}) should be a dead letter"
                assert not schema_errors("dead-letter", letter), schema_errors("dead-letter", letter)
                assert letter["topic"] == str(self.path)
                assert letter["reason"] == expected.reason, (number, body[:80], letter["detail"][:200])
                assert base64.b64decode(letter["value_b64"]) == body
                continue
            assert letter is None, (number, body[:80], letter["reason"], letter["detail"][:200])
            if expected.kind == "deletion":
                line = {"article_id": expected.article_id, "deleted": True}
                assert pending == line, (number, pending, line)  # a removal, whatever was held
                pending = next(out, None)
                gone = model.held.get(expected.article_id)
                if not model.delete(expected.article_id):
                    unknown += 1
                elif not model.exact:
                    unsure += 1
                if gone is None or gone.verdict["verdict"] in ("unique", "revised"):
                    feed += raw if raw.endswith(b"\n") else raw + b"\n"
                continue
            assert pending is not None, f"line {number} has no verdict"
            model.decided(expected, pending)
            if pending["verdict"] in ("unique", "revised"):  # the feed's default filter
                feed += raw if raw.endswith(b"\n") else raw + b"\n"
            pending = next(out, None)
        assert pending is None, f"an outcome no line accounts for: {pending}"
        assert not letters, f"dead letters no line accounts for: {sorted(letters)}"
        return unknown, unsure, feed


@pytest.mark.parametrize("seed", SEEDED)
@pytest.mark.parametrize("store", ["memory", "rocks", "rocks-held", "helpers"])
def test_embedded_mode_gives_every_line_one_outcome(
    seed: int, store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store` "helpers": in memory, signed by a helper process in small batches."""
    lines = Lines.write(tmp_path / "in.jsonl", Fuzzer(seed), EMBEDDED_LINES)
    output, feed, state_dir = tmp_path / "verdicts.jsonl", tmp_path / "unique.jsonl", tmp_path / "state"
    held = RocksOptions(hold_families=store == "rocks-held")
    state: IndexState = RocksState(state_dir, held) if store.startswith("rocks") else MemoryState()
    monkeypatch.setattr(embedded, "SIGN_BATCH", 50)  # with helpers, in small batches
    helpers = {"sign_processes": 1} if store == "helpers" else {}
    try:
        summary = run_file(
            lines.path, output, state, PARAMS, max_text_bytes=MAX_TEXT, feed_path=feed, **helpers
        )
        model = Model()
        dead = read_jsonl(output.with_name(output.name + ".dead.jsonl"))
        unknown, _, fed = lines.account(read_jsonl(output), dead, model)
        assert feed.read_bytes() == fed
        assert summary.unknown_deletes == unknown
        assert summary.articles == sum(1 for raw in lines.raw if raw.strip())
        assert sum(summary.dead_letters.values()) == len(dead)
        assert "internal_error" not in summary.dead_letters
        model.showed_everything()
        stats = state.stats().as_dict()
    finally:
        state.close()
    if store.startswith("rocks"):
        assert without_size(stats_command(state_dir, capsys)) == without_size(stats)
        state = RocksState(state_dir, read_only=True)
    try:
        check_state(state, stats, model)
    finally:
        state.close()


@pytest.mark.parametrize("containment", [True, False], ids=["containment-on", "containment-off"])
def test_the_fuzz_corpus_decided_in_batches_as_one_line_at_a_time(containment: bool, tmp_path: Path) -> None:
    """Embedded mode's batches (DECIDE_BATCH lines a call of the shard) against one line a call, the
    reference: the same verdicts, dead letters and feed, with retention expiring as it goes."""
    lines = Lines.write(tmp_path / "in.jsonl", Fuzzer(SEEDS[0], timed=True), EMBEDDED_LINES)
    params = dataclasses.replace(PARAMS, containment_index=containment)
    outputs = []
    for batch in (1, 32):
        out, feed = tmp_path / f"verdicts-{batch}.jsonl", tmp_path / f"unique-{batch}.jsonl"
        retention = Retention(parse_duration_ms("7d"))
        run_file(
            lines.path,
            out,
            MemoryState(),
            params,
            max_text_bytes=MAX_TEXT,
            retention=retention,
            feed_path=feed,
            decide_batch=batch,
        )
        letters = read_jsonl(out.with_name(out.name + ".dead.jsonl"))
        dead = [{**letter, "failed_at": None} for letter in letters]
        outputs.append((out.read_bytes(), feed.read_bytes(), dead))
    assert outputs[0] == outputs[1]
    assert outputs[0][0].count(b'"verdict"') > 100


@pytest.mark.parametrize("containment", [True, False], ids=["containment-on", "containment-off"])
def test_the_fuzz_corpus_is_decided_as_the_reference_decides_it(
    containment: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled run against the per-article reference (tests/support/reference_decide.py) on
    the lines the signer lets through (odd encodings, ids and texts near the limits, deletions,
    times far apart under a retention window): every verdict and the whole state alike."""
    lines = Lines.write(tmp_path / "in.jsonl", Fuzzer(SEEDS[0], timed=True), EMBEDDED_LINES)
    params = dataclasses.replace(PARAMS, containment_index=containment)
    items = signed_lines(lines.raw, params, MAX_TEXT)
    retention = Retention(parse_duration_ms("7d"))
    expected, taken = decided_both_ways(items, params, 32, monkeypatch, retention)
    assert {"unique", "duplicate"} <= {r.kind for r in expected[0] if r.verdict}
    assert taken > len(items) * 0.8, (taken, len(items))


@pytest.mark.parametrize("containment", [True, False], ids=["containment-on", "containment-off"])
@pytest.mark.parametrize("source", ["fuzz", "sample-news"])
def test_held_families_decide_as_keys_do(
    containment: bool, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state's buckets and posting lists held in memory (state/held.py) against the same state
    with them as RocksDB keys, the plain layout: the same verdicts, dead letters and feed, with
    small buckets (a cap of 3: members pushed out) and retention expiring as it goes (members
    leaving), and after a reopening the same stats and the same buckets and posting lists; also
    when the held entries outgrow their bound midway and go back to being keys, a step a write."""
    if source == "fuzz":
        path = Lines.write(tmp_path / "in.jsonl", Fuzzer(SEEDS[0], timed=True), EMBEDDED_LINES).path
    else:
        path = Path(embedded.__file__).parent / "data" / "sample_news.jsonl"
    params = dataclasses.replace(PARAMS, containment_index=containment)
    outputs = []
    for layout in ("keyed", "held", "spilled"):
        # spilled: past a few hundred entries, back to keys midway
        monkeypatch.setattr(held, "HELD_ENTRIES", 300 if layout == "spilled" else 10**9)
        monkeypatch.setattr(held, "DRAIN_STEP", 50)  # drained over many writes, read between them
        out, feed = tmp_path / f"verdicts-{layout}.jsonl", tmp_path / f"unique-{layout}.jsonl"
        state = RocksState(tmp_path / layout, RocksOptions(bucket_cap=3, hold_families=layout != "keyed"))
        retention = Retention(parse_duration_ms("7d"))
        try:
            run_file(path, out, state, params, max_text_bytes=MAX_TEXT, retention=retention, feed_path=feed)
            marks = state.rocks.get_many([held.HOLD_KEY, held.DRAIN_KEY])
            # held: marked so, not draining; spilled: drained, or draining still; keyed: neither
            assert [mark is not None for mark in marks] in {
                "keyed": [[False, False]],
                "held": [[True, False]],
                "spilled": [[False, False], [True, True]],
            }[layout]
        finally:
            state.close()
        reopened = RocksState(tmp_path / layout, read_only=True)
        # the sample's articles have no time: timed by the clock, which moves between the runs
        timeless = {name: value for name, value in reopened.stats().as_dict().items() if "_ms" not in name}
        families = {key: value for key, value in contents(reopened).items() if key[:1] in (BAND, POSTING)}
        reopened.close()
        letters = read_jsonl(out.with_name(out.name + ".dead.jsonl"))
        dead = [{**letter, "failed_at": None} for letter in letters]
        outputs.append((out.read_bytes(), feed.read_bytes(), dead, without_size(timeless), families))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0][0].count(b'"verdict":"duplicate"') > 10
    lists = [value for key, value in outputs[0][4].items() if key[:1] == POSTING]
    assert any(len(value) >= 15 for value in lists) if containment else not lists


def without_size(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats but the size on disk, which changes as RocksDB compacts."""
    return {name: value for name, value in stats.items() if name != "bytes_on_disk"}


def test_embedded_mode_with_retention_keeps_its_counts(tmp_path: Path) -> None:
    """Articles expire as their times move on: which ids are held is not modelled, only that
    every line has its outcome and that the counts match a scan."""
    lines = Lines.write(tmp_path / "in.jsonl", Fuzzer(SEEDS[0], timed=True), EMBEDDED_LINES)
    output = tmp_path / "verdicts.jsonl"
    state = MemoryState()
    retention = Retention(parse_duration_ms("7d"))
    summary = run_file(lines.path, output, state, PARAMS, max_text_bytes=MAX_TEXT, retention=retention)
    model = Model(exact=False)
    dead = read_jsonl(output.with_name(output.name + ".dead.jsonl"))
    unknown, unsure, _ = lines.account(read_jsonl(output), dead, model)
    assert unknown <= summary.unknown_deletes <= unknown + unsure
    assert "internal_error" not in summary.dead_letters
    stats = state.stats().as_dict()
    # every deletion either found its id or did not
    assert summary.unknown_deletes + stats["deleted"] == unknown + unsure
    assert stats["expired"] == summary.expired > 0
    check_state(state, stats, model, retention.cutoff(stats["newest_ms"]))


# -- the library --------------------------------------------------------------------------------


def expect_delete(article_id: Any) -> Expect:
    return expect_fields({"id": article_id, "deleted": True})


def library_calls(fuzzer: Fuzzer, count: int) -> Iterator[tuple[str, Any]]:
    """("check", input), ("check_many", inputs) and ("delete", id) calls."""
    rng = fuzzer.rng
    for _ in range(count):
        roll = rng.random()
        if roll < 0.08:
            yield (
                "delete",
                rng.choice(fuzzer.sent)[0] if fuzzer.sent and rng.random() < 0.7 else fuzzer.odd_id(),
            )
        elif roll < 0.12:
            yield "check_many", [fuzzer.library_input() for _ in range(rng.randrange(1, 6))]
        else:
            yield "check", fuzzer.library_input()


def refused(exc: BaseException, expected: Expect) -> None:
    assert isinstance(exc, neardup.InvalidMessage), f"{type(exc).__name__}: {exc}"
    assert exc.reason in DEAD_LETTER_REASONS
    assert expected.kind == "dead" and exc.reason == expected.reason, (exc, expected)


LIBRARY_SETTINGS: dict[str, dict[str, Any]] = {
    "memory": {"bucket_cap": 4},  # buckets of 4: members are pushed out, and leave again
    "directory": {},
    # word shingles and whitespace kept: a text may be more than whitespace and have no word
    "words": {"shingle_size": 3, "word_shingles": True, "normalize_whitespace": False},
}


def call_library(dedup: neardup.Deduplicator, model: Model, call: str, given: Any) -> None:
    """One call, its outcome checked against the oracle and the model."""
    if call == "delete":
        expected = expect_delete(given)
        try:
            removed = dedup.delete(given)
        except Exception as exc:
            refused(exc, expected)
            return
        assert expected.kind == "deletion"
        assert removed == model.delete(given)
    elif call == "check":
        expected = expect_input(given, dedup.params)
        try:
            verdict = dedup.check(given)
        except Exception as exc:
            refused(exc, expected)
            return
        assert expected.kind == "article", (repr(given)[:200], expected, verdict)
        model.decided(expected, verdict)
    else:
        verdicts = dedup.check_many(given)
        for item in given:  # lazily: each verdict is made when asked for, up to the first bad
            expected = expect_input(item, dedup.params)
            try:
                verdict = next(verdicts)
            except Exception as exc:
                refused(exc, expected)
                return
            model.decided(expected, verdict)


@pytest.mark.parametrize("seed", SEEDED)
@pytest.mark.parametrize("where", sorted(LIBRARY_SETTINGS))
def test_the_library_raises_only_invalid_message(
    seed: int, where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "directory": closed and reopened halfway, then read by `neardup stats`."""
    fuzzer, model = Fuzzer(seed), Model()
    state_dir = tmp_path / "state" if where == "directory" else None
    calls = list(library_calls(fuzzer, LIBRARY_CALLS))
    settings = LIBRARY_SETTINGS[where]
    dedup = neardup.open(state_dir, max_text_bytes=MAX_TEXT, **settings)
    try:
        for call, given in calls[: len(calls) // 2]:
            call_library(dedup, model, call, given)
        if state_dir is not None:
            dedup.close()
            dedup = neardup.open(state_dir, max_text_bytes=MAX_TEXT, **settings)
        for call, given in calls[len(calls) // 2 :]:
            call_library(dedup, model, call, given)
        stats = dedup.stats()
        model.showed_everything()
        if state_dir is None:
            check_state(dedup._shard.state, stats, model)
    finally:
        dedup.close()
    if state_dir is not None:
        assert without_size(stats_command(state_dir, capsys)) == without_size(stats)
        state = RocksState(state_dir, read_only=True)
        try:
            check_state(state, stats, model)
        finally:
            state.close()


# -- what the fuzzer found ----------------------------------------------------------------------


@pytest.mark.parametrize("text", ["   ", "\t\u3000", "\x1c"])
def test_a_text_without_a_word_is_refused_under_word_shingles(text: str) -> None:
    """With the whitespace kept it is not empty, but its set of word shingles is: every such text
    was a "duplicate" of the first, with a Jaccard of 1 and a containment of 0."""
    settings = LIBRARY_SETTINGS["words"]
    with neardup.open(**settings) as dedup:
        dedup.check({"id": "words", "text": "a text of words"})
        with pytest.raises(neardup.InvalidMessage) as caught:
            dedup.check({"id": "blank", "text": text})
        assert caught.value.reason == "empty_text"
        assert dedup.stats()["articles"] == 1
