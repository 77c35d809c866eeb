#!/usr/bin/env bash
# Local Apache Kafka (KRaft) for development and CI: one combined broker+controller by default,
# or a cluster of N such nodes on loopback (--brokers 3) to test replication and broker failures.
#
# The broker is assembled from the release jars published on Maven Central, so no tarball,
# container engine or system package is needed: only Java 17+, Maven and python3.
#
#   deploy/kafka/kafka.sh fetch                      download the jars once into the cache
#   deploy/kafka/kafka.sh start  [--port N] [--brokers B]  format storage (first time), start, wait until ready
#   deploy/kafka/kafka.sh start  [--port N] --sasl-ssl S [--sasl-user U]
#                                                    and a SASL_SSL listener on port S (SCRAM-SHA-512/256,
#                                                    a CA and broker certificate made with keytool, a
#                                                    SCRAM user U, default neardup; its password from
#                                                    NEARDUP_KAFKA_SASL_PASSWORD or made up). The client
#                                                    settings: DATA_DIR/sasl-ssl/client.env, CA ca.crt
#   deploy/kafka/kafka.sh status [--port N]          each node running or not (exit 0 if all ready)
#   deploy/kafka/kafka.sh stop   [--port N] [--wipe] stop it (every node); --wipe also removes its data dir
#   deploy/kafka/kafka.sh kill-broker I [--port N]   cluster only: SIGKILL node I (0-based)
#   deploy/kafka/kafka.sh start-broker I [--port N]  cluster only: start node I again, wait until it serves
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
HEAP_OPTS="${NEARDUP_KAFKA_HEAP_OPTS:-}"
BROKERS="${NEARDUP_KAFKA_BROKERS:-}"
START_TIMEOUT="${NEARDUP_KAFKA_START_TIMEOUT:-90}"
SASL_SSL_PORT="${NEARDUP_KAFKA_SASL_SSL_PORT:-}"
SASL_USER="${NEARDUP_KAFKA_SASL_USER:-}"
STOP_TIMEOUT="${NEARDUP_KAFKA_STOP_TIMEOUT:-30}"
HOST="127.0.0.1"
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
KEYTOOL="${JAVA_HOME:+$JAVA_HOME/bin/}keytool"

MAIN_CLASS="kafka.Kafka"
STORAGE_TOOL="kafka.tools.StorageTool"
TOPIC_TOOL="org.apache.kafka.tools.TopicCommand"

log() { printf '%s\n' "$*"; }
die() { printf 'kafka.sh: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
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
        --brokers) BROKERS="${2:?--brokers needs a value}"; shift 2 ;;
        --brokers=*) BROKERS="${1#*=}"; shift ;;
        --sasl-ssl) SASL_SSL_PORT="${2:?--sasl-ssl needs a port}"; shift 2 ;;
        --sasl-ssl=*) SASL_SSL_PORT="${1#*=}"; shift ;;
        --sasl-user) SASL_USER="${2:?--sasl-user needs a name}"; shift 2 ;;
        --sasl-user=*) SASL_USER="${1#*=}"; shift ;;
        --wipe) WIPE=1; shift ;;
        --compact) COMPACT=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --*) die "unknown option $1" ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

[[ "$PORT" =~ ^[0-9]+$ ]] || die "port must be a number, got '$PORT'"
DATA_DIR="${DATA_DIR:-/tmp/neardup-kafka-$PORT}"
# A cluster records its size in its data dir, so that stop, status, kill-broker and start-broker
# find every node without being told --brokers again.
if [[ -z "$BROKERS" && -s "$DATA_DIR/brokers" ]]; then
    BROKERS="$(cat "$DATA_DIR/brokers")"
fi
BROKERS="${BROKERS:-1}"
[[ "$BROKERS" =~ ^[1-9]$ ]] || die "--brokers must be 1..9, got '$BROKERS'"
if ((BROKERS > 1)); then
    # clear of the brokers' ports PORT..PORT+BROKERS-1
    CONTROLLER_PORT="${CONTROLLER_PORT:-$((PORT + 100))}"
    # three JVMs on a small machine: a small heap each
    HEAP_OPTS="${HEAP_OPTS:--Xms128m -Xmx512m}"
else
    CONTROLLER_PORT="${CONTROLLER_PORT:-$((PORT + 1))}"
    HEAP_OPTS="${HEAP_OPTS:--Xms256m -Xmx1g}"
fi
[[ "$CONTROLLER_PORT" =~ ^[0-9]+$ ]] || die "controller port must be a number"
if ((CONTROLLER_PORT >= PORT && CONTROLLER_PORT < PORT + BROKERS)); then
    die "controller ports must differ from the broker ports"
fi
# A broker started with --sasl-ssl records its port and user under its data dir, so that a later
# start (after stop, without the options), status and stop know the listener too.
SASL_DIR="$DATA_DIR/sasl-ssl"
if [[ -z "$SASL_SSL_PORT" && -s "$SASL_DIR/port" ]]; then
    SASL_SSL_PORT="$(cat "$SASL_DIR/port")"
fi
if [[ -n "$SASL_SSL_PORT" ]]; then
    [[ "$SASL_SSL_PORT" =~ ^[0-9]+$ ]] || die "--sasl-ssl must be a port number, got '$SASL_SSL_PORT'"
    ((BROKERS == 1)) || die "--sasl-ssl runs on a single broker, not a cluster"
    if ((SASL_SSL_PORT == PORT || SASL_SSL_PORT == CONTROLLER_PORT)); then
        die "the SASL_SSL port must differ from the broker and controller ports"
    fi
    if [[ -n "$SASL_USER" && -s "$SASL_DIR/user" && "$(cat "$SASL_DIR/user")" != "$SASL_USER" ]]; then
        die "$DATA_DIR holds the SCRAM user '$(cat "$SASL_DIR/user")', made when it was formatted; stop it with --wipe first to make another"
    fi
    [[ "$SASL_USER" =~ ^[A-Za-z0-9._-]*$ ]] || die "--sasl-user may hold letters, digits, '.', '_' and '-'"
fi
# The node the per-node functions act on. The single broker keeps its files at the top of the data
# dir, as it always has; node I of a cluster has its own under node-I/.
NODE=0
NODE_DIR="$DATA_DIR"
select_node() {
    NODE="$1"
    if ((BROKERS > 1)); then
        NODE_DIR="$DATA_DIR/node-$NODE"
    else
        NODE_DIR="$DATA_DIR"
    fi
    NODE_PORT=$((PORT + NODE))
    NODE_CONTROLLER_PORT=$((CONTROLLER_PORT + NODE))
    PID_FILE="$NODE_DIR/kafka.pid"
    LOG_FILE="$NODE_DIR/kafka.log"
    PROPS="$NODE_DIR/server.properties"
    LOG4J_CONF="$NODE_DIR/log4j2.properties"
    LOG_DIRS="$NODE_DIR/data"
}
select_node 0

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

# Ask the node over the Kafka protocol whether it serves metadata with itself registered
# (ApiVersions, then Metadata listing live brokers). Exit 0 when ready. For a cluster node, also:
# $1 live brokers at least (all of them, at a cluster's start), and with $2=isr, every partition
# replicated to this node has it back in its in-sync replicas (after start-broker).
probe() {
    local want="${1:-1}" isr="${2:-}" node_id=-1
    ((BROKERS > 1)) && node_id="$NODE"
    if ! command -v python3 >/dev/null; then
        # no python3: accept an open port plus the broker's own "started" log line
        port_busy "$NODE_PORT" && grep -q "Kafka Server started" "$LOG_FILE" 2>/dev/null
        return
    fi
    python3 - "$HOST" "$NODE_PORT" "$want" "$node_id" "$isr" <<'PY'
import socket, struct, sys

host, port, want, node_id, isr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

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

class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0
    def take(self, fmt):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]
    def string(self):
        n = self.take(">h")
        if n > 0:
            self.pos += n
    def ints(self):
        return [self.take(">i") for _ in range(self.take(">i"))]

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
        # Metadata v5..v7 share the request layout and the response read below
        v = max(lo, 5)
        if v > min(hi, 7):
            sys.exit(0)  # cannot speak a Metadata version we know; ApiVersions answered
        body = struct.pack(">i", -1) + b"\x01"  # all topics, allow auto-creation (ignored)
        r = Reader(call(s, 3, v, 2, body))
        r.take(">i")  # throttle time
        live = set()
        for _ in range(r.take(">i")):
            live.add(r.take(">i"))
            r.string()  # host
            r.take(">i")  # port
            r.string()  # rack
        if len(live) < want or (node_id >= 0 and node_id not in live):
            sys.exit(1)
        if isr != "isr":
            sys.exit(0)
        r.string()  # cluster id
        r.take(">i")  # controller id
        for _ in range(r.take(">i")):  # topics
            r.take(">h")
            r.string()
            r.take(">b")  # internal
            for _ in range(r.take(">i")):  # partitions
                r.take(">hii")  # error, index, leader
                if v >= 7:
                    r.take(">i")  # leader epoch
                replicas, in_sync = r.ints(), r.ints()
                r.ints()  # offline replicas
                if node_id in replicas and node_id not in in_sync:
                    sys.exit(1)
        sys.exit(0)
except (OSError, ValueError, struct.error):
    sys.exit(1)
PY
}

write_configs() {
    mkdir -p "$DATA_DIR" "$LOG_DIRS"
    # One node: replication 1. A cluster: every node is a voter of the KRaft quorum and a broker,
    # and everything is replicated up to 3 times with min.insync 2, so one node down loses
    # nothing acknowledged and stops nothing.
    local node_id=1 voters="1@$HOST:$CONTROLLER_PORT" rf=1 isr=1 i
    if ((BROKERS > 1)); then
        node_id="$NODE"
        voters=""
        for ((i = 0; i < BROKERS; i++)); do
            voters+="${voters:+,}$i@$HOST:$((CONTROLLER_PORT + i))"
        done
        rf=$((BROKERS < 3 ? BROKERS : 3))
        isr=$((rf - 1))
    fi
    # The PLAINTEXT listener stays beside a SASL_SSL one: the probe and the topic tool use it, and
    # the broker talks to itself over it.
    local listeners="PLAINTEXT://$HOST:$NODE_PORT,CONTROLLER://$HOST:$NODE_CONTROLLER_PORT"
    local advertised="PLAINTEXT://$HOST:$NODE_PORT" protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    if [[ -n "$SASL_SSL_PORT" ]]; then
        listeners+=",SASL_SSL://$HOST:$SASL_SSL_PORT"
        advertised+=",SASL_SSL://$HOST:$SASL_SSL_PORT"
        protocols+=",SASL_SSL:SASL_SSL"
    fi
    cat >"$PROPS" <<EOF
# generated by deploy/kafka/kafka.sh; rewritten on every start
process.roles=broker,controller
node.id=$node_id
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols
log.dirs=$LOG_DIRS
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
auto.create.topics.enable=false
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=${NEARDUP_KAFKA_OFFSETS_PARTITIONS:-8}
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=${NEARDUP_KAFKA_TXN_PARTITIONS:-8}
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
log.segment.bytes=67108864
log.cleaner.dedupe.buffer.size=16777216
delete.topic.enable=true
EOF
    if ((BROKERS > 1)); then
        # A killed node is fenced, and its partitions' leadership moves, after 3 s without its
        # heartbeat instead of Kafka's 9 s: clients on a test cluster wait that long for a leader.
        cat >>"$PROPS" <<EOF
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=3000
EOF
    fi
    if [[ -n "$SASL_SSL_PORT" ]]; then
        # SCRAM's credentials live in the cluster's metadata (made at format time); each enabled
        # mechanism of a listener needs a JAAS login module, even one that reads nothing from it.
        local store_pass
        store_pass="$(cat "$SASL_DIR/store.pass")"
        cat >>"$PROPS" <<EOF
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$SASL_DIR/broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$store_pass
listener.name.sasl_ssl.ssl.key.password=$store_pass
EOF
    fi
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
    local scram=()
    if [[ -n "$SASL_SSL_PORT" ]]; then
        scram=(--add-scram "$(scram_credential SCRAM-SHA-512)" --add-scram "$(scram_credential SCRAM-SHA-256)")
    fi
    "$JAVA" -Dlog4j2.configurationFile="$TOOLS_LOG4J_CONF" -cp "$(java_cp)" \
        "$STORAGE_TOOL" format --ignore-formatted -t "$cluster_id" -c "$PROPS" "${scram[@]}" >>"$LOG_FILE" 2>&1 \
        || { tail -n 20 "$LOG_FILE" >&2; die "formatting KRaft storage in $LOG_DIRS failed"; }
}

# ---------------------------------------------------------------------------------------------
# SASL_SSL
# ---------------------------------------------------------------------------------------------
random_secret() {
    python3 -c 'import secrets; print(secrets.token_urlsafe(18))'
}

# The SCRAM user as StorageTool's --add-scram takes it, salted here: the password itself never
# appears on a command line (ps shows those to every user of the machine).
scram_credential() {
    SCRAM_PASSWORD="$(cat "$SASL_DIR/password")" python3 - "$1" "$(cat "$SASL_DIR/user")" <<'PY'
import base64, hashlib, os, sys

mechanism, user = sys.argv[1], sys.argv[2]
digest = {"SCRAM-SHA-512": "sha512", "SCRAM-SHA-256": "sha256"}[mechanism]
salt, iterations = os.urandom(16), 4096
# SCRAM's SaltedPassword (RFC 5802, Hi) is PBKDF2 with one block of the hash's length
salted = hashlib.pbkdf2_hmac(digest, os.environ["SCRAM_PASSWORD"].encode(), salt, iterations)
b64 = lambda data: base64.b64encode(data).decode()
print(f'{mechanism}=[name={user},iterations={iterations},salt="{b64(salt)}",saltedpassword="{b64(salted)}"]')
PY
}

# A CA and a broker certificate signed by it, for 127.0.0.1 and localhost; the CA exported as PEM
# for clients (ca.crt). Made once per data dir, with the JDK's keytool: no other tool needed.
make_certificates() {
    [[ -s "$SASL_DIR/broker.p12" && -s "$SASL_DIR/ca.crt" ]] && return 0
    command -v "$KEYTOOL" >/dev/null || die "keytool not found ($KEYTOOL); it comes with the JDK"
    local pass t0=$SECONDS
    pass="$(cat "$SASL_DIR/store.pass")"
    rm -f "$SASL_DIR/broker.p12" "$SASL_DIR/ca.crt"
    log "making a CA and a broker certificate in $SASL_DIR ..."
    # The broker's keystore must end up holding its own key only (a TLS server picks its
    # certificate among the keys it holds), so the CA's key is made there, signs, and goes again.
    local keystore=(-keystore "$SASL_DIR/broker.p12" -storetype PKCS12 -storepass "$pass")
    {
        "$KEYTOOL" -genkeypair -alias ca -dname "CN=neardup local Kafka CA" -keyalg EC -groupname secp256r1 \
            -validity 3650 -ext bc:c -ext KeyUsage:c=keyCertSign,cRLSign "${keystore[@]}" &&
        "$KEYTOOL" -genkeypair -alias broker -dname "CN=localhost" -keyalg EC -groupname secp256r1 \
            -validity 3650 -signer ca -ext SAN=ip:127.0.0.1,dns:localhost \
            -ext KeyUsage:c=digitalSignature -ext ExtendedKeyUsage=serverAuth "${keystore[@]}" &&
        "$KEYTOOL" -exportcert -rfc -alias ca -file "$SASL_DIR/ca.crt" "${keystore[@]}" &&
        "$KEYTOOL" -delete -alias ca "${keystore[@]}"
    } >"$SASL_DIR/keytool.log" 2>&1 || { cat "$SASL_DIR/keytool.log" >&2; die "making the certificates failed"; }
    log "certificates made in $((SECONDS - t0)) s; clients trust $SASL_DIR/ca.crt"
}

# Everything the SASL_SSL listener needs before the broker starts: the user and its password
# (kept for a restart, and for the client settings), the certificates, the client settings.
prepare_sasl_ssl() {
    [[ -n "$SASL_SSL_PORT" ]] || return 0
    if [[ -f "$LOG_DIRS/meta.properties" && ! -s "$SASL_DIR/user" ]]; then
        die "$DATA_DIR was formatted without --sasl-ssl (its SCRAM user is made at format time); stop it with --wipe first or pick another --dir"
    fi
    (umask 077 && mkdir -p "$SASL_DIR")
    if [[ ! -s "$SASL_DIR/user" ]]; then
        printf '%s\n' "${SASL_USER:-neardup}" >"$SASL_DIR/user"
        (umask 077 && printf '%s\n' "${NEARDUP_KAFKA_SASL_PASSWORD:-$(random_secret)}" >"$SASL_DIR/password")
    elif [[ -n "${NEARDUP_KAFKA_SASL_PASSWORD:-}" && "$NEARDUP_KAFKA_SASL_PASSWORD" != "$(cat "$SASL_DIR/password")" ]]; then
        die "$DATA_DIR holds its SCRAM user's password from when it was formatted, not NEARDUP_KAFKA_SASL_PASSWORD; stop it with --wipe first to change it"
    fi
    [[ -s "$SASL_DIR/store.pass" ]] || (umask 077 && random_secret >"$SASL_DIR/store.pass")
    make_certificates
    printf '%s\n' "$SASL_SSL_PORT" >"$SASL_DIR/port"
    (umask 077 && cat >"$SASL_DIR/client.env" <<EOF
# generated by deploy/kafka/kafka.sh: neardup's settings for this broker's SASL_SSL listener
# (set -a; . $SASL_DIR/client.env; set +a)
NEARDUP_BROKER=kafka://$HOST:$SASL_SSL_PORT
NEARDUP_SECURITY_PROTOCOL=SASL_SSL
NEARDUP_SASL_MECHANISM=SCRAM-SHA-512
NEARDUP_SASL_USERNAME=$(cat "$SASL_DIR/user")
NEARDUP_SASL_PASSWORD=$(cat "$SASL_DIR/password")
NEARDUP_SSL_CAFILE=$SASL_DIR/ca.crt
EOF
    )
}

# ---------------------------------------------------------------------------------------------
# start / stop / status
# ---------------------------------------------------------------------------------------------
# Start the selected node's JVM (its storage formatted on first use); its pid in LAUNCHED_PID.
launch_node() {
    local p
    for p in "$NODE_PORT" "$NODE_CONTROLLER_PORT" $SASL_SSL_PORT; do
        if port_busy "$p"; then
            die "port $HOST:$p is already in use by another process (not a broker started by this script for $DATA_DIR); pick another with --port or NEARDUP_KAFKA_PORT"
        fi
    done
    mkdir -p "$DATA_DIR" "$LOG_DIRS"
    prepare_sasl_ssl
    write_configs
    rm -f "$PID_FILE"
    format_storage
    local what="kafka"
    ((BROKERS > 1)) && what="kafka node $NODE"
    log "starting $what $KAFKA_VERSION on $HOST:$NODE_PORT (controller $NODE_CONTROLLER_PORT), data dir $NODE_DIR"
    {
        printf '\n==== %s start kafka %s on %s:%s ====\n' "$(date -Is)" "$KAFKA_VERSION" "$HOST" "$NODE_PORT"
    } >>"$LOG_FILE"
    # setsid: the broker must not die with the caller's terminal or process group.
    # The child writes its own pid before exec'ing java, so the pid file names the JVM.
    # shellcheck disable=SC2086,SC2016
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$PID_FILE" \
        "$JAVA" $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$LOG4J_CONF" -Dkafka.logs.dir="$NODE_DIR" \
        -cp "$(java_cp)" "$MAIN_CLASS" "$PROPS" \
        </dev/null >>"$LOG_FILE" 2>&1 8>&- 9>&- &
    local _
    for _ in $(seq 1 50); do
        [[ -s "$PID_FILE" ]] && break
        sleep 0.1
    done
    LAUNCHED_PID="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ -n "$LAUNCHED_PID" ]] || die "broker process did not start; see $LOG_FILE"
}

# Wait until the selected node (pid $1) passes probe "$2" "$3"; fail if it exits meanwhile.
wait_node() {
    local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! alive "$pid"; then
            tail -n 40 "$LOG_FILE" >&2
            rm -f "$PID_FILE"
            die "kafka exited during startup; full log in $LOG_FILE"
        fi
        if probe "${2:-1}" "${3:-}"; then
            return 0
        fi
        sleep 0.25
    done
    tail -n 40 "$LOG_FILE" >&2
    die "kafka did not become ready on $HOST:$NODE_PORT within ${START_TIMEOUT}s (pid $pid still running; stop it with: $0 stop --port $PORT)"
}

cmd_start() {
    local pid
    mkdir -p "$DATA_DIR"
    exec 8>"$DATA_DIR/.start.lock"
    flock 8  # a second concurrent start for this data dir waits, then finds the broker running
    if ((BROKERS > 1)); then
        start_cluster
        return
    fi
    if pid="$(our_pid)"; then
        if probe; then
            log "kafka already running on $HOST:$PORT (pid $pid, data dir $DATA_DIR)"
            return 0
        fi
        log "kafka (pid $pid) is starting; waiting for it"
    else
        check_java
        cmd_fetch
        launch_node
        pid="$LAUNCHED_PID"
    fi
    wait_node "$pid"
    log "kafka ready on $HOST:$PORT"
    if [[ -n "$SASL_SSL_PORT" ]]; then
        log "SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256) on $HOST:$SASL_SSL_PORT for user $(cat "$SASL_DIR/user"); client settings in $SASL_DIR/client.env"
    fi
}

# Every node is launched before any is waited for: none serves before a majority of the
# controller quorum is up.
start_cluster() {
    if [[ -f "$DATA_DIR/brokers" ]] && [[ "$(cat "$DATA_DIR/brokers")" != "$BROKERS" ]]; then
        die "$DATA_DIR holds a cluster of $(cat "$DATA_DIR/brokers") nodes; stop it with --wipe first"
    fi
    if [[ ! -f "$DATA_DIR/brokers" && -f "$DATA_DIR/data/meta.properties" ]]; then
        die "$DATA_DIR holds a single broker's data; stop it with --wipe first or pick another --dir"
    fi
    printf '%s\n' "$BROKERS" >"$DATA_DIR/brokers"
    local i pids=()
    check_java
    cmd_fetch
    for ((i = 0; i < BROKERS; i++)); do
        select_node "$i"
        if pids[i]="$(our_pid)"; then
            log "kafka node $i already running on $HOST:$NODE_PORT (pid ${pids[i]})"
        else
            launch_node
            pids[i]="$LAUNCHED_PID"
        fi
    done
    for ((i = 0; i < BROKERS; i++)); do
        select_node "$i"
        wait_node "${pids[i]}" "$BROKERS"
    done
    log "kafka cluster of $BROKERS ready on $HOST:$PORT-$((PORT + BROKERS - 1)) (controllers $CONTROLLER_PORT-$((CONTROLLER_PORT + BROKERS - 1)))"
}

# SIGTERM the given pids together, then SIGKILL what is left after STOP_TIMEOUT
stop_pids() {
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT)) pid left
    while ((SECONDS < deadline)); do
        left=0
        for pid in "$@"; do alive "$pid" && left=1; done
        ((left)) || return 0
        sleep 0.2
    done
    log "kafka did not stop within ${STOP_TIMEOUT}s; killing it"
    for pid in "$@"; do
        kill -KILL "$pid" 2>/dev/null || true
        while alive "$pid"; do sleep 0.1; done
    done
}

cmd_stop() {
    local pid i pids=()
    for ((i = 0; i < BROKERS; i++)); do
        select_node "$i"
        if pid="$(our_pid)"; then
            pids+=("$pid")
        fi
    done
    if ((${#pids[@]} && BROKERS > 1 && WIPE)); then
        # Its data is about to go: no clean shutdown to wait for (a cluster's nodes stopping
        # together wait on each other's controlled shutdown, up to STOP_TIMEOUT)
        log "killing kafka (pid ${pids[*]}) on $HOST:$PORT ..."
        kill -KILL "${pids[@]}" 2>/dev/null || true
        for pid in "${pids[@]}"; do
            while alive "$pid"; do sleep 0.05; done
        done
        log "kafka stopped"
    elif ((${#pids[@]})); then
        log "stopping kafka (pid ${pids[*]}) on $HOST:$PORT ..."
        stop_pids "${pids[@]}"
        log "kafka stopped"
    else
        log "no kafka started by this script is running for $DATA_DIR"
    fi
    for ((i = 0; i < BROKERS; i++)); do
        select_node "$i"
        rm -f "$PID_FILE"
    done
    if ((WIPE)); then
        case "$DATA_DIR" in
            ""|/|"$HOME") die "refusing to wipe '$DATA_DIR'" ;;
        esac
        rm -rf "$DATA_DIR"
        log "removed $DATA_DIR"
    fi
    local p tries
    for ((i = 0; i < BROKERS; i++)); do
        for p in $((PORT + i)) $((CONTROLLER_PORT + i)) $SASL_SSL_PORT; do
            # A killed JVM's main thread shows as a zombie while its other threads still close
            # its sockets: give them up to 10 s before blaming another process.
            for ((tries = 0; tries < 100; tries++)); do
                port_busy "$p" || break
                sleep 0.1
            done
            if port_busy "$p"; then
                die "port $HOST:$p is still in use (by a process this script did not start)"
            fi
        done
    done
}

# One node's state, as a line; exit 0 if it answers
node_status() {
    local pid what="kafka"
    ((BROKERS > 1)) && what="kafka node $NODE"
    if pid="$(our_pid)"; then
        if probe; then
            log "$what running on $HOST:$NODE_PORT (pid $pid, data dir $NODE_DIR)"
            return 0
        fi
        log "$what process running (pid $pid) but not answering on $HOST:$NODE_PORT"
        return 1
    fi
    if port_busy "$NODE_PORT"; then
        log "$what not started by this script; port $HOST:$NODE_PORT is used by another process"
    else
        log "$what not running on $HOST:$NODE_PORT"
    fi
    return 1
}

cmd_status() {
    local i status=0
    for ((i = 0; i < BROKERS; i++)); do
        select_node "$i"
        node_status || status=1
    done
    return "$status"
}

# The node named by the one argument of kill-broker / start-broker, selected
cluster_node() {
    ((BROKERS > 1)) || die "$CMD needs a cluster (start --brokers 3); $DATA_DIR holds a single broker"
    ((${#ARGS[@]} == 1)) && [[ "${ARGS[0]}" =~ ^[0-9]$ ]] && ((ARGS[0] < BROKERS)) \
        || die "usage: $0 $CMD I [--port N]   (I: 0..$((BROKERS - 1)))"
    select_node "${ARGS[0]}"
}

cmd_kill_broker() {
    cluster_node
    local pid
    if ! pid="$(our_pid)"; then
        log "kafka node $NODE is not running"
        return 0
    fi
    kill -KILL "$pid"
    while alive "$pid"; do sleep 0.05; done
    rm -f "$PID_FILE"
    log "kafka node $NODE (pid $pid) killed"
}

# Back in service: registered as a live broker and in the in-sync replicas of every partition it
# holds a replica of, so that killing another node next keeps min.insync.
cmd_start_broker() {
    cluster_node
    local pid
    mkdir -p "$DATA_DIR"
    exec 8>"$DATA_DIR/.start.lock"
    flock 8
    if ! pid="$(our_pid)"; then
        check_java
        launch_node
        pid="$LAUNCHED_PID"
    fi
    wait_node "$pid" 1 isr
    log "kafka node $NODE ready on $HOST:$NODE_PORT, in sync"
}

# ---------------------------------------------------------------------------------------------
# topics
# ---------------------------------------------------------------------------------------------
topic_tool() {
    fetched || die "kafka jars not fetched; run: $0 fetch"
    write_tools_log4j
    local servers="" i
    for ((i = 0; i < BROKERS; i++)); do
        servers+="${servers:+,}$HOST:$((PORT + i))"
    done
    "$JAVA" -Xmx256m -Dlog4j2.configurationFile="$TOOLS_LOG4J_CONF" -cp "$(java_cp)" "$TOPIC_TOOL" \
        --bootstrap-server "$servers" "$@"
}

cmd_create_topic() {
    ((${#ARGS[@]} == 2)) || die "usage: $0 create-topic NAME PARTITIONS [--compact] [--port N]"
    local name="${ARGS[0]}" partitions="${ARGS[1]}"
    [[ "$partitions" =~ ^[1-9][0-9]*$ ]] || die "PARTITIONS must be a positive number"
    local extra=()
    ((COMPACT)) && extra+=(--config cleanup.policy=compact)
    # a cluster's topics take its default.replication.factor
    ((BROKERS > 1)) || extra+=(--replication-factor 1)
    topic_tool --create --if-not-exists --topic "$name" --partitions "$partitions" "${extra[@]}"
}

cmd_list_topics() {
    topic_tool --list
}

case "$CMD" in
    fetch) cmd_fetch ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    kill-broker) cmd_kill_broker ;;
    start-broker) cmd_start_broker ;;
    create-topic|topics) cmd_create_topic ;;
    list-topics) cmd_list_topics ;;
    -h|--help|help) usage ;;
    *) usage >&2; die "unknown command '$CMD'" ;;
esac
