#!/usr/bin/env bash
# The demo behind `make run`: migrate, first-run setup, the simulated upstream (unless UPSTREAM_URL is
# set), then toolrelay's Daphne launcher (`manage.py serve`) on 127.0.0.1:$PORT (default 8000).
# Expects the environment `make run` exports (var/secrets.env).
# Ctrl-C or SIGTERM stops the server and the simulator.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
PORT=${PORT:-8000}
SIMULATOR_PORT=${SIMULATOR_PORT:-8001}
SITE_URL=${SITE_URL:-http://127.0.0.1:$PORT}
export SIMULATOR_PORT SITE_URL
children=()

# A port already taken (another `make run`?) stops here, before anything is written or moved: var/run.env
# and the demo tenant's upstream stay those of the demo that is running.
port_free() {
  "$PY" -c 'import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: a TIME_WAIT port is free
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)' "$1"
}
taken=()
port_free "$PORT" || taken+=("PORT=$PORT")
if [[ -z "${UPSTREAM_URL:-}" ]]; then
  port_free "$SIMULATOR_PORT" || taken+=("SIMULATOR_PORT=$SIMULATOR_PORT")
fi
if (( ${#taken[@]} )); then
  echo "make run: 127.0.0.1 port already in use (${taken[*]}); is another \`make run\` serving?" >&2
  echo "Stop it, or choose other ports: PORT=8010 SIMULATOR_PORT=8011 make run. Nothing was changed." >&2
  exit 1
fi

# Saved for what runs next to the demo: manage.py (the URLs that `apikey create`, `provision` and
# `demo_setup` print) and scripts/tool_call_demo.py (where to send) read it.
mkdir -p var
cat > var/run.env <<EOF
# Written by \`make run\` (scripts/run.sh) each time it starts; the environment overrides it.
SITE_URL=${SITE_URL}
PORT=${PORT}
SIMULATOR_PORT=${SIMULATOR_PORT}
UPSTREAM_URL=${UPSTREAM_URL:-}
EOF

cleanup() {
  for pid in "${children[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT
# Children run in the background and we `wait`: bash runs traps only between commands, and `wait`
# is interruptible while a foreground child would not be.
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -z "${UPSTREAM_URL:-}" ]]; then
  # The simulator listens on loopback, which the outbound address policy refuses: allow that one
  # address for the demo, explicitly (added to any allow-list the environment already has).
  export UPSTREAM_ALLOW_NETWORKS="${UPSTREAM_ALLOW_NETWORKS:+$UPSTREAM_ALLOW_NETWORKS,}127.0.0.1/32"
fi

"$PY" manage.py migrate --no-input -v 0
"$PY" manage.py demo_setup

if [[ -z "${UPSTREAM_URL:-}" ]]; then
  echo "Starting the simulated upstream on http://127.0.0.1:${SIMULATOR_PORT}/v1 (20% of tool calls corrupted)."
  # Every fault kind but the one that is a genuine client error (context length, C43): the demo
  # shows broken tool calls being repaired or retried, not errors passed on to the client.
  kinds=$("$PY" -c 'from proxy.simulator import FAULTS; print(",".join(k for k in FAULTS if k != "nonstandard-sse-error-field"))')
  "$PY" manage.py simulate_upstream --port "$SIMULATOR_PORT" --corruption-rate 0.2 --kinds "$kinds" &
  children+=("$!")
fi

echo "Serving toolrelay on http://127.0.0.1:${PORT} (Ctrl-C to stop)."
"$PY" manage.py serve --host 127.0.0.1 --port "$PORT" &
server_pid=$!
children+=("$server_pid")
wait "$server_pid"
