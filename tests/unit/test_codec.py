"""The compiled writers of a record and a verdict (service/core/_decide.c) against their Python
references (tests/support/reference_records.py), byte for byte: every article a stream of copies,
excerpts, versions and deletions leaves decided (containment on and off, no verifier), the sample
news, and articles made to reach each branch (ids to escape, long ids, negative times, the match
apart from the candidates, floats at the edges of orjson's forms)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import orjson
import pytest

from neardup.core.anchors import Passage
from neardup.core.compiled import _sketch
from neardup.core.dedup import Candidate, Decision, IndexedArticle
from neardup.core.lsh import band_keys
from neardup.core.params import DedupParams
from neardup.core.signing import sketch_of
from neardup.pipeline.shard import IndexShard
from neardup.state.memory import MemoryState
from tests.support import reference_records as reference
from tests.support.arrivals import sample_news, signed_items, stream

PARAMS = DedupParams()
LATENCIES = (None, 0.0, 3.5, 1234.567, 1e-05, 1.234e-05, 1e-06, 1e16, 123456789012345.0)
# floats on each side of where orjson and repr change form, and the ones it writes as null
EDGES = (0.0, -0.0, 1.0, 0.1, 1e-05, 9.99e-06, 1.5e-05, 1e-07, 0.0001, 1e15, 1e16, 2.5e-10, 1e100, 5e-324)
UNWRITTEN = (math.nan, math.inf, -math.inf)


def decided(params: DedupParams, arrivals: list[tuple[str, str | None]]) -> list[IndexedArticle]:
    """Every article version the arrivals leave held, decided one batch at a time."""
    shard = IndexShard(MemoryState(), params)
    for at in range(0, len(arrivals), 32):
        shard.decide(signed_items(arrivals[at : at + 32], params))
    return list(shard.state.articles())


def same_bytes(article: IndexedArticle, params: DedupParams) -> None:
    assert _sketch.encode_record(article) == reference.encode_record(article), article.article_id
    audit = orjson.dumps(params.audit())
    for latency in LATENCIES:
        expected = reference.verdict_json(article, params, latency)
        assert _sketch.verdict_json(article, audit, latency) == expected, (article.article_id, latency)


@pytest.mark.parametrize(
    "params",
    [DedupParams(), DedupParams(containment_index=False), DedupParams(verify_perm=0)],
    ids=["defaults", "containment-off", "no-verifier"],
)
def test_every_article_of_a_stream_is_written_as_the_reference_writes_it(params: DedupParams) -> None:
    articles = decided(params, list(stream(7, 300)))
    kinds = {article.decision.kind for article in articles}
    assert {"unique", "duplicate"} <= kinds and (not params.containment_index or "partial" in kinds), kinds
    assert any(article.decision.exact for article in articles)
    assert any(article.version for article in articles) and any(a.cluster != a.seq for a in articles)
    for article in articles:
        same_bytes(article, params)


def test_the_sample_news_is_written_as_the_reference_writes_it() -> None:
    articles = decided(PARAMS, sample_news())
    assert any(article.decision.passages for article in articles)
    for article in articles:
        same_bytes(article, PARAMS)


def made(decision: Decision, /, **changes: object) -> IndexedArticle:
    sketch = sketch_of("A text long enough to have anchors of its own, " * 20, PARAMS)
    keys = tuple(band_keys(sketch.signature, PARAMS.lsh.bands, PARAMS.lsh.rows))
    article = IndexedArticle("id", 2, 40, sketch, decision, keys, 1_700_000_000_000, 12, "first")
    return dataclasses.replace(article, **changes)


@pytest.mark.parametrize(
    "decision",
    [
        Decision("unique", None, None, None, None, "id", False, ()),
        # the canonical id: the article's own, its cluster's, another's
        Decision("duplicate", "a", 1.0, 1.0, 1.0, "first", True, (Candidate("a", 1.0, 1.0, 1.0),)),
        Decision("duplicate", "a", 0.9, 0.9, 0.9, "elsewhere", False, (Candidate("a", 0.9, 0.9, 0.9),)),
        # the match apart from the candidates (scores that differ, or none of its id)
        Decision("revised", "b", 0.3, 0.5, 0.6, "id", False, (Candidate("b", 0.3, 0.5, 0.61),)),
        Decision("partial", "c", 0.2, 0.95, 0.1, "x", False, (Candidate("b", 0.2, 0.95, 0.1),)),
        Decision(
            "partial",
            "b",
            0.25,
            0.97,
            0.2,
            "first",
            False,
            (
                *[Candidate(f"c{n}", n / 7, 1 / (n + 1), n * 1e-06) for n in range(5)],
                Candidate("b", 0.25, 0.97, 0.2),
            ),
            (Passage(0, 1200, 40, 1240, 9), Passage(2**40, 2**40 + 1, 0, 2**63 - 1, 1)),
        ),
    ],
    ids=["unique", "exact", "canonical-apart", "match-scores-apart", "match-apart", "passages"],
)
def test_each_branch_of_the_decision_is_written_as_the_reference_writes_it(decision: Decision) -> None:
    same_bytes(made(decision), PARAMS)
    same_bytes(made(decision, cluster=40, cluster_id="id"), PARAMS)  # the article's own cluster


@pytest.mark.parametrize(
    "article_id",
    [
        'quote " and \\ backslash',
        "controls \x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f",
        "ünïcødé ✓ 𝄞 \u2028",
        "x" * 300,
        "",
    ],
)
def test_ids_are_escaped_as_orjson_escapes_them(article_id: str) -> None:
    candidates = (Candidate(article_id, 0.5, 0.5, 0.5), Candidate(article_id + "'", 0.4, 0.4, 0.4))
    decision = Decision("duplicate", article_id, 0.5, 0.5, 0.5, article_id[::-1], False, candidates)
    same_bytes(made(decision, article_id=article_id, cluster_id=article_id + "/c"), PARAMS)


@pytest.mark.parametrize("score", EDGES + UNWRITTEN)
def test_floats_take_the_form_orjson_gives_them(score: float) -> None:
    candidates = (Candidate("a", score, -score, score / 3),)
    decision = Decision("partial", "a", score, -score, score / 3, "id", False, candidates)
    article = made(decision)
    assert _sketch.verdict_json(article, b"{}", score) == orjson.dumps(
        {**orjson.loads(reference.verdict_json(article, PARAMS, None)), "params": {}, "latency_ms": score}
    )
    if not math.isnan(score):  # the reference finds no NaN among the candidates: NaN != NaN
        same_bytes(article, PARAMS)


@pytest.mark.parametrize(
    "changes",
    [
        {"time_ms": -86_400_000},
        {"time_ms": -(2**63)},
        {"time_ms": 2**63 - 1},
        {"seq": 2**40, "cluster": 0, "version": 2**63 - 1},
    ],
    ids=["before-1970", "least-time", "greatest-time", "large-numbers"],
)
def test_numbers_at_their_edges_are_written_as_the_reference_writes_them(changes: dict[str, int]) -> None:
    same_bytes(made(Decision("unique", None, None, None, None, "id", False, ()), **changes), PARAMS)


def test_a_short_text_without_verifier_keeps_its_signature() -> None:
    params = DedupParams(verify_perm=0)
    sketch = sketch_of("tiny", params)
    assert sketch.short and sketch.verifier.size == 0
    article = IndexedArticle("t", 0, 1, sketch, Decision("unique", None, None, None, None, "t", False, ()))
    assert _sketch.encode_record(article) == reference.encode_record(article)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"decision": Decision("other", None, None, None, None, "id", False, ())}, ValueError),  # type: ignore[arg-type]
        ({"decision": Decision("partial", "b", None, None, None, "id", False, ())}, TypeError),
        (
            {
                "decision": Decision(
                    "unique", None, None, None, None, "id", False, (Candidate("c", 0, 0, 0),) * 256
                )
            },
            ValueError,
        ),
        (
            {
                "decision": Decision(
                    "partial", "b", 0.1, 0.1, 0.1, "id", False, (), (Passage(-1, 0, 0, 0, 1),)
                )
            },
            ValueError,
        ),
        ({"seq": -1, "cluster": -1}, ValueError),
        ({"article_id": "\ud800"}, UnicodeEncodeError),
        ({"keys": [b"k"]}, ValueError),
        ({"seq": 2**64}, OverflowError),
    ],
    ids=[
        "kind",
        "match-without-scores",
        "candidates",
        "negative-passage",
        "negative-seq",
        "surrogate",
        "keys",
        "seq",
    ],
)
def test_what_a_record_cannot_hold_is_refused(changes: dict[str, object], error: type[Exception]) -> None:
    article = made(Decision("unique", None, None, None, None, "id", False, ()), **changes)
    with pytest.raises(error):
        _sketch.encode_record(article)


def test_a_verifier_of_wide_slots_and_a_bad_latency_are_refused() -> None:
    article = made(Decision("unique", None, None, None, None, "id", False, ()))
    wide = dataclasses.replace(
        article, sketch=dataclasses.replace(article.sketch, verifier=np.zeros(4, np.uint16))
    )
    with pytest.raises(ValueError, match="one byte a slot"):
        _sketch.encode_record(wide)
    with pytest.raises(TypeError, match="latency_ms"):
        _sketch.verdict_json(article, b"{}", "1.0")
    with pytest.raises(TypeError):
        _sketch.verdict_json(article, "{}", None)
