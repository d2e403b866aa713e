#!/usr/bin/env bash
# HTTP/2 callers that hold streams open, against the release binary on its
# embedded default (RELIABILITY.md, "Hostile callers"): 200 HTTP/2
# connections of 8 streams, each sending an 8 MiB body that waits for room
# in the body budget. Prints the server's RSS while the requests wait out
# the 30 s request timeout, and its peak.
#
# usage: benches/h2_flood.sh [binary]   (default: target/release/statusguard;
# needs h2load, Debian's nghttp2-client, and taskset; 2 cores or more)
set -euo pipefail
bin=${1:-target/release/statusguard}
work=$(mktemp -d)
pid=
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT
head -c $((8 * 1024 * 1024 - 100)) /dev/zero | tr '\0' ' ' > "$work/big.json"

taskset -c 0 "$bin" serve --write-ca "$work/ca.pem" --listen 127.0.0.1:18443 \
  --admin-listen 127.0.0.1:18080 --log-level error > "$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 50); do
  curl -sf http://127.0.0.1:18080/readyz > /dev/null && break
  sleep 0.2
done

taskset -c 1 h2load -c 200 -m 8 -n 1600 -d "$work/big.json" \
  -H 'content-type: application/json' https://127.0.0.1:18443/validate > "$work/h2load.out" 2>&1 &
load=$!
for i in $(seq 1 70); do
  sleep 0.5
  if (( i % 10 == 0 )); then
    echo "t=$((i / 2)) s: RSS $(awk '/VmRSS/ {print int($2 / 1024)}' /proc/$pid/status) MiB"
  fi
done
wait "$load" || true
echo "peak RSS $(awk '/VmHWM/ {print int($2 / 1024)}' /proc/$pid/status) MiB"
grep -E "^requests:|^status codes:" "$work/h2load.out"
