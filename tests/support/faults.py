"""Faults for tests, loaded into each process of the service through NEARDUP_TEST_HOOKS (the one
seam, service/testhooks.py) and set up by two variables:

NEARDUP_TEST_HELPER_FAULT=<hang|crash>:<signer|decider>:<n>: every child of that kind (each
replacement too, counting again from 1) hangs for good, or exits at once with status 70, when its
n-th batch comes (a batch to sign; a batch to decide); n = 0: as it starts.
<hang|crash>:signer:poison: when a batch to sign holds a message containing POISON (the message
that breaks a helper wherever it goes); <hang|crash>:decider:poison: as the decider comes to an
article whose id contains POISON (the decider never sees the text).

NEARDUP_TEST_AGENT_FAULT=raise:<sign|index>:<n>: that agent raises after it has sent what its n-th
batch caused, before the batch is acknowledged. delay:index:<n>:<ms>: the index agent's n-th
decided chunk is held that long between its decision and its changelog send (a SIGKILL then lands
between the two). delay:verdicts:<n>:<ms>: the n-th decided chunk's verdicts are held that long
after its changelog send; delay:verdicts:armed:<ms>: the first chunk decided once the file named by
NEARDUP_TEST_FAULT_ARMED exists (a test arms it when the stream is where it wants the fault).
delay:commit:<n>:<ms>: under exactly-once, the index stage's n-th transaction is held that long
once everything it sent is acknowledged, before its commit.

NEARDUP_TEST_HELD_STEPS=<entries>:<floor>:<fold step>:<drain step>: the held families' bounds
shrunk (state/held.py: HELD_ENTRIES, _SNAPSHOT_FLOOR in bytes, _FOLD_STEP, DRAIN_STEP), in every
process, so that a stream of thousands of articles folds its log and drains back to keys.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

HELPER_FAULT = "NEARDUP_TEST_HELPER_FAULT"
AGENT_FAULT = "NEARDUP_TEST_AGENT_FAULT"
ARMED = "NEARDUP_TEST_FAULT_ARMED"
HELD_STEPS = "NEARDUP_TEST_HELD_STEPS"
HOOKS_FILE = str(Path(__file__).resolve())
POISON = b"POISON-PILL"
log = logging.getLogger("neardup.faults")


class InjectedFault(RuntimeError):
    """What an agent fault raises."""


def fault_env(variable: str, spec: str) -> dict[str, str]:
    """The environment that injects one fault into a worker or its children."""
    from neardup.testhooks import HOOKS_VARIABLE

    return {variable: spec, HOOKS_VARIABLE: HOOKS_FILE}


def inject(monkeypatch: Any, variable: str, spec: str) -> None:
    """Set one fault for the processes a test starts (pytest's monkeypatch undoes it)."""
    for name, value in fault_env(variable, spec).items():
        monkeypatch.setenv(name, value)


def install(role: str) -> None:
    """Called once per process (worker, signer, decider) by neardup.testhooks."""
    helper = os.environ.get(HELPER_FAULT, "")
    agent = os.environ.get(AGENT_FAULT, "")
    if held_steps := os.environ.get(HELD_STEPS, ""):
        from neardup.state import held

        entries, floor, fold, drain = (int(part) for part in held_steps.split(":"))
        held.HELD_ENTRIES, held._SNAPSHOT_FLOOR, held._FOLD_STEP, held.DRAIN_STEP = (
            entries,
            floor,
            fold,
            drain,
        )
    if helper:
        action, kind, at = parse_helper_fault(helper)
        if kind == role:
            _fail_children(kind, action, at)
    if agent:
        parsed = parse_agent_fault(agent)
        if role == "worker":
            _fail_agent(*parsed)


def parse_helper_fault(spec: str) -> tuple[str, str, int]:
    """(action, kind of child, batch number; -1: a batch holding POISON)."""
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in ("hang", "crash") or parts[1] not in ("signer", "decider"):
        raise ValueError(f"{HELPER_FAULT}={spec!r}: expected <hang|crash>:<signer|decider>:<n|poison>")
    if parts[2] == "poison":
        return parts[0], parts[1], -1
    if not parts[2].isdigit():
        raise ValueError(f"{HELPER_FAULT}={spec!r}: <n> must be a number")
    return parts[0], parts[1], int(parts[2])


def parse_agent_fault(spec: str) -> tuple[str, str, int, float]:
    parts = spec.split(":")
    valid = (len(parts) == 3 and parts[0] == "raise" and parts[1] in ("sign", "index")) or (
        len(parts) == 4 and parts[0] == "delay" and parts[1] in ("index", "verdicts", "commit")
    )
    armed = valid and parts[1] == "verdicts" and parts[2] == "armed"
    if not valid or not all(part.isdigit() for part in parts[3 if armed else 2 :]):
        raise ValueError(
            f"{AGENT_FAULT}={spec!r}: expected raise:<sign|index>:<n> "
            "or delay:<index|verdicts|commit>:<n>:<ms>"
        )
    delay_s = int(parts[3]) / 1000.0 if parts[0] == "delay" else 0.0
    return parts[0], parts[1], -1 if armed else int(parts[2]), delay_s


def _fail(action: str) -> None:
    if action == "crash":
        os._exit(70)
    while True:
        time.sleep(3600)


def _fail_children(kind: str, action: str, at: int) -> None:
    """Wrap the child's per-batch function: the n-th call (or one holding POISON) hangs or exits."""
    if at == 0:
        _fail(action)
    if kind == "decider" and at == -1:
        _fail_on_poisoned_decisions(action)
        return
    if kind == "signer":
        from neardup.pipeline import signer as module

        name = "sign_batch"
    else:
        from neardup.pipeline import decider as module  # type: ignore[no-redef]

        name = "decide_messages"
    real = getattr(module, name)
    calls = [0]

    @functools.wraps(real)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at or (at == -1 and any(POISON in (item[0] or b"") for item in args[1])):
            _fail(action)
        return real(*args, **kwargs)

    setattr(module, name, wrapped)


def _fail_on_poisoned_decisions(action: str) -> None:
    """The decider fails as it comes to the poisoned article, half-way through its batch: as the
    shard starts deciding it (IndexShard.decide's `before`, called for each article in order by the
    compiled run and the Python path alike), once the worker's marker says which record it is."""
    from neardup.pipeline.shard import IndexShard

    real = IndexShard.decide

    @functools.wraps(real)
    def deciding(
        self: IndexShard,
        items: Any,
        offset: Any = None,
        now: Any = None,
        before: Any = None,
        records: Any = None,
    ) -> Any:
        def starting(n: int) -> None:
            if before is not None:
                before(n)
            if POISON in items[n].article_id.encode():
                _fail(action)

        return real(self, items, offset, now, starting, records)

    IndexShard.decide = deciding  # type: ignore[method-assign]


def _hold_commit(at: int, delay_s: float) -> None:
    """The index stage's `at`-th transaction held before its commit, its sends acknowledged."""
    from neardup.stream.transactions import ShardTransactions, Transaction

    real = ShardTransactions._commit
    calls = [0]

    async def held(self: ShardTransactions, transaction: Transaction) -> None:
        await asyncio.gather(*transaction.sends)
        calls[0] += 1
        if calls[0] == at:
            log.warning("injected_delay transaction=%d seconds=%.1f", at, delay_s)
            await asyncio.sleep(delay_s)
        await real(self, transaction)

    ShardTransactions._commit = held  # type: ignore[method-assign]


def _fail_agent(action: str, agent: str, at: int, delay_s: float) -> None:
    from neardup.stream.index_agent import IndexAgent
    from neardup.stream.outputs import IndexPublisher, Outputs
    from neardup.stream.sign_agent import SignAgent

    calls = [0]
    if action == "raise":
        cls: Any = SignAgent if agent == "sign" else IndexAgent
        real = cls.handle

        @functools.wraps(real)
        async def raising(self: Any, *args: Any) -> Any:
            result = await real(self, *args)  # what the batch caused is sent
            calls[0] += 1
            if calls[0] == at:
                raise InjectedFault(f"{AGENT_FAULT}: raised in agent {agent} at batch {at}")
            return result

        cls.handle = raising
        return
    if agent == "commit":
        _hold_commit(at, delay_s)
        return
    if agent == "verdicts":
        real_publish = IndexPublisher.publish

        @functools.wraps(real_publish)
        async def held(self: IndexPublisher, *args: Any) -> Any:
            calls[0] += 1
            if calls[0] == at or (at == -1 and calls[0] > 0 and Path(os.environ[ARMED]).exists()):
                calls[0] = -(10**9)  # once
                log.warning("injected_delay verdicts chunk=%d seconds=%.1f", at, delay_s)
                await asyncio.sleep(delay_s)
            return await real_publish(self, *args)

        IndexPublisher.publish = held  # type: ignore[method-assign]
        return
    real_send = Outputs.send_batches

    @functools.wraps(real_send)
    async def delayed(self: Outputs, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic.endswith("-records-changelog"):
            calls[0] += 1
            if calls[0] == at:
                log.warning("injected_delay chunk=%d seconds=%.1f", at, delay_s)
                await asyncio.sleep(delay_s)
        return await real_send(self, topic, *args, **kwargs)

    Outputs.send_batches = delayed  # type: ignore[method-assign]
