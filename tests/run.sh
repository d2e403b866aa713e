#!/usr/bin/env bash
# Runs every test of statusguard: unit, property, HTTP and end-to-end tests
# against a real kube-apiserver and etcd.
#
# The first run builds kube-apiserver, etcd and helm from pinned Go modules
# (tests/cluster/build.sh; 5-20 minutes on 2 cores, cached afterwards), and
# fetches the pinned Gateway API CRDs (tests/cluster/gateway-api.sh) and
# builds kubectl and a client-go status writer from the same pin
# (tests/clients/kubectl.sh, tests/clients/statuswriter.sh).
# Extra arguments go to `cargo test`, e.g. `tests/run.sh --test e2e_rollback`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

STATUSGUARD_TEST_ASSETS=$(tests/cluster/build.sh --print)
export STATUSGUARD_TEST_ASSETS
echo "tests/run.sh: control-plane binaries in $STATUSGUARD_TEST_ASSETS" >&2
STATUSGUARD_GATEWAY_CRDS=$(tests/cluster/gateway-api.sh --print)
export STATUSGUARD_GATEWAY_CRDS
echo "tests/run.sh: Gateway API CRDs in $STATUSGUARD_GATEWAY_CRDS" >&2
STATUSGUARD_KUBECTL=$(tests/clients/kubectl.sh --print)
export STATUSGUARD_KUBECTL
echo "tests/run.sh: kubectl at $STATUSGUARD_KUBECTL" >&2
STATUSGUARD_STATUSWRITER=$(tests/clients/statuswriter.sh --print)
export STATUSGUARD_STATUSWRITER
echo "tests/run.sh: statuswriter (client-go) at $STATUSGUARD_STATUSWRITER" >&2

cargo test --locked "$@"
