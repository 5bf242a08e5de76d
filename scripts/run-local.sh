#!/usr/bin/env bash
# `make run`: the simulator, the API and a worker in one terminal, on the local Postgres and Redis.
# The API creates the database and applies migrations at start. Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
bin/llmsim -listen 127.0.0.1:8090 -capacity 20 -rate 10 -latency 200ms -latency-jitter 300ms & pids+=($!)
bin/api --config configs/local.yaml & pids+=($!)
for _ in $(seq 1 100); do curl -fsS http://127.0.0.1:8080/healthz >/dev/null 2>&1 && break; sleep 0.1; done
bin/worker --config configs/local.yaml & pids+=($!)
echo "llmq is up: API on http://127.0.0.1:8080, simulator on :8090, worker metrics on :9091 (Ctrl-C stops)" >&2
wait -n "${pids[@]}"
