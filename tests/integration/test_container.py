"""The worker image: built by deploy/container/build.sh and run with podman against the test broker,
it decides the sample as the embedded mode does, answers /health and stops cleanly on SIGTERM."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import orjson
import pytest

from service.config import Settings

from .conftest import (
    REPO,
    Deployment,
    TopicReader,
    load_sample,
    produce_articles,
    run_embedded,
    without_latency,
)

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("podman") is None,
        reason="podman is not installed (Debian: apt-get install podman runc mmdebstrap; .ci/run does it)",
    ),
]

BUILD = REPO / "deploy" / "container" / "build.sh"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# The worker's own settings, and nothing else from the test's environment
SETTINGS = {f"NEARDUP_{spec.name.upper()}" for spec in fields(Settings)}


@pytest.fixture(scope="module")
def image() -> str:
    # The first build on a machine makes the Debian bases (minutes); later ones reuse every layer
    # whose inputs did not change.
    result = subprocess.run([str(BUILD)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-6000:]
    return result.stdout.strip().splitlines()[-1]


@dataclass
class ContainerDeployment(Deployment):
    """A Deployment whose workers run in the image: on the host's network, so the broker and the
    metrics port are where the subprocess workers would have them."""

    image: str = ""

    def container(self, index: int) -> str:
        return f"{self.name}-worker{index}"

    def start_worker(self, index: int = 0) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in self.env(index).items() if k in SETTINGS}
        del env["NEARDUP_STATE_DIR"]  # the image's volume, /var/lib/neardup
        env["NEARDUP_METRICS_HOST"] = "127.0.0.1"  # the host's loopback: the tests reach it, no one else
        command = ["podman", "run", "--rm", "--name", self.container(index), "--network", "host"]
        # No timer runs the image's HEALTHCHECK without systemd; the test runs it itself.
        command += ["--health-interval", "disable"]
        command += [arg for item in sorted(env.items()) for arg in ("--env", "=".join(item))]
        log = (self.root / f"worker{index}.log").open("ab")
        # `podman run` passes the SIGTERM of Deployment.stop_all on to the worker.
        proc = subprocess.Popen(
            [*command, self.image, "worker"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.workers.append(proc)
        self.wait_ready(index, proc, timeout=180)
        return proc

    def remove(self, index: int) -> None:
        subprocess.run(["podman", "rm", "--force", "--ignore", self.container(index)], capture_output=True)


@pytest.fixture
def container_deployment(kafka: str, tmp_path: Path, image: str) -> Iterator[ContainerDeployment]:
    dep = ContainerDeployment(kafka, tmp_path, image=image)
    yield dep
    dep.stop_all()
    dep.remove(0)


def test_image_is_tagged_with_the_package_version(image: str) -> None:
    assert image == f"localhost/neardup:{VERSION}"


def test_container_worker_verdicts_equal_embedded_mode(
    container_deployment: ContainerDeployment, tmp_path: Path
) -> None:
    dep = container_deployment
    articles = load_sample()
    expected = run_embedded(articles, tmp_path)
    proc = dep.start_worker()
    # /health answered ok from the host (wait_ready); the image's own HEALTHCHECK, inside, agrees
    check = subprocess.run(["podman", "healthcheck", "run", dep.container(0)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    produce_articles(dep.bootstrap, dep.topics["input"], articles)
    reader = TopicReader(dep.bootstrap, dep.topics["verdicts"])
    records = reader.read_until(lambda r: len(r) >= len(articles), timeout=240)
    assert len(records) == len(articles), dep.logs()
    got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
    assert got == {v["article_id"]: without_latency(v) for v in expected}
    assert {v["verdict"] for v in got.values()} == {"unique", "duplicate", "partial"}

    dep.stop_all()
    assert proc.returncode == 0, dep.logs()
    log = dep.logs()
    assert "Traceback" not in log and "Event loop is closed" not in log, log
