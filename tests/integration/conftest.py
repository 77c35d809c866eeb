"""Real-broker fixtures: the local Kafka from deploy/kafka/kafka.sh, a broker of a test's own, an
isolated deployment of workers. What they are made of, and what tests use beside them, is in
tests/support/broker.py and tests/support/deployment.py.

The broker is reused when one answers on NEARDUP_TEST_KAFKA_PORT (CI starts it); otherwise the
first test that needs it starts it, and the run stops it at its end (the main process, once every
parallel worker is done with it).
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BOOTSTRAP, KAFKA_SH, PORT, OwnBroker, free_port_pair
from tests.support.deployment import Deployment


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pytest_configure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the run's main process; its workers inherit the id
        os.environ["NEARDUP_TEST_RUN"] = str(os.getpid())


def _started_here() -> Path:
    """Says that this run started the broker, for the main process to stop it."""
    return Path(tempfile.gettempdir()) / f"neardup-kafka-{PORT}.started-by-{os.environ['NEARDUP_TEST_RUN']}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ and _started_here().exists():
        env = {**os.environ, "NEARDUP_KAFKA_PORT": str(PORT)}
        subprocess.run([str(KAFKA_SH), "stop", "--wipe"], check=False, env=env, timeout=120)
        _started_here().unlink()


@pytest.fixture(scope="session")
def kafka() -> Iterator[str]:
    # one start for the parallel workers that all find no broker
    with open(Path(tempfile.gettempdir()) / f"neardup-kafka-{PORT}.start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _port_open(PORT):
            env = {**os.environ, "NEARDUP_KAFKA_PORT": str(PORT)}
            subprocess.run([str(KAFKA_SH), "start"], check=True, env=env, timeout=600)
            _started_here().touch()
    yield BOOTSTRAP


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    broker = OwnBroker(free_port_pair(), tmp_path / "kafka")
    broker.run("start")
    try:
        yield broker
    finally:
        broker.run("stop", "--wipe")


@pytest.fixture
def deployment(kafka: str, tmp_path: Path) -> Iterator[Deployment]:
    dep = Deployment(kafka, tmp_path)
    yield dep
    dep.discard()
