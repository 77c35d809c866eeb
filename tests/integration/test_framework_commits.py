"""framework.allow_commits_past through the real broker: the worker's Faust app takes a topic,
acknowledges some of its messages and leaves others (the ones a consumer went past without
delivering them, which the worker reads back itself), and the offset the group commits shows
whether Faust's commits go past those it never acknowledged."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from faust.types import TP

from neardup.stream import framework
from tests.support.broker import create_topic, group_offset, produce, raw_app

MESSAGES = 9  # offsets 0-8
NEVER_ACKNOWLEDGED = [(2, 3), (6, 7)]  # as a consumer that skipped them would leave them


async def _committed_after_gaps(bootstrap: str, datadir: Path, allowed: bool) -> int | None:
    """The offset the app's group commits once its agent has taken every message, acknowledged
    all but NEVER_ACKNOWLEDGED, and (`allowed`) let commits go past those."""
    topic = f"gaps-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic)
    await produce(bootstrap, topic, [(b"k", str(n).encode()) for n in range(MESSAGES)])
    # failed: a stop does not wait for the messages never acknowledged (they never will be)
    app_class = framework.app_class(7, 1, failed=lambda: True)
    # committed below, once, when the test asks
    app, source = raw_app(app_class, topic, bootstrap, datadir, broker_commit_interval=3600)
    skipped = {offset for first, last in NEVER_ACKNOWLEDGED for offset in range(first, last + 1)}
    taken = asyncio.Event()

    async def take(stream: Any) -> None:
        async for batch in stream.take_events(MESSAGES, 0.2):
            await stream.acknowledge([event for event in batch if event.message.offset not in skipped])
            if any(event.message.offset == MESSAGES - 1 for event in batch):
                taken.set()

    app.agent(source, name="take")(take)
    await app.start()
    try:
        await asyncio.wait_for(taken.wait(), 60)
        if allowed:
            for first, last in NEVER_ACKNOWLEDGED:
                await framework.allow_commits_past(app, TP(topic, 0), first, last)
        await app.consumer.commit()
    finally:
        # bounded: without a broker, Faust's stop can wait for it for minutes
        await asyncio.wait_for(app.stop(), 30)
    return await group_offset(bootstrap, topic, f"{topic}-app")


def test_commits_go_past_the_offsets_allowed(kafka: str, tmp_path: Path) -> None:
    assert asyncio.run(_committed_after_gaps(kafka, tmp_path, allowed=True)) == MESSAGES


def test_without_them_commits_stop_at_the_first_offset_never_acknowledged(kafka: str, tmp_path: Path) -> None:
    """What allow_commits_past is for: Faust commits acknowledged offsets only, up to the first it
    has not seen acknowledged."""
    assert asyncio.run(_committed_after_gaps(kafka, tmp_path, allowed=False)) == NEVER_ACKNOWLEDGED[0][0]
