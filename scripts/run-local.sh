#!/usr/bin/env bash
# `make run`: the simulator and llmq (`llmq serve`: the API and a worker in one process) in one
# terminal, on the local Postgres and Redis. llmq creates the database and applies migrations at
# start. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
bin/llmsim -listen 127.0.0.1:8090 -capacity 20 -rate 10 -latency 200ms -latency-jitter 300ms & pids+=($!)
bin/llmq serve --config configs/local.yaml & pids+=($!)
for _ in $(seq 1 100); do curl -fsS http://127.0.0.1:8080/healthz >/dev/null 2>&1 && break; sleep 0.1; done
echo "llmq is up: API and metrics on http://127.0.0.1:8080, simulator on :8090 (Ctrl-C stops)" >&2
wait -n "${pids[@]}"
