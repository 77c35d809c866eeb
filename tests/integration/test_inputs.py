"""Through the real broker, the input rules: an unkeyed record is dead-lettered with its bytes, a
text of only invisible characters is empty, and a refused event time does not move the index's
time past a backfill."""

from __future__ import annotations

import asyncio
import base64

import orjson

from tests.support.broker import TopicReader, produce
from tests.support.deployment import Deployment, verdicts_by_id
from tests.support.prose import PROSE


def test_unkeyed_and_invisible_input_is_dead_lettered_and_a_refused_time_keeps_the_backfill(
    deployment: Deployment,
) -> None:
    """January 2026 news under a 30-day window: an article stamped 2099 between an original and
    its copy 10 days later leaves the copy a duplicate; an unkeyed record and a text of zero-width
    characters go to the dead-letter topic with their bytes, and the articles around them are
    judged."""
    unkeyed = orjson.dumps({"id": "unkeyed", "text": PROSE[4]})
    invisible = orjson.dumps({"id": "invisible", "text": "\u200b\u200c\u2060\x00"})
    articles = [
        {"id": "original", "text": PROSE[0], "published_at": "2026-01-05T08:00:00Z"},
        {"id": "future", "text": PROSE[1], "published_at": "2099-01-01T00:00:00Z"},
        {"id": "year-one", "text": PROSE[2], "published_at": "0001-01-01T00:00:00Z"},
        {"id": "copy", "text": PROSE[0] + " Updated.", "published_at": "2026-01-15T08:00:00Z"},
    ]
    keyed = [(a["id"].encode(), orjson.dumps(a)) for a in articles]
    messages: list[tuple[bytes | None, bytes | None]] = [
        *keyed[:2],
        (None, unkeyed),
        (b"invisible", invisible),
        *keyed[2:],
    ]
    deployment.extra_env["NEARDUP_RETENTION"] = "30d"
    deployment.start_worker()
    asyncio.run(produce(deployment.bootstrap, deployment.topics["input"], messages))

    records = TopicReader(deployment.bootstrap, deployment.topics["verdicts"]).read_until(
        lambda r: "copy" in verdicts_by_id(r), timeout=120
    )
    verdicts = verdicts_by_id(records)
    assert sorted(verdicts) == sorted(a["id"] for a in articles), deployment.logs()
    [copy] = verdicts["copy"]
    assert (copy["verdict"], copy["match_id"]) == ("duplicate", "original")

    dead = TopicReader(deployment.bootstrap, deployment.topics["dead"]).read_until(
        lambda r: len(r) >= 2, timeout=30
    )
    letters = {orjson.loads(r.value)["reason"]: (r, orjson.loads(r.value)) for r in dead}
    assert sorted(letters) == ["empty_text", "unkeyed"], deployment.logs()
    record, letter = letters["unkeyed"]
    assert record.key is None and letter["key_b64"] is None
    assert base64.b64decode(letter["value_b64"]) == unkeyed and letter["offset"] == 2
    assert "'unkeyed' has no key" in letter["detail"]
    assert base64.b64decode(letters["empty_text"][1]["value_b64"]) == invisible
    assert deployment.settled_metric(0, 'neardup_dead_letters_total{reason="unkeyed"}', 1.0) == 1.0
    assert deployment.settled_metric(0, "neardup_refused_times_total", 2.0) == 2.0
    assert deployment.settled_metric(0, "neardup_expired_total", 0.0) == 0.0
