"""A batch of decisions turned into what it publishes (pipeline/publication.py batch_publication),
without a broker: the records per output, in the decisions' order, and what they count."""

from __future__ import annotations

from neardup.pipeline.publication import BatchPublication, Undecided, batch_publication
from neardup.pipeline.shard import WHOLE_MESSAGE, Decided
from neardup.pipeline.wire import encode_signed, pack_signed, with_original
from tests.support.signing import signed

FEED = frozenset({"unique"})
NOT_A_MESSAGE = [(10, b"not a signatures message")]  # read only for a copy to the feed or an error


def batch(*entries: Decided, feed: bool = False, again: bool = True) -> BatchPublication:
    return batch_publication(
        entries, NOT_A_MESSAGE, feed_kinds=FEED if feed else None, replays_republished=again
    )


def verdict(article_id: str, status: str = "new", kind: str = "unique", expired: int = 0) -> Decided:
    return Decided(10, article_id, status, b"{}", kind, 250.0, expired=expired, record=0)


def test_verdicts_and_removals_keyed_by_article_in_their_order() -> None:
    deletion = Decided(11, "a", "deleted", kind="duplicate", deletion=True)
    unknown = Decided(12, "z", "unknown_delete", deletion=True)
    out = batch(verdict("a", kind="duplicate", expired=2), verdict("b"), deletion, unknown)
    assert out.verdicts == [(b"a", b"{}"), (b"b", b"{}"), (b"a", None), (b"z", None)]
    assert out.counts == {
        ("verdicts", "duplicate"): 1,
        ("verdicts", "unique"): 1,
        ("deletes", "deleted"): 1,
        ("deletes", "unknown_delete"): 1,
    }
    assert out.latencies_s == [0.25, 0.25]
    assert out.expired == 2
    assert (out.feed, out.feed_headers, out.errors) == ([], [], [])


def test_an_error_goes_to_its_dead_letter_and_nowhere_else() -> None:
    error = Decided.failed(10, ValueError("bad"), WHOLE_MESSAGE)  # the message could not be unpacked
    out = batch(error, feed=True)
    assert out == BatchPublication(errors=[(error, Undecided(NOT_A_MESSAGE[0][1], None))])


def test_a_replay_is_published_again_uncounted_at_least_once_and_not_at_all_exactly_once() -> None:
    replayed, stale = verdict("a", "replayed", expired=1), verdict("b", "stale")
    again = batch(replayed, stale)
    assert again.verdicts == [(b"a", b"{}"), (b"b", b"{}")]
    # a replayed verdict was counted when first decided; a stale one is answered anew
    assert again.counts == {("replays", "replayed"): 1, ("replays", "stale"): 1, ("verdicts", "unique"): 1}
    assert again.expired == 1
    once = batch(replayed, stale, again=False)
    assert once == BatchPublication(counts=once.counts)
    assert once.counts == {("replays", "replayed"): 1, ("replays", "stale"): 1}


def test_the_feed_copies_the_input_message_from_the_signatures_message() -> None:
    record = with_original(encode_signed(signed("a", "text")), b'{"id": "a"}', [("id", b"a")])
    messages = [(10, pack_signed([record]))]
    duplicate = verdict("b", kind="duplicate")._replace(offset=11)  # not fed: its message is never read
    removal = Decided(12, "c", "unknown_delete", deletion=True)
    out = batch_publication(
        [verdict("a"), duplicate, removal], messages, feed_kinds=FEED, replays_republished=True
    )
    assert out.feed == [(b"a", b'{"id": "a"}'), (b"c", None)]
    assert out.feed_headers == [(("id", b"a"),), ()]


def test_a_decision_without_an_article_publishes_nothing_but_its_expiries() -> None:
    out = batch(Decided(10, None, "new", expired=3))
    assert out == BatchPublication(expired=3)
