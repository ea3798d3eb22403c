#!/usr/bin/env bash
# The demo behind `make run`: migrate, first-run setup, the simulated upstream (unless UPSTREAM_URL is
# set), then Daphne on 127.0.0.1:8000. Expects the environment `make run` exports (var/secrets.env).
# Ctrl-C or SIGTERM stops Daphne and the simulator.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
SIMULATOR_PORT=${SIMULATOR_PORT:-8001}
export SIMULATOR_PORT
children=()

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

"$PY" manage.py migrate --no-input -v 0
"$PY" manage.py demo_setup

if [[ -z "${UPSTREAM_URL:-}" ]]; then
  echo "Starting the simulated upstream on http://127.0.0.1:${SIMULATOR_PORT}/v1 (20% of tool calls corrupted)."
  "$PY" manage.py simulate_upstream --port "$SIMULATOR_PORT" --corruption-rate 0.2 &
  children+=("$!")
fi

echo "Serving toolrelay on http://127.0.0.1:8000 (Ctrl-C to stop)."
.venv/bin/daphne -b 127.0.0.1 -p 8000 config.asgi:application &
daphne_pid=$!
children+=("$daphne_pid")
wait "$daphne_pid"
