"""One Settings object for the worker and the stream tools: environment (NEARDUP_*) then flags."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .core.params import DedupParams
from .core.retention import Retention, parse_duration_ms
from .core.shingle import ShingleOptions
from .messages import parse_verdict_filter

# Kafka's bounds: the broker's default group.min.session.timeout.ms, and Faust's request timeout,
# which a session timeout may not exceed.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 90_000
_INSTANCE_ID = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class ConfigError(ValueError):
    """A setting has a value the service cannot run with; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """Every knob, with its NEARDUP_<NAME> variable; deploy/docs/configuration.md lists them."""

    broker: str = "kafka://127.0.0.1:9092"
    app_id: str = "neardup"
    input_topic: str = "neardup-articles"
    input_partitions: int = 3
    signatures_topic: str = "neardup-signatures"
    verdicts_topic: str = "neardup-verdicts"
    verdicts_partitions: int = 3
    dead_letter_topic: str = "neardup-dead-letters"
    unique_topic: str = ""
    unique_filter: str = "unique"
    state_dir: str = "./var/neardup"
    max_text_bytes: int = 1_000_000
    threshold: float = 0.8
    containment_threshold: float = 0.9
    lsh_threshold: float = 0.0
    fn_weight: float = 0.5
    num_perm: int = 128
    verify_perm: int = 512
    shingle_size: int = 5
    seed: int = 1
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9108
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    sign_batch: int = 200
    sign_processes: int = 1
    sign_nice: int = 0
    index_process: int = 1
    index_handoff: int = 1
    helper_timeout: float = 20.0
    helper_item_timeout_ms: float = 100.0
    delivery_timeout: float = 300.0
    stall_timeout: float = 60.0
    failure_exit_timeout: float = 30.0
    record_cache: int = 20_000
    probe_cache: int = 100_000
    bucket_cap: int = 64
    retention: str = "0"
    time_skew: str = "10m"
    gc_freeze_every: int = 5_000
    fetch_wait_ms: int = 20
    fetch_min_bytes: int = 32_768
    rocksdb_nice: int = 10
    instance_id: str = ""
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    log_level: str = "info"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults ← NEARDUP_* variables ← explicit overrides (flags); values are type-checked."""
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            name = f"NEARDUP_{spec.name.upper()}"
            if name in env:
                values[spec.name] = _convert(name, env[name], type(getattr(cls(), spec.name)))
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if not self.broker.startswith(("kafka://", "aiokafka://")):
            raise ConfigError(f"NEARDUP_BROKER must look like kafka://host:port, got {self.broker!r}")
        for name in (
            "input_partitions",
            "verdicts_partitions",
            "max_text_bytes",
            "num_perm",
            "sign_batch",
            "fetch_wait_ms",
            "fetch_min_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"NEARDUP_{name.upper()} must be ≥ 1, got {getattr(self, name)}")
        for name in ("rocksdb_nice", "sign_nice"):
            if not 0 <= getattr(self, name) <= 19:
                raise ConfigError(f"NEARDUP_{name.upper()} must be in 0..19, got {getattr(self, name)}")
        for name in ("gc_freeze_every", "record_cache", "probe_cache", "sign_processes"):  # 0 turns each off
            if getattr(self, name) < 0:
                raise ConfigError(f"NEARDUP_{name.upper()} must be ≥ 0, got {getattr(self, name)}")
        for name in ("index_process", "index_handoff"):
            if getattr(self, name) not in (0, 1):
                raise ConfigError(f"NEARDUP_{name.upper()} must be 0 or 1, got {getattr(self, name)}")
        if not self.helper_timeout > 0 or not self.helper_item_timeout_ms >= 0:
            raise ConfigError(
                "NEARDUP_HELPER_TIMEOUT must be > 0 and NEARDUP_HELPER_ITEM_TIMEOUT_MS ≥ 0, got "
                f"{self.helper_timeout} and {self.helper_item_timeout_ms}"
            )
        try:
            self.feed_kinds()
        except ValueError as exc:
            raise ConfigError(f"NEARDUP_UNIQUE_FILTER: {exc}") from exc
        for name in ("delivery_timeout", "stall_timeout", "failure_exit_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"NEARDUP_{name.upper()} must be > 0 seconds, got {getattr(self, name)}")
        if self.bucket_cap < 1:
            raise ConfigError(f"NEARDUP_BUCKET_CAP must be ≥ 1, got {self.bucket_cap}")
        for name in ("retention", "time_skew"):
            try:
                if parse_duration_ms(getattr(self, name)) < 0:
                    raise ValueError("negative")
            except ValueError as exc:
                raise ConfigError(f"NEARDUP_{name.upper()}: {exc}") from exc
        if self.instance_id not in ("", "off") and not _INSTANCE_ID.fullmatch(self.instance_id):
            raise ConfigError(
                f"NEARDUP_INSTANCE_ID may hold letters, digits, '.', '_' and '-' (at most 249): "
                f"{self.instance_id!r}"
            )
        if not MIN_SESSION_TIMEOUT_MS <= self.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise ConfigError(
                f"NEARDUP_SESSION_TIMEOUT_MS must be in {MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}, "
                f"got {self.session_timeout_ms}"
            )
        if not 1 <= self.heartbeat_interval_ms <= self.session_timeout_ms // 3:
            raise ConfigError(
                "NEARDUP_HEARTBEAT_INTERVAL_MS must be ≥ 1 and at most a third of the session timeout, "
                f"got {self.heartbeat_interval_ms}"
            )
        if self.security_protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ConfigError(f"NEARDUP_SECURITY_PROTOCOL is not a Kafka protocol: {self.security_protocol}")
        try:
            self.params()
        except ValueError as exc:
            raise ConfigError(f"engine parameters: {exc}") from exc

    def feed_kinds(self) -> frozenset[str]:
        """The verdict kinds whose articles go to the filtered feed (NEARDUP_UNIQUE_TOPIC)."""
        return parse_verdict_filter(self.unique_filter)

    def params(self) -> DedupParams:
        return DedupParams(
            threshold=self.threshold,
            containment_threshold=self.containment_threshold or None,
            lsh_threshold=self.lsh_threshold or None,
            fn_weight=self.fn_weight,
            num_perm=self.num_perm,
            verify_perm=self.verify_perm,
            seed=self.seed,
            shingle=ShingleOptions(self.shingle_size),
        )

    def retention_window(self) -> Retention:
        return Retention(parse_duration_ms(self.retention), parse_duration_ms(self.time_skew))

    def group_instance_id(self) -> str | None:
        """The consumer's static group membership id (Kafka's group.instance.id), None for none.

        A member with one is not removed from the group when its process dies: a worker restarted
        with the same id takes its place, and its partitions, at once, instead of waiting for the
        dead member's session to expire. By default the host name (in Kubernetes the pod's name,
        stable in a StatefulSet) and the state directory, which no two workers share; hashed, as
        Kafka allows only [a-zA-Z0-9._-] in the id."""
        if self.instance_id == "off":
            return None
        if self.instance_id:
            return self.instance_id
        path = str(self.state_path.resolve()).encode()
        host = re.sub(r"[^a-zA-Z0-9._-]", "_", socket.gethostname())[:200]
        return f"{host}-{hashlib.sha256(path).hexdigest()[:12]}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(part.split("://", 1)[-1] for part in self.broker.split(";"))

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    def client_security(self) -> dict[str, Any]:
        """aiokafka keyword arguments for TLS/SASL; secrets stay out of repr() and logs."""
        extra: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            extra["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile or None,
                certfile=self.ssl_certfile or None,
                keyfile=self.ssl_keyfile or None,
            )
        if self.security_protocol.startswith("SASL"):
            extra.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return extra


def _convert(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            return raw.lower() in ("1", "true", "yes", "on")
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}") from exc


def settings_table() -> str:
    """Every setting and its default as a Markdown table, from the code, the password hidden
    (deploy/docs/configuration.md has the same rows, with their meaning)."""
    defaults = Settings()
    rows = ["| variable | default |", "| --- | --- |"]
    for spec in fields(Settings):
        value = "(secret)" if spec.name == "sasl_password" else getattr(defaults, spec.name)
        rows.append(f"| `NEARDUP_{spec.name.upper()}` | `{value}` |")
    return "\n".join(rows)
