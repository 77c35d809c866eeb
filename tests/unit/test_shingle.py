"""Shingling: the seed vectors, hashed sets against literal string sets, short and odd texts."""

from __future__ import annotations

import numpy as np
import pytest

from neardup.core.normalize import normalize
from neardup.core.shingle import ShingleOptions, shingle_hashes, shingle_set, shingle_strings
from neardup.core.similarity import exact_jaccard

K3 = ShingleOptions(k=3)


def string_jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def test_seed_000_abcabcac_has_four_3_shingles() -> None:
    text = "abcabcac"
    expected = {"abc", "bca", "cab", "cac"}
    assert shingle_strings(text, 3) == expected
    hashes = shingle_hashes(text, K3)
    assert hashes.size == len(text) - 3 + 1  # six windows, repeats kept
    assert np.unique(hashes).size == 4
    # The hashed set is exactly the hashes of those four strings (each is a single window).
    of_strings = np.unique(np.concatenate([shingle_hashes(s, K3) for s in expected]))
    assert np.array_equal(shingle_set(text, K3), of_strings)


def test_seed_001_the_cat_sat_has_seven_5_shingles() -> None:
    expected = {"the c", "he ca", "e cat", " cat ", "cat s", "at sa", "t sat"}
    assert shingle_strings("the cat sat", 5) == expected
    hashed = shingle_set("the cat sat")
    assert hashed.size == 7
    of_strings = np.unique(np.concatenate([shingle_hashes(s) for s in expected]))
    assert np.array_equal(hashed, of_strings)


def test_window_hash_depends_only_on_window_content() -> None:
    """The hash of "cat s" is the same wherever the window sits: sets from different texts compare."""
    a = shingle_hashes("the cat sat")
    b = shingle_hashes("a cat sat down")
    assert set(a.tolist()) & set(b.tolist()) == set(shingle_hashes("cat sat").tolist()) | set(
        shingle_hashes(" cat ").tolist()
    )


@pytest.mark.parametrize("k", [3, 5, 9])
def test_hashed_sets_match_string_sets_on_prose(prose: tuple[str, ...], k: int) -> None:
    options = ShingleOptions(k)
    texts = [normalize(t) for t in prose]
    for text in texts:
        assert np.unique(shingle_hashes(text, options)).size == len(shingle_strings(text, k))
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = texts[i], texts[j]
            hashed = exact_jaccard(shingle_set(a, options), shingle_set(b, options))
            assert hashed == pytest.approx(string_jaccard(shingle_strings(a, k), shingle_strings(b, k)))
        # a text against an edited copy of itself: a non-trivial overlap
        edited = texts[i].replace("the", "teh")
        hashed = exact_jaccard(shingle_set(texts[i], options), shingle_set(edited, options))
        literal = string_jaccard(shingle_strings(texts[i], k), shingle_strings(edited, k))
        assert 0.0 < literal < 1.0
        assert hashed == pytest.approx(literal)


def test_code_points_beyond_the_bmp_are_single_units() -> None:
    text = "news 😀 ✓ ḂẂ 中文新闻 again 😀 end"
    assert np.unique(shingle_hashes(text)).size == len(shingle_strings(text, 5))
    assert shingle_hashes("😀abcd").size == 1


def test_lone_surrogate_does_not_crash() -> None:
    """A str can hold a lone surrogate (e.g. from surrogateescape decoding); it is just a unit."""
    text = "broken \udcff byte in the middle"
    assert np.unique(shingle_hashes(text)).size == len(shingle_strings(text, 5))


def test_empty_text_has_no_shingles() -> None:
    assert shingle_hashes("").size == 0
    assert shingle_set("").size == 0
    assert shingle_strings("", 5) == set()
    assert shingle_hashes("   ", ShingleOptions(5, "word")).size == 0


def test_text_shorter_than_k_gets_one_whole_text_hash() -> None:
    short = shingle_hashes("cat")
    assert short.size == 1
    assert np.array_equal(shingle_hashes("cat"), short)  # deterministic
    assert not np.array_equal(shingle_hashes("cap"), short)
    # tagged with its length: not the hash of any 5-shingle, nor of other short texts
    assert short[0] not in set(shingle_hashes("the cat sat").tolist())
    lengths = {int(shingle_hashes("a" * n)[0]) for n in range(1, 5)}
    assert len(lengths) == 4
    assert int(shingle_hashes("aaaaa")[0]) not in lengths


def test_exactly_k_characters_is_one_ordinary_shingle() -> None:
    assert shingle_hashes("hello").size == 1
    assert shingle_hashes("hello")[0] in set(shingle_hashes("hello world").tolist())


def test_word_shingles() -> None:
    options = ShingleOptions(2, "word")
    text = "the cat sat on the cat"
    hashes = shingle_hashes(text, options)
    assert hashes.size == 5  # windows of 2 words
    assert np.unique(hashes).size == 4  # "the cat" repeats
    assert shingle_hashes("cat", options).size == 1  # shorter than k words
    assert not np.array_equal(shingle_hashes("cat", options), shingle_hashes("dog", options))


def test_repeated_character_run_is_one_shingle() -> None:
    assert np.unique(shingle_hashes("a" * 1000)).size == 1


@pytest.mark.parametrize(("k", "unit"), [(0, "char"), (65, "char"), (5, "byte")])
def test_invalid_shingle_options(k: int, unit: str) -> None:
    with pytest.raises(ValueError):
        ShingleOptions(k, unit)  # type: ignore[arg-type]


def test_shingle_set_is_sorted_and_distinct(prose: tuple[str, ...]) -> None:
    s = shingle_set(normalize(prose[0]))
    assert s.dtype == np.uint64
    assert np.all(s[1:] > s[:-1])
