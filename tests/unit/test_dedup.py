"""The decision rule through the IndexShard (its compiled run) over in-memory state, and the
reference it is written after (tests/support/reference_decide.py)."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest

from neardup.core.anchors import NO_ANCHORS
from neardup.core.dedup import Candidate, score
from neardup.core.lsh import band_keys
from neardup.core.minhash import EMPTY_VERIFIER_SLOT
from neardup.core.params import DedupParams
from neardup.core.signing import EmptyText, Sketch, sketch_of
from neardup.pipeline.shard import IndexShard
from neardup.state.memory import MemoryState
from tests.support import reference_sketch
from tests.support.reference_decide import _ranked, decide, rank
from tests.support.scoring import score_many
from tests.support.shard import process
from tests.support.state import band_members, id_for_content

BYLINE = "By Staff Writer, Associated Press\n\n"
FOOTER = "\n\nCopyright 2011 The Associated Press. All rights reserved."
FOOTER_2 = "\n\nRead more sports news and follow us for updates on the NFL lockout."


def test_exact_repost_under_a_new_id(shard: IndexShard, prose: tuple[str, ...]) -> None:
    first = process(shard, "first", prose[0])
    assert first.decision.kind == "unique" and first.decision.canonical_id == "first"
    assert first.version == 0
    again = process(shard, "second", prose[0])
    d = again.decision
    assert (d.kind, d.exact, d.match_id, d.canonical_id) == ("duplicate", True, "first", "first")
    assert d.jaccard == 1.0 and d.containment == 1.0 and d.contains == 1.0
    assert [c.article_id for c in d.candidates] == ["first"]
    assert again.seq == first.seq + 1


def test_exact_match_is_on_the_normalized_text(shard: IndexShard, prose: tuple[str, ...]) -> None:
    process(shard, "first", prose[1])
    retyped = "  " + prose[1].upper().replace(" ", "   ").replace("\n\n", "\r\n") + "\n"
    d = process(shard, "second", retyped).decision
    assert (d.kind, d.exact, d.match_id) == ("duplicate", True, "first")


def test_redelivery_repeats_the_verdict(shard: IndexShard, prose: tuple[str, ...]) -> None:
    a = process(shard, "a", prose[0])
    b = process(shard, "b", prose[0] + FOOTER)
    count, seq = shard.state.counts.articles, shard.state.next_seq()
    assert process(shard, "a", prose[0]) == a
    b_again = process(shard, "b", prose[0] + FOOTER)
    assert b_again == b
    assert b_again.decision.match_id == "a"  # never a duplicate of itself
    assert (shard.state.counts.articles, shard.state.next_seq()) == (count, seq)
    outcome = decide("b", sketch_of(prose[0] + FOOTER, shard.params), shard.state, shard.params)
    assert outcome.redelivered and outcome.article == b


def test_new_version_is_not_a_duplicate_of_its_old_self(shard: IndexShard, prose: tuple[str, ...]) -> None:
    process(shard, "x", prose[0])
    edited = process(shard, "x", prose[0].replace("Saturday", "Sunday"))
    assert edited.version == 1
    assert edited.decision.kind == "unique" and edited.decision.match_id is None
    assert edited.decision.canonical_id == "x"
    assert all(c.article_id != "x" for c in edited.decision.candidates)


def test_new_content_replaces_the_old_version(shard: IndexShard, prose: tuple[str, ...]) -> None:
    params, state = shard.params, shard.state
    old = process(shard, "x", prose[0])
    old_keys = set(band_keys(old.sketch.signature, params.lsh.bands, params.lsh.rows))
    new = process(shard, "x", prose[1])
    assert new.version == 1 and new.seq > old.seq
    assert state.get("x") == new and state.counts.articles == 1
    new_keys = set(band_keys(new.sketch.signature, params.lsh.bands, params.lsh.rows))
    for key in old_keys - new_keys:
        assert "x" not in band_members(state, key)
    for key in new_keys:
        assert "x" in band_members(state, key)
    assert id_for_content(state, old.sketch.content_hash) is None
    assert id_for_content(state, new.sketch.content_hash) == "x"
    # an article similar only to the old content no longer matches x, exact copies included
    assert process(shard, "near-old", BYLINE + prose[0] + FOOTER).decision.kind == "unique"
    assert process(shard, "copy-old", prose[0]).decision.match_id == "near-old"
    # and one similar to the new content does
    d = process(shard, "near-new", prose[1] + FOOTER).decision
    assert (d.kind, d.match_id) == ("duplicate", "x")
    # going back to the old text is a third version
    assert process(shard, "x", prose[0]).version == 2


def test_syndicated_copy_with_byline_and_footer(shard: IndexShard, prose: tuple[str, ...]) -> None:
    for i, text in enumerate(prose[1:]):
        process(shard, f"other-{i}", text)
    process(shard, "original", prose[0])
    copy = process(shard, "syndicated", BYLINE + prose[0] + FOOTER)
    d = copy.decision
    assert (d.kind, d.exact, d.match_id, d.canonical_id) == ("duplicate", False, "original", "original")
    assert d.jaccard is not None and d.jaccard >= shard.params.threshold
    assert d.candidates[0].article_id == "original"


def test_canonical_follows_the_chain(shard: IndexShard, prose: tuple[str, ...]) -> None:
    process(shard, "A", prose[0])
    b = process(shard, "B", BYLINE + prose[0] + FOOTER)
    c = process(shard, "C", BYLINE + prose[0] + FOOTER + FOOTER_2)
    assert (b.decision.match_id, b.decision.canonical_id) == ("A", "A")
    assert (c.decision.kind, c.decision.match_id, c.decision.canonical_id) == ("duplicate", "B", "A")
    # an exact copy of C names C as its match and still A as canonical
    d = process(shard, "D", BYLINE + prose[0] + FOOTER + FOOTER_2).decision
    assert (d.exact, d.match_id, d.canonical_id) == (True, "C", "A")


@pytest.mark.parametrize("index", range(5))
def test_truncated_copy_is_partial_with_containment(prose: tuple[str, ...], index: int) -> None:
    text = prose[index]
    head = text[: len(text) * 6 // 10]
    on = IndexShard(MemoryState(), DedupParams(containment_threshold=0.9))
    process(on, "full", text)
    d = process(on, "head", head).decision
    assert (d.kind, d.match_id, d.canonical_id) == ("partial", "full", "full")
    assert d.containment is not None and d.containment >= 0.9
    assert d.contains is not None and d.contains < 0.8
    # without partial verdicts a head of 60% still reuses much of its source: revised
    revised = IndexShard(MemoryState(), DedupParams(containment_threshold=None, containment_index=True))
    process(revised, "full", text)
    d = process(revised, "head", head).decision
    assert (d.kind, d.match_id, d.canonical_id) == ("revised", "full", "full")
    off = IndexShard(
        MemoryState(), DedupParams(containment_threshold=None, revised_threshold=None, containment_index=True)
    )
    process(off, "full", text)
    d = process(off, "head", head).decision
    assert (d.kind, d.match_id, d.canonical_id) == ("unique", None, "head")


def test_top_candidates_are_sorted_best_first(prose: tuple[str, ...]) -> None:
    shard = IndexShard(MemoryState(), DedupParams(top_candidates=3, containment_threshold=None))
    base = prose[0]
    cut = len(base) // 10
    process(shard, "v0", base)
    process(shard, "v1", base[cut:])
    process(shard, "v2", base[2 * cut :])
    process(shard, "v3", base[3 * cut :])
    process(shard, "v4", base[: len(base) // 2])
    d = process(shard, "probe", base + FOOTER).decision
    scores = [c.jaccard for c in d.candidates]
    assert len(scores) == 3
    assert scores == sorted(scores, reverse=True)
    assert d.candidates[0].article_id == "v0" and d.match_id == "v0"


def test_unrelated_articles_are_unique(shard: IndexShard, prose: tuple[str, ...]) -> None:
    kinds = [process(shard, f"a{i}", text).decision.kind for i, text in enumerate(prose)]
    assert kinds == ["unique"] * len(prose)


def test_decide_reads_without_writing(prose: tuple[str, ...]) -> None:
    params = DedupParams()
    state = MemoryState()
    state.open_header(params.header())
    outcome = decide("a", sketch_of(prose[0], params), state, params)
    assert outcome.update is not None and outcome.update.replaced is None
    assert state.counts.articles == 0 and state.next_seq() == 0 and state.get("a") is None
    assert len(outcome.update.article.keys) == params.lsh.bands


def test_decide_with_the_band_keys_given_equals_decide_computing_them(prose: tuple[str, ...]) -> None:
    params = DedupParams()
    state = MemoryState()
    state.open_header(params.header())
    for n, text in enumerate([prose[0], prose[0] + " Reporting by the desk.", prose[2]]):
        sketch = sketch_of(text, params)
        keys = band_keys(sketch.signature, params.lsh.bands, params.lsh.rows)
        given, computed = decide(f"a{n}", sketch, state, params, keys), decide(f"a{n}", sketch, state, params)
        assert given.article == computed.article and given.update == computed.update
        assert computed.update is not None and computed.update.article.keys == tuple(keys)
        state.apply(computed.update)


@pytest.mark.parametrize("text", ["", "   ", "\n\t \r\n", "\u3000\u00a0"])
def test_empty_and_whitespace_text_is_refused(shard: IndexShard, text: str) -> None:
    with pytest.raises(EmptyText):
        sketch_of(text, shard.params)
    with pytest.raises(EmptyText):
        process(shard, "empty", text)
    assert shard.state.counts.articles == 0


def test_texts_shorter_than_k_match_only_exactly(shard: IndexShard) -> None:
    first = process(shard, "s1", "Oops")
    assert first.sketch.short and first.sketch.shingle_count == 1
    d = process(shard, "s2", "  OOPS ").decision
    assert (d.kind, d.exact, d.match_id) == ("duplicate", True, "s1")
    assert process(shard, "s3", "Oopz").decision.kind == "unique"
    assert process(shard, "s4", "Oop").decision.kind == "unique"
    # a long text containing the short one is no match either way
    assert process(shard, "long", "Oops, the quarterback married in Dallas").decision.kind == "unique"


def test_ten_megabytes_of_text(shard: IndexShard, prose: tuple[str, ...]) -> None:
    paragraphs = []
    size, n = 0, 0
    while size < 10_000_000:
        paragraph = f"Paragraph {n}: {prose[n % len(prose)]}\n\n"
        paragraphs.append(paragraph)
        size += len(paragraph)
        n += 1
    text = "".join(paragraphs)
    started = time.perf_counter()
    sketch = sketch_of(text, shard.params)
    elapsed = time.perf_counter() - started
    print(f"10 MB sketch: {elapsed:.2f}s, {sketch.shingle_count} distinct shingles")
    assert sketch.shingle_count > 10_000 and not sketch.short
    state, params = shard.state, shard.params
    outcome = decide("big", sketch, state, params)
    assert outcome.update is not None and outcome.article.decision.kind == "unique"
    state.apply(outcome.update)
    copy = decide("big-copy", sketch, state, params).article.decision
    assert (copy.kind, copy.exact, copy.match_id) == ("duplicate", True, "big")


def test_scoring_many_candidates_equals_scoring_each(prose: tuple[str, ...]) -> None:
    """score_many's array passes give bit-identical figures to score, pair by pair: verdicts must
    not depend on how many candidates an article has."""
    params = DedupParams()
    query = sketch_of(prose[0], params)
    texts = [
        prose[0],  # identical
        prose[0] + " Reporting by the wire desk.",
        prose[0][: len(prose[0]) // 2],  # contained
        prose[1],
        prose[2] + " " + prose[0],  # contains
        "Short.",  # shorter than k: a one-hash sketch, mostly empty verifier slots
        "abcdef",
        *prose[3:],
    ]
    others = [(f"c{n}", sketch_of(text, params)) for n, text in enumerate(texts)]
    assert score_many(query, others) == [score(query, sketch, other_id) for other_id, sketch in others]
    tiny = sketch_of("Tiny.", params)
    assert score_many(tiny, others) == [score(tiny, sketch, other_id) for other_id, sketch in others]
    assert score_many(query, others[:1]) == [score(query, others[0][1], "c0")]
    # verifiers of another length (state written with other settings) are scored pair by pair
    coarse = DedupParams(verify_perm=256)
    mixed = [*others[:3], ("d0", sketch_of(prose[0], coarse)), ("d1", sketch_of(prose[1], coarse))]
    assert score_many(query, mixed) == [score(query, sketch, other_id) for other_id, sketch in mixed]
    same_other_length = [(i, sketch_of(t, coarse)) for i, t in (("e0", prose[0]), ("e1", prose[2]))]
    assert score_many(query, same_other_length) == [
        score(query, sketch, i) for i, sketch in same_other_length
    ]
    assert score_many(query, []) == []


def _reference_rule(
    article_id: str, sketch: Sketch, state: MemoryState, params: DedupParams
) -> tuple[str, Candidate | None, tuple[Candidate, ...]]:
    """The decision rule written plainly, candidate by candidate, each scored by itself in numpy:
    what _verified_match computes in one compiled pass (_sketch.rank)."""
    keys = band_keys(sketch.signature, params.lsh.bands, params.lsh.rows)
    others = state.candidates(keys, article_id, params.max_candidates)
    scored = sorted(
        ((score(sketch, o.sketch, o.article_id), o) for o in others),
        key=lambda pair: (-pair[0].jaccard, pair[1].seq),
    )
    top = tuple(candidate for candidate, _ in scored[: params.top_candidates])
    duplicates = [candidate for candidate, _ in scored if candidate.jaccard >= params.threshold]
    if duplicates:
        return "duplicate", duplicates[0], top
    assert params.containment_threshold is not None
    reach = params.containment_threshold
    partials = [pair for pair in scored if max(pair[0].containment, pair[0].contains) >= reach]
    if partials:
        best = min(partials, key=lambda pair: (-max(pair[0].containment, pair[0].contains), pair[1].seq))
        return "partial", best[0], top
    return "unique", None, top


def test_verdicts_equal_the_rule_applied_candidate_by_candidate(prose: tuple[str, ...]) -> None:
    params = DedupParams(top_candidates=4)
    state = MemoryState()
    state.open_header(params.header())
    rng = random.Random(7)
    parts = [p for text in prose for p in text.split(". ") if len(p) > 40]
    kinds: dict[str, int] = {}
    texts: dict[str, str] = {}
    for n in range(160):
        if n % 5 == 4:  # an exact copy: later articles then meet candidates that tie
            text = texts[f"a{rng.randrange(n)}"]
        elif n % 4 == 3:  # a near-copy of an earlier article: duplicates and partials
            earlier = state.get(f"a{rng.randrange(n)}")
            assert earlier is not None
            words = texts[earlier.article_id].split(" ")
            words = words[rng.randrange(len(words) // 3) :] if rng.random() < 0.5 else words
            text = " ".join(w if rng.random() > 0.03 else "edited" for w in words)
        else:  # recombined sentences: many partial overlaps, many candidates
            text = ". ".join(rng.sample(parts, rng.randint(3, 9)))
        texts[f"a{n}"] = text
        # without anchors: the rule under test is the verifier's, over the band candidates
        sketch = dataclasses.replace(sketch_of(text, params), anchors=NO_ANCHORS)
        expected = _reference_rule(f"a{n}", sketch, state, params)
        outcome = decide(f"a{n}", sketch, state, params)
        decision = outcome.article.decision
        kinds[decision.kind] = kinds.get(decision.kind, 0) + 1
        if not decision.exact:
            match = None if expected[1] is None else expected[1].article_id
            assert (decision.kind, decision.match_id, decision.candidates) == (
                expected[0],
                match,
                expected[2],
            )
            if expected[1] is not None:
                assert (decision.jaccard, decision.containment, decision.contains) == (
                    expected[1].jaccard,
                    expected[1].containment,
                    expected[1].contains,
                )
        assert outcome.update is not None
        state.apply(outcome.update)
    assert min(kinds.get(kind, 0) for kind in ("unique", "duplicate", "partial")) >= 5, kinds


class _Prospect:
    """A candidate as rank reads it: verifier, distinct count, arrival."""

    def __init__(self, article_id: str, seq: int, verifier: np.ndarray, shingle_count: int) -> None:
        self.article_id, self.seq, self.verifier, self.shingle_count = (
            article_id,
            seq,
            verifier,
            shingle_count,
        )
        self.canonical_id = article_id

    @property
    def sketch(self) -> Sketch:
        return Sketch(b"", np.zeros(4, dtype=np.uint64), self.shingle_count, False, self.verifier)


def _prospects(rng: np.random.Generator, query: np.ndarray, count: int) -> list[_Prospect]:
    """Candidates at every level of agreement with `query`, with ties on purpose: exact copies of
    one another (equal Jaccard, ordered by arrival), and equal reach through the containment side."""
    rows = []
    for share in rng.choice([0.0, 0.3, 0.6, 0.75, 0.8, 0.85, 0.95, 1.0], count):
        row = np.where(
            rng.random(query.size) < share, query, rng.integers(0, 256, query.size, dtype=np.uint8)
        )
        rows.append(row.astype(np.uint8))
    rows[count // 2] = rows[0].copy()  # a tie in Jaccard
    sizes = [int(n) for n in rng.choice([0, 200, 1500, 3000, 6000], count)]
    seqs = [int(s) for s in rng.permutation(10 * count)[:count]]
    return [_Prospect(f"c{i}", seqs[i], rows[i], sizes[i]) for i in range(count)]


def test_compiled_ranking_equals_the_numpy_reference() -> None:
    """_sketch.rank against reference_decide._ranked over the numpy reference's figures: the same top
    candidates in the same order, the same match, the same figures to the last bit, over many
    random candidate sets and every setting that changes the outcome."""
    rng = np.random.default_rng(5)
    query = rng.integers(0, EMPTY_VERIFIER_SLOT, 512, dtype=np.uint8)
    query[[3, 77]] = EMPTY_VERIFIER_SLOT
    settings = [
        DedupParams(),
        DedupParams(top_candidates=1, threshold=0.95),
        DedupParams(top_candidates=10, threshold=1.0, containment_threshold=0.5),
        DedupParams(threshold=1.0, containment_threshold=None),
        DedupParams(top_candidates=50),
    ]
    kinds: dict[str | None, int] = {}
    for trial in range(300):
        others = _prospects(rng, query, int(rng.integers(1, 40)))
        size = int(rng.choice([0, 150, 3000]))
        sketch = Sketch(b"", np.zeros(4, dtype=np.uint64), size, False, query)
        params = settings[trial % len(settings)]
        jaccard, inside, contains = reference_sketch.scores(query, size, others)
        scored = [Candidate("", *figures) for figures in zip(jaccard, inside, contains, strict=True)]
        expected = _ranked(others, params, scored)
        got = rank(sketch, others, params)
        assert got == expected, (trial, params)
        kind = None if got.match is None else got.match[0]
        kinds[kind] = kinds.get(kind, 0) + 1
        assert len(got.top) == min(params.top_candidates, len(others))
    assert min(kinds.get(kind, 0) for kind in (None, "duplicate", "partial")) >= 20, kinds


def test_ranking_falls_back_to_fingerprints_when_verifier_lengths_differ() -> None:
    """A candidate from other parameters: every candidate scored by itself from the sketches
    (score), then ranked by the same rule."""
    rng = np.random.default_rng(9)
    query = rng.integers(0, EMPTY_VERIFIER_SLOT, 512, dtype=np.uint8)
    others = _prospects(rng, query, 6)
    others[2].verifier = others[2].verifier[:256]
    sketch = Sketch(b"", np.zeros(4, dtype=np.uint64), 3000, False, query)
    apart = [score(sketch, other.sketch, other.article_id) for other in others]
    assert rank(sketch, others, DedupParams()) == _ranked(others, DedupParams(), apart)
