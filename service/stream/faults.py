"""For tests only: faults injected into the worker's agents, to test how it copes (the helper
processes have theirs: pipes.HelperFault).

NEARDUP_TEST_AGENT_FAULT=raise:<sign|index>:<n> makes that agent raise after it has sent what its
n-th batch caused, before the batch is acknowledged. NEARDUP_TEST_AGENT_FAULT=delay:index:<n>:<ms>
holds the index agent's n-th decided chunk that long between its decision and its changelog send
(a SIGKILL then lands between the two). Unset, nothing happens.
"""

from __future__ import annotations

import asyncio
import logging
import os

from ..errors import Error

AGENT_FAULT_VARIABLE = "NEARDUP_TEST_AGENT_FAULT"
log = logging.getLogger("neardup.faults")


class InjectedFault(Error, RuntimeError):
    """The exception NEARDUP_TEST_AGENT_FAULT raises."""


class AgentFault:
    def __init__(self, spec: str | None = None) -> None:
        spec = os.environ.get(AGENT_FAULT_VARIABLE, "") if spec is None else spec
        self.action, self.agent, self.at, self.delay_s = "", "", 0, 0.0
        self.batches: dict[str, int] = {}
        self.chunks = 0
        if not spec:
            return
        parts = spec.split(":")
        valid = (len(parts) == 3 and parts[0] == "raise" and parts[1] in ("sign", "index")) or (
            len(parts) == 4 and parts[0] == "delay" and parts[1] == "index"
        )
        if not valid or not all(part.isdigit() for part in parts[2:]):
            raise ValueError(
                f"{AGENT_FAULT_VARIABLE}={spec!r}: expected raise:<sign|index>:<n> or delay:index:<n>:<ms>"
            )
        self.action, self.agent, self.at = parts[0], parts[1], int(parts[2])
        if self.action == "delay":
            self.delay_s = int(parts[3]) / 1000.0

    def after_batch(self, agent: str) -> None:
        """The agent has sent what its batch caused."""
        if self.action != "raise" or agent != self.agent:
            return
        self.batches[agent] = self.batches.get(agent, 0) + 1
        if self.batches[agent] == self.at:
            raise InjectedFault(f"{AGENT_FAULT_VARIABLE}: raised in agent {agent} at batch {self.at}")

    async def before_changelog(self) -> None:
        """The index agent has a decided chunk, whose changelog is not sent yet."""
        if self.action != "delay":
            return
        self.chunks += 1
        if self.chunks == self.at:
            log.warning("injected_delay chunk=%d seconds=%.1f", self.chunks, self.delay_s)
            await asyncio.sleep(self.delay_s)
