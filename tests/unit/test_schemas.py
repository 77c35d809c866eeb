"""schemas/*.schema.json: the examples, the service's own messages, and the hand-written article check."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator

from neardup.core.params import DedupParams
from neardup.messages import (
    DEAD_LETTER_HEADROOM,
    DEAD_LETTER_MAX_BYTES,
    DEAD_LETTER_REASONS,
    InvalidMessage,
    decode_article,
    verdict_dict,
)
from neardup.pipeline import sign as stages
from neardup.pipeline.shard import IndexShard
from neardup.pipeline.sign import PROCESSING_FAILED, SignStage
from neardup.pipeline.wire import Provenance
from neardup.state.memory import MemoryState
from tests.support.prose import PROSE
from tests.support.shard import process

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
EXAMPLES = SCHEMAS / "examples"
KINDS = ("article", "verdict", "dead-letter")


def _validator(kind: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


VALIDATORS = {kind: _validator(kind) for kind in KINDS}


def _kind_of(path: Path) -> str:
    for kind in KINDS:
        if path.name.startswith(kind + "-"):
            return kind
    raise AssertionError(f"{path.name}: example names start with one of {KINDS}")


def _errors(kind: str, instance: Any) -> list[str]:
    return [error.message for error in VALIDATORS[kind].iter_errors(instance)]


VALID = sorted(EXAMPLES.glob("*.json"))
INVALID = sorted((EXAMPLES / "invalid").glob("*.json"))


def test_there_are_examples_of_every_kind() -> None:
    for kind in KINDS:
        assert any(_kind_of(p) == kind for p in VALID), f"no valid {kind} example"
        assert any(_kind_of(p) == kind for p in INVALID), f"no invalid {kind} example"
    names = {p.name for p in VALID}
    for required in ("verdict-unique.json", "verdict-duplicate.json", "verdict-partial.json"):
        assert required in names


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example(path: Path) -> None:
    assert _errors(_kind_of(path), json.loads(path.read_text())) == []


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example(path: Path) -> None:
    assert _errors(_kind_of(path), json.loads(path.read_text())), f"{path.name} should be rejected"


def test_the_verdict_kind_maybe_is_rejected_for_its_kind() -> None:
    verdict = json.loads((EXAMPLES / "invalid" / "verdict-kind-maybe.json").read_text())
    errors = list(VALIDATORS["verdict"].iter_errors(verdict))
    assert any(list(e.absolute_path) == ["verdict"] for e in errors)
    verdict["verdict"] = "duplicate"
    assert _errors("verdict", verdict) == []


def test_dead_letter_schema_lists_exactly_the_reasons() -> None:
    schema = json.loads((SCHEMAS / "dead-letter.schema.json").read_text())
    assert tuple(schema["properties"]["reason"]["enum"]) == DEAD_LETTER_REASONS


def test_example_dead_letters_carry_decodable_bytes() -> None:
    for path in EXAMPLES.glob("dead-letter-*.json"):
        record = json.loads(path.read_text())
        for field in ("key_b64", "value_b64"):
            if record[field] is not None:
                base64.b64decode(record[field], validate=True)


# --- verdicts produced by the engine -------------------------------------------------------------


def _verdicts(params: DedupParams) -> dict[str, dict[str, Any]]:
    engine = IndexShard(MemoryState(), params)
    text = PROSE[1]
    out = {
        "unique": process(engine, "first", text),
        "duplicate": process(engine, "bylined", "By Staff Writer\n\n" + text + "\n\nCopyright 2024."),
        "exact": process(engine, "copy", text),
        "partial": process(engine, "head", text[: len(text) * 6 // 10]),
        "other": process(engine, "other", PROSE[2]),
        "new-version": process(engine, "first", PROSE[3]),
    }
    return {name: verdict_dict(article, params, 3.5) for name, article in out.items()}


@pytest.mark.parametrize("containment_index", [False, True])
def test_engine_verdicts_validate_and_have_the_expected_kinds(containment_index: bool) -> None:
    verdicts = _verdicts(DedupParams(containment_index=containment_index))
    expected = {
        "unique": "unique",
        "duplicate": "duplicate",
        "exact": "duplicate",
        "partial": "partial",
        "other": "unique",
        "new-version": "unique",
    }
    assert {name: v["verdict"] for name, v in verdicts.items()} == expected
    assert verdicts["exact"]["exact"] is True
    assert verdicts["new-version"]["version"] == 1
    assert verdicts["duplicate"]["candidates"], "a duplicate lists its candidates"
    for name, verdict in verdicts.items():
        assert _errors("verdict", verdict) == [], name
        # what goes on the wire, not just the dict
        assert _errors("verdict", orjson.loads(orjson.dumps(verdict))) == [], name


def test_engine_verdicts_validate_without_containment_or_latency() -> None:
    params = DedupParams(containment_threshold=None, top_candidates=1, containment_index=True)
    verdicts = {name: {**v, "latency_ms": None} for name, v in _verdicts(params).items()}
    # without partial verdicts the excerpt reuses enough of its source to be revised
    assert verdicts["partial"]["verdict"] == "revised" and verdicts["partial"]["passages"]["spans"]
    assert verdicts["duplicate"]["params"]["containment_threshold"] is None
    for name, verdict in verdicts.items():
        assert _errors("verdict", verdict) == [], name


def test_verdict_conditionals_bite_on_real_verdicts() -> None:
    verdicts = _verdicts(DedupParams())
    assert _errors("verdict", {**verdicts["unique"], "match_id": "bylined"})
    assert _errors("verdict", {**verdicts["unique"], "jaccard": 0.5})
    assert _errors("verdict", {**verdicts["duplicate"], "match_id": None})
    assert _errors("verdict", {**verdicts["duplicate"], "jaccard": None})
    assert _errors("verdict", {**verdicts["partial"], "jaccard": 1.5})
    assert _errors("verdict", {**verdicts["partial"], "exact": True})
    assert _errors("verdict", {k: v for k, v in verdicts["unique"].items() if k != "latency_ms"})
    assert _errors("verdict", {**verdicts["unique"], "latency_ms": -1})


# --- dead letters produced by the sign stage -----------------------------------------------------

SRC = Provenance("neardup-articles", 1, 77, 1_717_000_000_000)
BAD_INPUTS: dict[str, bytes | None] = {
    "invalid_utf8": b'{"id": "a", "text": "caf\xe9"}',
    "invalid_json": b'{"id": "a", "text": ',
    "schema_violation": b'{"id": "a", "text": ["not", "a", "string"]}',
    "oversized": orjson.dumps({"id": "a", "text": "x" * 300}),
    "empty_text": b'{"id": "a", "text": " \\n\\t "}',
    "key_mismatch": b'{"id": "b", "text": "keyed as another article"}',
}


# what the worker's stage refuses without a key (the others are sent keyed "a")
UNKEYED = b'{"id": "a", "text": "sent without a key"}'


@pytest.mark.parametrize("reason", sorted([*BAD_INPUTS, "unkeyed"]))
def test_sign_stage_dead_letters_validate(reason: str) -> None:
    stage = SignStage(DedupParams(), max_text_bytes=100, keyed=True)
    result = (
        stage.handle(UNKEYED, None, SRC)
        if reason == "unkeyed"
        else stage.handle(BAD_INPUTS[reason], b"a", SRC)
    )
    assert result.reason == reason and result.dead_letter is not None
    record = orjson.loads(result.dead_letter)
    assert record["reason"] == reason
    assert _errors("dead-letter", record) == []


def test_a_dead_letter_cut_to_fit_the_topic_validates() -> None:
    raw = b'{"id": "big", "text": "' + b"x" * (7 * 1024 * 1024) + b'"}'
    result = SignStage(DedupParams(), 1_000_000).handle(raw, b"big", Provenance("in", 0, 5, None))
    assert result.reason == "oversized" and result.dead_letter is not None
    assert len(result.dead_letter) + len(b"big") <= DEAD_LETTER_MAX_BYTES - DEAD_LETTER_HEADROOM
    record = orjson.loads(result.dead_letter)
    assert record["value_truncated"] is True and record["value_size"] == len(raw)
    assert _errors("dead-letter", record) == []
    del record["value_sha256"]
    assert _errors("dead-letter", record)  # a cut value without its hash cannot be checked


def test_tombstone_and_keyless_dead_letters_validate() -> None:
    stage = SignStage(DedupParams(), max_text_bytes=100)
    for raw, key in ((None, None), (b"[]", None)):
        result = stage.handle(raw, key, SRC)
        assert result.dead_letter is not None
        assert _errors("dead-letter", orjson.loads(result.dead_letter)) == []


def test_internal_error_dead_letter_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str, params: DedupParams, max_points: int | None = None) -> None:
        raise RuntimeError("signer exploded")

    monkeypatch.setattr(stages, "sketch_of", broken)
    result = SignStage(DedupParams(), 1000).handle(b'{"id": "a", "text": "fine"}', None, SRC)
    assert result.reason == "internal_error" and result.dead_letter is not None
    record = orjson.loads(result.dead_letter)
    assert "RuntimeError: signer exploded" in record["detail"]
    assert _errors("dead-letter", record) == []


def test_processing_failed_dead_letter_validates() -> None:
    """What the signer sends for a message that broke a helper alone (test_signer.py isolates one)."""
    result = SignStage.dead(PROCESSING_FAILED, "the helper died", b'{"id": "a", "text": "t"}', b"a", SRC)
    assert result.reason == PROCESSING_FAILED and result.dead_letter is not None
    assert _errors("dead-letter", orjson.loads(result.dead_letter)) == []


def test_every_reason_is_exercised() -> None:
    assert {*BAD_INPUTS, "unkeyed", "internal_error", PROCESSING_FAILED} == set(DEAD_LETTER_REASONS)


# --- the hand-written article check agrees with the schema ---------------------------------------

ARTICLE_CASES: list[Any] = [
    {"id": "a", "text": "t"},
    {"id": "a", "text": ""},  # schema-valid; empty text is the sign stage's concern, not the schema's
    {"id": "a" * 512, "text": "t"},
    {"id": "a" * 513, "text": "t"},
    {"id": "é" * 512, "text": "t"},  # characters, not bytes
    {"id": "", "text": "t"},
    {"id": 1, "text": "t"},
    {"id": None, "text": "t"},
    {"id": ["a"], "text": "t"},
    {"text": "t"},
    {"id": "a"},
    {"id": "a", "text": None},
    {"id": "a", "text": 3},
    {"id": "a", "text": {"body": "t"}},
    {
        "id": "a",
        "text": "t",
        "title": None,
        "url": None,
        "source": None,
        "published_at": None,
        "language": None,
    },
    {"id": "a", "text": "t", "title": "T", "url": "u", "source": "s", "published_at": "2024-05-30T14:05:00Z"},
    {"id": "a", "text": "t", "published_at": "last tuesday"},  # format is documentation only
    {"id": "a", "text": "t", "title": 5},
    {"id": "a", "text": "t", "url": ["u"]},
    {"id": "a", "text": "t", "source": True},
    {"id": "a", "text": "t", "published_at": 1717077912},
    {"id": "a", "text": "t", "language": {"tag": "en"}},
    {"id": "a", "text": "t", "extra": [1, 2, 3], "nested": {"deep": None}},
    {"id": "a", "text": "t", "Title": 5},  # names are case-sensitive: an unknown field, ignored
    [],
    [{"id": "a", "text": "t"}],
    "just a string",
    17,
    None,
    True,
    {},
]


@pytest.mark.parametrize("case", ARTICLE_CASES, ids=lambda c: orjson.dumps(c).decode()[:60])
def test_decode_article_agrees_with_the_schema(case: Any) -> None:
    schema_ok = not _errors("article", case)
    try:
        article = decode_article(orjson.dumps(case), max_text_bytes=1_000_000)
    except InvalidMessage as exc:
        assert exc.reason == "schema_violation", exc
        decoded_ok = False
    else:
        decoded_ok = True
        assert (article.article_id, article.text) == (case["id"], case["text"])
    assert decoded_ok == schema_ok


def test_the_size_limit_is_the_only_difference() -> None:
    case = {"id": "a", "text": "x" * 101}
    assert _errors("article", case) == []
    with pytest.raises(InvalidMessage) as info:
        decode_article(orjson.dumps(case), max_text_bytes=100)
    assert info.value.reason == "oversized"
