"""The worker image: built by deploy/container/build.sh and run with podman against the test broker,
it decides the sample as the embedded mode does, answers /health and stops cleanly on SIGTERM; and
the pod template of deploy/k8s/statefulset.yaml, played by `podman kube play`, runs it too."""

from __future__ import annotations

import base64
import copy
import os
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from neardup.config import Settings
from tests.support.broker import TopicReader, produce_articles
from tests.support.deployment import REPO, Deployment, healthy, load_sample, run_embedded, without_latency

pytestmark = [
    # on one worker of a parallel run, so that the module's image is built once
    pytest.mark.xdist_group("container"),
    pytest.mark.skipif(
        shutil.which("podman") is None,
        reason="podman is not installed (Debian: apt-get install podman runc mmdebstrap; .ci/run does it)",
    ),
]

BUILD = REPO / "deploy" / "container" / "build.sh"
K8S = REPO / "deploy" / "k8s"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# The worker's own settings, and nothing else from the test's environment
SETTINGS = {f"NEARDUP_{spec.name.upper()}" for spec in fields(Settings)}
# The OCI runtime the containers run under, the one build.sh builds with (NEARDUP_PODMAN_RUNTIME,
# default runc); podman's global option, so it goes before the subcommand.
RUNTIME = ["--runtime", os.environ.get("NEARDUP_PODMAN_RUNTIME", "runc")]


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
        command = ["podman", *RUNTIME, "run", "--rm", "--name", self.container(index), "--network", "host"]
        # as deploy/k8s runs it: nothing written outside the state volume and /tmp (a tmpfs here)
        command += ["--read-only"]
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
    assert {v["verdict"] for v in got.values()} >= {"unique", "duplicate", "partial"}

    dep.stop_all()
    assert proc.returncode == 0, dep.logs()
    log = dep.logs()
    assert "Traceback" not in log and "Event loop is closed" not in log, log


def kube_play_rendering(dep: ContainerDeployment, secret_name: str) -> list[dict[str, Any]]:
    """deploy/k8s/ as podman 4.3's `kube play` takes it (deploy/k8s/README.md): the StatefulSet as a
    Deployment with a claim of its own, the ConfigMap pointed at the test broker, the Secret's name
    replaced by a podman secret's; the pod template's user, filesystem, probes and mounts unchanged."""
    statefulset = yaml.safe_load((K8S / "statefulset.yaml").read_text())
    config = yaml.safe_load((K8S / "configmap.yaml").read_text())
    template = copy.deepcopy(statefulset["spec"]["template"])
    pod = template["spec"]
    (container,) = pod["containers"]

    settings = {k: v for k, v in dep.env(0).items() if k in SETTINGS and k != "NEARDUP_STATE_DIR"}
    config["metadata"]["name"] = f"{dep.name}-config"
    config["data"].update(settings, NEARDUP_SECURITY_PROTOCOL="PLAINTEXT", NEARDUP_METRICS_HOST="127.0.0.1")
    container["envFrom"] = [{"configMapRef": {"name": config["metadata"]["name"]}}]
    for variable in container["env"]:
        variable["valueFrom"]["secretKeyRef"]["name"] = secret_name
    for volume in pod["volumes"]:
        if "secret" in volume:
            volume["secret"]["secretName"] = secret_name
    # the host's network: no port mappings, and the probes name the port by number
    del container["ports"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        container[probe]["httpGet"]["port"] = dep.metrics_ports[0]

    (claim_template,) = statefulset["spec"]["volumeClaimTemplates"]
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{dep.name}-state"},
        "spec": claim_template["spec"],
    }
    pod["volumes"].append(
        {
            "name": claim_template["metadata"]["name"],
            "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
        }
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": dep.name},
        "spec": {"replicas": 1, "selector": statefulset["spec"]["selector"], "template": template},
    }
    return [config, claim, deployment]


def test_kube_play_runs_the_statefulset_pod_template(kafka: str, tmp_path: Path, image: str) -> None:
    dep = ContainerDeployment(kafka, tmp_path, image=image)
    secret = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    secret_name = f"{dep.name}-kafka"
    kube_file = tmp_path / "kube.yaml"
    kube_file.write_text(yaml.safe_dump_all(kube_play_rendering(dep, secret_name)))
    # what podman 4.3's secretKeyRef reads: a JSON object of base64 values
    secret_file = tmp_path / "secret.json"
    secret_file.write_bytes(
        orjson.dumps({k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()})
    )
    articles = load_sample(60)
    expected = run_embedded(articles, tmp_path)
    try:
        podman("secret", "create", secret_name, str(secret_file))
        podman(*RUNTIME, "kube", "play", "--network", "host", str(kube_file))
        container = f"{dep.name}-pod-0-worker"
        wait_healthy(dep.metrics_ports[0], container, timeout=180)
        produce_articles(dep.bootstrap, dep.topics["input"], articles)
        reader = TopicReader(dep.bootstrap, dep.topics["verdicts"])
        records = reader.read_until(lambda r: len(r) >= len(articles), timeout=180)
        assert len(records) == len(articles), podman("logs", container, check=False)
        got = {v["article_id"]: without_latency(v) for v in map(orjson.loads, (r.value for r in records))}
        assert got == {v["article_id"]: without_latency(v) for v in expected}

        # the pod template's security settings held, and the credentials came from the secret
        inspect = orjson.loads(podman("container", "inspect", container))[0]
        assert inspect["Config"]["User"].split(":")[0] == "10001"
        assert inspect["HostConfig"]["ReadonlyRootfs"] is True
        env = dict(item.split("=", 1) for item in inspect["Config"]["Env"])
        assert env["NEARDUP_SASL_USERNAME"] == secret["stringData"]["sasl-username"]
        assert "NEARDUP_SASL_PASSWORD" in env
    finally:
        podman("kube", "down", str(kube_file), check=False)
        podman("secret", "rm", secret_name, check=False)
        # the claim, and the volume podman makes for the secret volume
        podman("volume", "rm", "--force", f"{dep.name}-state", secret_name, check=False)


def podman(*args: str, check: bool = True) -> str:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + ("" if check else result.stderr)


def wait_healthy(port: int, container: str, timeout: float) -> None:
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(url):
            return
        time.sleep(0.5)
    raise AssertionError(
        f"{container} not healthy after {timeout}s:\n{podman('logs', container, check=False)}"
    )
