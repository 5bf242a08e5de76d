#!/usr/bin/env bash
# `make run`: the simulator and llmq (`llmq serve`: the API and a worker in one process) in one
# terminal, on the local Postgres and Redis. llmq creates the database and applies migrations at
# start. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
# The ports are configs/local.yaml's: the API's listen, and the simulator's (the credentials'
# base_url). Either taken (another `make run` still up) is refused before anything starts: else
# the simulator failed to bind, the other instance's API answered for this one, and this one
# exited after saying it was up.
api_port=$(sed -n 's/^  listen: *[^ ]*:\([0-9][0-9]*\).*$/\1/p' configs/local.yaml | head -n 1)
sim_port=$(sed -n 's|^ *base_url: *http://127\.0\.0\.1:\([0-9][0-9]*\).*$|\1|p' configs/local.yaml | head -n 1)
if [[ -z $api_port || -z $sim_port ]]; then
  echo "make run: configs/local.yaml names no api.listen port or no simulator base_url port" >&2
  exit 1
fi
for p in "$api_port API" "$sim_port simulator"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/${p%% *}") 2>/dev/null; then
    echo "make run: port ${p%% *} (the ${p#* }'s) is already in use: another \`make run\` (or another program) holds it; stop it first" >&2
    exit 1
  fi
done
scripts/services.sh
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
bin/llmsim -listen "127.0.0.1:$sim_port" -capacity 20 -rate 10 -latency 200ms -latency-jitter 300ms & pids+=($!)
bin/llmq serve --config configs/local.yaml & pids+=($!)
# Up once /healthz answers; a process that exited first (a failed migration, a port taken since
# the check) ends the wait, and so do 10 s without an answer: neither is "up".
up=
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$api_port/healthz" >/dev/null 2>&1; then up=1; break; fi
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || break 2; done
  sleep 0.1
done
if [[ -z $up ]]; then
  echo "make run: llmq did not come up on :$api_port (its output above says why)" >&2
  exit 1
fi
echo "llmq is up: API and metrics on http://127.0.0.1:$api_port, simulator on :$sim_port (Ctrl-C stops)" >&2
wait -n "${pids[@]}"
