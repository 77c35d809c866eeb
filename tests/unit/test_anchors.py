"""Anchors: the compiled pass against the numpy reference bit for bit, the containment estimate
against brute-force containment, the passages against the texts, and anchors through the engine
and the state (posting lists capped, left on delete and expiry, counted)."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import numpy as np
import pytest

from neardup.core import compiled
from neardup.core.anchors import ANCHOR_K, ANCHOR_WINDOW, Anchors, anchors_of, containment, passages
from neardup.core.normalize import canonical_code_points, normalize
from neardup.core.params import DedupParams, IncompatibleState
from neardup.core.shingle import shingle_set
from neardup.core.signing import sketch_of
from neardup.pipeline.shard import IndexShard
from neardup.pipeline.wire import Provenance, Signed, decode_signed, encode_signed
from neardup.state.index import IndexState
from neardup.state.memory import MemoryKV, MemoryState
from neardup.state.records import decode_record, encode_record
from neardup.state.rocks import RocksState
from neardup.state.tables import POSTING, POSTING_ENTRY
from tests.support import reference_anchors as reference
from tests.support.reference_state import (
    join_postings,
    leave_entries,
    posting_entries,
    posting_keys,
    rank_postings,
)
from tests.support.shard import process

PARAMS = DedupParams(containment_index=True)


def points(text: str) -> np.ndarray:
    return canonical_code_points(text)


def exact_containment(part: str, whole: str) -> float:
    """The share of `part`'s 5-shingles in `whole`, by brute force."""
    a, b = shingle_set(normalize(part)), shingle_set(normalize(whole))
    return np.intersect1d(a, b).size / a.size


def test_the_compiled_anchors_are_the_reference_s_bit_for_bit(prose: tuple[str, ...]) -> None:
    rng = np.random.default_rng(5)
    texts = [points(text) for text in prose]
    # repetitive and random code points too: ties among equal windows, runs of one value
    texts += [rng.integers(97, 99, 4000).astype(np.uint32), rng.integers(0, 0x10FFFF, 900).astype(np.uint32)]
    texts += [np.full(700, 97, dtype=np.uint32), points(prose[0])[:ANCHOR_K]]
    for text in texts:
        # 255: the widest window whose gaps a packed offset holds
        for k, window in ((ANCHOR_K, ANCHOR_WINDOW), (5, 3), (1, 1), (24, 255)):
            expected = reference.anchors_of(text, k, window)
            got = anchors_of(text, k, window, most=text.size)
            assert got == expected and len(got) > 0
            assert reference.positions_of(got).dtype == np.uint32 and got.hashes.dtype == np.uint32
            assert got.distinct_count == reference.distinct_count(expected)
            first = anchors_of(text, k, window, most=3)  # the first ones only
            assert first == reference.packed_anchors(
                expected.hashes[:3], reference.positions_of(expected)[:3]
            )


def test_winnowing_keeps_an_anchor_in_every_window(prose: tuple[str, ...]) -> None:
    for text in prose:
        found = anchors_of(points(text))
        shingles = points(text).size - ANCHOR_K + 1
        gaps = np.diff(np.concatenate(([-1], reference.positions_of(found).astype(np.int64), [shingles])))
        assert gaps.max() <= ANCHOR_WINDOW, "a window of shingles without an anchor"
        assert len(found) <= 2 * shingles / (ANCHOR_WINDOW + 1) * 1.5 + 2  # density about 2/(w+1)


def test_an_excerpt_holds_only_its_source_s_anchors_and_the_estimate_follows_the_truth(
    prose: tuple[str, ...],
) -> None:
    rng = random.Random(3)
    errors: list[float] = []
    for text in prose:
        canonical = normalize(text)
        whole = anchors_of(points(canonical))
        for _ in range(20):
            length = rng.randrange(ANCHOR_WINDOW + ANCHOR_K, len(canonical) // 2)
            start = rng.randrange(len(canonical) - length)
            part = canonical[start : start + length]
            shared, inside, contains = containment(anchors_of(points(part)), whole)
            assert exact_containment(part, canonical) == 1.0
            assert inside == 1.0 and shared >= 1
            errors.append(abs(contains - exact_containment(canonical, part)))
    # the other way an estimate from a few anchors: right on average
    assert np.mean(errors) < 0.15


def test_unrelated_texts_share_next_to_no_anchor(prose: tuple[str, ...]) -> None:
    for i, a in enumerate(prose):
        for b in prose[i + 1 :]:
            shared, inside, contains = containment(anchors_of(points(a)), anchors_of(points(b)))
            assert exact_containment(a, b) < 0.5
            assert shared <= 1 and max(inside, contains) < 0.3


def test_passages_point_at_the_same_text_in_both(prose: tuple[str, ...]) -> None:
    source = normalize(prose[0])
    quoted = source[300:1500]
    host = normalize(prose[1])
    text = f"{host[:700]} {quoted} {host[700:]}"
    found = passages(anchors_of(points(text)), anchors_of(points(source)))
    assert found, "the quoted passage is found"
    longest = found[0]
    assert text[longest.start : longest.end] == source[longest.other_start : longest.other_end]
    # at the anchors' resolution: inside the quote, within a window of its ends
    assert 700 <= longest.start < 700 + ANCHOR_WINDOW + ANCHOR_K
    assert longest.end <= 701 + len(quoted)
    assert longest.end - longest.start >= len(quoted) - 2 * (ANCHOR_WINDOW + ANCHOR_K)
    assert all(a.end - a.start >= b.end - b.start for a, b in itertools.pairwise(found))


def test_the_compiled_passages_are_the_reference_s(prose: tuple[str, ...]) -> None:
    """Quotes, shuffled paragraphs, repeats and edits: the same passages, in the same order."""
    rng = random.Random(7)
    texts = [normalize(text) for text in prose[:12]]
    checked = 0
    for _ in range(150):
        source = rng.choice(texts)
        cuts = sorted(rng.sample(range(len(source)), 4))
        pieces = [source[cuts[0] : cuts[1]], rng.choice(texts)[:400], source[cuts[2] : cuts[3]]]
        rng.shuffle(pieces)
        text = " ".join(pieces) * rng.choice((1, 1, 2))
        mine, other = anchors_of(points(text)), anchors_of(points(source))
        for limit in (0, 3, 50):
            found = passages(mine, other, limit)
            assert reference.passages(mine, other, limit) == found
            checked += bool(found)
    assert checked > 200


@pytest.mark.parametrize("seed", range(6))
def test_entries_leave_in_c_as_the_reference_takes_them_out(seed: int) -> None:
    """_sketch.leave_entries against its reference: buckets (8-byte seqs, sizes counted) and
    posting lists (5-byte entries matched without their flag, full lists counted), entries absent,
    present once or twice, lists emptied, absent ones."""
    rng = random.Random(seed)
    for width, masked, full in ((8, False, 0), (POSTING_ENTRY, True, 4 * POSTING_ENTRY)):
        pool = [rng.randbytes(width) for _ in range(5)]
        entry = rng.choice(pool)
        flagged = bytes([entry[0] ^ 0x80]) + entry[1:]  # the same seq, its flag the other way
        names = [b"k%d" % n for n in range(40)]
        found: list[bytes | None] = [
            None
            if rng.random() < 0.2
            else b"".join(rng.choice([*pool, flagged]) for _ in range(rng.randrange(6)))
            for _ in names
        ]
        sizes = [0, *[rng.randrange(50, 60) for _ in range(6)]] if not masked else None
        expected_into: dict[bytes, bytes | None] = {}
        expected_sizes = None if sizes is None else list(sizes)
        expected = leave_entries(names, found, entry, masked, full, expected_into, expected_sizes)
        into: dict[bytes, bytes | None] = {}
        assert compiled._sketch.leave_entries(names, found, entry, masked, full, into, sizes) == expected
        assert into == expected_into and sizes == expected_sizes
        assert expected[2], "some changed"
        assert any(value is None for value in into.values()) or expected[0] == 0


def test_posting_keys_and_joins_in_c_as_the_reference_makes_them(prose: tuple[str, ...]) -> None:
    anchors = anchors_of(points(" ".join(prose[:2]) * 2))  # repeated anchors join once
    keys = posting_keys(anchors)
    assert len(keys) == anchors.distinct_count < len(anchors)
    assert keys == [POSTING + int(h).to_bytes(4, "big") for h in dict.fromkeys(anchors.hashes.tolist())]
    rng = random.Random(3)
    full = 4 * POSTING_ENTRY
    lists = [None if rng.random() < 0.3 else bytes(POSTING_ENTRY * rng.randrange(1, 6)) for _ in keys]
    entry = (7).to_bytes(POSTING_ENTRY, "big")
    into: dict[bytes, bytes] = {}
    counts = join_postings(keys, lists, entry, full, into)
    assert counts == (
        lists.count(None),
        sum(stored is not None and len(stored) == 3 * POSTING_ENTRY for stored in lists),
    )
    assert into == {
        k: (s or b"") + entry for k, s in zip(keys, lists, strict=True) if s is None or len(s) < full
    }
    assert compiled._sketch.posting_keys(anchors.packed, POSTING) == keys
    compiled_into: dict[bytes, bytes] = {}
    assert compiled._sketch.join_postings(keys, lists, entry, full, compiled_into) == counts
    assert compiled_into == into


def test_passages_of_a_repeated_text_stay_linear() -> None:
    """Every anchor of a periodic text has the same few hashes: all pairs would be quadratic."""
    text = "abcdefghij" * 3000
    anchors = anchors_of(points(text))
    started = time.perf_counter()
    found = passages(anchors, anchors)
    assert time.perf_counter() - started < 0.5
    assert found and all(text[p.start : p.end] == text[p.other_start : p.other_end] for p in found)


def test_anchors_round_trip_records_and_the_wire(prose: tuple[str, ...]) -> None:
    anchors = anchors_of(points(prose[2]))
    assert Anchors.unpack_from(anchors.packed, len(anchors)) == anchors
    sketch = sketch_of(prose[2], PARAMS)
    assert sketch.anchors == anchors
    signed = Signed.of("a", sketch, Provenance("t", 0, 1, None))
    decoded = decode_signed(encode_signed(signed))
    assert isinstance(decoded, Signed) and decoded.sketch.anchors == anchors
    with pytest.raises(ValueError, match="255"):
        reference.packed_anchors(np.array([1, 2], np.uint32), np.array([0, 400], np.uint32))
    with pytest.raises(ValueError, match="order"):
        reference.packed_anchors(np.array([1, 2], np.uint32), np.array([9, 3], np.uint32))
    unpacked = reference.packed_anchors(anchors.hashes, reference.positions_of(anchors))
    assert unpacked == anchors and unpacked.packed == anchors.packed


@pytest.mark.parametrize("excerpt_first", [False, True])
def test_an_excerpt_is_partial_in_either_order_with_its_passages(
    prose: tuple[str, ...], excerpt_first: bool
) -> None:
    source = prose[1]
    excerpt = normalize(source)[400 : 400 + len(source) // 5]
    shard = IndexShard(MemoryState(), PARAMS)
    order = [("source", source), ("excerpt", excerpt)]
    if excerpt_first:
        order.reverse()
    process(shard, *order[0])
    d = process(shard, *order[1]).decision
    assert (d.kind, d.match_id) == ("partial", order[0][0])
    assert max(d.containment or 0, d.contains or 0) >= PARAMS.containment_threshold  # type: ignore[operator]
    assert d.jaccard is not None and d.jaccard < 0.5, "Jaccard alone would not find it"
    later = normalize(order[1][1])
    earlier = normalize(order[0][1])
    assert d.passages and all(
        later[p.start : p.end] == earlier[p.other_start : p.other_end] for p in d.passages
    )
    # the record repeats the verdict, passages included
    assert decode_record(encode_record(shard.state.get(order[1][0]))).decision == d  # type: ignore[arg-type]


def test_without_the_containment_index_an_excerpt_is_unique_and_its_state_is_another(
    prose: tuple[str, ...], tmp_path: Path
) -> None:
    """With the index off (the setting that keeps state of the earlier default): no anchors are
    picked, no posting list is kept, an excerpt out of LSH's reach stays unique, and a state built
    either way refuses to open the other way."""
    source, excerpt = prose[1], normalize(prose[1])[400 : 400 + len(prose[1]) // 5]
    off = DedupParams(containment_index=False)
    assert not off.containment_index and len(sketch_of(source, off).anchors) == 0
    assert off.header()["anchors"] == "none" and PARAMS.header()["anchors"].startswith("winnow-")
    shard = IndexShard(RocksState(tmp_path / "off"), off)
    process(shard, "source", source)
    d = process(shard, "excerpt", excerpt).decision
    assert (d.kind, d.match_id, d.passages) == ("unique", None, ())
    assert shard.state.counts.postings == 0
    assert not any(key.startswith(POSTING) for key, _ in shard.state.kv.scan(POSTING))
    shard.state.close()
    with pytest.raises(IncompatibleState, match=r"anchors: .*\(setting containment_index\)"):
        IndexShard(RocksState(tmp_path / "off"), PARAMS)


def test_a_revision_is_revised_and_the_threshold_turns_it_off(prose: tuple[str, ...]) -> None:
    story = f"{prose[0]} {prose[1]}"
    sentences = normalize(story).split(". ")
    quarter = len(sentences) // 4
    # a quarter cut, two paragraphs' worth added, the last sentences moved to the top
    kept = sentences[:quarter] + sentences[2 * quarter :]
    revision = ". ".join(kept[-3:] + kept[:-3] + normalize(prose[4]).split(". "))
    without_revised = DedupParams(revised_threshold=None, containment_index=True)
    for params, kind in ((PARAMS, "revised"), (without_revised, "unique")):
        shard = IndexShard(MemoryState(), params)
        process(shard, "story", story)
        d = process(shard, "rewrite", revision).decision
        assert d.kind == kind
    assert d.passages == () and d.match_id is None


def test_posting_lists_are_capped_left_on_delete_and_counted(prose: tuple[str, ...]) -> None:
    state = MemoryState()
    shard = IndexShard(state, PARAMS)
    process(shard, "a", prose[0])
    postings = state.stats().anchor_postings
    assert postings == len(anchors_of(points(prose[0])).distinct) > 0
    process(shard, "b", prose[1])
    assert state.stats().anchor_postings > postings
    state.delete("b")
    assert state.stats().anchor_postings == postings
    # an anchor in more articles than the cap is boilerplate: counted, and proposes nobody
    shard = IndexShard(MemoryState(), PARAMS)
    boiler = normalize(prose[2])[:300]
    words = normalize(" ".join(prose)).split()
    rng = random.Random(1)
    for n in range(state.anchor_cap + 1):  # a new text each, under the same 300 characters
        process(shard, f"n{n}", f"{boiler} {' '.join(rng.choices(words, k=150))}")
    stats = shard.state.stats()
    assert stats.boilerplate_anchors > 0
    assert shard.state.anchor_candidates(anchors_of(points(boiler)), "", 10) == []


def test_posting_entries_read_back_five_byte_seqs_with_their_flag() -> None:
    values = [0, 1, 255, 256, (1 << 38) + 7, (1 << 39) - 1, (1 << 39) | 5]
    stored = b"".join(value.to_bytes(POSTING_ENTRY, "big") for value in values)
    assert len(stored) == POSTING_ENTRY * len(values)
    assert posting_entries(stored).tolist() == values


def test_posting_lists_read_back_follow_the_overlay_through_a_discard(
    prose: tuple[str, ...], tmp_path: Path
) -> None:
    state = RocksState(tmp_path / "index", layered=True)
    shard = IndexShard(state, PARAMS)
    try:
        shard.begin(1)
        process(shard, "a", prose[0])
        excerpt = anchors_of(points(normalize(prose[0])[:600]))
        assert [p.article_id for p, _ in state.anchor_candidates(excerpt, "", 4)] == ["a"]
        shard.discard()  # "a" never committed: its posting entries must go with it
        shard.begin(2)
        process(shard, "b", prose[0])  # the same seq as "a" had, in the same posting lists
        shard.commit(2, 0)
        lists = dict(state.rocks.scan(b"n"))
        assert lists and all(len(stored) == POSTING_ENTRY for stored in lists.values())
        assert [p.article_id for p, _ in state.anchor_candidates(excerpt, "", 4)] == ["b"]
    finally:
        shard.state.close()


def test_posting_lists_counted_in_c_as_the_reference_counts_them() -> None:
    rng = random.Random(4)
    loops = compiled._sketch
    full = 8 * POSTING_ENTRY
    for _ in range(300):
        seqs = [rng.randrange(40) | (rng.random() < 0.1) << 39 for _ in range(60)]
        lists: list[bytes | None] = [None] * rng.randrange(3)
        while seqs:
            size = rng.randrange(1, 10)
            take, seqs = seqs[:size], seqs[size:]
            lists.append(b"".join(seq.to_bytes(POSTING_ENTRY, "big") for seq in take))
        args = (lists, POSTING_ENTRY, full, rng.randrange(4), rng.randrange(8))
        assert loops.count_postings(*args) == rank_postings(*args)
    mixed = [(5).to_bytes(5, "big") * 2, ((1 << 39) | 9).to_bytes(5, "big"), (7).to_bytes(5, "big")]
    assert rank_postings(mixed, POSTING_ENTRY, full, 2, 5) == [(5, 2), (9, 1)]
    with pytest.raises(ValueError):
        loops.count_postings([b"1234"], POSTING_ENTRY, full, 2, 5)


def test_the_distinct_count_is_that_of_the_distinct_hashes(prose: tuple[str, ...]) -> None:
    found = anchors_of(points(" ".join(prose[:2]) * 2))  # a repeated passage repeats its anchors
    assert found.distinct_count == len(found.distinct) < len(found)


def test_a_posting_cache_smaller_than_one_text_or_none_gives_the_same_verdicts_and_lists(
    prose: tuple[str, ...],
) -> None:
    first = " ".join(prose[:2])
    size = anchors_of(points(first)).distinct_count
    # the first text fills the small cache; the next quotes its start (anchors held in the cache,
    # the oldest there) before a passage of its own (anchors not held: their lookup evicts)
    texts = [first, f"{first[:700]} {prose[2][:500]}", prose[3], f"{prose[3][:500]} {prose[4][:500]}"]
    states = [IndexState(MemoryKV(), posting_cache=size) for size in (size, 50_000, 0)]
    shards = [IndexShard(state, PARAMS) for state in states]
    kinds = []
    for n, text in enumerate(texts):
        small, large, uncached = (process(shard, f"a{n}", text).decision for shard in shards)
        assert small == large == uncached
        kinds.append(small.kind)
    assert len(states[0].postings._cache) <= size < len(states[1].postings._cache)
    assert not states[2].postings._cache
    assert dict(states[0].kv.scan(b"n")) == dict(states[1].kv.scan(b"n")) == dict(states[2].kv.scan(b"n"))
    assert kinds == ["unique", "revised", "unique", "revised"]


def test_posting_entries_past_their_39_bits_name_the_right_articles(prose: tuple[str, ...]) -> None:
    state = IndexState(MemoryKV())
    state._seq = (1 << 39) - 2  # as after 5.5 * 10**11 arrivals: the next ones wrap in an entry
    shard = IndexShard(state, PARAMS)
    for n, text in enumerate(prose[:4]):
        process(shard, f"a{n}", text)
    assert state.next_seq() > 1 << 39
    for n, text in enumerate(prose[:4]):
        found = state.anchor_candidates(anchors_of(points(normalize(text)[:700])), "", 4)
        assert [(p.article_id, p.seq) for p, _ in found] == [(f"a{n}", (1 << 39) - 2 + n)]
    state.delete("a3")  # leaves its posting lists by its low bits
    assert state.anchor_candidates(anchors_of(points(normalize(prose[3])[:700])), "", 4) == []


def test_a_short_text_is_contained_with_all_but_one_anchor_shared() -> None:
    """One anchor of an excerpt cut inside a window may be its own: a text too short for the
    threshold to spare one is held with all but one shared, a longer one by its share alone."""
    from tests.support.reference_decide import _holds

    assert _holds(5, 6, 0.9) and _holds(2, 3, 0.9) and _holds(9, 10, 0.9) and _holds(27, 30, 0.9)
    assert not _holds(4, 6, 0.9) and not _holds(8, 10, 0.9) and not _holds(26, 30, 0.9)
    assert not _holds(1, 2, 0.9) and not _holds(0, 1, 0.9)
    # 0.8 spares one of six already (the share alone decides), not one of four
    assert _holds(5, 6, 0.8) and not _holds(4, 6, 0.8) and _holds(3, 4, 0.8)
