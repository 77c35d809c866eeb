"""Event time and the retention window: which time an article counts under, and what has expired.

An article's time is its `published_at` when that parses, is not before the earliest time allowed
and is not ahead of the signing process's clock by more than an allowed skew; otherwise it is
refused. Articles older than the newest time seen minus the window expire. A refused time never
moves the newest time: the index takes it as the newest accepted time (pipeline/shard.py), so one
article stamped 2099 cannot expire the whole index, nor one of year 1 expire at once, and a file
of last year's news expires by its own dates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

EARLIEST_MS = -(2**63)  # before every time an int64 holds
_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
# RFC 3339: a full date, "T" or a space, a time, and an offset ("Z" or ±hh:mm) that it requires
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def parse_duration_ms(text: str) -> int:
    """`30d`, `12h`, `90m`, `45s`, `2w` (a bare number: seconds) → milliseconds; `0` → 0."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 30d, 12h, 90m, 45s, or 0)")
    number, unit = match.groups()
    return round(float(number) * _UNITS_MS[unit or "s"])


def format_duration_ms(value: int) -> str:
    """The shortest exact unit: 2592000000 → '30d'; 0 → '0'."""
    if value == 0:
        return "0"
    for unit in ("w", "d", "h", "m", "s"):
        if value % _UNITS_MS[unit] == 0:
            return f"{value // _UNITS_MS[unit]}{unit}"
    return f"{value / 1000:g}s"


def parse_rfc3339_ms(text: str) -> int | None:
    """Milliseconds since the epoch, or None when `text` is not an RFC 3339 date-time."""
    if not isinstance(text, str) or _RFC3339.match(text) is None:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return None
    return round(stamp.timestamp() * 1000)


# The earliest event time accepted by default: the Unix epoch, before which Kafka has no record
# timestamps. What a feed sends before it is a placeholder (year 1 from a zero date value, 1900 from
# a spreadsheet or database default), not a publication date.
DEFAULT_EARLIEST = "1970-01-01T00:00:00Z"


def parse_earliest_ms(text: str) -> int:
    """An RFC 3339 date-time → milliseconds since the epoch; ValueError otherwise."""
    if (stamp := parse_rfc3339_ms(text)) is None:
        raise ValueError(f"not an RFC 3339 date-time: {text!r} (expected e.g. {DEFAULT_EARLIEST})")
    return stamp


@dataclass(frozen=True)
class EventTime:
    """The time an article counts under, and whether its `published_at` was refused (present, but
    unparseable, before the earliest time or too far ahead of the reference clock)."""

    time_ms: int
    refused: bool


def event_time(
    published_at: str | None, reference_ms: int, fallback_ms: int, skew_ms: int, earliest_ms: int = 0
) -> EventTime:
    """`published_at` when valid, not before `earliest_ms` and at most `skew_ms` ahead of
    `reference_ms`, else `fallback_ms`."""
    stamp = None if published_at is None else parse_rfc3339_ms(published_at)
    if stamp is None or not earliest_ms <= stamp <= reference_ms + skew_ms:
        return EventTime(fallback_ms, refused=published_at is not None)  # absent is not refused
    return EventTime(stamp, False)


@dataclass(frozen=True)
class Retention:
    """The window (0: keep forever), which event times are used (`accepts`), and how far apart
    expiry passes run: expiry walks the oldest arrivals by time, and running it for every article
    would cost a scan start each time."""

    window_ms: int = 0
    skew_ms: int = 10 * 60_000
    earliest_ms: int = 0  # DEFAULT_EARLIEST: an event time before it is refused

    @property
    def enabled(self) -> bool:
        return self.window_ms > 0

    def accepts(self, time_ms: int, now_ms: int) -> bool:
        """Whether an event time is used: not before the earliest, not too far ahead of `now_ms`."""
        return self.earliest_ms <= time_ms <= now_ms + self.skew_ms

    def cutoff(self, newest_ms: int | None) -> int | None:
        """Articles with a time before this have expired (None: nothing expires)."""
        return None if not self.enabled or newest_ms is None else newest_ms - self.window_ms

    def due_from(self, last_cutoff_ms: int | None) -> int | None:
        """The cutoff from which an expiry pass is due, the last one having run for
        `last_cutoff_ms`: once the cutoff has moved by 1/1000 of the window, at least 1 s (None:
        nothing expires; EARLIEST_MS: no pass has run yet). Expiry walks the oldest arrivals by
        time, and running it for every article would cost a scan start each time."""
        if not self.enabled:
            return None
        if last_cutoff_ms is None:
            return EARLIEST_MS
        return last_cutoff_ms + max(1000, self.window_ms // 1000)


NO_RETENTION = Retention()  # keep forever
