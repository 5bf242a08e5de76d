#!/usr/bin/env bash
# The JavaScript tooling of the tests lives in test/js (package.json, versions pinned in its
# package-lock.json). This script installs it with `npm ci` when test/js/node_modules is missing or
# was installed from another package.json or lock file, then runs `npm run ARGS` there if given:
#   scripts/js.sh          install only (what Go tests that run node call first)
#   scripts/js.sh check    install, lint api/openapi.yaml, generate and type-check its client
# Concurrent runs (test packages in parallel) take turns on a lock; an up-to-date install costs a
# hash of two files.
set -euo pipefail
# shellcheck source=scripts/npm-ci.sh
source "$(dirname "$0")/npm-ci.sh"
cd "$(dirname "$0")/../test/js"

for tool in node npm flock sha256sum; do
  command -v "$tool" >/dev/null || { echo "scripts/js.sh: $tool is required" >&2; exit 1; }
done

exec 9>.install.lock
flock 9
npm_ci_if_stale scripts/js.sh
flock -u 9

if [[ $# -gt 0 ]]; then
  npm run --silent "$@"
fi
