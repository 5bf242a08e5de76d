#!/usr/bin/env bash
# The JavaScript tooling of the tests lives in test/js (package.json, versions pinned in its
# package-lock.json). This script installs it with `npm ci` when test/js/node_modules is missing or
# was installed from another package.json or lock file, then runs `npm run ARGS` there if given:
#   scripts/js.sh          install only (what Go tests that run node call first)
#   scripts/js.sh check    install, lint api/openapi.yaml, generate and type-check its client
# Concurrent runs (test packages in parallel) take turns on a lock; an up-to-date install costs a
# hash of two files.
set -euo pipefail
cd "$(dirname "$0")/../test/js"

for tool in node npm flock sha256sum; do
  command -v "$tool" >/dev/null || { echo "scripts/js.sh: $tool is required" >&2; exit 1; }
done

exec 9>.install.lock
flock 9
want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
have=$(cat node_modules/.installed-from 2>/dev/null || true)
if [[ "$want" != "$have" ]]; then
  echo "scripts/js.sh: npm ci in test/js" >&2
  npm ci --no-audit --no-fund --loglevel=error >&2
  echo "$want" > node_modules/.installed-from
fi
flock -u 9

if [[ $# -gt 0 ]]; then
  npm run --silent "$@"
fi
