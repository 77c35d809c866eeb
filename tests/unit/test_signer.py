"""neardup.pipeline.signer: signing in helper processes gives exactly the in-process results, in order,
a killed, crashed or hung helper is replaced, and helpers failing twice on a batch are fatal."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import os
import signal
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from neardup.core.params import DedupParams
from neardup.core.retention import Retention
from neardup.pipeline.pipes import PIPE_BYTES, CallTimeout, widen_pipe
from neardup.pipeline.sign import SignResult, SignStage
from neardup.pipeline.signer import Signer, SignerFailed, SignItem
from neardup.pipeline.wire import Provenance, Signed, decode_signed
from tests.support.faults import HELPER_FAULT, POISON, inject
from tests.support.prose import PROSE
from tests.support.signing import helper_pids, signed_here

PARAMS = DedupParams()
STAGE = SignStage(PARAMS, max_text_bytes=10_000)


def comparable(results: list[SignResult]) -> list[tuple[bytes | None, str | None, dict[str, object] | None]]:
    """Results without the dead letters' failure time, which differs between two runs."""
    out = []
    for result in results:
        record = orjson.loads(result.dead_letter) if result.dead_letter else None
        if record is not None:
            record.pop("failed_at")
        out.append((result.signed, result.reason, record))
    return out


def items(count: int) -> list[SignItem]:
    made: list[SignItem] = []
    for n in range(count):
        raw = orjson.dumps({"id": f"a-{n}", "text": PROSE[n % len(PROSE)] + f" Item {n}."})
        if n % 7 == 3:
            raw = b"\xff not json"  # dead letters keep their place in the order too
        made.append((raw, f"k{n}".encode(), Provenance("in", n % 3, n, 1_700_000_000_000 + n)))
    return made


@pytest.fixture
async def pooled() -> AsyncIterator[Signer]:
    signer = Signer(STAGE, processes=2)
    yield signer
    signer.close()


async def test_pool_results_equal_in_process_results_in_order(pooled: Signer) -> None:
    batch = items(50)  # split across both processes
    expected = comparable(signed_here(Signer(STAGE, processes=0), batch))
    assert comparable(await pooled.sign(batch)) == expected
    assert [reason for _, reason, _ in expected].count("invalid_utf8") == 7
    assert comparable(await pooled.sign(batch[:3])) == expected[:3]  # too small to split
    assert await pooled.sign([]) == []


def environment_of(pid: int) -> dict[bytes, bytes]:
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    entries = (entry.partition(b"=") for entry in environ.split(b"\0"))
    return {name: value for name, _, value in entries if name}


async def test_helpers_start_no_blas_threads(pooled: Signer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper calls no BLAS routine: its numpy starts none of OpenBLAS's threads, whatever the
    caller's environment says (they would spin at import, in every helper started)."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    await pooled.sign(items(8))
    for pid in helper_pids(pooled):
        assert environment_of(pid)[b"OPENBLAS_NUM_THREADS"] == b"1"


@pytest.mark.slow  # starts its helper processes twice
async def test_a_killed_helper_is_replaced(pooled: Signer) -> None:
    batch = items(40)
    expected = comparable(signed_here(pooled, batch))
    assert comparable(await pooled.sign(batch)) == expected
    before = helper_pids(pooled)
    assert len(before) == 2
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    assert comparable(await pooled.sign(batch)) == expected
    after = helper_pids(pooled)
    assert len(after) == 2 and not set(after) & set(before)


async def test_helpers_exit_when_the_worker_goes(pooled: Signer) -> None:
    await pooled.warm_up()
    processes = [helper.process for helper in pooled._helpers]
    for process in processes:
        assert process.stdin is not None
        process.stdin.close()  # what the helper sees when the worker dies
    codes = [await asyncio.wait_for(process.wait(), 10) for process in processes]
    assert codes == [0, 0]


async def test_without_helpers_signing_stays_in_process() -> None:
    signer = Signer(STAGE, processes=0)
    batch = items(20)
    assert comparable(await signer.sign(batch)) == comparable(signed_here(signer, batch))
    await signer.warm_up()
    assert helper_pids(signer) == []


async def test_concurrent_warm_ups_start_the_configured_number_of_helpers() -> None:
    """The worker warms up at start while its first batch may already be signing."""
    signer = Signer(STAGE, processes=1)
    try:
        results, _ = await asyncio.gather(signer.sign(items(40)), signer.warm_up())
        assert len(results) == 40
        assert len(helper_pids(signer)) == 1
    finally:
        signer.close()


async def test_aclose_ends_the_helpers_inside_the_loop(pooled: Signer) -> None:
    """At shutdown the helpers have exited before the event loop closes: nothing is left for the
    garbage collector to close afterwards."""
    await pooled.warm_up()
    processes = [helper.process for helper in pooled._helpers]
    await pooled.aclose()
    assert helper_pids(pooled) == []
    assert all(process.returncode is not None for process in processes)
    assert comparable(await pooled.sign(items(5))) == comparable(signed_here(pooled, items(5)))  # restarts


async def test_helper_pipes_hold_a_whole_sign_batch(pooled: Signer) -> None:
    """Both pipes to a helper are widened to PIPE_BYTES (Linux): a batch's ~650 KB of requests is
    written in one or two rounds of the event loop rather than ten."""
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("pipe sizes are Linux's")
    await pooled.warm_up()
    for helper in pooled._helpers:
        process = helper.process
        assert process.stdin is not None and process.stdout is not None
        to_helper = process.stdin.transport.get_extra_info("pipe").fileno()
        from_helper = process.stdout._transport.get_extra_info("pipe").fileno()  # type: ignore[attr-defined]
        assert fcntl.fcntl(to_helper, fcntl.F_GETPIPE_SZ) == PIPE_BYTES
        assert fcntl.fcntl(from_helper, fcntl.F_GETPIPE_SZ) == PIPE_BYTES
    not_a_pipe = os.open(os.devnull, os.O_RDONLY)
    try:
        assert widen_pipe(not_a_pipe) == 0  # left as it is
    finally:
        os.close(not_a_pipe)


async def test_helpers_run_at_the_niceness_they_are_given() -> None:
    """On a busy machine the helpers yield the CPU to the serial decider (NEARDUP_SIGN_NICE)."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    for nice in (0, 7):
        signer = Signer(STAGE, processes=1, nice=nice)
        try:
            batch = items(20)
            assert comparable(await signer.sign(batch)) == comparable(signed_here(signer, batch))
            [pid] = helper_pids(signer)
            assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, own + nice)
        finally:
            signer.close()


async def test_helpers_sign_with_the_configured_skew_and_report_refused_times() -> None:
    """A published_at 30 minutes ahead of the helper's clock: within a one-hour skew it is the
    article's time; within ten minutes it is refused, the article is timed by its record, and the
    helper says so."""
    now_ms = round(time.time() * 1000)
    stamp = now_ms - 60_000
    ahead_ms = now_ms // 1000 * 1000 + 1_800_000
    published = datetime.fromtimestamp(ahead_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    raw = orjson.dumps({"id": "a", "text": PROSE[0], "published_at": published})
    item: SignItem = (raw, b"a", Provenance("in", 0, 0, stamp))
    for skew_ms, refused in ((3_600_000, False), (600_000, True)):
        signer = Signer(SignStage(PARAMS, 1_000_000, Retention(skew_ms=skew_ms)), processes=1)
        try:
            [result] = await signer.sign([item])
        finally:
            signer.close()
        assert result.refused_time is refused
        signed = decode_signed(result.signed or b"")
        assert isinstance(signed, Signed)
        assert signed.time_ms == (stamp if refused else ahead_ms)


# --- helpers that hang or crash (NEARDUP_TEST_HELPER_FAULT) ---------------------------------------


def poisoned(batch: list[SignItem], *at: int) -> list[SignItem]:
    """`batch` with the messages at `at` made to break any helper that signs them."""
    for n in at:
        _, key, src = batch[n]
        batch[n] = (orjson.dumps({"id": f"poison-{n}", "text": POISON.decode()}), key, src)
    return batch


def isolated(results: list[SignResult], batch: list[SignItem], at: tuple[int, ...]) -> None:
    """The poisoned messages dead-lettered (processing_failed, with their bytes), the rest as signed
    in this process, in order."""
    here = comparable(signed_here(Signer(STAGE, processes=0), batch))
    got = comparable(results)
    for n, (result, expected) in enumerate(zip(got, here, strict=True)):
        if n in at:
            record = result[2]
            assert result[1] == "processing_failed" and record is not None
            assert base64.b64decode(record["value_b64"]) == batch[n][0] and record["offset"] == n
        else:
            assert result == expected


@pytest.mark.slow  # waits out helpers that crash, hang or are killed
async def test_a_message_that_crashes_its_helper_is_isolated_and_the_rest_signed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inject(monkeypatch, HELPER_FAULT, "crash:signer:poison")
    signer = Signer(STAGE, processes=2, timeout=CallTimeout(base_s=30.0))
    try:
        batch = poisoned(items(40), 17, 30)
        results = await asyncio.wait_for(signer.sign(batch), 60)  # crashes need no timeout
        isolated(results, batch, (17, 30))
        assert signer.isolated == 2 and not signer.isolating
        clean = items(12)
        assert comparable(await signer.sign(clean)) == comparable(signed_here(signer, clean))
    finally:
        await signer.aclose()


@pytest.mark.slow  # waits out helpers that crash, hang or are killed
async def test_a_message_that_hangs_its_helper_is_isolated_within_its_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inject(monkeypatch, HELPER_FAULT, "hang:signer:poison")
    signer = Signer(STAGE, processes=1, timeout=CallTimeout(base_s=1.0, per_item_s=0.0))
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        batch = poisoned(items(16), 5)
        results = await signer.sign(batch)
        isolated(results, batch, (5,))
        # 16, 8, 4, 2, then alone: five timeouts and the restarts between them
        assert 5.0 <= loop.time() - started < 60
        assert helper_pids(signer)  # a live helper for the next batch; the hung ones were killed
    finally:
        await signer.aclose()


async def test_helpers_that_cannot_start_are_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a message's doing: nothing is dead-lettered for it."""
    inject(monkeypatch, HELPER_FAULT, "crash:signer:0")
    signer = Signer(STAGE, processes=2, timeout=CallTimeout(base_s=5.0, per_item_s=0.0))
    with pytest.raises(SignerFailed, match="cannot start"):
        await asyncio.wait_for(signer.sign(items(20)), 60)
    assert helper_pids(signer) == []
    await signer.aclose()
