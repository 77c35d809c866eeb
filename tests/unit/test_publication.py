"""The publication rules (pipeline/publication.py), without a broker: what each decision publishes,
and that the worker, embedded mode and the library render the same rules."""

from __future__ import annotations

import itertools

import pytest

from neardup.pipeline.publication import DELETES, REPLAYS, Feed, Publication, publication

FEED = frozenset({"unique"})
STATUSES = ["new", "redelivered", "replayed", "stale", "deleted", "unknown_delete", "error"]


def rule(
    status: str, kind: str | None, deletion: bool, verdict: bool, feed: bool, again: bool
) -> Publication:
    return publication(
        status,
        kind,
        deletion=deletion,
        has_verdict=verdict,
        feed_kinds=FEED if feed else None,
        replays_republished=again,
    )


@pytest.mark.parametrize(("feed", "again"), list(itertools.product([False, True], [False, True])))
def test_an_error_publishes_its_dead_letter_and_nothing_else(feed: bool, again: bool) -> None:
    assert rule("error", None, False, False, feed, again) == Publication(dead_letter=True)
    assert rule("error", "unique", True, False, feed, again) == Publication(dead_letter=True)


@pytest.mark.parametrize("status", sorted(REPLAYS))
def test_a_replay_is_answered_again_at_least_once_and_never_twice_exactly_once(status: str) -> None:
    assert rule(status, "unique", False, True, True, again=False) == Publication(answered_before=True)
    assert rule(status, "unique", False, True, True, again=True) == Publication(verdict=True, feed=Feed.COPY)
    # a replayed deletion: its removal again, the feed's too (whatever the article was)
    assert rule(status, None, True, False, True, again=True) == Publication(removal=True, feed=Feed.REMOVAL)


@pytest.mark.parametrize("status", sorted(DELETES))
def test_a_deletion_publishes_a_removal_whatever_the_index_held(status: str) -> None:
    for kind in ("unique", "duplicate", None):
        assert rule(status, kind, True, False, feed=False, again=True) == Publication(removal=True)


def test_the_feed_drops_an_id_unless_it_never_carried_the_article() -> None:
    assert rule("deleted", "unique", True, False, True, True).feed is Feed.REMOVAL
    assert rule("deleted", "duplicate", True, False, True, True).feed is None  # never fed
    # an id the index does not hold (never seen, or expired): the feed may hold it
    assert rule("unknown_delete", None, True, False, True, True).feed is Feed.REMOVAL


def test_a_verdict_is_published_and_fed_by_its_kind() -> None:
    for status in ("new", "redelivered"):
        assert rule(status, "unique", False, True, True, True) == Publication(verdict=True, feed=Feed.COPY)
        assert rule(status, "duplicate", False, True, True, True) == Publication(verdict=True)
        assert rule(status, "unique", False, True, False, True) == Publication(verdict=True)
    assert rule("new", None, False, False, True, True) == Publication()  # nothing to publish


def test_every_status_has_a_rule() -> None:
    """No status falls through to publishing nothing by accident: each publishes something, or
    is a replay already answered."""
    for status in STATUSES:
        deletion = status in DELETES
        what = rule(status, "unique", deletion, not deletion and status != "error", True, False)
        assert what != Publication(), status
