#!/usr/bin/env bash
# Puts promtool (to test deploy/prometheus's alerting rules) in bin/, once: from Debian's
# prometheus package, unpacked rather than installed, so that no Prometheus server or service
# comes with it. A promtool already on PATH is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v promtool > /dev/null || [ -x bin/promtool ]; then
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt downloads as its own user where it can
if ! (cd "$tmp" && apt-get download -q prometheus > /dev/null 2>&1); then
	apt-get update -q > /dev/null
	(cd "$tmp" && apt-get download -q prometheus > /dev/null)
fi
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
mkdir -p bin
install -m 755 "$tmp/root/usr/bin/promtool" bin/promtool
echo "promtool: $(bin/promtool --version 2>&1 | head -1)"
