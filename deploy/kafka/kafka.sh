#!/usr/bin/env bash
# Local single-node Apache Kafka (KRaft, combined broker+controller) for development and CI.
#
# The broker is assembled from the release jars published on Maven Central, so no tarball,
# container engine or system package is needed: only Java 17+, Maven and python3.
#
#   deploy/kafka/kafka.sh fetch                      download the jars once into the cache
#   deploy/kafka/kafka.sh start  [--port N]          format storage (first time), start, wait until ready
#   deploy/kafka/kafka.sh status [--port N]          running or not (exit 0 if ready, 1 otherwise)
#   deploy/kafka/kafka.sh stop   [--port N] [--wipe] stop it; --wipe also removes its data dir
#   deploy/kafka/kafka.sh create-topic NAME PARTITIONS [--compact] [--port N]
#   deploy/kafka/kafka.sh list-topics [--port N]
#
# See deploy/kafka/README.md for the environment variables.
set -euo pipefail

KAFKA_VERSION="${NEARDUP_KAFKA_VERSION:-4.4.0}"
SCALA_VERSION="2.13"
# log4j2 is the logging backend of Kafka 4.x. The published poms bring log4j-api/-core but no
# slf4j binding (Kafka logs through slf4j-api 1.7), so the slf4j 1.x -> log4j2 bridge is added
# explicitly, at the log4j version Kafka itself is built with.
LOG4J_VERSION="${NEARDUP_KAFKA_LOG4J_VERSION:-2.25.5}"
DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

CACHE_ROOT="${NEARDUP_KAFKA_CACHE:-$HOME/.cache/neardup/kafka}"
VERSION_DIR="$CACHE_ROOT/$KAFKA_VERSION"
LIBS="$VERSION_DIR/libs"
MARKER="$VERSION_DIR/.fetched"
TOOLS_LOG4J_CONF="$VERSION_DIR/tools-log4j2.properties"

PORT="${NEARDUP_KAFKA_PORT:-9092}"
CONTROLLER_PORT="${NEARDUP_KAFKA_CONTROLLER_PORT:-}"
DATA_DIR="${NEARDUP_KAFKA_DIR:-}"
HEAP_OPTS="${NEARDUP_KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
START_TIMEOUT="${NEARDUP_KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT="${NEARDUP_KAFKA_STOP_TIMEOUT:-30}"
HOST="127.0.0.1"
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"

MAIN_CLASS="kafka.Kafka"
STORAGE_TOOL="kafka.tools.StorageTool"
TOPIC_TOOL="org.apache.kafka.tools.TopicCommand"

log() { printf '%s\n' "$*"; }
die() { printf 'kafka.sh: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------------------------------------
# argument parsing: one subcommand, positional args, options anywhere
# ---------------------------------------------------------------------------------------------
CMD="${1:-}"
[[ -n "$CMD" ]] || { usage; exit 2; }
shift
ARGS=()
WIPE=0
COMPACT=0
while (($#)); do
    case "$1" in
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --port=*) PORT="${1#*=}"; shift ;;
        --controller-port) CONTROLLER_PORT="${2:?--controller-port needs a value}"; shift 2 ;;
        --controller-port=*) CONTROLLER_PORT="${1#*=}"; shift ;;
        --dir) DATA_DIR="${2:?--dir needs a value}"; shift 2 ;;
        --dir=*) DATA_DIR="${1#*=}"; shift ;;
        --timeout) START_TIMEOUT="${2:?--timeout needs a value}"; shift 2 ;;
        --timeout=*) START_TIMEOUT="${1#*=}"; shift ;;
        --wipe) WIPE=1; shift ;;
        --compact) COMPACT=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --*) die "unknown option $1" ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

[[ "$PORT" =~ ^[0-9]+$ ]] || die "port must be a number, got '$PORT'"
CONTROLLER_PORT="${CONTROLLER_PORT:-$((PORT + 1))}"
[[ "$CONTROLLER_PORT" =~ ^[0-9]+$ ]] || die "controller port must be a number"
[[ "$CONTROLLER_PORT" != "$PORT" ]] || die "controller port must differ from the broker port"
DATA_DIR="${DATA_DIR:-/tmp/neardup-kafka-$PORT}"
PID_FILE="$DATA_DIR/kafka.pid"
LOG_FILE="$DATA_DIR/kafka.log"
PROPS="$DATA_DIR/server.properties"
LOG4J_CONF="$DATA_DIR/log4j2.properties"
LOG_DIRS="$DATA_DIR/data"

# ---------------------------------------------------------------------------------------------
# fetch
# ---------------------------------------------------------------------------------------------
# complete when the marker exists and every jar it lists is still there
fetched() {
    [[ -s "$MARKER" && -d "$LIBS" ]] || return 1
    local jar
    while IFS= read -r jar; do
        [[ -s "$LIBS/$jar" ]] || return 1
    done <"$MARKER"
}

write_pom() {
    cat >"$1" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>neardup.local</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_$SCALA_VERSION</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-storage</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
}

cmd_fetch() {
    if fetched; then
        log "kafka $KAFKA_VERSION jars already in $LIBS"
        return 0
    fi
    command -v mvn >/dev/null || die "mvn (Maven) is needed to fetch the Kafka jars"
    mkdir -p "$CACHE_ROOT"
    # one fetch at a time per cache (parallel CI jobs on one machine)
    exec 9>"$CACHE_ROOT/.lock"
    flock 9
    if fetched; then
        log "kafka $KAFKA_VERSION jars already in $LIBS"
        exec 9>&-
        return 0
    fi
    rm -rf "$VERSION_DIR".staging.*  # leftovers of an interrupted fetch
    local stage
    stage="$(mktemp -d "$VERSION_DIR.staging.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$stage'" EXIT
    write_pom "$stage/pom.xml"
    log "fetching kafka $KAFKA_VERSION jars from Maven Central into $LIBS ..."
    local t0=$SECONDS
    # -U: retry artifacts whose earlier download failed (Maven caches failures otherwise).
    # The Maven repository lives inside the cache so the cache is self-contained.
    if ! mvn -B -q -U -f "$stage/pom.xml" \
        -Dmaven.repo.local="$CACHE_ROOT/m2" \
        "$DEPENDENCY_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime -DoutputDirectory="$stage/libs" >"$stage/mvn.log" 2>&1; then
        tail -n 40 "$stage/mvn.log" >&2
        die "fetching kafka $KAFKA_VERSION failed (see above); run fetch again to retry"
    fi
    local jar
    for jar in "kafka_$SCALA_VERSION-$KAFKA_VERSION.jar" "kafka-server-$KAFKA_VERSION.jar" \
               "kafka-tools-$KAFKA_VERSION.jar" "kafka-clients-$KAFKA_VERSION.jar" \
               "log4j-core-$LOG4J_VERSION.jar" "log4j-slf4j-impl-$LOG4J_VERSION.jar"; do
        [[ -s "$stage/libs/$jar" ]] || die "fetch incomplete: $jar missing"
    done
    rm -rf "$LIBS" "$MARKER"
    mkdir -p "$VERSION_DIR"
    mv "$stage/libs" "$LIBS"
    find "$LIBS" -maxdepth 1 -name '*.jar' -printf '%f\n' | sort >"$MARKER.tmp"
    mv "$MARKER.tmp" "$MARKER"
    rm -rf "$stage"
    trap - EXIT
    exec 9>&-
    log "fetched $(wc -l <"$MARKER") jars in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
java_cp() { printf '%s/*' "$LIBS"; }

check_java() {
    command -v "$JAVA" >/dev/null || die "java not found ($JAVA); Kafka $KAFKA_VERSION needs Java 17+"
    local v
    v="$("$JAVA" -XshowSettings:properties -version 2>&1 \
        | awk -F'= ' '/java.specification.version/ {print $2}')"
    if ! [[ "${v%%.*}" =~ ^[0-9]+$ ]] || ((${v%%.*} < 17)); then
        die "Kafka $KAFKA_VERSION needs Java 17+, found '${v:-?}' ($JAVA); set JAVA_HOME"
    fi
}

# true if something accepts TCP connections on 127.0.0.1:$1
port_busy() {
    (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# process exists and is not a zombie
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
    [[ "$state" != "Z" ]]
}

# pid of the broker this script started for this data dir, if it is alive
our_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$MAIN_CLASS $PROPS" || return 1
    printf '%s\n' "$pid"
}

# Ask the broker over the Kafka protocol whether it serves metadata with itself registered
# (ApiVersions, then Metadata listing at least one live broker). Exit 0 when ready.
probe() {
    if ! command -v python3 >/dev/null; then
        # no python3: accept an open port plus the broker's own "started" log line
        port_busy "$PORT" && grep -q "Kafka Server started" "$LOG_FILE" 2>/dev/null
        return
    fi
    python3 - "$HOST" "$PORT" <<'PY'
import socket, struct, sys

host, port = sys.argv[1], int(sys.argv[2])

def call(sock, api_key, version, corr, body=b""):
    client = b"neardup-kafka-sh"
    req = struct.pack(">hhih", api_key, version, corr, len(client)) + client + body
    sock.sendall(struct.pack(">i", len(req)) + req)
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(4 - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    (size,) = struct.unpack(">i", buf)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    if struct.unpack(">i", data[:4])[0] != corr:
        raise ValueError("correlation id mismatch")
    return data[4:]

try:
    with socket.create_connection((host, port), timeout=3) as s:
        s.settimeout(3)
        resp = call(s, 18, 0, 1)  # ApiVersions v0
        err, n = struct.unpack(">hi", resp[:6])
        if err != 0:
            sys.exit(1)
        ranges = {}
        for i in range(n):
            k, lo, hi = struct.unpack(">hhh", resp[6 + 6 * i: 12 + 6 * i])
            ranges[k] = (lo, hi)
        lo, hi = ranges.get(3, (0, -1))
        # Metadata v4..v7 share the request layout and the response prefix read below
        v = max(lo, 4)
        if v > min(hi, 7):
            sys.exit(0)  # cannot speak a Metadata version we know; ApiVersions answered
        body = struct.pack(">i", -1) + b"\x01"  # all topics, allow auto-creation (ignored)
        resp = call(s, 3, v, 2, body)
        _throttle, brokers = struct.unpack(">ii", resp[:8])
        sys.exit(0 if brokers >= 1 else 1)
except (OSError, ValueError, struct.error):
    sys.exit(1)
PY
}

write_configs() {
    mkdir -p "$DATA_DIR" "$LOG_DIRS"
    cat >"$PROPS" <<EOF
# generated by deploy/kafka/kafka.sh; rewritten on every start
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$LOG_DIRS
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=${NEARDUP_KAFKA_OFFSETS_PARTITIONS:-8}
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=${NEARDUP_KAFKA_TXN_PARTITIONS:-8}
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
log.segment.bytes=67108864
log.cleaner.dedupe.buffer.size=16777216
delete.topic.enable=true
EOF
    cat >"$LOG4J_CONF" <<'EOF'
# generated by deploy/kafka/kafka.sh: everything to stdout, which is redirected to kafka.log
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.statechange.name = state.change.logger
logger.statechange.level = warn
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = warn
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = warn
EOF
}

# command-line tools (storage format, topics): warnings and errors only, to stderr
write_tools_log4j() {
    [[ -s "$TOOLS_LOG4J_CONF" ]] && return 0
    cat >"$TOOLS_LOG4J_CONF.tmp.$$" <<'EOF'
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = STDERR
EOF
    mv "$TOOLS_LOG4J_CONF.tmp.$$" "$TOOLS_LOG4J_CONF"
}

format_storage() {
    if [[ -f "$LOG_DIRS/meta.properties" ]]; then
        return 0
    fi
    write_tools_log4j
    local cluster_id
    if [[ -s "$DATA_DIR/cluster.id" ]]; then
        cluster_id="$(cat "$DATA_DIR/cluster.id")"
    else
        # what `StorageTool random-uuid` prints (a base64url UUID), without starting a JVM
        cluster_id="$(python3 -c '
import base64, uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break
')"
        printf '%s\n' "$cluster_id" >"$DATA_DIR/cluster.id"
    fi
    "$JAVA" -Dlog4j2.configurationFile="$TOOLS_LOG4J_CONF" -cp "$(java_cp)" \
        "$STORAGE_TOOL" format --ignore-formatted -t "$cluster_id" -c "$PROPS" >>"$LOG_FILE" 2>&1 \
        || { tail -n 20 "$LOG_FILE" >&2; die "formatting KRaft storage in $LOG_DIRS failed"; }
}

# ---------------------------------------------------------------------------------------------
# start / stop / status
# ---------------------------------------------------------------------------------------------
cmd_start() {
    local pid
    mkdir -p "$DATA_DIR"
    exec 8>"$DATA_DIR/.start.lock"
    flock 8  # a second concurrent start for this data dir waits, then finds the broker running
    if pid="$(our_pid)"; then
        if probe; then
            log "kafka already running on $HOST:$PORT (pid $pid, data dir $DATA_DIR)"
            return 0
        fi
        log "kafka (pid $pid) is starting; waiting for it"
    else
        local p
        for p in "$PORT" "$CONTROLLER_PORT"; do
            if port_busy "$p"; then
                die "port $HOST:$p is already in use by another process (not a broker started by this script for $DATA_DIR); pick another with --port or NEARDUP_KAFKA_PORT"
            fi
        done
        check_java
        cmd_fetch
        write_configs
        rm -f "$PID_FILE"
        format_storage
        log "starting kafka $KAFKA_VERSION on $HOST:$PORT (controller $CONTROLLER_PORT), data dir $DATA_DIR"
        {
            printf '\n==== %s start kafka %s on %s:%s ====\n' "$(date -Is)" "$KAFKA_VERSION" "$HOST" "$PORT"
        } >>"$LOG_FILE"
        # setsid: the broker must not die with the caller's terminal or process group.
        # The child writes its own pid before exec'ing java, so the pid file names the JVM.
        # shellcheck disable=SC2086,SC2016
        setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PID_FILE" \
            "$JAVA" $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
            -Djava.awt.headless=true \
            -Dlog4j2.configurationFile="$LOG4J_CONF" -Dkafka.logs.dir="$DATA_DIR" \
            -cp "$(java_cp)" "$MAIN_CLASS" "$PROPS" \
            </dev/null >>"$LOG_FILE" 2>&1 8>&- 9>&- &
        local _
        for _ in $(seq 1 50); do
            [[ -s "$PID_FILE" ]] && break
            sleep 0.1
        done
        pid="$(cat "$PID_FILE" 2>/dev/null || true)"
        [[ -n "$pid" ]] || die "broker process did not start; see $LOG_FILE"
    fi
    local deadline=$((SECONDS + START_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! alive "$pid"; then
            tail -n 40 "$LOG_FILE" >&2
            rm -f "$PID_FILE"
            die "kafka exited during startup; full log in $LOG_FILE"
        fi
        if probe; then
            log "kafka ready on $HOST:$PORT"
            return 0
        fi
        sleep 0.25
    done
    tail -n 40 "$LOG_FILE" >&2
    die "kafka did not become ready on $HOST:$PORT within ${START_TIMEOUT}s (pid $pid still running; stop it with: $0 stop --port $PORT)"
}

cmd_stop() {
    local pid
    if pid="$(our_pid)"; then
        log "stopping kafka (pid $pid) on $HOST:$PORT ..."
        kill -TERM "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + STOP_TIMEOUT))
        while alive "$pid" && ((SECONDS < deadline)); do
            sleep 0.2
        done
        if alive "$pid"; then
            log "kafka did not stop within ${STOP_TIMEOUT}s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            while alive "$pid"; do sleep 0.1; done
        fi
        rm -f "$PID_FILE"
        log "kafka stopped"
    else
        rm -f "$PID_FILE"
        log "no kafka started by this script is running for $DATA_DIR"
    fi
    if ((WIPE)); then
        case "$DATA_DIR" in
            ""|/|"$HOME") die "refusing to wipe '$DATA_DIR'" ;;
        esac
        rm -rf "$DATA_DIR"
        log "removed $DATA_DIR"
    fi
    local p
    for p in "$PORT" "$CONTROLLER_PORT"; do
        if port_busy "$p"; then
            die "port $HOST:$p is still in use (by a process this script did not start)"
        fi
    done
}

cmd_status() {
    local pid
    if pid="$(our_pid)"; then
        if probe; then
            log "kafka running on $HOST:$PORT (pid $pid, data dir $DATA_DIR)"
            return 0
        fi
        log "kafka process running (pid $pid) but not answering on $HOST:$PORT"
        return 1
    fi
    if port_busy "$PORT"; then
        log "kafka not started by this script; port $HOST:$PORT is used by another process"
    else
        log "kafka not running on $HOST:$PORT"
    fi
    return 1
}

# ---------------------------------------------------------------------------------------------
# topics
# ---------------------------------------------------------------------------------------------
topic_tool() {
    fetched || die "kafka jars not fetched; run: $0 fetch"
    write_tools_log4j
    "$JAVA" -Xmx256m -Dlog4j2.configurationFile="$TOOLS_LOG4J_CONF" -cp "$(java_cp)" "$TOPIC_TOOL" \
        --bootstrap-server "$HOST:$PORT" "$@"
}

cmd_create_topic() {
    ((${#ARGS[@]} == 2)) || die "usage: $0 create-topic NAME PARTITIONS [--compact] [--port N]"
    local name="${ARGS[0]}" partitions="${ARGS[1]}"
    [[ "$partitions" =~ ^[1-9][0-9]*$ ]] || die "PARTITIONS must be a positive number"
    local extra=()
    ((COMPACT)) && extra+=(--config cleanup.policy=compact)
    topic_tool --create --if-not-exists --topic "$name" --partitions "$partitions" \
        --replication-factor 1 "${extra[@]}"
}

cmd_list_topics() {
    topic_tool --list
}

case "$CMD" in
    fetch) cmd_fetch ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    create-topic|topics) cmd_create_topic ;;
    list-topics) cmd_list_topics ;;
    -h|--help|help) usage ;;
    *) usage >&2; die "unknown command '$CMD'" ;;
esac
