#!/usr/bin/env bash
# Fetches the pinned Gateway API CRDs (standard channel) that the Gateway API
# end-to-end tests install, from the Go module sigs.k8s.io/gateway-api through
# Go's module download (checked against go.sum's database like any module),
# into a cache folder keyed by version.
#
#   tests/cluster/gateway-api.sh            fetch what is missing
#   tests/cluster/gateway-api.sh --print    also print the folder holding the CRDs
#
# STATUSGUARD_GATEWAY_CRDS=DIR skips fetching and uses DIR/*.yaml.
# STATUSGUARD_CACHE_DIR moves the cache (default: ${XDG_CACHE_HOME:-~/.cache}/statusguard).
#
# A separate script from build.sh on purpose: build.sh's cache key covers its
# own text, and changing it would rebuild kube-apiserver.
set -euo pipefail

module=sigs.k8s.io/gateway-api
version=v1.6.3
# Standard channel; Gateway and GatewayClass so that routes can name real parents.
crds=(
  gateway.networking.k8s.io_gatewayclasses.yaml
  gateway.networking.k8s.io_gateways.yaml
  gateway.networking.k8s.io_httproutes.yaml
  gateway.networking.k8s.io_grpcroutes.yaml
  gateway.networking.k8s.io_backendtlspolicies.yaml
)

print=false
[[ "${1:-}" == "--print" ]] && print=true
say() { echo "statusguard gateway-api CRDs: $*" >&2; }

if [[ -n "${STATUSGUARD_GATEWAY_CRDS:-}" ]]; then
  for f in "${crds[@]}"; do
    [[ -f "$STATUSGUARD_GATEWAY_CRDS/$f" ]] || {
      say "STATUSGUARD_GATEWAY_CRDS=$STATUSGUARD_GATEWAY_CRDS has no $f"
      exit 1
    }
  done
  $print && echo "$STATUSGUARD_GATEWAY_CRDS"
  exit 0
fi

cache=${STATUSGUARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/statusguard}
out="$cache/gateway-api/$version-standard"
if [[ ! -f "$out/.complete" ]]; then
  if ! command -v go >/dev/null 2>&1; then
    say "Go is not installed. The Gateway API tests take the CRDs of the Go module"
    say "$module $version; install Go 1.26 or newer, or point"
    say "STATUSGUARD_GATEWAY_CRDS at a folder that holds ${crds[*]}."
    exit 1
  fi
  mkdir -p "$cache/gateway-api"
  exec 9>"$cache/gateway-api/.lock"
  flock 9
  if [[ ! -f "$out/.complete" ]]; then
    say "fetching $module@$version (first run only)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # Outside any module, so that no go.mod around the checkout is consulted.
    if ! (cd "$work" && go mod download -json "$module@$version") >"$work/download.json" 2>"$work/download.err"; then
      cat "$work/download.json" "$work/download.err" >&2
      say "cannot download $module@$version (above: Go's own message)."
      say "Check the network and GOPROXY, or set STATUSGUARD_GATEWAY_CRDS."
      exit 1
    fi
    dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' "$work/download.json")
    source="$dir/config/crd/standard"
    [[ -d "$source" ]] || { say "$module@$version has no $source"; exit 1; }
    rm -rf "$out.partial"
    mkdir -p "$out.partial"
    for f in "${crds[@]}"; do
      [[ -f "$source/$f" ]] || { say "$module@$version has no config/crd/standard/$f"; exit 1; }
      cp "$source/$f" "$out.partial/$f"
      chmod u+w "$out.partial/$f"
    done
    touch "$out.partial/.complete"
    rm -rf "$out"
    mv "$out.partial" "$out"
    say "CRDs in $out"
  fi
fi
$print && echo "$out"
exit 0
