#!/usr/bin/env bash
# The console's browser tests (test/browser) drive Debian's Chromium with playwright-core (pinned
# in test/browser/package-lock.json). This script installs Chromium with apt-get when
# /usr/bin/chromium is missing, and runs `npm ci` in test/browser when node_modules is missing or
# was installed from another package.json or lock file. Then, with arguments, it runs
# `node ARGS` in test/browser. Concurrent runs take turns on a lock.
set -euo pipefail
# shellcheck source=scripts/npm-ci.sh
source "$(dirname "$0")/npm-ci.sh"
cd "$(dirname "$0")/../test/browser"

for tool in node npm flock sha256sum; do
  command -v "$tool" >/dev/null || { echo "scripts/browser.sh: $tool is required" >&2; exit 1; }
done

exec 9>.install.lock
flock 9
if [[ ! -x /usr/bin/chromium ]]; then
  echo "scripts/browser.sh: apt-get install chromium" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >&2
fi
npm_ci_if_stale scripts/browser.sh
flock -u 9

if [[ $# -gt 0 ]]; then
  exec node "$@"
fi
