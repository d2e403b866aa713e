#!/usr/bin/env bash
# Builds the statusguard container image without a container engine, then
# checks it. The image is what the Dockerfile describes: one static binary
# at /statusguard on an empty (scratch) base, run as 65532:65532.
#
#   image/build.sh                 build and check; writes target/image/statusguard-<version>.tar
#   IMAGE=REPO:TAG image/build.sh  also copy the checked image to that registry
#                                  (crane's credentials: ~/.docker/config.json)
#
# How: cargo builds the binary statically (glibc, -C target-feature=+crt-static;
# in a pod the binary reaches the API server by the IP in
# KUBERNETES_SERVICE_HOST, so the static glibc's lack of NSS modules never
# matters). crane, built from the Go module pinned in image/crane, assembles
# the image in a registry of its own that lives for the length of the build
# (`crane registry serve` on loopback), sets its config, validates it, and
# writes it as a tarball that `docker load`, `podman load`, `crane push`,
# kind and containerd (`ctr images import`) all take.
#
# The checks: the manifest and layers validate; the config says
# linux/amd64, user 65532:65532, entrypoint /statusguard, cmd serve, ports
# 8443 and 8080; the filesystem holds exactly /statusguard, mode 0755,
# owned by root; the binary has no ELF interpreter (static), and the copy
# taken out of the image runs `--version`, checks the example document, and
# serves until /readyz answers 200. The layer is reproducible (fixed owner,
# mode and time): the same binary gives the same digest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "image: $*" >&2; }
fail() { echo "image: FAILED: $*" >&2; exit 1; }
# N free loopback ports, on one line.
free_ports() {
  python3 -c 'import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))' "$1"
}

for tool in cargo go tar readelf python3; do
  command -v "$tool" >/dev/null || fail "needs $tool on the machine"
done

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
target=x86_64-unknown-linux-gnu
work=target/image
mkdir -p "$work"
out="$work/statusguard-$version.tar"

# crane, pinned by image/crane/go.sum, cached by that pin.
cache=${STATUSGUARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/statusguard}
key=$(cat image/crane/go.mod image/crane/go.sum | sha256sum | cut -c1-12)
crane="$cache/tools/crane-$key"
if [[ ! -x "$crane" ]]; then
  say "building crane from image/crane (first run only)"
  mkdir -p "$cache/tools"
  (cd image/crane && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$crane.partial" \
    github.com/google/go-containerregistry/cmd/crane)
  mv "$crane.partial" "$crane"
fi

say "building the static binary (release, $target)"
# --target: the build scripts and proc-macros stay dynamic; only the binary is static.
# Panic locations name the crates' sources: remap the build machine's paths
# (cargo's home, this checkout) so that the binary names none of them and
# is the same wherever it is built from.
cargo fetch --locked --quiet # the crates' sources unpacked, so that their folders are known
rustflags=(-C target-feature=+crt-static "--remap-path-prefix=$PWD=/statusguard")
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for sources in "$cargo_home"/registry/src/* "$cargo_home/git/checkouts"; do
  if [[ -d "$sources" ]]; then rustflags+=("--remap-path-prefix=$sources=/cargo"); fi
done
# One flag per 0x1f-separated field: paths may hold spaces.
CARGO_ENCODED_RUSTFLAGS=$(IFS=$'\x1f'; echo "${rustflags[*]}") cargo build --locked --release \
  --target "$target" --target-dir "$work/cargo" --bin statusguard
binary="$work/cargo/$target/release/statusguard"
if readelf -l "$binary" | grep -q 'INTERP'; then
  fail "$binary asks for a dynamic loader: it is not static"
fi
if grep -aqF -e "$cargo_home/" -e "$PWD/" "$binary"; then
  fail "$binary names a path of the build machine"
fi

# One layer: /statusguard, reproducible (fixed owner, mode and time).
staging=$(mktemp -d)
registry_pid=""
cleanup() {
  [[ -n "$registry_pid" ]] && kill "$registry_pid" 2>/dev/null || true
  rm -rf "$staging"
}
trap cleanup EXIT
install -m 0755 "$binary" "$staging/statusguard"
tar --owner=0 --group=0 --numeric-owner --mtime=@0 --sort=name \
  -cf "$staging/layer.tar" -C "$staging" statusguard

# A registry of crane's own on a loopback port, for the length of the build.
port=$(free_ports 1)
"$crane" registry serve --address "127.0.0.1:$port" >"$staging/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do
  "$crane" catalog "127.0.0.1:$port" >/dev/null 2>&1 && break
  sleep 0.1
done
ref="127.0.0.1:$port/statusguard:$version"

say "assembling $ref"
log="$staging/crane.log"
"$crane" append --oci-empty-base --platform linux/amd64 \
  -f "$staging/layer.tar" -t "$ref" >/dev/null 2>"$log" || { cat "$log" >&2; fail "crane append"; }
"$crane" mutate "$ref" -t "$ref" \
  --set-platform linux/amd64 \
  --entrypoint /statusguard --cmd serve \
  --user 65532:65532 \
  --exposed-ports 8443/tcp,8080/tcp \
  -l org.opencontainers.image.title=statusguard \
  -l org.opencontainers.image.version="$version" \
  -l org.opencontainers.image.licenses="$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -n1)" \
  >/dev/null 2>"$log" || { cat "$log" >&2; fail "crane mutate"; }

say "checking it"
"$crane" validate --remote "$ref" >/dev/null || fail "crane validate"
config=$("$crane" config "$ref")
cat >"$staging/check.py" <<'EOF'
import json, sys
config = json.load(sys.stdin)
expected = {
    "os": "linux",
    "architecture": "amd64",
    "config.User": "65532:65532",
    "config.Entrypoint": ["/statusguard"],
    "config.Cmd": ["serve"],
    "config.ExposedPorts": {"8080/tcp": {}, "8443/tcp": {}},
}
for path, want in expected.items():
    value = config
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value != want:
        sys.exit(f"config {path}: {value!r}, expected {want!r}")
EOF
python3 "$staging/check.py" <<<"$config" || fail "the image config"
"$crane" export "$ref" "$staging/filesystem.tar"
listing=$(tar -tvf "$staging/filesystem.tar" --numeric-owner)
[[ $(wc -l <<<"$listing") -eq 1 ]] || fail "the filesystem holds more than /statusguard: $listing"
grep -Eq '^-rwxr-xr-x 0/0 .* statusguard$' <<<"$listing" || fail "unexpected entry: $listing"
mkdir -p "$staging/root"
tar -xf "$staging/filesystem.tar" -C "$staging/root"
"$staging/root/statusguard" --version >/dev/null || fail "the image's binary does not run"
"$staging/root/statusguard" check examples/ownership.yaml >/dev/null || fail "the image's binary cannot check a document"
# And it serves: TLS and the admin port up, ready on the embedded document.
read -r tls_port admin_port < <(free_ports 2)
"$staging/root/statusguard" serve --listen "127.0.0.1:$tls_port" --admin-listen "127.0.0.1:$admin_port" \
  >"$staging/serve.log" 2>&1 &
serve_pid=$!
ready=false
for _ in $(seq 100); do
  if python3 -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$admin_port/readyz', timeout=1)" 2>/dev/null; then
    ready=true
    break
  fi
  sleep 0.1
done
kill "$serve_pid" 2>/dev/null || true
wait "$serve_pid" 2>/dev/null || true
$ready || { cat "$staging/serve.log" >&2; fail "the image's binary did not become ready serving"; }

"$crane" pull "$ref" "$out.partial"
mv "$out.partial" "$out"
digest=$("$crane" digest "$ref")
size=$(du -h "$out" | cut -f1)
say "ok: $out ($size), statusguard:$version@$digest, static, non-root, scratch"

if [[ -n "${IMAGE:-}" ]]; then
  # Copied as checked, digest unchanged. No --insecure, here or above: crane
  # speaks plain HTTP by itself only to loopback and private addresses (the
  # build's registry), and --insecure would allow it for $IMAGE too.
  say "copying to $IMAGE"
  "$crane" copy "$ref" "$IMAGE"
fi
