"""neardup.pipeline.order: offsets the consumer went past, and the messages read back for them put
in their place."""

from __future__ import annotations

import pytest

from neardup.pipeline.order import OffsetGap, following_run, in_log_order, offset_gaps


def test_offset_gaps_are_forward_jumps_per_partition() -> None:
    last: dict[tuple[str, int], int] = {("s", 0): 9}
    delivered = [
        (("s", 0), 10),
        (("s", 0), 11),
        (("i", 1), 40),
        (("s", 0), 14),
        (("i", 1), 41),
        (("i", 1), 43),
    ]
    assert offset_gaps(last, delivered) == [OffsetGap(("s", 0), 12, 14), OffsetGap(("i", 1), 42, 43)]
    assert last == {("s", 0): 14, ("i", 1): 43}
    # re-delivery goes back, and a partition seen for the first time has nothing to compare with
    assert offset_gaps(last, [(("s", 0), 3), (("s", 0), 4), (("t", 0), 500)]) == []
    # the first message after the recorded one must be the next
    assert offset_gaps({("s", 0): -1}, [(("s", 0), 1)]) == [OffsetGap(("s", 0), 0, 1)]


def test_messages_read_for_gaps_go_back_where_they_belong() -> None:
    s, i = ("s", 0), ("i", 1)
    gaps = [OffsetGap(s, 3, 5), OffsetGap(s, 7, 9), OffsetGap(i, 3, 4)]
    delivered = [(s, 2, b"c"), (i, 2, b"C"), (s, 5, b"f"), (i, 4, b"E"), (s, 6, b"g"), (s, 9, b"j")]
    read_back = [(s, 8, b"i"), (i, 3, b"D"), (s, 3, b"d"), (s, 7, b"h"), (s, 4, b"e")]
    ordered = in_log_order(delivered, gaps, read_back)
    assert [(p, o, v) for p, o, v in ordered if p == s] == [
        (s, o, bytes([ord("a") + o])) for o in range(2, 10)
    ]
    assert [(p, o, v) for p, o, v in ordered if p == i] == [
        (i, o, bytes([ord("A") + o])) for o in range(2, 5)
    ]
    # each read-back message comes just before the delivered one that revealed its gap
    assert ordered.index((i, 3, b"D")) == ordered.index((i, 4, b"E")) - 1
    # what retention removed is simply absent
    partly = in_log_order(delivered, gaps, [(s, 4, b"e")])
    assert partly == [
        (s, 2, b"c"),
        (i, 2, b"C"),
        (s, 4, b"e"),
        (s, 5, b"f"),
        (i, 4, b"E"),
        (s, 6, b"g"),
        (s, 9, b"j"),
    ]
    with pytest.raises(ValueError, match="fills no gap"):
        in_log_order(delivered, gaps, [(s, 6, b"x")])
    with pytest.raises(ValueError, match="fills no gap"):  # the right offsets, the wrong partition
        in_log_order(delivered, gaps, [(i, 8, b"x")])


def test_the_following_run_starts_right_after_the_last_offset_decided() -> None:
    messages = [(4, "e"), (5, "f"), (6, "g"), (8, "i"), (9, "j")]
    assert following_run(3, messages) == [(4, "e"), (5, "f"), (6, "g")]  # 7 is missing: stop before 8
    assert following_run(4, messages) == [(5, "f"), (6, "g")]  # 4 decided already
    assert following_run(7, messages) == [(8, "i"), (9, "j")]
    assert following_run(9, messages) == []  # all decided already
    assert following_run(2, messages) == []  # 3 comes first, and it is not among them
    assert following_run(-1, [(0, "a")]) == [(0, "a")]
