"""Broker security: the SASL mechanisms accepted at start, the warning for a password sent in clear,
and what a client that cannot connect says (service/stream/connect.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

from neardup import cli
from neardup.config import SASL_MECHANISMS, ConfigError, Settings
from neardup.stream import connect, topics
from neardup.stream.connect import BrokerUnreachable, start_client, unreachable

PASSWORD = "s3cr3t-Pa55w0rd-xyzzy"
SCRAM = {
    "NEARDUP_BROKER": "kafka://broker-1:9093;kafka://broker-2:9093",
    "NEARDUP_SECURITY_PROTOCOL": "SASL_SSL",
    "NEARDUP_SASL_MECHANISM": "SCRAM-SHA-512",
    "NEARDUP_SASL_USERNAME": "neardup",
    "NEARDUP_SASL_PASSWORD": PASSWORD,
}
CLEAR = {**SCRAM, "NEARDUP_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "NEARDUP_SASL_MECHANISM": "PLAIN"}


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_the_mechanisms_a_user_and_password_are_enough_for_are_accepted(mechanism: str) -> None:
    assert Settings.from_env({**SCRAM, "NEARDUP_SASL_MECHANISM": mechanism}).sasl_mechanism == mechanism
    assert SASL_MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.mark.parametrize(
    ("mechanism", "why"),
    [("OAUTHBEARER", "needs a token provider"), ("GSSAPI", "needs Kerberos"), ("gssapi", "needs Kerberos")],
)
def test_the_others_are_refused_by_name_with_the_reason(mechanism: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({**SCRAM, "NEARDUP_SASL_MECHANISM": mechanism})
    message = str(refused.value)
    assert message.startswith(f"NEARDUP_SASL_MECHANISM: {mechanism} is not supported: it {why}")
    assert message.endswith("use one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512")


@pytest.mark.parametrize("mechanism", ["scram-sha-512", "DIGEST-MD5", ""])
def test_an_unknown_or_misspelt_mechanism_is_refused(mechanism: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^NEARDUP_SASL_MECHANISM must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
    ):
        Settings.from_env({**SCRAM, "NEARDUP_SASL_MECHANISM": mechanism})
    with pytest.raises(ConfigError, match="NEARDUP_SASL_MECHANISM"):
        Settings.from_env({}, sasl_mechanism=mechanism)  # a flag's value: the same check


def test_plain_without_tls_is_warned_of_and_nothing_else_is() -> None:
    (warning,) = Settings.from_env(CLEAR).security_warnings()
    assert "SASL_PLAINTEXT" in warning and "PLAIN" in warning and "in clear" in warning
    assert PASSWORD not in warning
    for env in (
        SCRAM,
        {**SCRAM, "NEARDUP_SASL_MECHANISM": "PLAIN"},  # PLAIN inside TLS
        {**CLEAR, "NEARDUP_SASL_MECHANISM": "SCRAM-SHA-512"},  # no password on the wire
        {},
    ):
        assert Settings.from_env(env).security_warnings() == []


def test_the_worker_logs_the_warning_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def unreachable_broker(settings: Settings) -> dict[str, int]:
        raise BrokerUnreachable("cannot connect to Kafka (…)")

    for name, value in {**CLEAR, "NEARDUP_STATE_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(topics, "ensure_topics", unreachable_broker)
    with caplog.at_level(logging.WARNING, logger="neardup.worker"):
        assert cli.main(["worker"]) == 2
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "neardup.worker"]
    assert logged[0][0] == "WARNING" and "insecure_connection" in logged[0][1] and "in clear" in logged[0][1]
    assert logged[-1] == ("ERROR", "broker_unavailable cannot connect to Kafka (…)")
    assert PASSWORD not in caplog.text


def test_the_summary_names_servers_protocol_mechanism_user_and_ca_never_the_password() -> None:
    summary = Settings.from_env(
        {**SCRAM, "NEARDUP_SSL_CAFILE": "/etc/neardup/kafka/ca.crt"}
    ).connection_summary()
    assert summary == (
        "bootstrap servers broker-1:9093,broker-2:9093, security protocol SASL_SSL, "
        "SASL mechanism SCRAM-SHA-512, user 'neardup', CA file /etc/neardup/kafka/ca.crt"
    )
    assert Settings.from_env(CLEAR).connection_summary() == (
        "bootstrap servers broker-1:9093,broker-2:9093, security protocol SASL_PLAINTEXT, "
        "SASL mechanism PLAIN, user 'neardup'"
    )
    assert Settings().connection_summary() == "bootstrap servers 127.0.0.1:9092, security protocol PLAINTEXT"
    tls = Settings.from_env({"NEARDUP_SECURITY_PROTOCOL": "SSL"}).connection_summary()
    assert tls.endswith("security protocol SSL, the system's CA certificates")


def _refusing(monkeypatch: pytest.MonkeyPatch, errors: dict[str, BaseException]) -> list[dict[str, Any]]:
    """create_conn raising each host's error; the keyword arguments it was given, one dict a call."""
    calls: list[dict[str, Any]] = []

    async def create_conn(host: str, port: int, **kwargs: Any) -> Any:
        calls.append({"host": host, "port": port, **kwargs})
        raise errors[host]

    monkeypatch.setattr(connect, "create_conn", create_conn)
    return calls


def _message(env: dict[str, str]) -> str:
    return asyncio.run(
        unreachable(Settings.from_env(env), KafkaConnectionError("Unable to bootstrap from [...]"))
    )


def test_a_wrong_password_is_said_with_where_how_and_as_whom(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = SaslAuthenticationFailed(
        "Authentication failed during authentication due to invalid credentials with SASL mechanism "
        "SCRAM-SHA-512"
    )
    calls = _refusing(monkeypatch, {"broker-1": refused, "broker-2": refused})
    message = _message(SCRAM)
    assert message.startswith(
        "cannot connect to Kafka (bootstrap servers broker-1:9093,broker-2:9093, security protocol SASL_SSL, "
        "SASL mechanism SCRAM-SHA-512, user 'neardup', the system's CA certificates): "
        "broker-1:9093: authentication failed ("
    )
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in message
    assert "check NEARDUP_SASL_USERNAME and NEARDUP_SASL_PASSWORD" in message
    assert "; broker-2:9093: authentication failed" in message
    assert PASSWORD not in message
    # asked again as the clients connect: the same security, each server in order
    assert [(c["host"], c["port"]) for c in calls] == [("broker-1", 9093), ("broker-2", 9093)]
    assert calls[0]["sasl_plain_password"] == PASSWORD and calls[0]["sasl_mechanism"] == "SCRAM-SHA-512"
    assert isinstance(calls[0]["ssl_context"], ssl.SSLContext)


def test_each_refusal_says_which_setting_to_look_at(monkeypatch: pytest.MonkeyPatch) -> None:
    untrusted = ssl.SSLCertVerificationError("certificate verify failed")
    untrusted.verify_message = "self-signed certificate in certificate chain"
    _refusing(
        monkeypatch,
        {
            "broker-1": untrusted,
            "broker-2": UnsupportedSaslMechanismError("<AIOKafkaConnection host=broker-2 port=9093>"),
        },
    )
    message = _message(SCRAM)
    assert (
        "broker-1:9093: the broker's TLS certificate is not trusted (self-signed certificate in certificate "
        "chain): check NEARDUP_SSL_CAFILE"
    ) in message
    assert (
        "broker-2:9093: the broker does not enable SASL mechanism SCRAM-SHA-512 on this listener" in message
    )

    _refusing(monkeypatch, {"broker-1": ConnectionResetError(), "broker-2": TimeoutError()})
    message = _message(SCRAM)
    assert (
        "broker-1:9093: the connection was closed (ConnectionResetError): check NEARDUP_SECURITY_PROTOCOL"
        in message
    )
    assert f"broker-2:9093: no answer within {connect.DIAGNOSE_TIMEOUT_S:g} s" in message


def test_servers_that_accept_now_leave_the_clients_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Connection:
        def close(self) -> None:
            pass

    async def create_conn(host: str, port: int, **kwargs: Any) -> Connection:
        return Connection()

    monkeypatch.setattr(connect, "create_conn", create_conn)
    assert _message(SCRAM).endswith(
        "user 'neardup', the system's CA certificates): KafkaConnectionError: Unable to bootstrap from [...]"
    )


def test_a_client_that_cannot_start_raises_broker_unreachable_and_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _refusing(
        monkeypatch,
        {"broker-1": SaslAuthenticationFailed("bad"), "broker-2": SaslAuthenticationFailed("bad")},
    )

    class Client:
        stopped = False

        async def start(self) -> None:
            raise KafkaConnectionError("Unable to bootstrap from [...]")

        async def stop(self) -> None:
            self.stopped = True

    client = Client()
    with pytest.raises(BrokerUnreachable) as failed:
        asyncio.run(start_client(Settings.from_env(SCRAM), client))
    assert client.stopped
    # still what it was: whatever handles a KafkaConnectionError handles it the same
    assert isinstance(failed.value, KafkaConnectionError)
    assert str(failed.value).startswith(
        "cannot connect to Kafka (bootstrap servers broker-1:9093,broker-2:9093"
    )
    assert isinstance(failed.value.__cause__, KafkaConnectionError)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: nothing listens there


@pytest.mark.parametrize(
    "args",
    [["produce", "ARTICLES"], ["tail", "--max", "1"], ["stats", "--broker", "BROKER"]],
    ids=["produce", "tail", "stats"],
)
def test_the_commands_exit_non_zero_with_the_message_and_warn_first(
    args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = f"kafka://127.0.0.1:{_closed_port()}"
    for name, value in {**CLEAR, "NEARDUP_BROKER": broker}.items():
        monkeypatch.setenv(name, value)
    articles = tmp_path / "articles.jsonl"
    articles.write_text('{"id": "a", "text": "some text"}\n')
    args = [{"ARTICLES": str(articles), "BROKER": broker}.get(arg, arg) for arg in args]
    with pytest.raises(SystemExit) as exited:
        cli.main(args)
    message = str(exited.value.code)
    assert message.startswith(
        f"error: cannot connect to Kafka (bootstrap servers {broker[len('kafka://') :]}, security protocol "
        "SASL_PLAINTEXT, SASL mechanism PLAIN, user 'neardup'): "
    )
    assert "Connect call failed" in message
    stderr = capsys.readouterr().err
    assert stderr.startswith(
        "warning: NEARDUP_SECURITY_PROTOCOL=SASL_PLAINTEXT with NEARDUP_SASL_MECHANISM=PLAIN"
    )
    assert PASSWORD not in message + stderr
