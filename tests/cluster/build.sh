#!/usr/bin/env bash
# Builds the pinned kube-apiserver, etcd and helm that the integration tests
# run, from Go modules, into a cache folder keyed by version and go.sum.
#
#   tests/cluster/build.sh            build what is missing, with progress on stderr
#   tests/cluster/build.sh --print    also print the folder holding the binaries
#
# STATUSGUARD_TEST_ASSETS=DIR skips building and uses DIR/{kube-apiserver,etcd,helm}
# (like envtest's KUBEBUILDER_ASSETS). STATUSGUARD_CACHE_DIR moves the cache
# (default: ${XDG_CACHE_HOME:-~/.cache}/statusguard).
#
# Idempotent and safe to run concurrently: a lock serialises builders, and a
# binary is moved into place only once it is complete.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
print=false
[[ "${1:-}" == "--print" ]] && print=true

say() { echo "statusguard test cluster: $*" >&2; }

binaries=(kube-apiserver etcd helm)

if [[ -n "${STATUSGUARD_TEST_ASSETS:-}" ]]; then
  for b in "${binaries[@]}"; do
    [[ -x "$STATUSGUARD_TEST_ASSETS/$b" ]] || {
      say "STATUSGUARD_TEST_ASSETS=$STATUSGUARD_TEST_ASSETS has no executable '$b'"
      exit 1
    }
  done
  $print && echo "$STATUSGUARD_TEST_ASSETS"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  say "Go is not installed. The tests build kube-apiserver, etcd and helm from"
  say "pinned Go modules; install Go 1.26 or newer (https://go.dev/doc/install),"
  say "or point STATUSGUARD_TEST_ASSETS at a folder that holds those binaries."
  exit 1
fi

# module version of a dependency, as pinned in a wrapper go.mod
pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$here/$1/go.mod"; }

kube_version=$(pinned kube-apiserver k8s.io/kubernetes)
etcd_version=$(pinned etcd go.etcd.io/etcd/server/v3)
helm_version=$(pinned helm helm.sh/helm/v3)
# The key covers the pins and every go.sum, so changing a pin rebuilds.
key=$(cat "$here"/*/go.mod "$here"/*/go.sum "$here/build.sh" | sha256sum | cut -c1-12)
cache=${STATUSGUARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/statusguard}
out="$cache/bin/k8s-$kube_version-etcd-$etcd_version-helm-$helm_version-$key"
mkdir -p "$out"

exec 9>"$out/.lock"
flock 9

kube_minor=$(echo "$kube_version" | cut -d. -f2)
build() {
  local name=$1 module=$2 package=$3 ldflags=$4
  if [[ -x "$out/$name" ]]; then
    say "$name: cached in $out"
    return
  fi
  say "$name: building $package (first run only; kube-apiserver takes 10-20 minutes on 2 cores)"
  local started=$SECONDS
  (cd "$here/$module" &&
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $ldflags" -o "$out/.$name.partial" "$package")
  mv "$out/.$name.partial" "$out/$name"
  say "$name: built in $((SECONDS - started)) s"
}

cv=k8s.io/component-base/version
build etcd etcd go.etcd.io/etcd/server/v3 ""
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
  "-X $cv.gitVersion=$kube_version -X $cv.gitMajor=1 -X $cv.gitMinor=$kube_minor -X $cv.gitTreeState=clean -X $cv.buildDate=1970-01-01T00:00:00Z"
build helm helm helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"

$print && echo "$out"
exit 0
