#!/usr/bin/env bash
# Starts the three-node Redis Cluster that the tests run against (masters only, on 127.0.0.1
# ports 7001-7003, nothing kept on disk), unless it is already up and healthy. A half-up or broken
# cluster is recreated from scratch: it holds only test data. Waits for cluster_state:ok.
# Concurrent runs (two `make test` at once) take turns on a lock.
#
#   REDIS_CLUSTER_PORTS  the nodes' ports (default "7001 7002 7003")
#   REDIS_CLUSTER_DIR    their data directories' parent (default /var/lib/redis-cluster)
set -euo pipefail

read -r -a ports <<<"${REDIS_CLUSTER_PORTS:-7001 7002 7003}"
dir=${REDIS_CLUSTER_DIR:-/var/lib/redis-cluster}
mkdir -p "$dir"

cli() { timeout 5 redis-cli -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null | tr -d '\r'; }

# healthy: every node answers, in cluster mode, sees all the nodes, and all slots are served.
healthy() {
  local p info
  for p in "${ports[@]}"; do
    info=$(cli "$p" cluster info) || return 1
    grep -qx 'cluster_state:ok' <<<"$info" || return 1
    grep -qx "cluster_known_nodes:${#ports[@]}" <<<"$info" || return 1
    grep -qx 'cluster_slots_ok:16384' <<<"$info" || return 1
  done
}

# stop shuts down the node on port $1 if one answers there; it refuses to touch a server that
# this script did not start (another data directory).
stop() {
  local p=$1 d
  d=$(cli "$p" config get dir | sed -n 2p) || true
  [ -z "$d" ] && return 0
  if [ "$d" != "$dir/$p" ]; then
    echo "port $p is taken by a Redis that is not this cluster's node (dir $d)" >&2
    exit 1
  fi
  cli "$p" shutdown nosave >/dev/null || true
  for _ in $(seq 1 50); do
    [ "$(cli "$p" ping)" = PONG ] || return 0
    sleep 0.1
  done
  echo "Redis Cluster node on port $p did not stop" >&2
  exit 1
}

exec 9>"$dir/.lock"
flock -w 60 9

if healthy; then
  exit 0
fi
echo "starting Redis Cluster on ports ${ports[*]}" >&2
for p in "${ports[@]}"; do
  stop "$p"
  rm -rf "${dir:?}/$p"
  mkdir -p "$dir/$p"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --dir "$dir/$p" \
    --logfile "$dir/$p/redis.log" --save "" --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 9>&-
done
for p in "${ports[@]}"; do
  for _ in $(seq 1 50); do
    [ "$(cli "$p" ping)" = PONG ] && break
    sleep 0.1
  done
done
# What `redis-cli --cluster create ... --cluster-replicas 0` does, without its one-second polls:
# a distinct config epoch and an equal share of the 16384 slots for each node, then every node
# introduced to the first.
n=${#ports[@]}
for i in "${!ports[@]}"; do
  p=${ports[$i]}
  [ "$(cli "$p" cluster set-config-epoch $((i + 1)))" = OK ] &&
    [ "$(cli "$p" cluster addslotsrange $((i * 16384 / n)) $(((i + 1) * 16384 / n - 1)))" = OK ] ||
    { echo "Redis Cluster node on port $p refused its slots (log: $dir/$p/redis.log)" >&2; exit 1; }
done
for p in "${ports[@]:1}"; do
  [ "$(cli "$p" cluster meet 127.0.0.1 "${ports[0]}")" = OK ] ||
    { echo "Redis Cluster node on port $p did not meet port ${ports[0]}" >&2; exit 1; }
done
for _ in $(seq 1 200); do
  healthy && exit 0
  sleep 0.1
done
echo "Redis Cluster on ports ${ports[*]} did not reach cluster_state:ok" >&2
exit 1
