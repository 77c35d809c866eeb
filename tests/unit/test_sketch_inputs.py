"""The compiled loops (service/core/_sketch.c) check their arguments: wrong lengths, counts and
values raise ValueError naming the argument (TypeError for what is not a buffer or a sequence)
before any memory is touched, and buffers at any address give the results aligned ones give.
.ci/asan runs these against a build under AddressSanitizer, where a read or write outside a buffer
aborts the run instead of passing unnoticed."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from neardup.core import anchors as anchors_module
from neardup.core import compiled
from neardup.core.minhash import CHANCE_AGREEMENT, EMPTY_SLOT, EMPTY_VERIFIER_SLOT
from tests.support import reference_anchors, reference_state

sketch: Any = compiled._sketch

Table = sketch.HeldTable
ENTRY_POINTS = {
    "anchors",
    "oph_minima",
    "finish",
    "band_keys",
    "collapse_spaces",
    "scores",
    "rank",
    "merge_buckets",
    "count_postings",
    "varints",
    "passages",
    "posting_keys",
    "join_postings",
    "join_buckets",
    "leave_entries",
    "pack_changes",
    "split_changes",
    "HeldTable",
    "sign_batch",
    "SignBatch",
    "encode_record",  # its cases: test_codec.py
    "verdict_json",  # its cases: test_codec.py
    "decide_fresh",  # its cases: test_fresh_run.py
    "signed_record",  # its cases: test_wire.py
    # _shard.c's, their cases: test_shard_rules.py
    "input_key",
    "replayed",
    "latency_ms",
    "mark",
    "marked",
    "mark_deciding",
    "signed_records",
    "fresh_rows",
    "fresh_results",
}


def test_every_entry_point_is_checked_here() -> None:
    """A function added to _sketch.c gets its cases below."""
    assert {name for name in dir(sketch) if not name.startswith("_")} == ENTRY_POINTS


def misaligned(array: np.ndarray) -> np.ndarray:
    """A writable copy of `array` one byte past an aligned address (a view into a bytearray)."""
    raw = bytearray(array.nbytes + 1)
    view = np.frombuffer(raw, dtype=array.dtype, count=array.size, offset=1)
    view[...] = array
    assert view.ctypes.data % 2 == 1 and view.flags.writeable
    return view


def tail(size: int) -> memoryview:
    """`size` writable bytes at an odd address, at the very end of their allocation."""
    return memoryview(bytearray(size + 1))[1:]


def packed_tail(cut: int) -> memoryview:
    """Two packed changes at an odd address at the end of their allocation, `cut` bytes longer."""
    packed = sketch.pack_changes({b"b1": b"12345678", b"n2": None})
    view = tail(len(packed) + cut)
    view[:] = packed[: len(view)].ljust(len(view), b"x")
    return view


def test_packed_changes_are_read_from_any_address() -> None:
    into = sketch.HeldTable()
    into.apply(sketch.pack_changes({b"n2": b"old"}))
    assert into.apply(packed_tail(0)) == 2
    assert into.get_many([b"b1", b"n2"]) == [b"12345678", None] and len(into) == 1


@pytest.mark.parametrize(("start", "most"), [(-1, 1), (0, -1)])
def test_a_table_is_listed_from_a_slot_and_count_not_negative(start: int, most: int) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        Table().items(start, most)


def test_a_table_is_packed_in_chunks_of_at_least_a_byte() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Table().pack_range(0, 1, 0)
    for step, steps in ((0, 3), (2, 2), (-1, 2)):  # a range of a power of two of them
        with pytest.raises(ValueError, match="power of two, step one of them"):
            Table().pack_range(step, steps, 1)
    with pytest.raises(TypeError, match="keys must be"):
        Table().get_many([b"a", "b"])


def units(count: int, dtype: type = np.uint64) -> np.ndarray:
    return np.random.default_rng(count).integers(1, 0x10FFFF, count).astype(dtype)


def minima(bins: int = 64) -> np.ndarray:
    return np.full(bins, EMPTY_SLOT, dtype=np.uint64)


def verifier_of(rng: np.random.Generator, size: int = 64) -> np.ndarray:
    return rng.integers(0, 256, size, dtype=np.uint8)


def candidates(count: int = 3) -> list[SimpleNamespace]:
    """Candidates agreeing with QUERY on from none to nearly all of their slots."""
    rng = np.random.default_rng(count)
    rows = [np.where(rng.random(QUERY.size) < i / count, QUERY, verifier_of(rng)) for i in range(count)]
    return [SimpleNamespace(verifier=row, shingle_count=100 + i, seq=i) for i, row in enumerate(rows)]


QUERY = verifier_of(np.random.default_rng(99))
SCORING = (100, EMPTY_VERIFIER_SLOT, CHANCE_AGREEMENT)  # size_a, empty, chance


def scores(
    query: Any = QUERY, others: Any = None, size_a: Any = 100, empty: Any = 255, chance: Any = 0.01
) -> Any:
    return sketch.scores(query, candidates() if others is None else others, size_a, empty, chance)


def rank(
    query: Any = QUERY,
    others: Any = None,
    size_a: Any = 100,
    empty: Any = 255,
    chance: Any = 0.01,
    top: Any = 5,
) -> Any:
    return sketch.rank(
        query, candidates() if others is None else others, size_a, empty, chance, top, 0.8, 0.5
    )


def anchors(points: Any, k: Any = 24, window: Any = 200, most: Any = 1024) -> Any:
    return sketch.anchors(points, k, window, 7, most)


def sign_row(count: int = 40, bins: int = 64, num_perm: int = 16, anchors: bool = True) -> tuple[Any, ...]:
    """One text's row of sign_batch: its points, the buffers finish writes, whether anchors are wanted."""
    signature, verifier = np.empty(num_perm, dtype=np.uint64), np.empty(bins, dtype=np.uint8)
    return units(count, np.uint32), signature, verifier, anchors


def sign_batch(
    rows: Any = None,
    num_perm: Any = 16,
    empty_slot: Any = 255,
    anchor_k: Any = 24,
    window: Any = 200,
    most: Any = 1024,
) -> Any:
    rows = [sign_row()] if rows is None else rows
    return sketch.sign_batch(rows, 5, 7, num_perm, EMPTY_SLOT, empty_slot, anchor_k, window, 9, most)


def waited_twice() -> None:
    batch = sign_batch()
    batch.wait()
    batch.wait()


BAD_CALLS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # sign_batch(rows, k, seed_key, num_perm, empty, empty_slot, anchor_k, window, anchor_seed, most)
    ("sign_batch-rows-int", lambda: sign_batch(rows=3), TypeError, ""),
    ("sign_batch-row-short", lambda: sign_batch(rows=[sign_row()[:3]]), TypeError, ""),
    ("sign_batch-units-fewer-than-k", lambda: sign_batch(rows=[sign_row(count=4)]), ValueError, "at least k"),
    ("sign_batch-units-ragged", lambda: sign_batch(rows=[(tail(9), *sign_row()[1:])]), ValueError, "units"),
    ("sign_batch-signature-short", lambda: sign_batch(num_perm=32), ValueError, "signature"),
    (
        "sign_batch-signature-readonly",
        lambda: sign_batch(rows=[(*sign_row()[:1], bytes(128), *sign_row()[2:])]),
        TypeError,
        "",
    ),
    ("sign_batch-verifier-ragged", lambda: sign_batch(rows=[sign_row(bins=63)]), ValueError, "num_perm"),
    ("sign_batch-verifier-empty", lambda: sign_batch(rows=[sign_row(bins=0)]), ValueError, "bins"),
    (
        "sign_batch-verifier-unequal",
        lambda: sign_batch(rows=[sign_row(), sign_row(bins=32)]),
        ValueError,
        "every row",
    ),
    ("sign_batch-anchor_k-zero", lambda: sign_batch(anchor_k=0), ValueError, "anchor_k"),
    ("sign_batch-window-wide", lambda: sign_batch(window=256), ValueError, "window"),
    ("sign_batch-most-negative", lambda: sign_batch(most=-1), ValueError, "most"),
    ("sign_batch-empty_slot-past", lambda: sign_batch(empty_slot=256), ValueError, "empty_slot"),
    ("SignBatch.wait-twice", waited_twice, ValueError, "waited for already"),
    # anchors(points, k, window, seed_key, most)
    ("anchors-points-fewer-than-k", lambda: anchors(np.zeros(10, np.uint32)), ValueError, "at least k"),
    ("anchors-points-ragged", lambda: anchors(memoryview(bytes(4 * 30 + 2))), ValueError, "uint32"),
    ("anchors-k-zero", lambda: anchors(np.zeros(30, np.uint32), k=0), ValueError, "k must"),
    ("anchors-window-zero", lambda: anchors(np.zeros(30, np.uint32), window=0), ValueError, "window"),
    ("anchors-window-wide", lambda: anchors(np.zeros(30, np.uint32), window=256), ValueError, "window"),
    ("anchors-most-negative", lambda: anchors(np.zeros(30, np.uint32), most=-1), ValueError, "most"),
    # oph_minima(units, k, seed_key, minima[, width])
    ("oph_minima-units-empty", lambda: sketch.oph_minima(b"", 1, 7, minima()), ValueError, "units"),
    ("oph_minima-units-empty-tail", lambda: sketch.oph_minima(tail(0), 1, 7, minima()), ValueError, "units"),
    ("oph_minima-units-ragged", lambda: sketch.oph_minima(b"\1" * 43, 5, 7, minima()), ValueError, "units"),
    (
        "oph_minima-units-ragged-u32",
        lambda: sketch.oph_minima(b"\1" * 22, 5, 7, minima(), 4),
        ValueError,
        "units",
    ),
    (
        "oph_minima-units-fewer-than-k",
        lambda: sketch.oph_minima(units(4), 5, 7, minima()),
        ValueError,
        "units",
    ),
    ("oph_minima-k-zero", lambda: sketch.oph_minima(units(9), 0, 7, minima()), ValueError, "k must"),
    ("oph_minima-k-negative", lambda: sketch.oph_minima(units(9), -3, 7, minima()), ValueError, "k must"),
    ("oph_minima-width", lambda: sketch.oph_minima(units(9), 5, 7, minima(), 2), ValueError, "width"),
    ("oph_minima-width-zero", lambda: sketch.oph_minima(units(9), 5, 7, minima(), 0), ValueError, "width"),
    ("oph_minima-minima-empty", lambda: sketch.oph_minima(units(9), 5, 7, tail(0)), ValueError, "minima"),
    ("oph_minima-minima-ragged", lambda: sketch.oph_minima(units(9), 5, 7, tail(12)), ValueError, "minima"),
    (
        "oph_minima-minima-too-many",
        lambda: sketch.oph_minima(units(9), 5, 7, minima(65537)),
        ValueError,
        "minima",
    ),
    ("oph_minima-minima-read-only", lambda: sketch.oph_minima(units(9), 5, 7, bytes(64)), TypeError, ""),
    ("oph_minima-units-str", lambda: sketch.oph_minima("abcdefgh", 5, 7, minima()), TypeError, ""),
    ("oph_minima-k-str", lambda: sketch.oph_minima(units(9), "5", 7, minima()), TypeError, ""),
    # finish(wide, num_perm, empty, empty_slot, signature, verifier)
    (
        "finish-wide-empty",
        lambda: sketch.finish(b"", 1, EMPTY_SLOT, 255, tail(8), tail(0)),
        ValueError,
        "wide",
    ),
    (
        "finish-wide-empty-tail",
        lambda: sketch.finish(tail(0), 1, EMPTY_SLOT, 255, tail(8), tail(0)),
        ValueError,
        "wide",
    ),
    (
        "finish-wide-ragged",
        lambda: sketch.finish(tail(20), 1, EMPTY_SLOT, 255, tail(8), tail(2)),
        ValueError,
        "wide",
    ),
    (
        "finish-wide-fewer-than-num_perm",
        lambda: sketch.finish(minima(2), 4, EMPTY_SLOT, 255, tail(32), tail(2)),
        ValueError,
        "wide",
    ),
    (
        "finish-wide-not-a-multiple",
        lambda: sketch.finish(minima(6), 4, EMPTY_SLOT, 255, tail(32), tail(6)),
        ValueError,
        "wide",
    ),
    (
        "finish-num_perm-zero",
        lambda: sketch.finish(minima(8), 0, EMPTY_SLOT, 255, tail(0), tail(8)),
        ValueError,
        "num_perm",
    ),
    (
        "finish-num_perm-negative",
        lambda: sketch.finish(minima(8), -2, EMPTY_SLOT, 255, tail(8), tail(8)),
        ValueError,
        "num_perm",
    ),
    (
        "finish-num_perm-overflowing",
        lambda: sketch.finish(minima(8), 2**61, EMPTY_SLOT, 255, tail(0), tail(8)),
        ValueError,
        "wide",
    ),
    (
        "finish-signature-short",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, 255, tail(24), tail(8)),
        ValueError,
        "signature",
    ),
    (
        "finish-signature-long",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, 255, tail(40), tail(8)),
        ValueError,
        "signature",
    ),
    (
        "finish-verifier-short",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, 255, tail(32), tail(7)),
        ValueError,
        "verifier",
    ),
    (
        "finish-verifier-long",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, 255, tail(32), tail(9)),
        ValueError,
        "verifier",
    ),
    (
        "finish-empty_slot-high",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, 256, tail(32), tail(8)),
        ValueError,
        "empty_slot",
    ),
    (
        "finish-empty_slot-negative",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, -1, tail(32), tail(8)),
        ValueError,
        "empty_slot",
    ),
    (
        "finish-signature-read-only",
        lambda: sketch.finish(minima(8), 4, EMPTY_SLOT, 255, bytes(32), tail(8)),
        TypeError,
        "",
    ),
    ("finish-wide-none", lambda: sketch.finish(None, 4, EMPTY_SLOT, 255, tail(32), tail(8)), TypeError, ""),
    # band_keys(signature, bands, rows)
    ("band_keys-signature-empty", lambda: sketch.band_keys(tail(0), 1, 1), ValueError, "signature"),
    ("band_keys-signature-ragged", lambda: sketch.band_keys(tail(12), 1, 1), ValueError, "signature"),
    ("band_keys-signature-short", lambda: sketch.band_keys(minima(24), 5, 5), ValueError, "signature"),
    ("band_keys-rows-overflowing", lambda: sketch.band_keys(minima(24), 8, 2**61), ValueError, "signature"),
    ("band_keys-bands-negative", lambda: sketch.band_keys(minima(24), -1, 5), ValueError, "bands"),
    ("band_keys-bands-too-many", lambda: sketch.band_keys(minima(24), 65536, 1), ValueError, "bands"),
    ("band_keys-rows-zero", lambda: sketch.band_keys(minima(24), 4, 0), ValueError, "rows"),
    ("band_keys-signature-list", lambda: sketch.band_keys([1, 2, 3], 1, 1), TypeError, ""),
    # collapse_spaces(points, is_space, out)
    (
        "collapse_spaces-points-ragged",
        lambda: sketch.collapse_spaces(tail(7), tail(33), tail(8)),
        ValueError,
        "points",
    ),
    (
        "collapse_spaces-out-ragged",
        lambda: sketch.collapse_spaces(tail(8), tail(33), tail(9)),
        ValueError,
        "out",
    ),
    (
        "collapse_spaces-out-short",
        lambda: sketch.collapse_spaces(tail(8), tail(33), tail(4)),
        ValueError,
        "out",
    ),
    (
        "collapse_spaces-out-empty",
        lambda: sketch.collapse_spaces(tail(4), tail(33), tail(0)),
        ValueError,
        "out",
    ),
    (
        "collapse_spaces-out-read-only",
        lambda: sketch.collapse_spaces(tail(8), tail(33), bytes(8)),
        TypeError,
        "",
    ),
    ("collapse_spaces-is_space-none", lambda: sketch.collapse_spaces(tail(8), None, tail(8)), TypeError, ""),
    # scores(query, others, size_a, empty, chance)
    ("scores-verifier-longer", lambda: scores(query=QUERY[:-1]), ValueError, "verifier"),
    ("scores-verifier-empty-query", lambda: scores(query=tail(0)), ValueError, "verifier"),
    ("scores-size_a-negative", lambda: scores(size_a=-1), ValueError, "size_a"),
    ("scores-empty-high", lambda: scores(empty=256), ValueError, "empty"),
    ("scores-empty-negative", lambda: scores(empty=-1), ValueError, "empty"),
    ("scores-chance-one", lambda: scores(chance=1.0), ValueError, "chance"),
    ("scores-chance-negative", lambda: scores(chance=-0.5), ValueError, "chance"),
    ("scores-chance-nan", lambda: scores(chance=float("nan")), ValueError, "chance"),
    (
        "scores-shingle_count-negative",
        lambda: scores(others=[SimpleNamespace(verifier=QUERY, shingle_count=-1)]),
        ValueError,
        "shingle_count",
    ),
    (
        "scores-shingle_count-overflowing",
        lambda: scores(size_a=10, others=[SimpleNamespace(verifier=QUERY, shingle_count=2**63 - 5)]),
        ValueError,
        "shingle_count",
    ),
    ("scores-others-int", lambda: scores(others=5), TypeError, "others"),
    ("scores-others-set", lambda: scores(others={1, 2}), TypeError, "others"),
    ("scores-query-str", lambda: scores(query="abc"), TypeError, ""),
    (
        "scores-verifier-not-a-buffer",
        lambda: scores(others=[SimpleNamespace(verifier=[1] * 64, shingle_count=5)]),
        TypeError,
        "",
    ),
    (
        "scores-no-shingle_count",
        lambda: scores(others=[SimpleNamespace(verifier=QUERY)]),
        AttributeError,
        "shingle_count",
    ),
    # rank(query, others, size_a, empty, chance, top, threshold, containment)
    ("rank-verifier-longer", lambda: rank(query=QUERY[:-1]), ValueError, "verifier"),
    ("rank-size_a-negative", lambda: rank(size_a=-1), ValueError, "size_a"),
    ("rank-empty-high", lambda: rank(empty=300), ValueError, "empty"),
    ("rank-chance-one", lambda: rank(chance=1.0), ValueError, "chance"),
    ("rank-chance-nan", lambda: rank(chance=float("nan")), ValueError, "chance"),
    ("rank-top-negative", lambda: rank(top=-1), ValueError, "top"),
    ("rank-width-odd", lambda: sketch.rank(QUERY, [], 5, 0, 0.0, 3, 0.8, -1.0, 3), ValueError, "width"),
    (
        "rank-width-ragged",
        lambda: sketch.rank(QUERY[:12], [], 5, 0, 0.0, 3, 0.8, -1.0, 8),
        ValueError,
        "slots",
    ),
    ("scores-width-zero", lambda: sketch.scores(QUERY, [], 5, 0, 0.0, 0), ValueError, "width"),
    (
        "rank-shingle_count-negative",
        lambda: rank(others=[SimpleNamespace(verifier=QUERY, shingle_count=-1, seq=0)]),
        ValueError,
        "shingle_count",
    ),
    ("rank-others-int", lambda: rank(others=5), TypeError, "others"),
    ("rank-query-none", lambda: rank(query=None), TypeError, ""),
    (
        "rank-no-seq",
        lambda: rank(others=[SimpleNamespace(verifier=QUERY, shingle_count=5)]),
        AttributeError,
        "seq",
    ),
    # merge_buckets(buckets, count)
    ("merge_buckets-count-negative", lambda: sketch.merge_buckets([bytes(8)], -1), ValueError, "count"),
    (
        "merge_buckets-bucket-ragged",
        lambda: sketch.merge_buckets([bytes(8), bytes(7)], 5),
        ValueError,
        "buckets",
    ),
    ("merge_buckets-bucket-str", lambda: sketch.merge_buckets(["abcdefgh"], 5), ValueError, "buckets"),
    (
        "merge_buckets-bucket-bytearray",
        lambda: sketch.merge_buckets([bytearray(8)], 5),
        ValueError,
        "buckets",
    ),
    ("merge_buckets-buckets-int", lambda: sketch.merge_buckets(5, 5), TypeError, "buckets"),
    ("merge_buckets-count-str", lambda: sketch.merge_buckets([bytes(8)], "5"), TypeError, ""),
    # count_postings(lists, width, full, need, top)
    (
        "count_postings-width-zero",
        lambda: sketch.count_postings([bytes(6)], 0, 192, 2, 4),
        ValueError,
        "width",
    ),
    (
        "count_postings-width-wide",
        lambda: sketch.count_postings([bytes(6)], 9, 192, 2, 4),
        ValueError,
        "width",
    ),
    (
        "count_postings-need-negative",
        lambda: sketch.count_postings([bytes(6)], 6, 192, -1, 4),
        ValueError,
        "need",
    ),
    (
        "count_postings-top-negative",
        lambda: sketch.count_postings([bytes(6)], 6, 192, 2, -1),
        ValueError,
        "top",
    ),
    (
        "count_postings-list-ragged",
        lambda: sketch.count_postings([bytes(6), bytes(7)], 6, 192, 2, 4),
        ValueError,
        "lists",
    ),
    ("count_postings-list-str", lambda: sketch.count_postings(["abcdef"], 6, 192, 2, 4), ValueError, "lists"),
    ("count_postings-lists-int", lambda: sketch.count_postings(5, 6, 192, 2, 4), TypeError, "lists"),
    ("count_postings-top-str", lambda: sketch.count_postings([bytes(6)], 6, 192, 2, "4"), TypeError, ""),
    # passages(mine, other, k, gap, shift, repeats, limit)
    (
        "passages-mine-ragged",
        lambda: sketch.passages(bytes(6), bytes(5), 24, 424, 48, 4, 3),
        ValueError,
        "mine",
    ),
    (
        "passages-other-ragged",
        lambda: sketch.passages(bytes(5), bytes(9), 24, 424, 48, 4, 3),
        ValueError,
        "other",
    ),
    ("passages-k-negative", lambda: sketch.passages(bytes(5), bytes(5), -1, 424, 48, 4, 3), ValueError, "k"),
    (
        "passages-gap-negative",
        lambda: sketch.passages(bytes(5), bytes(5), 24, -1, 48, 4, 3),
        ValueError,
        "gap",
    ),
    (
        "passages-shift-zero",
        lambda: sketch.passages(bytes(5), bytes(5), 24, 424, 0, 4, 3),
        ValueError,
        "shift",
    ),
    (
        "passages-repeats-zero",
        lambda: sketch.passages(bytes(5), bytes(5), 24, 424, 48, 0, 3),
        ValueError,
        "repeats",
    ),
    (
        "passages-limit-negative",
        lambda: sketch.passages(bytes(5), bytes(5), 24, 424, 48, 4, -1),
        ValueError,
        "limit",
    ),
    ("passages-mine-str", lambda: sketch.passages("abcde", bytes(5), 24, 424, 48, 4, 3), TypeError, ""),
    # posting_keys(anchors, prefix)
    ("posting_keys-anchors-ragged", lambda: sketch.posting_keys(bytes(7), b"n"), ValueError, "anchors"),
    ("posting_keys-prefix-long", lambda: sketch.posting_keys(bytes(5), bytes(65)), ValueError, "prefix"),
    ("posting_keys-anchors-str", lambda: sketch.posting_keys("abcde", b"n"), TypeError, ""),
    # leave_entries(names, stored, entry, masked, full, into, sizes)
    (
        "leave_entries-entry-empty",
        lambda: sketch.leave_entries([b"b"], [None], b"", False, 0, {}, None),
        ValueError,
        "entry",
    ),
    (
        "leave_entries-stored-ragged",
        lambda: sketch.leave_entries([b"b"], [bytes(12)], bytes(8), False, 0, {}, None),
        ValueError,
        "whole entries",
    ),
    (
        "leave_entries-lengths-differ",
        lambda: sketch.leave_entries([b"b", b"c"], [None], bytes(8), False, 0, {}, None),
        ValueError,
        "as long",
    ),
    (
        "leave_entries-full-negative",
        lambda: sketch.leave_entries([b"b"], [None], bytes(8), False, -1, {}, None),
        ValueError,
        "full",
    ),
    (
        "leave_entries-sizes-dict",
        lambda: sketch.leave_entries([b"b"], [None], bytes(8), False, 0, {}, {}),
        ValueError,
        "sizes",
    ),
    (
        "leave_entries-name-str",
        lambda: sketch.leave_entries(["b"], [bytes(8)], bytes(8), False, 0, {}, None),
        ValueError,
        "names",
    ),
    # join_postings(names, lists, entry, full, into)
    (
        "join_postings-entry-empty",
        lambda: sketch.join_postings([b"n"], [None], b"", 10, {}),
        ValueError,
        "entry",
    ),
    (
        "join_postings-full-zero",
        lambda: sketch.join_postings([b"n"], [None], bytes(5), 0, {}),
        ValueError,
        "full",
    ),
    (
        "join_postings-lists-short",
        lambda: sketch.join_postings([b"n", b"m"], [None], bytes(5), 10, {}),
        ValueError,
        "as long",
    ),
    (
        "join_postings-list-str",
        lambda: sketch.join_postings([b"n"], ["ab"], bytes(5), 10, {}),
        ValueError,
        "lists",
    ),
    (
        "join_postings-name-str",
        lambda: sketch.join_postings(["n"], [None], bytes(5), 10, {}),
        ValueError,
        "names",
    ),
    (
        "join_postings-into-list",
        lambda: sketch.join_postings([b"n"], [None], bytes(5), 10, []),
        TypeError,
        "",
    ),
    ("join_postings-names-int", lambda: sketch.join_postings(5, [None], bytes(5), 10, {}), TypeError, ""),
    # varints(data, position, count)
    ("varints-position-negative", lambda: sketch.varints(b"\x01", -1, 1), ValueError, "position"),
    ("varints-position-past", lambda: sketch.varints(b"\x01", 2, 0), ValueError, "position"),
    ("varints-count-negative", lambda: sketch.varints(b"\x01", 0, -1), ValueError, "count"),
    ("varints-count-past", lambda: sketch.varints(b"\x01\x02", 1, 2), ValueError, "count"),
    ("varints-runs-past-the-end", lambda: sketch.varints(b"\x01\x81", 0, 2), ValueError, "end of data"),
    ("varints-past-64-bits", lambda: sketch.varints(b"\xff" * 10 + b"\x01", 0, 1), ValueError, "64 bits"),
    ("varints-data-str", lambda: sketch.varints("\x01", 0, 1), TypeError, ""),
    # join_buckets(names, buckets, entry, limit, into, sizes)
    (
        "join_buckets-entry-empty",
        lambda: sketch.join_buckets([b"b"], [None], b"", 8, {}, [0]),
        ValueError,
        "entry",
    ),
    (
        "join_buckets-limit-short",
        lambda: sketch.join_buckets([b"b"], [None], bytes(8), 4, {}, [0]),
        ValueError,
        "limit",
    ),
    (
        "join_buckets-limit-ragged",
        lambda: sketch.join_buckets([b"b"], [None], bytes(8), 12, {}, [0]),
        ValueError,
        "limit",
    ),
    (
        "join_buckets-ragged",
        lambda: sketch.join_buckets([b"b"], [tail(7)], bytes(8), 16, {}, [0]),
        ValueError,
        "buckets",
    ),
    (
        "join_buckets-bucket-bytes-ragged",
        lambda: sketch.join_buckets([b"b"], [bytes(7)], bytes(8), 16, {}, [0]),
        ValueError,
        "whole",
    ),
    (
        "join_buckets-short",
        lambda: sketch.join_buckets([b"b", b"c"], [None], bytes(8), 8, {}, [0]),
        ValueError,
        "as long",
    ),
    (
        "join_buckets-name-str",
        lambda: sketch.join_buckets(["b"], [None], bytes(8), 8, {}, [0]),
        ValueError,
        "names",
    ),
    (
        "join_buckets-sizes-str",
        lambda: sketch.join_buckets([b"b"], [None], bytes(8), 8, {}, ["0"]),
        ValueError,
        "sizes",
    ),
    (
        "join_buckets-sizes-tuple",
        lambda: sketch.join_buckets([b"b"], [None], bytes(8), 8, {}, (0,)),
        TypeError,
        "",
    ),
    (
        "join_buckets-into-list",
        lambda: sketch.join_buckets([b"b"], [None], bytes(8), 8, [], [0]),
        TypeError,
        "",
    ),
    # pack_changes(changes), split_changes(changes, prefixes); HeldTable's apply(data), get_many(keys)
    ("pack_changes-key-long", lambda: sketch.pack_changes({bytes(256): None}), ValueError, "changes"),
    ("pack_changes-key-str", lambda: sketch.pack_changes({"k": None}), ValueError, "changes"),
    ("pack_changes-value-int", lambda: sketch.pack_changes({b"k": 1}), ValueError, "changes"),
    ("pack_changes-changes-list", lambda: sketch.pack_changes([(b"k", None)]), TypeError, ""),
    ("split_changes-changes-list", lambda: sketch.split_changes([(b"k", None)], b"k"), TypeError, ""),
    ("split_changes-prefixes-str", lambda: sketch.split_changes({}, "k"), TypeError, ""),
    ("split_changes-key-long", lambda: sketch.split_changes({b"k" * 256: b""}, b"k"), ValueError, "changes"),
    ("HeldTable.apply-data-empty-tail", lambda: Table().apply(tail(0)), ValueError, "count"),
    ("HeldTable.apply-data-short-tail", lambda: Table().apply(tail(3)), ValueError, "count"),
    ("HeldTable.apply-count-past", lambda: Table().apply(b"\0\0\0\2" + bytes(9)), ValueError, "count"),
    ("HeldTable.apply-lengths-past", lambda: Table().apply(packed_tail(-1)), ValueError, "lengths"),
    ("HeldTable.apply-data-str", lambda: Table().apply("abcd"), TypeError, ""),
    ("HeldTable.get_many-keys-tuple", lambda: Table().get_many((b"k",)), TypeError, ""),
    # encode_record(article), verdict_json(article, params, latency_ms): test_codec.py has the rest
    ("encode_record-article-none", lambda: sketch.encode_record(None), AttributeError, "decision"),
    ("verdict_json-article-none", lambda: sketch.verdict_json(None, b"{}", None), AttributeError, ""),
    ("verdict_json-params-str", lambda: sketch.verdict_json(None, "{}", None), TypeError, ""),
    # decide_fresh(items, seq, context): test_fresh_run.py has the rest
    ("decide_fresh-items-tuple", lambda: sketch.decide_fresh((), 0, ()), TypeError, ""),
    ("decide_fresh-context-short", lambda: sketch.decide_fresh([], 0, ()), TypeError, ""),
    # signed_record(data, signed_type, provenance_type): test_wire.py has the rest
    ("signed_record-data-str", lambda: sketch.signed_record("S6", tuple, tuple), TypeError, ""),
    (
        "signed_record-type-not-tuple",
        lambda: sketch.signed_record(b"S6", dict, tuple),
        TypeError,
        "tuple types",
    ),
    # _shard.c's rules: test_shard_rules.py has the rest
    ("input_key-provenance-short", lambda: sketch.input_key(("t", 0)), TypeError, "4-tuple"),
    ("replayed-inputs-list", lambda: sketch.replayed(("t", 0, 1, None), 1, 0, []), TypeError, ""),
    ("replayed-offset-str", lambda: sketch.replayed(("t", 0, "1", None), 1, 0, {}), TypeError, ""),
    ("latency_ms-timestamp-str", lambda: sketch.latency_ms("1", 2.0), TypeError, ""),
    ("mark-memory-short", lambda: sketch.mark(tail(23), 1, 1, False), ValueError, "24 bytes"),
    ("marked-memory-short", lambda: sketch.marked(tail(23)), ValueError, "24 bytes"),
    ("mark_deciding-index-past", lambda: sketch.mark_deciding(tail(24), 1, [0], 1), IndexError, ""),
    ("signed_records-message-str", lambda: sketch.signed_records("SP", tuple, tuple, None, 0), TypeError, ""),
    (
        "signed_records-memory-short",
        lambda: sketch.signed_records(b"SP\0\0\0\1\0\0\0\0", tuple, tuple, tail(8), 0),
        ValueError,
        "24 bytes",
    ),
    ("fresh_rows-shell-short", lambda: sketch.fresh_rows([], ()), TypeError, ""),
    (
        "fresh_rows-item-short",
        lambda: sketch.fresh_rows([("a",)], (tuple, 0, 0, {}, None, 0.0, 0, 0, None, 1, 1)),
        TypeError,
        "12 fields",
    ),
    ("fresh_results-shell-short", lambda: sketch.fresh_results([], [], [], ()), TypeError, ""),
    (
        "fresh_results-written-past",
        lambda: sketch.fresh_results(
            [], ([], []), [(b"r", b"v", "unique", False)], ((None,) * 11, None, None, None, 0, b"a", b"d")
        ),
        TypeError,
        "template",
    ),
    (
        "fresh_results-keys-short",
        lambda: sketch.fresh_results([], ([()], []), [], ((None,) * 11, None, None, None, 0, b"a", b"d")),
        TypeError,
        "a key per row",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "match"), [case[1:] for case in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_arguments_raise(call: Callable[[], Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match or None):
        call()


def test_every_entry_point_has_bad_calls() -> None:
    assert {case[0].split("-")[0].split(".")[0] for case in BAD_CALLS} == ENTRY_POINTS


def test_a_rejected_call_leaves_its_outputs_untouched() -> None:
    """The checks come before the first write."""
    signature, verifier = np.zeros(4, dtype=np.uint64), np.zeros(7, dtype=np.uint8)
    with pytest.raises(ValueError, match="verifier"):
        sketch.finish(minima(8), 4, EMPTY_SLOT, 255, signature, verifier)
    out = np.zeros(3, dtype=np.uint32)
    with pytest.raises(ValueError, match="out"):
        sketch.collapse_spaces(np.array([65, 32, 66, 67], dtype=np.uint32), np.ones(40, dtype=bool), out)
    assert not signature.any() and not verifier.any() and not out.any()


# Misaligned but valid: the same results as aligned buffers.


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32])
def test_oph_minima_reads_misaligned_units_and_minima(dtype: type) -> None:
    points = units(300, dtype)
    width = np.dtype(dtype).itemsize
    aligned = minima(64)
    distinct = sketch.oph_minima(points, 5, 0x1234, aligned, width)
    shifted = misaligned(minima(64))
    assert sketch.oph_minima(misaligned(points), 5, 0x1234, shifted, width) == distinct
    assert np.array_equal(shifted, aligned) and int(np.count_nonzero(aligned != EMPTY_SLOT)) > 32


def test_collapse_spaces_with_a_short_or_empty_table() -> None:
    """A code point past the table is no space (its first entry, U+0000, is read for it); an
    empty table makes nothing a space, and is never read past."""
    points = np.array([32, 65, 32, 32, 0x3000, 66, 9, 32], dtype=np.uint32)
    table = np.zeros(33, dtype=bool)
    table[[9, 32]] = True
    out = np.zeros(points.size, dtype=np.uint32)
    length = sketch.collapse_spaces(points, table, out)
    assert out[:length].tolist() == [65, 32, 0x3000, 66]
    length = sketch.collapse_spaces(misaligned(points), tail(0), out)
    assert out[:length].tolist() == points.tolist()[:-1], "unchanged, but for the space that ends it"


def test_oph_minima_at_the_smallest_sizes() -> None:
    """Exactly k units and a single bin: one window, read to its last unit."""
    one_bin = tail(8)
    one_bin[:] = np.full(1, EMPTY_SLOT, dtype=np.uint64).tobytes()
    assert sketch.oph_minima(misaligned(units(5)), 5, 3, one_bin) == 1
    assert np.frombuffer(one_bin, dtype=np.uint64)[0] != EMPTY_SLOT


def test_finish_reads_and_writes_misaligned_buffers() -> None:
    rng = np.random.default_rng(3)
    wide = rng.integers(0, 2**64 - 1, 512, dtype=np.uint64)
    wide[::7] = EMPTY_SLOT
    wide[::11] |= np.uint64(0xFF)  # low bits as the empty verifier slot's
    signature, verifier = np.empty(128, dtype=np.uint64), np.empty(512, dtype=np.uint8)
    unfilled = sketch.finish(wide, 128, EMPTY_SLOT, EMPTY_VERIFIER_SLOT, signature, verifier)
    out_signature, out_verifier = misaligned(signature), misaligned(verifier)
    args = (misaligned(wide), 128, EMPTY_SLOT, EMPTY_VERIFIER_SLOT, out_signature, out_verifier)
    assert sketch.finish(*args) == unfilled
    assert np.array_equal(out_signature, signature) and np.array_equal(out_verifier, verifier)
    assert np.array_equal(signature, wide.reshape(128, 4).min(axis=1))


def test_finish_with_one_bin() -> None:
    signature, verifier = tail(8), tail(1)
    assert (
        sketch.finish(np.array([EMPTY_SLOT], dtype=np.uint64), 1, EMPTY_SLOT, 255, signature, verifier) == 1
    )
    assert sketch.finish(np.array([0x1FF], dtype=np.uint64), 1, EMPTY_SLOT, 255, signature, verifier) == 0
    assert bytes(verifier) == b"\xfe" and np.frombuffer(signature, dtype=np.uint64)[0] == 0x1FF


def test_band_keys_read_a_misaligned_signature() -> None:
    signature = np.random.default_rng(8).integers(0, 2**64, 128, dtype=np.uint64)
    keys = sketch.band_keys(signature, 25, 5)
    assert len(keys) == 25 and sketch.band_keys(misaligned(signature), 25, 5) == keys
    assert sketch.band_keys(misaligned(signature[:125]), 25, 5) == keys  # exactly bands * rows slots
    assert sketch.band_keys(tail(0), 0, 5) == []


def test_collapse_spaces_reads_and_writes_misaligned_buffers() -> None:
    text = "  a  b\t\tc d \u3000 e  "
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    is_space = np.zeros(0x3001, dtype=bool)
    is_space[[9, 32, 0x3000]] = True
    out = np.empty(points.size, dtype=np.uint32)
    length = sketch.collapse_spaces(points, is_space, out)
    assert out[:length].tobytes().decode("utf-32-le") == "a b c d e"
    shifted = misaligned(np.zeros(points.size, dtype=np.uint32))
    assert sketch.collapse_spaces(misaligned(points), misaligned(is_space), shifted) == length
    assert np.array_equal(shifted[:length], out[:length])
    assert sketch.collapse_spaces(tail(0), is_space, tail(0)) == 0


def test_scores_and_rank_read_a_query_at_any_offset() -> None:
    others = candidates(6)
    others[2].verifier = misaligned(others[2].verifier)
    expected = sketch.scores(QUERY, candidates(6), *SCORING)
    assert sketch.scores(misaligned(QUERY), others, *SCORING) == expected
    assert max(np.frombuffer(expected[0], dtype=np.float64)) > 0  # figures, not all zero
    args = (*SCORING, 4, 0.5, 0.1)
    assert sketch.rank(misaligned(QUERY), others, *args) == sketch.rank(QUERY, candidates(6), *args)


class _Changing:
    """A candidate that, when its verifier is read, changes the list of candidates it is in: puts a
    plain copy of itself in its place (dropping the list's reference to it), or empties the list."""

    def __init__(self, owner: list[Any], index: int, verifier: np.ndarray, empty_the_list: bool) -> None:
        self.owner, self.index, self.empty_the_list = owner, index, empty_the_list
        self._verifier, self.shingle_count, self.seq = verifier, 50 + index, index

    @property
    def verifier(self) -> np.ndarray:
        if self.empty_the_list:
            self.owner.clear()
        else:
            self.owner[self.index] = SimpleNamespace(
                verifier=self._verifier, shingle_count=self.shingle_count, seq=self.seq
            )
        return self._verifier


def _changing_and_plain(empty_the_list: bool) -> tuple[list[Any], list[SimpleNamespace]]:
    rows = [c.verifier for c in candidates(4)]
    plain = [SimpleNamespace(verifier=row, shingle_count=50 + i, seq=i) for i, row in enumerate(rows)]
    changing: list[Any] = []
    changing += [_Changing(changing, i, row, empty_the_list) for i, row in enumerate(rows)]
    return changing, plain


@pytest.mark.parametrize("entry", ["scores", "rank"])
def test_a_candidate_replaced_in_its_list_while_read(entry: str) -> None:
    """The candidate being read is held: the list dropping it (its last reference) does not free it
    under the call."""
    changing, plain = _changing_and_plain(empty_the_list=False)
    extra = (4, 0.5, 0.1) if entry == "rank" else ()
    got = getattr(sketch, entry)(QUERY, changing, *SCORING, *extra)
    assert all(isinstance(c, SimpleNamespace) for c in changing)
    assert got == getattr(sketch, entry)(QUERY, plain, *SCORING, *extra)


@pytest.mark.parametrize("entry", ["scores", "rank"])
def test_a_list_emptied_while_read_raises(entry: str) -> None:
    """Not read past its new end, nor the candidates it dropped."""
    changing, _ = _changing_and_plain(empty_the_list=True)
    extra = (4, 0.5, 0.1) if entry == "rank" else ()
    with pytest.raises(RuntimeError, match="others changed size"):
        getattr(sketch, entry)(QUERY, changing, *SCORING, *extra)
    assert changing == []


def test_merge_buckets_counts_and_repeats() -> None:
    bucket = np.arange(1, 6, dtype=">u8").tobytes()
    assert sketch.merge_buckets([bucket, None, bucket], 0) == []
    assert sketch.merge_buckets([bucket, None, bucket], 3) == [1, 2, 3]
    # a count far above the members: the set is sized by the members
    assert sketch.merge_buckets((bucket,) * 1000, 2**62) == [1, 2, 3, 4, 5]
    assert sketch.merge_buckets([], 10) == []


def test_varints_agree_with_the_reference() -> None:
    from tests.support.reference_records import _varints

    values = (0, 1, 127, 128, 300, 2**32, 2**63 + 5, 2**64 - 1, 16383, 16384)
    data = b"ab" + _varints(values) + b"tail"
    assert sketch.varints(data, 2, len(values)) == reference_state.read_varints(data, 2, len(values))
    assert sketch.varints(data, 2, len(values)) == (values, len(data) - 4)
    assert sketch.varints(memoryview(data)[1:], 1, 3) == ((0, 1, 127), 4)
    assert sketch.varints(b"", 0, 0) == ((), 0)
    for bad in (b"\x80", b"\xff" * 10 + b"\x01"):
        with pytest.raises(ValueError):
            reference_state.read_varints(bad, 0, 1)


def test_anchors_at_any_alignment_are_the_reference_s() -> None:
    points = units(3000, np.uint32) % 50 + 97
    packed = sketch.anchors(misaligned(points), 24, 200, anchors_module._ANCHOR_SEED, 1 << 20)
    reference = reference_anchors.anchors_of(points, 24, 200)
    assert packed == reference.packed and len(reference) > 0
    assert sketch.anchors(points, 24, 200, anchors_module._ANCHOR_SEED, 3) == (
        reference_anchors.packed_anchors(
            reference.hashes[:3], reference_anchors.positions_of(reference)[:3]
        ).packed
    )


def test_passages_keys_and_joins_of_misaligned_buffers_are_the_reference_s() -> None:
    from neardup.state.tables import POSTING

    points = units(3000, np.uint32) % 50 + 97
    found = reference_anchors.anchors_of(points, 24, 200)
    copy = reference_anchors.anchors_of(np.concatenate([points[1500:], points[:1400]]), 24, 200)
    packed = misaligned(np.frombuffer(found.packed, dtype=np.uint8))
    spans = sketch.passages(packed, copy.packed, 24, 424, 48, 4, 3)
    reference = reference_anchors.passages(found, copy, 3)
    assert [anchors_module.Passage(*s) for s in spans] == reference and len(reference) == 2
    assert sketch.posting_keys(packed, POSTING) == reference_state.posting_keys(found)
    into: dict[bytes, bytes] = {}
    assert sketch.join_postings((b"a", b"b"), (None, bytes(5)), bytes(5), 10, into) == (1, 1)
    assert into == {b"a": bytes(5), b"b": bytes(10)}


def test_a_signing_batch_of_misaligned_buffers_gives_what_each_pass_gives() -> None:
    """sign_batch's three passes on its thread give what oph_minima, finish and anchors give for
    each text, buffers at odd addresses included; no anchors for a text too short for one, nor
    where they are not wanted."""
    texts = [units(count, np.uint32) % 50 + 97 for count in (30, 5, 23, 3000, 3000)]
    rows, expected = [], []
    for n, points in enumerate(texts):
        wide, signature, verifier = minima(64), np.empty(16, dtype=np.uint64), np.empty(64, dtype=np.uint8)
        distinct = sketch.oph_minima(points, 5, 7, wide, 4)
        unfilled = sketch.finish(wide, 16, EMPTY_SLOT, 255, signature, verifier)
        wanted = n != 4
        packed = sketch.anchors(points, 24, 200, 9, 1024) if points.size >= 24 and wanted else None
        expected.append((signature, verifier, (distinct, unfilled, packed)))
        shifted = (misaligned(np.zeros(16, np.uint64)), misaligned(np.zeros(64, np.uint8)))
        rows.append((misaligned(points), *shifted, wanted))
    results = sketch.sign_batch(rows, 5, 7, 16, EMPTY_SLOT, 255, 24, 200, 9, 1024).wait()
    for (_, signature, verifier, _), (s, v, outcome), got in zip(rows, expected, results, strict=True):
        assert got == outcome
        assert np.array_equal(signature, s) and np.array_equal(verifier, v)
    assert [len(outcome[2] or b"") // 5 for *_, outcome in expected][:3] == [1, 0, 0]
    assert results[3][2] and results[4][2] is None
    assert sketch.sign_batch([], 5, 7, 16, EMPTY_SLOT, 255, 24, 200, 9, 1024).wait() == []


def test_a_signing_batch_dropped_unwaited_finishes_first() -> None:
    """The thread writes into the rows' buffers: a batch let go without wait() joins it before
    they are released (under AddressSanitizer, a write after their release would abort)."""
    rows = [sign_row(count=3000) for _ in range(8)]
    for row in rows:
        row[1][:] = 0
    batch = sign_batch(rows=rows)
    del batch
    assert all(row[1].any() for row in rows), "every signature written"
