"""deploy/: the Kubernetes manifests against the API's schemas (strict: an unknown or misspelt field
fails), and what they and the compose file promise: credentials only from a Secret, the image by
version, probes on /health and /ready, a volume sized for a month of articles, a network policy,
loopback ports."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from neardup.config import Settings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
COMPOSE = REPO / "deploy" / "docker-compose.yml"
# The newest release kubernetes-validate ships schemas for (pinned in pyproject.toml)
KUBERNETES_VERSION = "1.37.0"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SETTINGS = {f"NEARDUP_{spec.name.upper()}" for spec in fields(Settings)}
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def load(name: str) -> dict[str, Any]:
    (doc,) = yaml.safe_load_all((K8S / name).read_text())
    return doc


def worker() -> dict[str, Any]:
    (container,) = load("statefulset.yaml")["spec"]["template"]["spec"]["containers"]
    return container


def quantity(value: str) -> int:
    """A Kubernetes quantity in binary units (Ki, Mi, Gi, Ti), in bytes."""
    number, unit = re.fullmatch(r"(\d+)([KMGT]i)", value).groups()  # type: ignore[union-attr]
    return int(number) * 1024 ** ("KMGT".index(unit[0]) + 1)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_for_kubernetes(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    statefulset = load("statefulset.yaml")
    statefulset["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 15
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSION, strict=True)


def test_kustomization_applies_everything_but_the_secret_template() -> None:
    resources = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(resources) == sorted(p.name for p in MANIFESTS if p.name != "secret.example.yaml")


def test_image_is_the_package_version() -> None:
    assert worker()["image"] == f"neardup:{VERSION}"
    compose = yaml.safe_load(COMPOSE.read_text())
    assert compose["services"]["worker"]["image"] == f"neardup:{VERSION}"


def test_settings_are_real_and_credentials_come_from_the_secret() -> None:
    config = load("configmap.yaml")["data"]
    assert set(config) <= SETTINGS
    assert not {"NEARDUP_SASL_USERNAME", "NEARDUP_SASL_PASSWORD"} & set(config)
    assert config["NEARDUP_SECURITY_PROTOCOL"] == "SASL_SSL"
    Settings.from_env({**config, "NEARDUP_SASL_USERNAME": "u", "NEARDUP_SASL_PASSWORD": "p"})

    secret = load("secret.example.yaml")
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in worker()["env"]}
    assert set(env) == {"NEARDUP_SASL_USERNAME", "NEARDUP_SASL_PASSWORD"}
    for ref in env.values():
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"]
    # a template: placeholders only
    assert all(value.strip() == "REPLACE-ME" for value in secret["stringData"].values())
    # the CA file NEARDUP_SSL_CAFILE names is the Secret's ca.crt
    mounts = {m["name"]: m["mountPath"] for m in worker()["volumeMounts"]}
    volumes = {v["name"]: v for v in load("statefulset.yaml")["spec"]["template"]["spec"]["volumes"]}
    ca = volumes["kafka-ca"]["secret"]
    assert ca["secretName"] == secret["metadata"]["name"]
    assert config["NEARDUP_SSL_CAFILE"] == f"{mounts['kafka-ca']}/{ca['items'][0]['path']}"


def test_probes_ask_health_on_the_metrics_port() -> None:
    container = worker()
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": 9108}
    assert load("configmap.yaml")["data"]["NEARDUP_METRICS_PORT"] == "9108"
    # liveness (and startup) on /health, which a broker outage leaves 200; readiness on /ready
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}


def test_volume_and_memory_are_sized_for_a_month_of_articles() -> None:
    # deploy/docs/operations.md, "Sizing": 1 M articles a day, 30 days, ~1.2 KB each, 2x for RocksDB
    state_bytes = 1_000_000 * 30 * 1_200 * 2
    (claim,) = load("statefulset.yaml")["spec"]["volumeClaimTemplates"]
    assert quantity(claim["spec"]["resources"]["requests"]["storage"]) >= state_bytes
    assert load("configmap.yaml")["data"]["NEARDUP_RETENTION"] == "30d"  # the retention it assumes
    resources = worker()["resources"]
    assert quantity(resources["requests"]["memory"]) <= quantity(resources["limits"]["memory"])
    assert "cpu" not in resources["limits"]
    operations = (REPO / "deploy" / "docs" / "operations.md").read_text()
    sizing = operations.split("\n## Sizing\n", 1)[1].split("\n## ", 1)[0]
    for doc in (sizing, (K8S / "README.md").read_text()):
        assert claim["spec"]["resources"]["requests"]["storage"] in doc
        assert resources["requests"]["memory"] in doc and resources["limits"]["memory"] in doc
        assert "30d" in doc


def test_network_policy_allows_kafka_dns_and_monitoring_only() -> None:
    policy = load("networkpolicy.yaml")["spec"]
    template = load("statefulset.yaml")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]

    (ingress,) = policy["ingress"]
    (source,) = ingress["from"]
    assert source == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    assert ingress["ports"] == [{"protocol": "TCP", "port": 9108}]

    broker_port = int(load("configmap.yaml")["data"]["NEARDUP_BROKER"].rsplit(":", 1)[1])
    kafka, dns = policy["egress"]
    assert kafka["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}]
    assert kafka["ports"] == [{"protocol": "TCP", "port": broker_port}]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"]
    assert {p["port"] for p in dns["ports"]} == {53}


def test_compose_publishes_on_loopback_only() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    assert set(compose["services"]) == {"kafka", "worker"}
    published = [port for service in compose["services"].values() for port in service.get("ports", [])]
    assert published
    for port in published:
        assert isinstance(port, str) and port.startswith("127.0.0.1:"), port
    worker_env = compose["services"]["worker"]["environment"]
    assert set(worker_env) <= SETTINGS
    assert worker_env["NEARDUP_METRICS_PORT"] == 9108


def test_compose_says_how_to_turn_on_sasl_and_tls() -> None:
    comments = "\n".join(line for line in COMPOSE.read_text().splitlines() if line.lstrip().startswith("#"))
    named = set(re.findall(r"NEARDUP_[A-Z_]+", comments))
    security = {name for name in SETTINGS if name.startswith(("NEARDUP_SASL_", "NEARDUP_SSL_"))}
    assert security | {"NEARDUP_SECURITY_PROTOCOL"} <= named
    assert named <= SETTINGS
