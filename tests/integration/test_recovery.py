"""Crash safety through the real broker and real RocksDB.

SIGKILL mid-stream, several times: every article ends with a verdict, repeats are identical, and
the final state equals an uninterrupted (embedded) run; the same while the held index folds and
drains (its bounds shrunk by a test hook); SIGTERM the same. (A deleted state
directory, rebuilt from the changelog: test_delivery.py, after a kill between a decision and its
changelog.)
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from neardup.state.held import DRAIN_KEY, HOLD_KEY
from neardup.state.rocks import RocksKV, RocksOptions, RocksState
from neardup.state.tables import BAND
from tests.support.broker import TopicReader, produce_articles, repeated_after
from tests.support.deployment import Deployment, stream_of, verdicts_by_id, without_latency
from tests.support.faults import HELD_STEPS, fault_env
from tests.support.runs import reference_state, untimed

# Long streams that keep a core busy: run one at a time, beside the lighter tests (tests/run)
pytestmark = [pytest.mark.xdist_group("heavy")]


@pytest.mark.budget(35)  # a worker start and a rebuild after each kill
def test_sigkill_during_stream_loses_nothing(deployment: Deployment, tmp_path: Path) -> None:
    """A kill lands within a few hundred articles of its target, and the restarted worker handles
    again what was not committed: 6,000 articles keep thousands pending at the last kill."""
    restarted_mid_stream(deployment, tmp_path, signal.SIGKILL, 6_000, stops=3, every=1_000)


@pytest.mark.budget(45)  # a worker start and a rebuild after each kill
def test_sigkill_while_the_held_index_folds_and_drains_loses_nothing(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The index held in memory (the default), its bounds shrunk (a 128 KB log folded 2,048
    entries a write; past 20,000 entries, ~1,600 of these articles, drained 2,048 a write) so that
    these 6,000 articles fold it and drain it back to keys: the worker killed three times
    mid-stream as they go. Nothing lost, repeats identical, the final state that of an
    uninterrupted run, and the drain under way or done."""
    deployment.extra_env.update(fault_env(HELD_STEPS, "20000:131072:2048:2048"))
    restarted_mid_stream(deployment, tmp_path, signal.SIGKILL, 6_000, stops=3, every=1_000)
    state = RocksKV(deployment.state_dir(0) / "index", RocksOptions())
    try:
        held, draining = state.get_many([HOLD_KEY, DRAIN_KEY])
        assert draining is not None or held is None, "the drain began"
        assert next(iter(state.scan(BAND)), None) is not None, "buckets went back to keys"
    finally:
        state.close()


@pytest.mark.budget(70)  # a stream that outlasts two drains
def test_sigterm_during_stream_loses_nothing(deployment: Deployment, tmp_path: Path) -> None:
    """A clean stop (what an orchestrator sends to roll a deployment) while articles stream in: the
    stop commits what Faust acknowledged, which must be exactly what was handled. A clean stop
    first finishes what the worker had fetched (up to ~7,000 articles, with the containment index
    on too), hence the longer stream: input must still be pending after the second drain."""
    restarted_mid_stream(deployment, tmp_path, signal.SIGTERM, 20_000, stops=2, every=500)


def restarted_mid_stream(
    deployment: Deployment, tmp_path: Path, sig: int, count: int, *, stops: int, every: int
) -> None:
    """Stop the worker with `sig` `stops` times, each time once `every` more articles have their
    verdict than at the stop before, and restart it: every article ends with a verdict, repeats are
    identical, verdicts and final state equal an uninterrupted (embedded) run. Each stop lands on a
    running worker while input is pending (the verdict topic read to its end once the worker is
    gone lacks articles); after each SIGKILL, the next worker delivers again verdicts that the
    topic held at the kill (input handled but not committed comes back)."""
    articles = stream_of(count)
    verdicts_expected, state_expected = reference_state(articles, tmp_path)
    expected = {v["article_id"]: without_latency(v) for v in verdicts_expected}
    deployment.create_topics()
    produce_articles(deployment.bootstrap, deployment.topics["input"], articles)
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    worker = deployment.start_worker()
    at_stops: list[list[Any]] = []  # the verdict topic as each stopped worker left it
    pending: list[int] = []  # articles without a verdict then
    for _ in range(stops):
        # counted by article (a record's key), not by record: a restarted worker's first verdicts
        # may all be repeats
        target = len(articles) - (pending[-1] if pending else len(articles)) + every
        reader.reach(lambda r, t=target: len({m.key for m in r}) >= t, timeout=300, logs=deployment.logs)
        assert deployment.kill(worker, sig), f"the worker was running at the stop:\n{deployment.logs()}"
        at_stops.append(reader.read_all())
        pending.append(len(articles) - len(verdicts_by_id(at_stops[-1])))
        assert pending[-1] > 0, f"the stop at {target} articles lands while input is pending"
        worker = deployment.start_worker()
    records = reader.read_until(lambda r: len(verdicts_by_id(r)) >= len(articles), timeout=600)
    verdicts = verdicts_by_id(records)
    missing = [a["id"] for a in articles if a["id"] not in verdicts]
    assert not missing, f"{len(missing)} articles without verdict, e.g. {missing[:5]}\n{deployment.logs()}"
    repeated = 0
    differing = []
    for article_id, seen in verdicts.items():
        first = without_latency(seen[0])
        assert all(without_latency(v) == first for v in seen[1:]), (article_id, seen)
        if first != expected[article_id]:
            differing.append(article_id)
        repeated += len(seen) - 1
    # every differing verdict at once, with what the workers logged about skipped offsets
    logs = [path.read_text(errors="replace") for path in sorted(deployment.root.glob("*.log"))]
    gaps = [line for log in logs for line in log.splitlines() if "offset_gap" in line]
    assert not differing, (
        f"{len(differing)} verdicts differ from the embedded run, e.g. {differing[:10]}; "
        f"first: {verdicts[differing[0]][0]} expected {expected[differing[0]]}; offset gaps logged: {gaps}"
    )
    # what the worker after each stop delivered again, up to the next stop (or the end)
    later = [*at_stops[1:], reader.read_all()]
    again = [repeated_after(at, after, lambda r: r.key) for at, after in zip(at_stops, later, strict=True)]
    if sig == signal.SIGKILL:
        assert all(n > 0 for n in again), f"killed before its offsets were committed: {again} again"
    assert deployment.kill(worker, signal.SIGTERM), deployment.logs()
    final = RocksState(deployment.state_dir(0) / "index")
    try:
        # event times differ by design: the worker's are the records' timestamps, embedded mode's
        # the time of processing (the articles carry no published_at)
        assert [untimed(a) for a in final.articles()] == [untimed(a) for a in state_expected]
    finally:
        final.close()
    print(f"verdicts={len(records)} repeated={repeated} pending at each stop={pending} then again={again}")
