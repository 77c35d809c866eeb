"""Event time and the retention window (pure core)."""

from __future__ import annotations

import pytest

from neardup.core.retention import (
    EARLIEST_MS,
    Retention,
    event_time,
    format_duration_ms,
    parse_duration_ms,
    parse_rfc3339_ms,
)

HOUR_MS = 3_600_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30d", 30 * 24 * HOUR_MS),
        ("12h", 12 * HOUR_MS),
        ("90m", 90 * 60_000),
        ("45s", 45_000),
        ("2w", 14 * 24 * HOUR_MS),
        ("0", 0),
        ("15", 15_000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@pytest.mark.parametrize("text", ["", "30 days", "-1d", "d", "1y"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms(text)


def test_rfc3339() -> None:
    assert parse_rfc3339_ms("1970-01-01T00:00:01Z") == 1000
    assert parse_rfc3339_ms("1970-01-01T01:00:01+01:00") == 1000
    assert parse_rfc3339_ms("2026-12-03t10:00:00.250z") == parse_rfc3339_ms("2026-12-03T10:00:00.25Z")
    for bad in ("2026-12-03", "2026-12-03T10:00:00", "yesterday", "2026-13-03T10:00:00Z", ""):
        assert parse_rfc3339_ms(bad) is None, bad


def test_event_time_takes_published_at_unless_unparseable_or_ahead() -> None:
    now = parse_rfc3339_ms("2026-12-03T10:00:00Z")
    assert now is not None
    skew = 10 * 60_000
    published = "2026-12-01T08:00:00Z"
    assert event_time(published, now, 7, skew).time_ms == parse_rfc3339_ms(published)
    assert event_time(None, now, 7, skew).time_ms == 7 and not event_time(None, now, 7, skew).refused
    assert event_time("not a date", now, 7, skew).refused
    assert event_time("2099-01-01T00:00:00Z", now, 7, skew).time_ms == 7
    assert not event_time("2026-12-03T10:05:00Z", now, 7, skew).refused, "within the allowed skew"
    assert event_time("2026-12-03T10:15:00Z", now, 7, skew).refused


def test_the_window_expires_by_the_newest_time_and_passes_run_in_steps() -> None:
    window = Retention(window_ms=1000 * HOUR_MS)
    assert Retention().cutoff(123) is None and not Retention().enabled
    assert window.cutoff(None) is None
    assert window.cutoff(5000 * HOUR_MS) == 4000 * HOUR_MS
    assert window.due_from(None) == EARLIEST_MS and Retention().due_from(None) is None
    assert window.due_from(10 * HOUR_MS) == 11 * HOUR_MS, "a thousandth of the window on"
    assert Retention(window_ms=HOUR_MS).due_from(0) == 3_600, "3.6 s"
    assert Retention(window_ms=60_000).due_from(0) == 1000, "a second at least"
