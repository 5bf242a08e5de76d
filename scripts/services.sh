#!/usr/bin/env bash
# Starts the local PostgreSQL and Redis when they are not already answering (the commands of
# this machine kind's env notes), then waits until both accept connections; with --with-cluster
# (make test), then the Redis Cluster that the tests also run on (scripts/redis-cluster.sh), which
# `make run` and the benchmarks do not need.
set -euo pipefail

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis" >&2
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
for _ in $(seq 1 60); do
  if pg_isready -q -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    if [ "${1:-}" = --with-cluster ]; then
      exec "$(dirname "$0")/redis-cluster.sh"
    fi
    exit 0
  fi
  sleep 0.5
done
echo "PostgreSQL or Redis did not come up on 127.0.0.1" >&2
exit 1
