"""Guards for service/stream/framework.py: every private name of Faust, mode and aiokafka it uses
still exists on the installed (pinned) versions, and the methods it overrides or calls keep the
parameters it passes. An upgrade that changes one fails here, naming it. What those uses do is
checked through their public effects, with the real broker where the effect is Kafka's:
tests/integration/test_framework_commits.py (allow_commits_past),
tests/integration/test_framework_fetch.py (the fetch wait and minimum) and
tests/integration/test_coordinator_lookup.py (coordinator_lookups_retried)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaProducer
from faust.transport.drivers import aiokafka as aiokafka_driver

from tests.support.private_names import PRIVATE_NAMES


def _owner_name(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or owner.__name__


def _set_in_source(owner: Any, name: str) -> bool:
    """An instance attribute: assigned as self.<name> in the module of the class or of one of its
    bases. The module's text, not inspect.getsource: that parses the module with ast, which on this
    Python can fail for the rest of the process once an earlier test caught a RecursionError."""
    for cls in inspect.getmro(owner) if inspect.isclass(owner) else ():
        try:
            source = Path(inspect.getsourcefile(cls) or "").read_text(encoding="utf-8")
        except (OSError, TypeError):  # built-in or compiled: no source
            continue
        if f"self.{name} " in source or f"self.{name}:" in source:
            return True
    return False


@pytest.mark.parametrize(
    ("owner", "name", "why"),
    PRIVATE_NAMES,
    ids=[f"{_owner_name(owner)}.{name}" for owner, name, _ in PRIVATE_NAMES],
)
def test_each_private_name_the_worker_uses_still_exists(owner: Any, name: str, why: str) -> None:
    assert hasattr(owner, name) or _set_in_source(owner, name), (
        f"{owner.__module__}.{_owner_name(owner)}.{name} is gone from the installed version, and "
        f"service/stream/framework.py uses it ({why}): adapt that module to the new version"
    )


@pytest.mark.parametrize(
    ("method", "parameters"),
    [
        (aiokafka_driver.AIOKafkaConsumerThread._create_worker_consumer, ["self", "transport"]),
        (aiokafka_driver.Consumer._add_gap, ["self", "tp", "offset_from", "offset_to"]),
        (faust.App._on_agent_error, ["self", "agent", "exc"]),
        (faust.App._consumer_wait_empty, ["self", "consumer", "logger"]),
        (
            AIOKafkaProducer._partition,
            ["self", "topic", "partition", "key", "value", "serialized_key", "serialized_value"],
        ),
    ],
    ids=lambda value: getattr(value, "__qualname__", "parameters"),
)
def test_the_private_methods_keep_the_parameters_passed_to_them(method: Any, parameters: list[str]) -> None:
    found = list(inspect.signature(method).parameters)
    assert found == parameters, (
        f"{method.__qualname__} now takes {found}, service/stream/framework.py passes {parameters}"
    )


def test_wait_first_still_takes_coroutines_and_a_timeout() -> None:
    parameters = inspect.signature(aiokafka_driver.Consumer.wait_first).parameters
    assert [p.kind for p in parameters.values()][1] == inspect.Parameter.VAR_POSITIONAL
    assert "timeout" in parameters
