#!/usr/bin/env bash
# Builds statuswriter (tests/clients/kubectl/statuswriter: a client-go
# controller's status write, RetryOnConflict around get and UpdateStatus) in
# the kubectl wrapper module, with its pinned client-go, into a cache folder
# keyed by the module and the program.
#
#   tests/clients/statuswriter.sh            build what is missing
#   tests/clients/statuswriter.sh --print    also print its path
#
# STATUSGUARD_STATUSWRITER=PATH skips the build and uses PATH.
# STATUSGUARD_CACHE_DIR moves the cache (default: ${XDG_CACHE_HOME:-~/.cache}/statusguard).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
print=false
[[ "${1:-}" == "--print" ]] && print=true
say() { echo "statusguard statuswriter: $*" >&2; }

if [[ -n "${STATUSGUARD_STATUSWRITER:-}" ]]; then
  [[ -x "$STATUSGUARD_STATUSWRITER" ]] || { say "STATUSGUARD_STATUSWRITER=$STATUSGUARD_STATUSWRITER is not an executable"; exit 1; }
  $print && echo "$STATUSGUARD_STATUSWRITER"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  say "Go is not installed. The tests build statuswriter with the pinned client-go;"
  say "install Go 1.26 or newer, or set STATUSGUARD_STATUSWRITER."
  exit 1
fi

key=$(cat "$here/kubectl/go.mod" "$here/kubectl/go.sum" "$here/kubectl/statuswriter/main.go" "$here/statuswriter.sh" |
  sha256sum | cut -c1-12)
cache=${STATUSGUARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/statusguard}
out="$cache/bin/statuswriter-$key"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [[ ! -x "$out/statuswriter" ]]; then
  say "building tests/clients/kubectl/statuswriter (first run only)"
  (cd "$here/kubectl" &&
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$out/.statuswriter.partial" ./statuswriter)
  mv "$out/.statuswriter.partial" "$out/statuswriter"
fi
$print && echo "$out/statuswriter"
exit 0
