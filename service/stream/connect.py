"""Starting a Kafka client, and what a failure to connect says.

aiokafka's bootstrap logs each server's error and then raises only "Unable to bootstrap from
[...]": a wrong password, an untrusted certificate and a port with nothing on it all read the
same. A client that cannot start raises BrokerUnreachable instead, whose message names the bootstrap
servers, the security protocol, the SASL mechanism and user (never the password) and each server's
own refusal, asked again directly."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, Protocol

from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from ..config import Settings
from ..errors import Error

# How long the second attempt waits for each server: it only says why the first one failed.
DIAGNOSE_TIMEOUT_S = 5.0
# The servers asked again, at most: a long bootstrap list says no more with all of them.
DIAGNOSE_HOSTS = 3


class BrokerUnreachable(Error, KafkaConnectionError):
    """A client could not connect at its start. A KafkaConnectionError still, so that whatever
    handles one handles this the same; only its message says more (alone: not after the class's
    name, as aiokafka's errors put it)."""

    def __str__(self) -> str:
        return str(self.args[0])


class Startable(Protocol):
    async def start(self) -> None: ...


async def start_client(settings: Settings, client: Startable) -> None:
    """`client.start()`; a failure to connect raised as BrokerUnreachable, the client closed (a
    producer, consumer or admin client that failed its start holds its half-made connections)."""
    try:
        await client.start()
    except KafkaConnectionError as exc:
        close = getattr(client, "stop", None) or getattr(client, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
        raise BrokerUnreachable(await unreachable(settings, exc)) from exc


async def unreachable(settings: Settings, error: BaseException) -> str:
    """The message for a client that could not connect: where and how it connected, and why each
    server (the first few) refuses a connection made with the settings' security, or the client's
    own error when none does now."""
    security = settings.client_security()
    hosts = collect_hosts(settings.bootstrap_servers, randomize=False)[:DIAGNOSE_HOSTS]
    causes = [(host, port, await _refusal(host, port, security)) for host, port, _family in hosts]
    why = "; ".join(f"{host}:{port}: {cause}" for host, port, cause in causes if cause is not None)
    return f"cannot connect to Kafka ({settings.connection_summary()}): {why or error}"


async def _refusal(host: str, port: int, security: dict[str, Any]) -> str | None:
    try:
        async with asyncio.timeout(DIAGNOSE_TIMEOUT_S):
            conn = await create_conn(
                host, port, request_timeout_ms=int(DIAGNOSE_TIMEOUT_S * 1000), **security
            )
    except Exception as exc:  # whatever it is, it is the reason to report
        return describe(exc, security)
    conn.close()
    return None


def describe(exc: BaseException, security: dict[str, Any]) -> str:
    """A server's refusal in words, with the settings that would change it."""
    if isinstance(exc, SaslAuthenticationFailed):
        return f"authentication failed ({exc}): check NEARDUP_SASL_USERNAME and NEARDUP_SASL_PASSWORD"
    if isinstance(exc, UnsupportedSaslMechanismError):
        return (
            f"the broker does not enable SASL mechanism {security.get('sasl_mechanism')} on this "
            "listener: check NEARDUP_SASL_MECHANISM"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the broker's TLS certificate is not trusted ({exc.verify_message}): check NEARDUP_SSL_CAFILE"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc}): check NEARDUP_SECURITY_PROTOCOL (is the listener TLS?)"
    if isinstance(exc, TimeoutError):
        return f"no answer within {DIAGNOSE_TIMEOUT_S:g} s"
    if isinstance(exc, (ConnectionResetError, KafkaConnectionError)):
        # what a listener does with a client that speaks another protocol to it (TLS to a plain
        # one or plain Kafka to a TLS one), among others
        return f"the connection was closed ({_text(exc)}): check NEARDUP_SECURITY_PROTOCOL"
    return _text(exc)


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
