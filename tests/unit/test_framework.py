"""Guards for service/stream/framework.py: every private name of Faust, mode and aiokafka it uses
still exists on the installed (pinned) versions, and the methods it overrides or calls keep the
parameters it passes. An upgrade that changes one fails here, naming it."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any, cast

import faust
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.client import CoordinationType
from aiokafka.errors import GroupAuthorizationFailedError, KafkaConnectionError, KafkaError, UnknownError
from faust.transport.drivers import aiokafka as aiokafka_driver

from neardup.stream import framework


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
    framework.PRIVATE_NAMES,
    ids=[f"{_owner_name(owner)}.{name}" for owner, name, _ in framework.PRIVATE_NAMES],
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


def _producer_whose_lookups_fail(errors: list[BaseException]) -> tuple[AIOKafkaProducer, list[str]]:
    """A producer (never started) whose client raises `errors` in turn at each coordinator lookup,
    then names node 7: the broker's side of a lookup, as aiokafka's sender sees it."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", transactional_id="t", retry_backoff_ms=1)
    asked: list[str] = []

    async def coordinator_lookup(coordinator_type: int, key: str) -> int:
        asked.append(key)
        if errors:
            raise errors.pop(0)
        return 7

    async def ready(node_id: int, **_: Any) -> bool:
        return True

    def force_metadata_update() -> asyncio.Future[bool]:
        done = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    client: Any = producer.client
    client.coordinator_lookup, client.ready = coordinator_lookup, ready
    client.force_metadata_update = force_metadata_update
    return producer, asked


async def test_a_coordinator_lookup_whose_connection_breaks_is_asked_again() -> None:
    # aiokafka alone: its sender gives up (if an upgrade makes it ask again, the wrapper can go)
    producer, asked = _producer_whose_lookups_fail([KafkaConnectionError("reset by peer")])
    with pytest.raises(KafkaError) as gave_up:
        await cast(Any, producer)._sender._find_coordinator(CoordinationType.GROUP, "group")
    assert isinstance(gave_up.value.__cause__, KafkaConnectionError)

    producer, asked = _producer_whose_lookups_fail([KafkaConnectionError("reset"), KafkaConnectionError("x")])
    framework.coordinator_lookups_retried(producer)
    assert await cast(Any, producer)._sender._find_coordinator(CoordinationType.GROUP, "group") == 7
    assert asked == ["group"] * 3


async def test_a_coordinator_lookup_refused_for_another_reason_still_fails() -> None:
    producer, asked = _producer_whose_lookups_fail([GroupAuthorizationFailedError()])
    framework.coordinator_lookups_retried(producer)
    with pytest.raises(GroupAuthorizationFailedError):
        await cast(Any, producer)._sender._find_coordinator(CoordinationType.GROUP, "group")
    producer, asked = _producer_whose_lookups_fail([UnknownError()])
    framework.coordinator_lookups_retried(producer)
    with pytest.raises(KafkaError) as failed:
        await cast(Any, producer)._sender._find_coordinator(CoordinationType.TRANSACTION, "t")
    assert isinstance(failed.value.__cause__, UnknownError) and asked == ["t"]


async def test_commits_go_past_the_offsets_allowed() -> None:
    """allow_commits_past, which the stages call for the offsets a consumer went past without
    delivering them: Faust's next commit then covers them. Faust's commit offset has no public
    reader short of a commit to a broker, so its own bookkeeping is read here, beside the other
    private names this module guards."""
    app = framework.app_class(7, 4096)(
        "gaps", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    app.finalize()
    consumer: Any = app.consumer
    tp = faust.types.TP("signatures", 0)
    consumer._committed_offset[tp] = 2
    consumer._acked[tp] = [4, 5, 8]  # delivered and acknowledged: 4, 5 and 8
    consumer._acked_index[tp] = {4, 5, 8}
    assert consumer._new_offset(tp) is None  # 2 and 3 never acknowledged: nothing to commit
    await framework.allow_commits_past(app, tp, 2, 3)
    await framework.allow_commits_past(app, tp, 6, 7)
    assert consumer._new_offset(tp) == 9
