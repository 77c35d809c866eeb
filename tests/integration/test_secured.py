"""Through a secured broker: a listener of SASL_SSL with SCRAM-SHA-512 (deploy/kafka/kafka.sh start
--sasl-ssl, its CA and certificate made on the spot), the worker and the CLI configured as
deploy/k8s/configmap.yaml ships them. Articles in, verdicts out, the changelog read back; a wrong
password refused with a message that says where, how and as whom, and a non-zero exit."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import yaml

from tests.support.broker import KAFKA_SH, free_port_pair
from tests.support.deployment import REPO, Deployment, load_sample, run_embedded

CONFIGMAP = REPO / "deploy" / "k8s" / "configmap.yaml"
USER = "neardup-test"
ARTICLES = 60
CLI_TIMEOUT_S = 60


@dataclass(frozen=True)
class SecuredBroker:
    port: int  # the PLAINTEXT listener, which kafka.sh keeps for its own probes
    sasl_port: int
    data: Path
    password: str

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def ca_file(self) -> Path:
        return self.data / "sasl-ssl" / "ca.crt"

    def run(self, *command: str) -> None:
        env = {
            **os.environ,
            "NEARDUP_KAFKA_PORT": str(self.port),
            "NEARDUP_KAFKA_DIR": str(self.data),
            "NEARDUP_KAFKA_SASL_PASSWORD": self.password,
        }
        subprocess.run([str(KAFKA_SH), *command], check=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    """One broker for the module: its start (a CA, a certificate, a format with the SCRAM user, the
    JVM) takes longer than either test."""
    port = free_port_pair()  # and its controller's, the next
    sasl_port = free_port_pair()
    while sasl_port in (port, port + 1):
        sasl_port = free_port_pair()
    broker = SecuredBroker(
        port, sasl_port, tmp_path_factory.mktemp("secured") / "kafka", secrets.token_urlsafe(16)
    )
    try:  # a start that fails half-way may have left a JVM running
        broker.run("start", "--sasl-ssl", str(broker.sasl_port), "--sasl-user", USER)
        yield broker
    finally:
        broker.run("stop", "--wipe")


def shipped_settings(broker: SecuredBroker, password: str) -> dict[str, str]:
    """The ConfigMap's settings, but for what names this machine's broker, CA file and ports, and
    the credentials the Secret would give."""
    config: dict[str, str] = yaml.safe_load(CONFIGMAP.read_text())["data"]
    assert (config["NEARDUP_SECURITY_PROTOCOL"], config["NEARDUP_SASL_MECHANISM"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
    )
    local = (
        "NEARDUP_BROKER",
        "NEARDUP_SSL_CAFILE",
        "NEARDUP_STATE_DIR",
        "NEARDUP_METRICS_HOST",
        "NEARDUP_METRICS_PORT",
    )
    return {
        **{name: value for name, value in config.items() if name not in local},
        "NEARDUP_SSL_CAFILE": str(broker.ca_file),
        "NEARDUP_SASL_USERNAME": USER,
        "NEARDUP_SASL_PASSWORD": password,
    }


def neardup(deployment: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    """A CLI command with the deployment's environment (its topics, the broker, the security)."""
    return subprocess.run(
        [sys.executable, "-m", "neardup", *args],
        cwd=REPO,
        env=deployment.env(0),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


def test_worker_produce_tail_and_stats_over_sasl_ssl_with_scram(
    secured: SecuredBroker, tmp_path: Path
) -> None:
    articles = load_sample(ARTICLES)
    expected = {v["article_id"]: v["verdict"] for v in run_embedded(articles, tmp_path)}
    deployment = Deployment(secured.bootstrap, tmp_path)
    deployment.extra_env.update(shipped_settings(secured, secured.password))
    try:
        deployment.start_worker()
        source = tmp_path / "articles.jsonl"
        source.write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in articles))

        produced = neardup(deployment, "produce", str(source))
        assert produced.returncode == 0, produced.stderr
        assert f"sent {ARTICLES} messages" in produced.stdout

        tailed = neardup(
            deployment, "tail", "--from-beginning", "--json", "--max", str(ARTICLES), "--idle-timeout", "45"
        )
        assert tailed.returncode == 0, tailed.stderr + deployment.logs()
        verdicts: dict[str, list[str]] = {}
        for line in tailed.stdout.splitlines():
            verdict = orjson.loads(line)
            verdicts.setdefault(verdict["article_id"], []).append(verdict["verdict"])
        assert verdicts == {article_id: [verdict] for article_id, verdict in expected.items()}
        assert set(expected.values()) - {"unique"}, "the sample holds copies: not every verdict is unique"

        stats = neardup(
            deployment,
            "stats",
            "--broker",
            f"kafka://{secured.bootstrap}",
            "--app-id",
            deployment.name,
            "--json",
        )
        assert stats.returncode == 0, stats.stderr
        assert orjson.loads(stats.stdout)["articles"] == ARTICLES
        for output in (produced, tailed, stats):
            assert secured.password not in output.stdout + output.stderr
        assert secured.password not in deployment.log_text()
    finally:
        deployment.discard()


def test_a_wrong_password_names_the_servers_protocol_mechanism_and_user(
    secured: SecuredBroker, tmp_path: Path
) -> None:
    wrong = "not-" + secured.password
    deployment = Deployment(secured.bootstrap, tmp_path)
    deployment.extra_env.update(shipped_settings(secured, wrong))
    expected = (
        f"cannot connect to Kafka (bootstrap servers {secured.bootstrap}, security protocol SASL_SSL, "
        f"SASL mechanism SCRAM-SHA-512, user '{USER}', CA file {secured.ca_file}): "
        f"{secured.bootstrap}: authentication failed"
    )
    worker = deployment.start_worker(wait=False)
    try:
        assert worker.wait(timeout=CLI_TIMEOUT_S) == 2
    finally:
        deployment.discard()
    logs = deployment.log_text()
    assert f"broker_unavailable {expected}" in logs, deployment.logs()

    source = tmp_path / "articles.jsonl"
    source.write_bytes(orjson.dumps(load_sample(1)[0]) + b"\n")
    outputs = [logs]
    for args in (
        ("produce", str(source)),
        ("tail", "--from-beginning", "--max", "1"),
        ("stats", "--broker", f"kafka://{secured.bootstrap}", "--app-id", deployment.name),
    ):
        done = neardup(deployment, *args)
        assert done.returncode != 0, (args, done.stdout, done.stderr)
        assert f"error: {expected}" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)
        outputs += [done.stdout, done.stderr]
    for text in outputs:
        assert wrong not in text
        assert secured.password not in text
