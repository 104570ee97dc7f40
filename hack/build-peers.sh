#!/usr/bin/env bash
# Build the peers the benchmarks measure torchkube against, from their pinned Go modules:
#   Kubeflow training-operator (PyTorchJob), the v1 operator users run today: v1.8.1, and the
#   last v1 release (as training-operator.v1-<version>), whose --kube-api-qps/--kube-api-burst
#   flags (new in v1.9) let a benchmark run it with its client limits raised.
#
# Like hack/build-cluster.sh, binaries are cached outside git, keyed by the pins, this script
# and the Go toolchain: ${TORCHKUBE_CACHE:-~/.cache/torchkube}/peers/<key>/. The module's own
# source (its CRDs and webhook manifests, which the benchmark installs) stays in Go's module
# cache; its path is the second-to-last line of stdout, the bin folder the last.
#
# Usage: hack/build-peers.sh   (cold: a few minutes on 2 cores; warm: a second)
set -euo pipefail

readonly KUBEFLOW_MODULE=github.com/kubeflow/training-operator
readonly KUBEFLOW_VERSION=v1.8.1
readonly KUBEFLOW_RAISED_VERSION=v1.9.3
readonly KUBEFLOW_CMD=$KUBEFLOW_MODULE/cmd/training-operator.v1

log() { printf 'build-peers: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "Go is not installed (need Go >= 1.24 and the Go module proxy)"
script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
key=$({ cat "$script"; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -c1-16)
cache_root=${TORCHKUBE_CACHE:-$HOME/.cache/torchkube}
bin_dir="$cache_root/peers/$key"
mkdir -p "$bin_dir"

exec 9>"$bin_dir/.lock"
flock 9

module_dir=$(cd "$bin_dir" && go mod download -json "$KUBEFLOW_MODULE@$KUBEFLOW_VERSION" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') ||
    die "could not download $KUBEFLOW_MODULE@$KUBEFLOW_VERSION from the Go module proxy"

# build VERSION BINARY: go install the operator at VERSION into $bin_dir/BINARY, unless there.
build() {
    local version=$1 binary=$2 start=$SECONDS stage
    [[ -x "$bin_dir/$binary" ]] && return 0
    log "building Kubeflow training-operator $version ..."
    stage=$(mktemp -d "$bin_dir/.stage.XXXXXX")
    (cd "$stage" && GOBIN="$stage" go install -ldflags "-s -w" "$KUBEFLOW_CMD@$version") >"$bin_dir/build-$version.log" 2>&1 ||
        { tail -n 40 "$bin_dir/build-$version.log" >&2; rm -rf "$stage"; die "FAILED to build $KUBEFLOW_CMD@$version"; }
    mv -f "$stage/training-operator.v1" "$bin_dir/$binary"
    rm -rf "$stage"
    log "built in $((SECONDS - start)) s"
}
build "$KUBEFLOW_VERSION" training-operator.v1
build "$KUBEFLOW_RAISED_VERSION" "training-operator.v1-$KUBEFLOW_RAISED_VERSION"
echo "$module_dir"
echo "$bin_dir"
