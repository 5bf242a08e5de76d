# Sourced by scripts/js.sh and scripts/browser.sh, in the npm project's directory:
# npm_ci_if_stale NAME installs that directory's pinned packages with `npm ci` when node_modules is
# missing or was installed from another package.json or lock file (an up-to-date install costs a
# hash of two files). Call it while holding the directory's install lock.
npm_ci_if_stale() {
  local want have
  want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
  have=$(cat node_modules/.installed-from 2>/dev/null || true)
  if [[ "$want" != "$have" ]]; then
    echo "$1: npm ci in $(basename "$PWD")" >&2
    npm ci --no-audit --no-fund --loglevel=error >&2
    echo "$want" > node_modules/.installed-from
  fi
}
