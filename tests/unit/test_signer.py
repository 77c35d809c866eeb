"""service.stream.signer: signing in helper processes gives exactly the in-process results, in order,
and a broken pool (a helper killed) does not stop signing."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import orjson
import pytest

from service.core.params import DedupParams
from service.stream.signer import Signer, SignItem
from service.stream.stages import Provenance, SignResult, SignStage
from tests.conftest import PROSE

STAGE = SignStage(DedupParams(), max_text_bytes=10_000)


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
def pooled() -> Iterator[Signer]:
    signer = Signer(STAGE, processes=2)
    yield signer
    signer.close()


async def test_pool_results_equal_in_process_results_in_order(pooled: Signer) -> None:
    batch = items(50)  # split across both processes
    expected = comparable(Signer(STAGE, processes=0).sign_here(batch))
    assert comparable(await pooled.sign(batch)) == expected
    assert [reason for _, reason, _ in expected].count("invalid_utf8") == 7
    assert comparable(await pooled.sign(batch[:3])) == expected[:3]  # too small to split
    assert await pooled.sign([]) == []


async def test_a_killed_helper_is_replaced(pooled: Signer) -> None:
    batch = items(40)
    expected = comparable(pooled.sign_here(batch))
    assert comparable(await pooled.sign(batch)) == expected
    pool = pooled._pool
    assert pool is not None
    for pid in list(pool._processes):  # the helpers of a running pool
        os.kill(pid, signal.SIGKILL)
    assert comparable(await pooled.sign(batch)) == expected
    assert pooled._pool is not None and pooled._pool is not pool
