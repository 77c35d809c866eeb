"""Exact measures: seed 001's Jaccard examples as real sets, containment, seed 004's block similarity."""

from __future__ import annotations

import numpy as np
import pytest

from neardup.core.normalize import normalize
from neardup.core.shingle import shingle_set
from neardup.core.similarity import block_similarity, blocks, exact_containment, exact_jaccard


def overlapping_sets(common: int, only_a: int, only_b: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two distinct-sorted uint64 sets sharing exactly `common` elements."""
    rng = np.random.default_rng(seed)
    values = np.unique(rng.integers(0, 2**64, size=4 * (common + only_a + only_b) + 8, dtype=np.uint64))
    values = rng.permutation(values)[: common + only_a + only_b]
    shared, rest = values[:common], values[common:]
    a = np.sort(np.concatenate([shared, rest[:only_a]]))
    b = np.sort(np.concatenate([shared, rest[only_a:]]))
    return a, b


@pytest.mark.parametrize(
    ("common", "only_a", "only_b", "expected"),
    [
        (40, 5, 5, 0.8),  # seed 001: |A∩B| = 40, |A∪B| = 50
        (40, 10, 0, 0.8),  # the same ratio, all the difference on one side
        (10, 45, 45, 0.1),  # seed 001: |A∩B| = 10, |A∪B| = 100
        (10, 90, 0, 0.1),
        (0, 3, 4, 0.0),
        (7, 0, 0, 1.0),
    ],
)
def test_seed_001_jaccard_examples(common: int, only_a: int, only_b: int, expected: float) -> None:
    a, b = overlapping_sets(common, only_a, only_b)
    assert a.size + b.size - common == common + only_a + only_b
    assert exact_jaccard(a, b) == pytest.approx(expected)
    assert exact_jaccard(b, a) == pytest.approx(expected)


def test_jaccard_of_empty_sets() -> None:
    empty = np.empty(0, dtype=np.uint64)
    one = np.array([5], dtype=np.uint64)
    assert exact_jaccard(empty, empty) == 1.0
    assert exact_jaccard(empty, one) == 0.0
    assert exact_jaccard(one, empty) == 0.0


def test_containment_is_directional() -> None:
    a, b = overlapping_sets(30, 0, 70)  # A is inside B
    assert exact_containment(a, b) == 1.0
    assert exact_containment(b, a) == pytest.approx(0.3)
    assert exact_jaccard(a, b) == pytest.approx(0.3)
    empty = np.empty(0, dtype=np.uint64)
    assert exact_containment(empty, empty) == 1.0
    assert exact_containment(empty, a) == 0.0
    assert exact_containment(a, empty) == 0.0


def test_truncated_copy_is_contained(prose: tuple[str, ...]) -> None:
    full = normalize(prose[0])
    head = full[: len(full) * 6 // 10]
    a, b = shingle_set(head), shingle_set(full)
    assert exact_containment(a, b) == 1.0
    assert 0.5 < exact_jaccard(a, b) < 0.7


# Seed 004: a.txt and b.txt, four lines each, "\n" line ends, one trailing newline; b's third line
# has 49 "A" where a's has 48. The seed's tool reports 79.54545454545455% = 35/44.
_LINE_1 = "23l4kj23 klgjdlskgj235 3lkj 0952ru lkfj lkqejfg"
_LINE_2 = "2t34lktj3409t uj34gjklejeglekjfdklsafjalsfj"
_LINE_4 = "sdgakdgjsdalgjaslfjsalkfjsadlf"
SEED_004_A = f"{_LINE_1}\n{_LINE_2}\n{'A' * 48}\n{_LINE_4}\n"
SEED_004_B = f"{_LINE_1}\n{_LINE_2}\n{'A' * 49}\n{_LINE_4}\n"


def test_seed_004_block_similarity_is_35_of_44() -> None:
    assert len(blocks(SEED_004_A)) == 43 and len(blocks(SEED_004_B)) == 44
    assert block_similarity(SEED_004_A, SEED_004_B) == 35 / 44
    assert block_similarity(SEED_004_B, SEED_004_A) == 35 / 44


def test_blocks_pad_the_last_block() -> None:
    assert blocks("abcdefghij") == ["abcd", "efgh", "ij  "]
    assert blocks("abcd") == ["abcd"]
    assert blocks("") == []


def test_block_similarity_edge_cases() -> None:
    assert block_similarity("", "") == 1.0
    assert block_similarity("same text here", "same text here") == 1.0
    assert block_similarity("abcd", "") == 0.0
    assert block_similarity("abcdefgh", "wxyzabcd") == 0.5
    # repeated blocks of the first text are all taken out of the second by their first occurrence
    assert block_similarity("abcdabcd", "abcdabcd") == 1.0
