"""neardup.config.Settings: NEARDUP_* parsing, validation, precedence, secrets."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from neardup.config import BY_NAME, ConfigError, Settings, markdown

SECRET = "s3cr3t-Pa55w0rd-xyzzy"


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.broker == "kafka://127.0.0.1:9092"
    assert settings.bootstrap_servers == "127.0.0.1:9092"


def test_environment_values_are_converted() -> None:
    settings = Settings.from_env(
        {
            "NEARDUP_BROKER": "kafka://broker-1:9093",
            "NEARDUP_INPUT_TOPIC": "news-in",
            "NEARDUP_INPUT_PARTITIONS": "12",
            "NEARDUP_THRESHOLD": "0.85",
            "NEARDUP_CONTAINMENT_THRESHOLD": "0",
            "NEARDUP_NUM_PERM": "256",
            "NEARDUP_SHINGLE_SIZE": "7",
            "NEARDUP_METRICS_PORT": "9200",
            "NEARDUP_STATE_DIR": "/var/lib/neardup",
            "NEARDUP_UNRELATED": "ignored",
            "UNPREFIXED_THRESHOLD": "0.1",
        }
    )
    assert settings.broker == "kafka://broker-1:9093"
    assert settings.input_topic == "news-in"
    assert settings.input_partitions == 12 and isinstance(settings.input_partitions, int)
    assert settings.threshold == 0.85 and isinstance(settings.threshold, float)
    assert settings.num_perm == 256 and settings.shingle_size == 7 and settings.metrics_port == 9200
    assert settings.state_path == Path("/var/lib/neardup")
    params = settings.params()
    assert (params.threshold, params.num_perm, params.shingle.k) == (0.85, 256, 7)
    assert settings.containment_threshold is None  # 0 switches partial verdicts off: None, not 0.0
    assert params.containment_threshold is None


@pytest.mark.parametrize("raw", ["none", "None", "", "0", "0.0"])
def test_a_threshold_of_none_or_zero_is_none(raw: str) -> None:
    settings = Settings.from_env({"NEARDUP_CONTAINMENT_THRESHOLD": raw, "NEARDUP_LSH_THRESHOLD": raw})
    assert settings.containment_threshold is None and settings.lsh_threshold is None
    assert Settings().lsh_threshold is None and Settings().bands is None


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("true", True), ("ON", True), ("no", False)])
def test_booleans(raw: str, value: bool) -> None:
    settings = Settings.from_env({"NEARDUP_WORD_SHINGLES": raw, "NEARDUP_NORMALIZE_NFKC": raw})
    assert settings.word_shingles is value and settings.normalize_nfkc is value
    assert settings.params().shingle.unit == ("word" if value else "char")
    assert settings.params().normalize.nfkc is value


def test_the_worker_sets_the_banding() -> None:
    params = Settings.from_env({"NEARDUP_BANDS": "16", "NEARDUP_ROWS": "8"}).params()
    assert (params.lsh.bands, params.lsh.rows) == (16, 8)
    with pytest.raises(ConfigError, match="give both bands and rows"):
        Settings.from_env({"NEARDUP_BANDS": "16"})


def test_reads_os_environ_when_no_mapping_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARDUP_APP_ID", "neardup-test")
    monkeypatch.setenv("NEARDUP_SIGN_BATCH", "17")
    settings = Settings.from_env()
    assert (settings.app_id, settings.sign_batch) == ("neardup-test", 17)


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("NEARDUP_NUM_PERM", "many", "int"),
        ("NEARDUP_INPUT_PARTITIONS", "1.5", "int"),
        ("NEARDUP_METRICS_PORT", "", "int"),
        ("NEARDUP_THRESHOLD", "high", "float"),
        ("NEARDUP_FN_WEIGHT", "0,5", "float"),
        ("NEARDUP_WORD_SHINGLES", "maybe", "bool"),
        ("NEARDUP_BANDS", "sixteen", "int or none"),
    ],
)
def test_type_errors_name_the_variable(name: str, value: str, kind: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: value})
    message = str(info.value)
    assert name in message and repr(value) in message and kind in message


@pytest.mark.parametrize("broker", ["http://127.0.0.1:9092", "127.0.0.1:9092", "", "KAFKA://x:1"])
def test_invalid_broker_url(broker: str) -> None:
    with pytest.raises(ConfigError, match="NEARDUP_BROKER"):
        Settings.from_env({"NEARDUP_BROKER": broker})


def test_several_brokers() -> None:
    settings = Settings.from_env({"NEARDUP_BROKER": "kafka://a:9092;kafka://b:9093;aiokafka://c:9094"})
    assert settings.bootstrap_servers == "a:9092,b:9093,c:9094"


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("NEARDUP_INPUT_PARTITIONS", "0", "NEARDUP_INPUT_PARTITIONS"),
        ("NEARDUP_VERDICTS_PARTITIONS", "-1", "NEARDUP_VERDICTS_PARTITIONS"),
        ("NEARDUP_MAX_TEXT_BYTES", "0", "NEARDUP_MAX_TEXT_BYTES"),
        ("NEARDUP_SIGN_BATCH", "0", "NEARDUP_SIGN_BATCH"),
        ("NEARDUP_FETCH_WAIT_MS", "0", "NEARDUP_FETCH_WAIT_MS"),
        ("NEARDUP_FETCH_MIN_BYTES", "0", "NEARDUP_FETCH_MIN_BYTES"),
        ("NEARDUP_SIGN_PROCESSES", "-1", "NEARDUP_SIGN_PROCESSES"),
        ("NEARDUP_RECORD_CACHE", "-1", "NEARDUP_RECORD_CACHE"),
        ("NEARDUP_PROBE_CACHE", "-1", "NEARDUP_PROBE_CACHE"),
        ("NEARDUP_GC_FREEZE_EVERY", "-5", "NEARDUP_GC_FREEZE_EVERY"),
        ("NEARDUP_INDEX_PROCESS", "2", "NEARDUP_INDEX_PROCESS"),
        ("NEARDUP_INDEX_PROCESS", "-1", "NEARDUP_INDEX_PROCESS"),
        ("NEARDUP_INDEX_HANDOFF", "2", "NEARDUP_INDEX_HANDOFF"),
        ("NEARDUP_HELPER_TIMEOUT", "0", "NEARDUP_HELPER_TIMEOUT"),
        ("NEARDUP_HELPER_ITEM_TIMEOUT_MS", "-1", "NEARDUP_HELPER_ITEM_TIMEOUT_MS"),
        ("NEARDUP_ROCKSDB_NICE", "20", "NEARDUP_ROCKSDB_NICE"),
        ("NEARDUP_ROCKSDB_NICE", "-1", "NEARDUP_ROCKSDB_NICE"),
        ("NEARDUP_SIGN_NICE", "20", "NEARDUP_SIGN_NICE"),
        ("NEARDUP_SIGN_NICE", "-3", "NEARDUP_SIGN_NICE"),
        ("NEARDUP_SECURITY_PROTOCOL", "TLS", "NEARDUP_SECURITY_PROTOCOL"),
        ("NEARDUP_THRESHOLD", "1.5", r"NEARDUP_THRESHOLD must be in \(0, 1\], got 1.5"),
        ("NEARDUP_THRESHOLD", "0", "NEARDUP_THRESHOLD"),
        ("NEARDUP_CONTAINMENT_THRESHOLD", "2", "NEARDUP_CONTAINMENT_THRESHOLD"),
        ("NEARDUP_NUM_PERM", "1", "NEARDUP_NUM_PERM must be in 2..4096, got 1"),
        ("NEARDUP_SHINGLE_SIZE", "0", "NEARDUP_SHINGLE_SIZE"),
        ("NEARDUP_MAX_CANDIDATES", "0", "NEARDUP_MAX_CANDIDATES"),
        ("NEARDUP_VERIFY_PERM", "100", "verify_perm must be 0 .off. or a multiple of num_perm=128"),
    ],
)
def test_invalid_values(name: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Settings.from_env({name: value})


def test_overrides_win_over_environment() -> None:
    env = {"NEARDUP_THRESHOLD": "0.7", "NEARDUP_INPUT_TOPIC": "from-env", "NEARDUP_NUM_PERM": "64"}
    settings = Settings.from_env(env, threshold=0.9, input_topic="from-flag", containment_threshold=None)
    assert settings.threshold == 0.9
    assert settings.input_topic == "from-flag"
    assert settings.containment_threshold is None  # None is a value an override can give
    assert settings.num_perm == 64


def test_overrides_are_the_worker_settings() -> None:
    with pytest.raises(TypeError, match="threshhold"):
        Settings.from_env({}, threshhold=0.9)
    with pytest.raises(ConfigError, match="NEARDUP_NUM_PERM"):
        Settings.from_env({}, num_perm="64")


def test_overrides_are_validated() -> None:
    with pytest.raises(ConfigError, match="NEARDUP_BROKER"):
        Settings.from_env({}, broker="localhost:9092")


def test_an_invalid_environment_value_is_reported_even_when_overridden() -> None:
    # the variable is parsed before flags apply: a broken environment is never silently accepted
    with pytest.raises(ConfigError, match="NEARDUP_NUM_PERM"):
        Settings.from_env({"NEARDUP_NUM_PERM": "x"}, num_perm=64)


def test_repr_never_shows_the_sasl_password() -> None:
    settings = Settings.from_env(
        {
            "NEARDUP_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "NEARDUP_SASL_MECHANISM": "SCRAM-SHA-512",
            "NEARDUP_SASL_USERNAME": "neardup",
            "NEARDUP_SASL_PASSWORD": SECRET,
        }
    )
    assert settings.sasl_password == SECRET
    for text in (repr(settings), str(settings), f"{settings}", f"{settings!r}", repr([settings])):
        assert SECRET not in text
        assert "sasl_username='neardup'" in text
    assert SECRET not in markdown()
    # the client gets it, of course
    security = settings.client_security()
    assert security["sasl_plain_password"] == SECRET
    assert security["security_protocol"] == "SASL_PLAINTEXT"
    assert security["sasl_mechanism"] == "SCRAM-SHA-512"


def test_plaintext_security_has_no_credentials() -> None:
    assert Settings().client_security() == {"security_protocol": "PLAINTEXT"}


def _sample(name: str, default: object) -> str:
    if name == "broker":
        return "kafka://elsewhere:1"
    if name == "security_protocol":
        return "SASL_PLAINTEXT"
    if name == "sasl_mechanism":  # one of those a user and a password are enough for
        return "SCRAM-SHA-512"
    if name in ("index_process", "index_handoff"):  # 0 or 1
        return "0"
    if name in ("retention", "time_skew"):  # durations
        return {"retention": "30d", "time_skew": "5m"}[name]
    if name == "min_event_time":
        return "1900-01-01T00:00:00Z"
    if name in ("num_perm", "verify_perm"):  # the verifier must be a multiple of the signature
        return {"num_perm": "64", "verify_perm": "256"}[name]
    if name == "unique_filter":
        return "unique,partial"
    if name == "processing_guarantee":
        return "exactly_once"
    if name == "session_timeout_ms":  # within Kafka's bounds, and three heartbeats
        return "20000"
    if name in ("bands", "rows"):  # both or neither, within num_perm
        return {"bands": "16", "rows": "8"}[name]
    if name in ("replication_factor", "min_insync_replicas"):  # none by default: the broker's
        return "3"
    if isinstance(default, bool):
        return str(not default).lower()
    if name == "lsh_threshold":
        return "0.4"
    if isinstance(default, int):
        return "7"
    if isinstance(default, float):
        return "0.6"
    return f"value-{name}"


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Settings)])
def test_every_field_can_be_set_from_the_environment(name: str) -> None:
    # each field's variable is honoured (a typo in a name would silently keep the default)
    default = getattr(Settings(), name)
    raw = _sample(name, default)
    env = {f"NEARDUP_{name.upper()}": raw}
    if name in ("bands", "rows"):
        env = {"NEARDUP_BANDS": "16", "NEARDUP_ROWS": "8"}
    settings = Settings.from_env(env)
    assert getattr(settings, name) == BY_NAME[name].kind.from_text(raw) != default


def test_zero_turns_helpers_cache_and_freezing_off() -> None:
    env = {
        "NEARDUP_SIGN_PROCESSES": "0",
        "NEARDUP_RECORD_CACHE": "0",
        "NEARDUP_PROBE_CACHE": "0",
        "NEARDUP_GC_FREEZE_EVERY": "0",
    }
    settings = Settings.from_env(env)
    caches = (settings.record_cache, settings.probe_cache)
    assert (settings.sign_processes, *caches, settings.gc_freeze_every) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("name", "raw"), [("RETENTION", "30 days"), ("TIME_SKEW", "-5m"), ("BUCKET_CAP", "0")]
)
def test_retention_settings_are_checked(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=f"NEARDUP_{name}"):
        Settings.from_env({f"NEARDUP_{name}": raw})


def test_the_retention_window_from_settings() -> None:
    window = Settings.from_env({"NEARDUP_RETENTION": "12h", "NEARDUP_TIME_SKEW": "1m"}).retention_window()
    assert (window.window_ms, window.skew_ms) == (12 * 3_600_000, 60_000)
    assert not Settings().retention_window().enabled, "the default keeps articles forever"


def test_the_group_instance_id_is_stable_per_host_and_state_dir(tmp_path: Path) -> None:
    first = Settings(state_dir=str(tmp_path / "a")).group_instance_id()
    assert first == Settings(state_dir=str(tmp_path / "a")).group_instance_id()
    assert first != Settings(state_dir=str(tmp_path / "b")).group_instance_id()
    assert first is not None and re.fullmatch(r"[a-zA-Z0-9._-]+", first), "Kafka's allowed characters"
    assert Settings(instance_id="neardup-worker-0").group_instance_id() == "neardup-worker-0"
    assert Settings(instance_id="off").group_instance_id() is None


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("INSTANCE_ID", "pod/0"),
        ("SESSION_TIMEOUT_MS", "5000"),
        ("SESSION_TIMEOUT_MS", "120000"),
        ("HEARTBEAT_INTERVAL_MS", "0"),
        ("HEARTBEAT_INTERVAL_MS", "4000"),
    ],
)
def test_membership_settings_are_checked(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=f"NEARDUP_{name}"):
        Settings.from_env({f"NEARDUP_{name}": raw})
