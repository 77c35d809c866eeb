"""Verdicts with the verifier off (verify_perm=0, a documented setting): candidates are then scored
from their MinHash signatures, and a near-duplicate is found as it is with the verifier on."""

from __future__ import annotations

import numpy as np
import pytest

from neardup.core.compiled import _sketch
from neardup.core.dedup import Candidate, Decision, IndexedArticle, score
from neardup.core.normalize import normalize
from neardup.core.params import DedupParams
from neardup.core.shingle import shingle_strings
from neardup.core.signing import Sketch, sketch_of
from neardup.pipeline.shard import IndexShard
from neardup.state.memory import MemoryState
from neardup.state.records import decode_probe, encode_record
from tests.support.prose import MEMORIAL, ROMO
from tests.support.reference_decide import rank
from tests.support.scoring import score_many
from tests.support.shard import process
from tests.support.state import MakeState

OFF = DedupParams(verify_perm=0)
# ROMO with a few words changed, as an editor touches a wire story
EDITED = (
    ROMO.replace("wedding planner", "event planner")
    .replace("Saturday", "Sunday")
    .replace("pizza and short ribs", "burgers and ribs")
    .replace("last December", "in December")
)


def brute_jaccard(a: str, b: str) -> float:
    """The exact Jaccard of two texts' 5-character shingle sets, as literal strings."""
    sa, sb = (shingle_strings(normalize(text), OFF.shingle.k) for text in (a, b))
    return len(sa & sb) / len(sa | sb)


def test_the_edited_copy_is_a_near_duplicate_by_exact_jaccard() -> None:
    assert OFF.threshold < brute_jaccard(ROMO, EDITED) < 1.0
    assert brute_jaccard(ROMO, MEMORIAL) < 0.1


def test_an_edited_copy_is_a_duplicate_of_its_source(make_state: MakeState) -> None:
    """Through the shard, its candidates read from the store (a RocksDB record keeps the signature
    where there is no verifier)."""
    shard = IndexShard(make_state(), OFF)
    assert process(shard, "source", ROMO).decision.kind == "unique"
    decision = process(shard, "edited", EDITED).decision
    assert (decision.kind, decision.match_id, decision.exact) == ("duplicate", "source", False)
    assert decision.jaccard == pytest.approx(brute_jaccard(ROMO, EDITED), abs=0.1)
    assert process(shard, "other", MEMORIAL).decision.kind == "unique"


def test_the_same_verdicts_as_with_the_verifier_on() -> None:
    verdicts = []
    for params in (OFF, DedupParams()):
        shard = IndexShard(MemoryState(), params)
        texts = (("s", ROMO), ("e", EDITED), ("o", MEMORIAL))
        verdicts.append([(d.kind, d.match_id) for d in (process(shard, i, t).decision for i, t in texts)])
    assert verdicts[0] == verdicts[1] == [("unique", None), ("duplicate", "s"), ("unique", None)]


def test_rank_and_score_many_score_as_score_does() -> None:
    """The compiled path's figures are score's (Sketch.estimate_jaccard: from the signatures)."""
    source, edited, other = (sketch_of(text, OFF) for text in (ROMO, EDITED, MEMORIAL))
    assert source.verifier.size == 0
    expected = [score(edited, sketch, i) for i, sketch in (("s", source), ("o", other))]
    assert expected[0].jaccard > OFF.threshold > expected[1].jaccard
    assert score_many(edited, [("s", source), ("o", other)]) == expected
    top, match = rank(edited, [indexed("s", source, 1), indexed("o", other, 2)], OFF)
    assert top == [(0, *figures(expected[0])), (1, *figures(expected[1]))]
    assert match == ("duplicate", 0, *figures(expected[0]))


def test_the_compiled_rank_over_records_scores_the_signatures_as_score_does() -> None:
    """What the compiled run compares without a verifier: the signature kept at the end of each
    record, read as a probe's slots (8 bytes each), against the article's signature: the same
    figures as score's, and the same pick as the reference's rank."""
    source, edited, other = (sketch_of(text, OFF) for text in (ROMO, EDITED, MEMORIAL))
    probes = [
        decode_probe(encode_record(indexed(article_id, sketch, seq)))
        for article_id, sketch, seq in (("s", source, 1), ("o", other, 2))
    ]
    slots = edited.signature.astype("<u8").tobytes()
    assert [probe.verifier for probe in probes] == [
        s.signature.astype("<u8").tobytes() for s in (source, other)
    ]
    args = (slots, probes, edited.shingle_count, 0, 0.0, OFF.top_candidates, OFF.threshold, -1.0, 8)
    top, match = _sketch.rank(*args)
    expected = [score(edited, sketch, i) for i, sketch in (("s", source), ("o", other))]
    assert top == [(0, *figures(expected[0])), (1, *figures(expected[1]))]
    assert match == (1, 0, *figures(expected[0]))
    jaccard, _, _ = _sketch.scores(slots, probes, edited.shingle_count, 0, 0.0, 8)
    assert np.frombuffer(jaccard).tolist() == [c.jaccard for c in expected]


def figures(candidate: Candidate) -> tuple[float, float, float]:
    return candidate.jaccard, candidate.containment, candidate.contains


def indexed(article_id: str, sketch: Sketch, seq: int) -> IndexedArticle:
    decision = Decision("unique", None, None, None, None, article_id, False, ())
    return IndexedArticle(article_id, 0, seq, sketch, decision)
