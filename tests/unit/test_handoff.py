"""The index hand-off's queue (pipeline/order.py `HandOff`): signatures messages decided in the
order they were sent, as soon as their sends are acknowledged; the agents' side is in
test_agents_memory.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from neardup.pipeline.order import HANDOFF_QUEUE, HandOff


def _acknowledged(offset: int) -> asyncio.Future[Any]:
    sent: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    sent.set_result(SimpleNamespace(offset=offset))
    return sent


async def test_messages_are_decided_in_send_order_those_acknowledged_meanwhile_together() -> None:
    decided: list[list[tuple[int, bytes]]] = []
    release = asyncio.Event()

    async def decide(messages: list[tuple[int, bytes]]) -> None:
        decided.append(messages)
        await release.wait()  # a decision in progress: what is sent meanwhile waits for it

    hand_off = HandOff()
    runner = asyncio.create_task(hand_off.run(decide))
    hand_off.submit(_acknowledged(7), b"h")
    await asyncio.sleep(0.01)
    late: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    hand_off.submit(late, b"i")  # acknowledged after the next one was sent
    hand_off.submit(_acknowledged(9), b"j")
    release.set()
    await asyncio.sleep(0.01)
    assert decided == [[(7, b"h")]]  # the next ones wait for the first send's acknowledgement
    late.set_result(SimpleNamespace(offset=8))
    await asyncio.sleep(0.01)
    assert decided == [[(7, b"h")], [(8, b"i"), (9, b"j")]]
    runner.cancel()


async def test_a_failed_send_leaves_it_and_those_sent_after_it_to_the_consumer() -> None:
    decided: list[list[tuple[int, bytes]]] = []

    async def decide(messages: list[tuple[int, bytes]]) -> None:
        decided.append(messages)

    hand_off = HandOff()
    failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("broker gone"))
    hand_off.submit(_acknowledged(3), b"d")
    hand_off.submit(failed, b"e")
    hand_off.submit(_acknowledged(5), b"f")
    hand_off.submit(None, b"g")  # not a send's future (a stand-in topic): nothing to wait for
    runner = asyncio.create_task(hand_off.run(decide))
    await asyncio.sleep(0.01)
    assert decided == [[(3, b"d")]]
    hand_off.submit(_acknowledged(6), b"h")
    await asyncio.sleep(0.01)
    assert decided == [[(3, b"d")], [(6, b"h")]]
    runner.cancel()


async def test_a_full_queue_leaves_the_message_to_the_consumer() -> None:
    """Bounded: while the decisions lag, at most `maxsize` messages wait; the next are not handed
    off (the consumer delivers them), and the sign stage does not wait for room."""
    decided: list[list[tuple[int, bytes]]] = []

    async def decide(messages: list[tuple[int, bytes]]) -> None:
        decided.append(messages)

    hand_off = HandOff(maxsize=2)
    for offset in range(4):
        hand_off.submit(_acknowledged(offset), b"m%d" % offset)
    assert hand_off._sent.qsize() == 2
    runner = asyncio.create_task(hand_off.run(decide))
    await asyncio.sleep(0.01)
    assert decided == [[(0, b"m0"), (1, b"m1")]]
    hand_off.submit(_acknowledged(4), b"m4")  # room again
    await asyncio.sleep(0.01)
    assert decided[-1] == [(4, b"m4")]
    runner.cancel()


def test_the_queue_is_bounded_by_default() -> None:
    assert HandOff()._sent.maxsize == HANDOFF_QUEUE > 0
