#!/usr/bin/env bash
# Builds the kubectl the tests drive (server-side apply as users run it) from
# the pinned k8s.io/kubernetes release, in the wrapper module
# tests/clients/kubectl (the same pin and staging versions as
# tests/cluster/kube-apiserver), into a cache folder keyed by the module.
#
#   tests/clients/kubectl.sh            build what is missing
#   tests/clients/kubectl.sh --print    also print kubectl's path
#
# STATUSGUARD_KUBECTL=PATH skips the build and uses PATH.
# STATUSGUARD_CACHE_DIR moves the cache (default: ${XDG_CACHE_HOME:-~/.cache}/statusguard).
#
# Apart from tests/cluster/build.sh on purpose: that script's cache key covers
# every module under tests/cluster and its own text, and changing either
# would rebuild kube-apiserver.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
print=false
[[ "${1:-}" == "--print" ]] && print=true
say() { echo "statusguard kubectl: $*" >&2; }

if [[ -n "${STATUSGUARD_KUBECTL:-}" ]]; then
  [[ -x "$STATUSGUARD_KUBECTL" ]] || { say "STATUSGUARD_KUBECTL=$STATUSGUARD_KUBECTL is not an executable"; exit 1; }
  $print && echo "$STATUSGUARD_KUBECTL"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  say "Go is not installed. The tests build kubectl from the pinned module"
  say "k8s.io/kubernetes; install Go 1.26 or newer, or set STATUSGUARD_KUBECTL."
  exit 1
fi

version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$here/kubectl/go.mod")
key=$(cat "$here/kubectl/go.mod" "$here/kubectl/go.sum" "$here/kubectl.sh" | sha256sum | cut -c1-12)
cache=${STATUSGUARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/statusguard}
out="$cache/bin/kubectl-$version-$key"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [[ ! -x "$out/kubectl" ]]; then
  say "building k8s.io/kubernetes/cmd/kubectl $version (first run only; a few minutes on 2 cores)"
  started=$SECONDS
  minor=$(echo "$version" | cut -d. -f2)
  cv=k8s.io/component-base/version
  (cd "$here/kubectl" &&
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
      -ldflags "-s -w -X $cv.gitVersion=$version -X $cv.gitMajor=1 -X $cv.gitMinor=$minor -X $cv.gitTreeState=clean -X $cv.buildDate=1970-01-01T00:00:00Z" \
      -o "$out/.kubectl.partial" k8s.io/kubernetes/cmd/kubectl)
  mv "$out/.kubectl.partial" "$out/kubectl"
  say "built in $((SECONDS - started)) s"
fi
$print && echo "$out/kubectl"
exit 0
