#!/usr/bin/env bash
# One command, end to end on this machine: install, start a local Kafka broker, run the worker, send
# the bundled sample of real prose with near-duplicates, print the verdicts and a summary, clean up.
#   deploy/demo.sh            (NEARDUP_DEMO_PORT=19192 by default; --keep leaves broker and worker up)
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${NEARDUP_DEMO_PORT:-19192}"
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
RUN="$(date +%s)"
STATE="${TMPDIR:-/tmp}/neardup-demo-$RUN"
METRICS_PORT="${NEARDUP_DEMO_METRICS_PORT:-19108}"
SAMPLE=service/data/sample_news.jsonl

if [ ! -x .venv/bin/neardup ]; then
  echo "== installing into .venv"
  python3 -m venv .venv
  .venv/bin/pip install --quiet -e .
fi

echo "== starting Kafka on 127.0.0.1:$PORT (jars fetched once into ~/.cache/neardup/kafka)"
NEARDUP_KAFKA_PORT="$PORT" deploy/kafka/kafka.sh start

export NEARDUP_BROKER="kafka://127.0.0.1:$PORT"
export NEARDUP_APP_ID="neardup-demo-$RUN"
export NEARDUP_INPUT_TOPIC="demo-$RUN-articles"
export NEARDUP_SIGNATURES_TOPIC="demo-$RUN-signatures"
export NEARDUP_VERDICTS_TOPIC="demo-$RUN-verdicts"
export NEARDUP_DEAD_LETTER_TOPIC="demo-$RUN-dead-letters"
export NEARDUP_INPUT_PARTITIONS=1
export NEARDUP_STATE_DIR="$STATE"
export NEARDUP_METRICS_PORT="$METRICS_PORT"
export NEARDUP_LOG_LEVEL=warning

echo "== starting the worker (state in $STATE, metrics on 127.0.0.1:$METRICS_PORT)"
.venv/bin/neardup worker >"$STATE.log" 2>&1 &
WORKER=$!
cleanup() {
  if [ "$KEEP" -eq 0 ]; then
    kill "$WORKER" 2>/dev/null || true
    wait "$WORKER" 2>/dev/null || true
    NEARDUP_KAFKA_PORT="$PORT" deploy/kafka/kafka.sh stop --wipe >/dev/null || true
    rm -rf "$STATE" "$STATE.log"
  fi
}
trap cleanup EXIT
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$METRICS_PORT/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$WORKER" 2>/dev/null; then cat "$STATE.log"; exit 1; fi
  sleep 0.5
done

TOTAL=$(grep -c . "$SAMPLE")
echo "== sending $TOTAL articles from $SAMPLE (see service/data/README.md for source and licence)"
.venv/bin/neardup produce "$SAMPLE"

echo "== verdicts (first 25 shown)"
.venv/bin/neardup tail --from-beginning --max "$TOTAL" --idle-timeout 60 --summary >"$STATE.verdicts"
head -n 25 "$STATE.verdicts"
echo "   ..."
echo "== summary"
tail -n 3 "$STATE.verdicts"
echo "== metrics (excerpt)"
curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" | grep -E '^neardup_(articles_in|verdicts|indexed|dead_letters)_?[a-z_]*(\{|\s)' \
  | grep -v '_created' | grep -v ' 0.0$' || true
