"""Every setting declared once, as a field of Settings: its type and default, and in the field's
metadata its flags, the modes it applies to, its meaning and its check (its variable is its name's).
The settings table (SETTINGS), the flags of each command, `neardup.open`'s keywords and the table
of deploy/docs/configuration.md (`python -m neardup.settings_doc`) are derived from the fields."""

from __future__ import annotations

import argparse
import difflib
import enum
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from .core.normalize import NormalizeOptions
from .core.params import FIELD_BOUNDS, DedupParams, bound_problem
from .core.retention import (
    DEFAULT_EARLIEST,
    Retention,
    format_duration_ms,
    parse_duration_ms,
    parse_earliest_ms,
)
from .core.shingle import ShingleOptions
from .errors import Error
from .messages import parse_verdict_filter
from .state.index import DEFAULT_BUCKET_CAP, DEFAULT_PROBE_CACHE, DEFAULT_RECORD_CACHE

# Kafka's bounds: the broker's default group.min.session.timeout.ms, and Faust's request timeout,
# which a session timeout may not exceed.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 90_000
_INSTANCE_ID = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class ConfigError(Error, ValueError):
    """A setting has a value the service cannot run with; the message names the variable."""


class Mode(enum.Enum):
    """Where settings are given: each has its own spelling of a setting's name."""

    WORKER = "worker"  # NEARDUP_* variables, then `neardup worker`'s flags (and the stream tools')
    DEDUP = "dedup"  # `neardup dedup`'s flags, NEARDUP_* variables under them
    EVALUATE = "evaluate"  # `neardup evaluate`'s flags, NEARDUP_* variables under them
    LIBRARY = "library"  # keywords of neardup.open()

    @property
    def label(self) -> str:
        return "neardup.open()" if self is Mode.LIBRARY else f"`neardup {self.value}`"


ALL_MODES = frozenset(Mode)


@dataclass(frozen=True)
class Kind:
    """How a value is written in a variable or a flag, and the Python type it has."""

    label: str  # in messages and flag metavars
    from_text: Callable[[str], Any]  # raises ValueError
    from_value: Callable[[Any], Any]  # a keyword's value as the type; raises TypeError or ValueError


def _typed(
    expected: type | tuple[type, ...], convert: Callable[[Any], Any] | None = None
) -> Callable[[Any], Any]:
    """A keyword's value if it is an `expected` one (as `convert` makes it): a bool is a number
    to Python, but no setting's number."""

    def from_value(value: Any) -> Any:
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise TypeError(value)
        return value if convert is None else convert(value)

    return from_value


def _bool_text(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _or_none(kind: Kind, zero_is_none: bool = False) -> Kind:
    """`kind` or None: `none` (or nothing) in text; with `zero_is_none`, 0 too: the "off" the
    thresholds take in variables and flags, as a threshold of 0 would mean nothing else."""

    def from_text(raw: str) -> Any:
        if raw.strip().lower() in ("", "none"):
            return None
        value = kind.from_text(raw)
        return None if zero_is_none and value == 0 else value

    return Kind(
        f"{kind.label} or none", from_text, lambda value: None if value is None else kind.from_value(value)
    )


def shown(value: Any) -> str:
    """A value as a variable or a flag writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


INT = Kind("int", int, _typed(int))
FLOAT = Kind("float", float, _typed((int, float), float))
STR = Kind("text", str, _typed(str))
BOOL = Kind("bool", _bool_text, _typed(bool))
DURATION = Kind("duration", str, STR.from_value)

Check = Callable[[Any], str | None]  # why a value is refused (the words after its name), or None


@dataclass(frozen=True)
class Setting:
    """One setting, as its field of Settings declares it: NEARDUP_<NAME> in the environment,
    `flags` on the command line of the commands of its modes, `name` as a keyword of neardup.open()."""

    name: str
    kind: Kind
    default: Any
    annotation: str  # its field's type
    help: str
    modes: frozenset[Mode] = frozenset({Mode.WORKER})
    flags: tuple[str, ...] = ()  # none: set by its variable only
    check: Check | None = None
    # modes that refuse it, and why: a setting that changes verdicts applies to every mode or says
    # why one cannot take it
    refused: Mapping[Mode, str] = field(default_factory=dict)
    changes_verdicts: bool = False
    secret: bool = False

    @property
    def env(self) -> str:
        return f"NEARDUP_{self.name.upper()}"

    @property
    def flag(self) -> str:
        """The long flag, which messages name."""
        return self.flags[-1]

    def parse(self, raw: str, where: str) -> Any:
        """A value as a variable or a flag writes it, converted and checked; `where` names it."""
        return self._converted(self.kind.from_text, raw, where)

    def from_environ(self, environ: Mapping[str, str]) -> Any:
        """Its variable's value in `environ`, converted and checked, else its default."""
        return self.parse(environ[self.env], self.env) if self.env in environ else self.default

    def coerce(self, value: Any, where: str) -> Any:
        """A value given as a Python object (a keyword), as its kind, checked."""
        return self._converted(self.kind.from_value, value, where)

    def _converted(self, convert: Callable[[Any], Any], given: Any, where: str) -> Any:
        try:
            value = convert(given)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}={given!r} is not a valid {self.kind.label}") from None
        self.validate(value, where)
        return value

    def validate(self, value: Any, where: str) -> None:
        """`NEARDUP_X must be ≥ 1, got 0`, `--x: not a duration: …`: a setting's name as its mode
        spells it, then the same words in every mode."""
        problem = None if self.check is None else self.check(value)
        if problem is not None:
            between = " " if problem.startswith(("must ", "may ")) else ": "
            raise ConfigError(f"{where}{between}{problem}")

    def not_applying(self, mode: Mode, where: str) -> str:
        """Why `where` (its name as the mode spells it) is refused by a mode it does not apply to."""
        why = self.refused.get(mode)
        return f"{where} does not apply to {mode.label}" + (f": {why}" if why else "")


def _at_least(low: float) -> Check:
    return lambda value: None if value >= low else f"must be ≥ {low}, got {value}"


def _none_or_at_least(low: int) -> Check:
    return lambda value: None if value is None or value >= low else f"must be ≥ {low} or none, got {value}"


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def _within(low: int, high: int) -> Check:
    return lambda value: None if low <= value <= high else f"must be in {low}..{high}, got {value}"


def _one_of(*choices: Any) -> Check:
    listed = ", ".join(str(choice) for choice in choices)
    return lambda value: None if value in choices else f"must be one of {listed}, got {value!r}"


def _reason(parse: Callable[[str], Any]) -> Check:
    """A parser's ValueError as the reason."""

    def check(value: str) -> str | None:
        try:
            parse(value)
        except ValueError as exc:
            return str(exc)
        return None

    return check


def _broker(value: str) -> str | None:
    if value.startswith(("kafka://", "aiokafka://")):
        return None
    return f"must look like kafka://host:port, got {value!r}"


# The SASL mechanisms a user and a password are enough for: aiokafka's others need what neardup
# does not configure, and would fail at the first connection with an error that does not say so.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SASL_REFUSED = {
    "OAUTHBEARER": "needs a token provider, which neardup does not configure",
    "GSSAPI": "needs Kerberos (a keytab, the gssapi package), which neardup does not configure",
}


def _sasl_mechanism(value: str) -> str | None:
    if value in SASL_MECHANISMS:
        return None
    listed = ", ".join(SASL_MECHANISMS)
    if value.upper() in _SASL_REFUSED:
        return f"{value} is not supported: it {_SASL_REFUSED[value.upper()]}; use one of {listed}"
    return f"must be one of {listed} (in capitals, as Kafka names them), got {value!r}"


def _instance_id(value: str) -> str | None:
    if value in ("", "off") or _INSTANCE_ID.fullmatch(value):
        return None
    return f"may hold letters, digits, '.', '_' and '-' (at most 249), got {value!r}"


@dataclass(frozen=True)
class _Declared:
    """A setting's default and the rest of its table entry (Setting's fields, `flag=True` for the flag
    its name spells), which `means` makes a field of Settings with its help."""

    default: Any
    entry: Mapping[str, Any]

    def means(self, help: str) -> Any:
        """The field; `help` is prose, its line breaks and indentation read as single spaces."""
        metadata = {**self.entry, "help": " ".join(help.split())}
        return field(default=self.default, repr=not self.entry.get("secret"), metadata=metadata)


def _setting(default: Any, **entry: Any) -> _Declared:
    """A worker's setting unless `modes` says otherwise; `kind` when the field's type alone does not
    say how it is written."""
    return _Declared(default, entry)


# Defaults that a lower layer needs too are read from it, so that each is written once.
_ENGINE = DedupParams()
_RETENTION = Retention()


def _verdicts(default: Any, **entry: Any) -> _Declared:
    """A setting that changes verdicts: a flag in every command that decides, a keyword of open()."""
    return _Declared(default, {"modes": ALL_MODES, "flag": True, **entry, "changes_verdicts": True})


def _by_time(default: str, parse: Callable[[str], Any], kind: Kind | None = None) -> _Declared:
    """A rule of event time, which evaluate refuses as it takes no time from the articles."""
    refused = {Mode.EVALUATE: "it times each article by its place in the file, so none expires"}
    modes = ALL_MODES - {Mode.EVALUATE}
    return _verdicts(default, kind=kind, modes=modes, check=_reason(parse), refused=refused)


@dataclass(frozen=True)
class Settings:
    """Every setting, as the worker takes it (NEARDUP_* variables, then flags): each field is the
    one declaration of a setting, its type and default, the rest of its table entry in the field's
    metadata."""

    broker: str = _setting("kafka://127.0.0.1:9092", flag=True, check=_broker).means("""
        Kafka bootstrap servers""")
    app_id: str = _setting("neardup").means("Faust app id (consumer group, changelog topic prefix)")
    input_topic: str = _setting("neardup-articles", flag=True).means("input topic")
    input_partitions: int = _setting(3, flag=True, check=_at_least(1)).means("""
        partitions when the worker creates the input topic""")
    signatures_topic: str = _setting("neardup-signatures").means("""
        internal topic between the stages (1 partition = 1 index shard)""")
    verdicts_topic: str = _setting("neardup-verdicts", flag=True).means("output topic")
    verdicts_partitions: int = _setting(3, check=_at_least(1)).means("""
        partitions when the worker creates the verdict topic""")
    dead_letter_topic: str = _setting("neardup-dead-letters").means("dead letters")
    unique_topic: str = _setting("").means("""
        the filtered feed: each article whose verdict passes `NEARDUP_UNIQUE_FILTER`, its input message (bytes
        and headers) unchanged, keyed by id; empty: off""")
    unique_filter: str = _setting(
        "unique,revised",
        modes=frozenset({Mode.WORKER, Mode.DEDUP}),
        flag=True,
        check=_reason(parse_verdict_filter),
    ).means("""
        the verdict kinds the filtered feed forwards, comma-separated: `unique`, `revised`, `partial`,
        `duplicate` (`neardup dedup`: with `--unique-out`); a revised article is a new text for an index,
        `unique` alone holds it back""")
    state_dir: str = _setting("./var/neardup", flag=True).means("""
        RocksDB state: the LSH index and its records (the decider's)""")
    max_text_bytes: int = _verdicts(1_000_000, check=_at_least(1)).means("""
        larger texts, and texts that normalisation expands past this many characters, are refused as
        `oversized` (dead-lettered; `neardup evaluate` skips them); with `NEARDUP_UNIQUE_TOPIC`, the feed
        topic must take this + 128 KB ([Message sizes](operations.md#message-sizes))""")
    threshold: float = _verdicts(_ENGINE.threshold).means("Jaccard for `duplicate`")
    containment_threshold: float | None = _verdicts(_ENGINE.containment_threshold).means("""
        containment for `partial` (`none` or 0: no partial verdicts)""")
    revised_threshold: float | None = _verdicts(_ENGINE.revised_threshold).means("""
        share of anchors (24-character shingles) one article holds of another for `revised`: it reuses that
        much of an earlier text without being a copy or a part of it; with `NEARDUP_CONTAINMENT_INDEX` on
        (`none` or 0: no revised verdicts)""")
    containment_index: bool = _verdicts(_ENGINE.containment_index).means("""
        the containment index: excerpts `partial` and reused text `revised` whatever their Jaccard, with the
        shared passages, for about a quarter of the worker's throughput
        ([Containment](operations.md#containment)); off: `partial` only for copies LSH finds, no `revised`,
        and state written without the index (the earlier default) opens as it is; a change needs a rebuild
        ([Upgrades](operations.md#upgrades))""")
    lsh_threshold: float | None = _verdicts(_ENGINE.lsh_threshold).means("""
        similarity LSH is tuned for (`none`: 0.5 with containment on, threshold-0.2 without)""")
    fn_weight: float = _verdicts(_ENGINE.fn_weight).means("""
        false-negative weight when tuning bands/rows (0..1)""")
    bands: int | None = _verdicts(_ENGINE.bands).means("""
        LSH bands, with `rows` (`none`: tuned for the LSH threshold)""")
    rows: int | None = _verdicts(_ENGINE.rows).means("rows per LSH band, with `bands`")
    num_perm: int = _verdicts(_ENGINE.num_perm).means("MinHash signature slots (LSH bands are cut from them)")
    verify_perm: int = _verdicts(_ENGINE.verify_perm).means("""
        slots of the verification sketch, 8 bits each (a multiple of num_perm; 0: verify on the signature)""")
    shingle_size: int = _verdicts(
        _ENGINE.shingle.k, flag=("-k", "--shingle-size"), check=_within(1, 64)
    ).means("""
        k: units per shingle""")
    word_shingles: bool = _verdicts(_ENGINE.shingle.unit == "word").means("""
        shingles of words instead of characters""")
    normalize_nfkc: bool = _verdicts(_ENGINE.normalize.nfkc).means("""
        Unicode NFKC before shingling (folds ligatures, full-width forms)""")
    normalize_casefold: bool = _verdicts(_ENGINE.normalize.casefold).means("case folding before shingling")
    normalize_whitespace: bool = _verdicts(_ENGINE.normalize.collapse_whitespace).means("""
        whitespace collapsed to single spaces before shingling""")
    seed: int = _verdicts(_ENGINE.seed).means("hashing seed (stored state records it)")
    top_candidates: int = _verdicts(_ENGINE.top_candidates).means("""
        verified candidates a verdict lists, best first""")
    max_candidates: int = _verdicts(_ENGINE.max_candidates).means("""
        LSH candidates an article is verified against at most""")
    metrics_host: str = _setting("127.0.0.1").means("bind address of /metrics and /health")
    metrics_port: int = _setting(9108, flag=True).means("port of /metrics and /health")
    web_host: str = _setting("127.0.0.1").means("bind address passed to Faust (its own web server stays off)")
    web_port: int = _setting(6066).means("Faust web port (unused while its server is off)")
    sign_batch: int = _setting(200, check=_at_least(1)).means("events the sign stage takes at a time")
    sign_processes: int = _setting(1, check=_at_least(0)).means("""
        helper processes that sign (normalize, shingle, MinHash) beside the event loop; 0: sign in the
        worker's own process""")
    sign_nice: int = _setting(0, check=_within(0, 19)).means("""
        niceness the signing helpers add to their own (0..19). Deciding is one serial process, signing can run
        on any core: where the worker shares a saturated machine with its broker (one host, as in the
        benchmark), 10 lets the decider have the CPU first, 1.09x articles/s; but the helpers then yield to
        every other process too: beside another busy process it cost 0.85x, and in a CPU group of the worker's
        own it made no difference (tests/benchmarks/RESULTS.md)""")
    index_process: int = _setting(1, check=_one_of(0, 1)).means("""
        1: the index stage (derived index, its caches, decisions) runs in a child process beside the event
        loop; 0: in the worker's own process""")
    index_handoff: int = _setting(1, check=_one_of(0, 1)).means("""
        1: while this worker owns the index shard, a signatures message it sent is decided as soon as the
        broker acknowledges it, in its place in the shard's order, instead of after the consumer has fetched
        it back (one fetch round trip less latency); 0: always through the consumer""")
    helper_timeout: float = _setting(20.0, check=_positive).means("""
        seconds a child process (signing helper, decider) may take to answer a request, plus the next setting
        per article (or record loaded) in it; one that takes longer is deemed hung, killed and replaced, and
        the request sent again; a second failure on the same batch stops the worker (exit status 1). A child's
        start may take 60 s""")
    helper_item_timeout_ms: float = _setting(100.0, check=_at_least(0)).means("""
        added to `NEARDUP_HELPER_TIMEOUT` per article of a request (signing a 1 MB text takes ~0.1 s)""")
    delivery_timeout: float = _setting(300.0, check=_positive).means("""
        seconds the producer retries a batch the broker does not acknowledge; then the worker stops with a
        failure and restarts from its last commit""")
    processing_guarantee: str = _setting(
        "at_least_once", check=_one_of("at_least_once", "exactly_once")
    ).means("""
        at_least_once: after a crash, verdicts of the articles decided since the last commit are published
        again (the same verdicts); exactly_once: the index stage's verdicts, feed messages, dead letters and
        changelog records and the signatures offsets it consumed commit together in Kafka transactions
        (batches committed in group), under a transactional id per index shard that fences any earlier owner,
        so a consumer reading with isolation.level=read_committed sees each (id, version) once
        (deploy/docs/operations.md, Guarantees)""")
    transaction_timeout: float = _setting(60.0, check=_positive).means("""
        exactly_once: seconds a transaction may stay open before the broker aborts it (a worker paused or cut
        off longer is fenced by its own timeout); it must not exceed the broker's transaction.max.timeout.ms
        (15 minutes by default)""")
    commit_interval: float = _setting(0.05, check=_at_least(0)).means("""
        exactly_once: the least time, in seconds, from one commit of a stage's transaction to the next (Kafka
        Streams' commit.interval.ms): batches that come meanwhile join the open transaction. Fewer, larger
        transactions cost the broker and the worker less (each commit leaves a marker that the index stage
        reads past) and add up to this much to a verdict's latency; 0 commits as soon as a batch joins""")
    stall_timeout: float = _setting(60.0, check=_positive).means("""
        seconds without progress (waiting input no agent takes while its stage waits for no acknowledgement,
        or a blocked event loop) after which `/health`, the liveness probe, answers 503 `stalled`; a broker
        outage is readiness' (`NEARDUP_READY_TIMEOUT`), not this""")
    ready_timeout: float = _setting(30.0, check=_positive).means("""
        seconds a stage's batches may wait for the broker's acknowledgement before `/ready` answers 503 (a
        broker outage): the worker is then not ready, but alive (`/health` stays 200), and delivers again when
        the broker returns, within `NEARDUP_DELIVERY_TIMEOUT`""")
    failure_exit_timeout: float = _setting(10.0, check=_positive).means("""
        seconds a stop for a failure may take before the process exits (status 1) without finishing it
        (nothing is lost: what was not committed comes back after the restart, and the index is on its
        write-ahead log); it adds to the time a broker outage costs""")
    record_cache: int = _setting(DEFAULT_RECORD_CACHE, check=_at_least(0)).means("""
        decoded article records the index keeps in memory (~2.8 KB each with their objects): the records read
        again for exact copies, re-deliveries and replays; 0: none""")
    probe_cache: int = _setting(DEFAULT_PROBE_CACHE, check=_at_least(0)).means("""
        candidates' probes the index keeps in memory (~1.2 KB each with the record they are read from), the
        latest read back or restored (hits do not reorder it): what verifying a candidate reads; misses cost a
        RocksDB read; 0: none""")
    bucket_cap: int = _verdicts(DEFAULT_BUCKET_CAP, check=_at_least(1)).means("""
        latest members an LSH bucket keeps: what one article reads and rewrites per bucket, whatever the size
        of a story's cluster""")
    retention: str = _by_time(format_duration_ms(_RETENTION.window_ms), parse_duration_ms, DURATION).means("""
        retention window (`30d`, `12h`, `90m`; `0`: keep forever): articles older than the newest article time
        minus this are expired from the index, and from the worker's changelog by tombstones""")
    time_skew: str = _by_time(format_duration_ms(_RETENTION.skew_ms), parse_duration_ms, DURATION).means("""
        a `published_at` or record timestamp further ahead of this process's clock than this (or a
        `published_at` that does not parse) is refused: the article is timed by the newest article time the
        index holds (by its record timestamp, else its arrival, while it holds none), and
        `neardup_refused_times_total` counts it""")
    min_event_time: str = _by_time(DEFAULT_EARLIEST, parse_earliest_ms).means("""
        the earliest `published_at` or record timestamp used (RFC 3339): an earlier one is refused as one too
        far ahead is. The default, the Unix epoch, refuses placeholder dates (year 1, 1900); an archive of
        older news sets it lower""")
    gc_freeze_every: int = _setting(5_000, check=_at_least(0)).means("""
        every so many indexed articles, freeze the surviving objects out of Python's full collections (0: off;
        see `service/pipeline/collector.py`)""")
    fetch_wait_ms: int = _setting(20, check=_at_least(1)).means("""
        how long the broker may hold a fetch (Faust hard-codes 1500 ms, which halved throughput here)""")
    fetch_min_bytes: int = _setting(32_768, check=_at_least(1)).means("""
        bytes the broker gathers for a fetch before it answers, unless the wait ends first: ~10 articles, so
        that at low rates the worker fetches in small batches rather than for nearly every article
        (tests/benchmarks/RESULTS.md has what it gains and costs; 64 KB with a 2 ms wait, and before that 1
        byte with 5 ms, were earlier defaults)""")
    rocksdb_nice: int = _setting(10, check=_within(0, 19)).means("""
        niceness added to RocksDB's flush and compaction threads in the index process (Linux), so that they
        yield to the decisions on a busy machine; 0 leaves them as they are""")
    index_in_memory: bool = _setting(True).means("""
        true: a new index holds its band buckets and posting lists in the decider's memory (~2 KB an article)
        and logs their changes to RocksDB one value a batch, rather than as keys of their own, which gives
        more articles/s (tests/benchmarks/BATCH.md); past 10,000,000 entries held (~1 GB, 200,000 to 600,000
        articles) they go back to being keys, a few thousand a write, and the index goes on keyed. false: keys
        from the start. A state keeps the layout it was created with: to switch, delete the state directory
        (the worker rebuilds the index from the changelog)""")
    instance_id: str = _setting("", check=_instance_id).means("""
        the worker's static membership id in the consumer group (Kafka's `group.instance.id`; letters, digits,
        `.`, `_`, `-`), unique per worker: a worker restarted with the same id gets its partitions back at
        once instead of after the dead one's session timeout. Empty: the host name (in Kubernetes the pod's
        name, stable in a StatefulSet) and a hash of the state directory's absolute path; `off`: no static
        membership. See "Membership" in [operations.md](operations.md)""")
    session_timeout_ms: int = _setting(
        10_000, check=_within(MIN_SESSION_TIMEOUT_MS, MAX_SESSION_TIMEOUT_MS)
    ).means(f"""
        how long the group waits for a silent worker before its partitions go to the others
        ({MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}; Faust's default is 60000): what a failover
        waits for""")
    heartbeat_interval_ms: int = _setting(1_000, check=_at_least(1)).means("""
        how often the consumer heartbeats (at most a third of the session timeout)""")
    standby_replicas: int = _setting(0, check=_at_least(0)).means("""
        warm standbys of the index: with 1 or more, every worker that does not own the index shard keeps its
        own index current from the committed changelog, so that a takeover replays seconds of it, not all of
        it (with one shard, values above 1 mean the same). See "Standbys" in
        [operations.md](operations.md)""")
    standby_interval: float = _setting(1.0, check=_positive).means("""
        seconds between a standby's catch-ups with the changelog: about what a takeover has left to replay, at
        the rate the changelog grows""")
    replication_factor: int | None = _setting(None, check=_none_or_at_least(1)).means("""
        replicas of every topic the worker creates (`none`: the broker's `default.replication.factor`); a
        topic it writes that exists with fewer is refused at start""")
    min_insync_replicas: int | None = _setting(None, check=_none_or_at_least(1)).means("""
        `min.insync.replicas` of every topic the worker creates (`none`: the broker's own); a topic it writes
        that exists with fewer is refused at start""")
    signatures_purge_interval: float = _setting(30.0, check=_positive).means("""
        seconds between purges of the signatures topic (delete-records up to the index stage's committed
        offset: messages whose verdicts the broker holds); the topic has no time or size retention, so nothing
        undecided is lost however long the worker stops""")
    log_level: str = _setting("info").means("log level")
    security_protocol: str = _setting(
        "PLAINTEXT", check=_one_of("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    ).means("""
        `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`""")
    sasl_mechanism: str = _setting("PLAIN", check=_sasl_mechanism).means("""
        SASL mechanism: `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` (others are refused at start); `PLAIN` sends
        the password as it is, so without TLS (`SASL_PLAINTEXT`) neardup warns at start""")
    sasl_username: str = _setting("").means("SASL user")
    sasl_password: str = _setting("", secret=True).means("SASL password (never printed)")
    ssl_cafile: str = _setting("").means("""
        CA bundle (PEM) that signed the brokers' certificates (empty: the system's)""")
    ssl_certfile: str = _setting("").means("client certificate")
    ssl_keyfile: str = _setting("").means("client key")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults ← NEARDUP_* variables ← overrides (the flags given, as values); all checked, a
        refusal naming the variable."""
        env = os.environ if env is None else env
        values = {s.name: s.parse(env[s.env], s.env) for s in for_mode(Mode.WORKER) if s.env in env}
        for name, value in overrides.items():
            if name not in BY_NAME or Mode.WORKER not in BY_NAME[name].modes:
                raise TypeError(f"no worker setting {name!r}")
            values[name] = BY_NAME[name].coerce(value, BY_NAME[name].env)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for setting in for_mode(Mode.WORKER):
            setting.coerce(getattr(self, setting.name), setting.env)
        if not self.heartbeat_interval_ms <= self.session_timeout_ms // 3:
            raise ConfigError(
                "NEARDUP_HEARTBEAT_INTERVAL_MS must be at most a third of the session timeout, "
                f"got {self.heartbeat_interval_ms}"
            )
        self.params()

    def feed_kinds(self) -> frozenset[str]:
        """The verdict kinds whose articles go to the filtered feed (NEARDUP_UNIQUE_TOPIC)."""
        return parse_verdict_filter(self.unique_filter)

    def params(self) -> DedupParams:
        return engine_params(vars(self))  # its fields are the settings

    def retention_window(self) -> Retention:
        return retention_window(vars(self))

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
        import hashlib  # with socket, imported here: only a worker asks for its id
        import socket

        path = str(self.state_path.resolve()).encode()
        host = re.sub(r"[^a-zA-Z0-9._-]", "_", socket.gethostname())[:200]
        return f"{host}-{hashlib.sha256(path).hexdigest()[:12]}"

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def isolation_level(self) -> str:
        """How the worker reads its topics: under exactly-once, committed records only (what an
        aborted transaction wrote is never decided, replayed or read back)."""
        return "read_committed" if self.exactly_once else "read_uncommitted"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(part.split("://", 1)[-1] for part in self.broker.split(";"))

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL")

    def security_warnings(self) -> list[str]:
        """What is accepted but exposes the credentials; logged at start."""
        if self.security_protocol == "SASL_PLAINTEXT" and self.sasl_mechanism == "PLAIN":
            return [
                "NEARDUP_SECURITY_PROTOCOL=SASL_PLAINTEXT with NEARDUP_SASL_MECHANISM=PLAIN sends the "
                "SASL password in clear to the brokers, readable by anyone on the network between: use "
                "SASL_SSL (TLS), or at least SCRAM-SHA-512"
            ]
        return []

    def connection_summary(self) -> str:
        """Where and how the clients connect, for a message that says a connection failed: the
        bootstrap servers, the security protocol and under SASL the mechanism and the user, never
        the password."""
        parts = [f"bootstrap servers {self.bootstrap_servers}", f"security protocol {self.security_protocol}"]
        if self.uses_sasl:
            parts += [f"SASL mechanism {self.sasl_mechanism}", f"user {self.sasl_username!r}"]
        if self.security_protocol in ("SSL", "SASL_SSL"):
            parts.append(f"CA file {self.ssl_cafile}" if self.ssl_cafile else "the system's CA certificates")
        return ", ".join(parts)

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
        if self.uses_sasl:
            extra.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return extra


# How a field's type is written in a variable or a flag, unless its declaration names a kind.
_KINDS = {
    "int": INT,
    "float": FLOAT,
    "str": STR,
    "bool": BOOL,
    "int | None": _or_none(INT),
    "float | None": _or_none(FLOAT, zero_is_none=True),
}


def _entry(declared: Field[Any]) -> Setting:
    """A field's table entry; an engine parameter's bounds are DedupParams's (FIELD_BOUNDS)."""
    name, annotation, entry = declared.name, str(declared.type), dict(declared.metadata)
    flag = entry.pop("flag", False)
    flags = (f"--{name.replace('_', '-')}",) if flag is True else flag or ()
    if "check" not in entry and name in FIELD_BOUNDS:
        entry["check"] = partial(bound_problem, name)
    kind = entry.pop("kind", None) or _KINDS[annotation]
    return Setting(name, kind, declared.default, annotation, flags=flags, **entry)


SETTINGS: tuple[Setting, ...] = tuple(_entry(declared) for declared in fields(Settings))
BY_NAME = {setting.name: setting for setting in SETTINGS}


def for_mode(mode: Mode) -> tuple[Setting, ...]:
    """The settings a mode takes, in the table's order."""
    return tuple(setting for setting in SETTINGS if mode in setting.modes)


def engine_params(values: Mapping[str, Any]) -> DedupParams:
    """The engine's parameters from settings' values (a missing one: its default); what the
    engine refuses (a banding that does not fit, say) is a ConfigError in its own words."""
    v = {setting.name: values.get(setting.name, setting.default) for setting in SETTINGS}
    try:
        return DedupParams(
            # a setting named as a field of DedupParams is that field; its compound fields take several
            **{param.name: v[param.name] for param in fields(DedupParams) if param.name in v},
            shingle=ShingleOptions(v["shingle_size"], "word" if v["word_shingles"] else "char"),
            normalize=NormalizeOptions(
                v["normalize_nfkc"], v["normalize_casefold"], v["normalize_whitespace"]
            ),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def retention_window(values: Mapping[str, Any]) -> Retention:
    """The retention window and the event time rules from the values of `retention`, `time_skew`
    and `min_event_time` (checked already)."""
    names = ("retention", "time_skew", "min_event_time")
    window, skew, earliest = (values.get(name, BY_NAME[name].default) for name in names)
    return Retention(parse_duration_ms(window), parse_duration_ms(skew), parse_earliest_ms(earliest))


# Other names of engine parameters (DedupParams's compound fields, the long spelling of fn_weight):
# a keyword using one is pointed to the settings' names.
_FORMER_KEYWORDS = {
    "false_negative_weight": "fn_weight",
    "shingle": "shingle_size and word_shingles",
    "normalize": "normalize_nfkc, normalize_casefold and normalize_whitespace",
}


def keyword_values(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting of neardup.open() from keywords (checked) and defaults. An unknown keyword,
    or a setting of other modes, is a TypeError naming it."""
    taken = {setting.name: setting for setting in for_mode(Mode.LIBRARY)}
    values = {name: setting.default for name, setting in taken.items()}
    for name, value in keywords.items():
        if name not in taken:
            raise TypeError(_not_taken(name, taken))
        values[name] = taken[name].coerce(value, name)
    return values


def _not_taken(name: str, taken: Mapping[str, Setting]) -> str:
    if name in BY_NAME:
        return BY_NAME[name].not_applying(Mode.LIBRARY, name)
    hint = _FORMER_KEYWORDS.get(name) or ", ".join(difflib.get_close_matches(name, taken, n=1))
    return f"{Mode.LIBRARY.label} has no setting {name!r}" + (f" (did you mean {hint}?)" if hint else "")


@dataclass(frozen=True)
class FlagSet:
    """The settings one command takes as flags, NEARDUP_* variables under them when `env`. A
    setting that changes verdicts but that the command's mode refuses is a hidden flag that
    refuses in the table's words."""

    settings: tuple[Setting, ...]
    env: bool = True
    refusals: Mapping[str, str] = field(default_factory=dict)  # a hidden flag's name: its refusal

    @classmethod
    def of(cls, mode: Mode) -> FlagSet:
        refused = [s for s in SETTINGS if mode in s.refused]
        refusals = {s.name: s.not_applying(mode, s.flag) for s in refused}
        return cls((*(s for s in for_mode(mode) if s.flags), *refused), True, refusals)

    @classmethod
    def named(cls, *names: str, env: bool = True) -> FlagSet:
        return cls(tuple(BY_NAME[name] for name in names), env)

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """The flags, as a group of the parser's arguments."""
        where = " over NEARDUP_* variables" if self.env else ""
        group = parser.add_argument_group(f"settings (flags{where}; deploy/docs/configuration.md)")
        for setting in self.settings:
            options: dict[str, Any] = {"dest": setting.name, "default": argparse.SUPPRESS}
            if setting.name in self.refusals:
                options["help"] = argparse.SUPPRESS
            else:
                default = shown(setting.default) or "empty"
                where = f"; env {setting.env}" if self.env else ""
                options["help"] = f"{setting.help} (default: {default}{where})".replace("%", "%%")
            if setting.kind is BOOL:
                options["action"] = argparse.BooleanOptionalAction
            else:
                options["metavar"] = setting.kind.label.split()[0].upper()
            group.add_argument(*setting.flags, **options)

    def given(self, args: argparse.Namespace) -> dict[str, Any]:
        """The values of the flags given, converted and checked (ConfigError naming the flag)."""
        values = {}
        for setting in (s for s in self.settings if hasattr(args, s.name)):
            if setting.name in self.refusals:
                raise ConfigError(self.refusals[setting.name])
            # a flag's text, but a bool as BooleanOptionalAction made it
            convert = setting.coerce if setting.kind is BOOL else setting.parse
            values[setting.name] = convert(getattr(args, setting.name), setting.flag)
        return values

    def resolve(self, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Every setting's value: its flag's, else its variable's (when `env`), else its default."""
        environ = (os.environ if environ is None else environ) if self.env else {}
        given = self.given(args)
        taken = (s for s in self.settings if s.name not in self.refusals)
        return {s.name: given[s.name] if s.name in given else s.from_environ(environ) for s in taken}


def markdown() -> str:
    """The table of deploy/docs/configuration.md: every setting, a row."""
    short = {Mode.WORKER: "worker", Mode.DEDUP: "dedup", Mode.EVALUATE: "evaluate", Mode.LIBRARY: "open()"}
    rows = [
        "| variable | flag | keyword | default | applies to | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for setting in SETTINGS:
        negation = "[no-]" if setting.kind is BOOL else ""
        flags = ", ".join(f"`{flag[:2]}{negation}{flag[2:]}`" for flag in setting.flags)
        keyword = f"`{setting.name}`" if Mode.LIBRARY in setting.modes else ""
        written = shown(setting.default)
        default = f"`{written}`" if written else ""
        modes = ", ".join(short[mode] for mode in Mode if mode in setting.modes)
        refusals = "".join(f" ({mode.label} refuses it: {why})" for mode, why in setting.refused.items())
        meaning = setting.help + refusals
        rows.append(f"| `{setting.env}` | {flags} | {keyword} | {default} | {modes} | {meaning} |")
    return "\n".join(rows) + "\n"
