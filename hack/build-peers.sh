#!/usr/bin/env bash
# Build the peers the benchmarks measure torchkube against, from their pinned Go modules:
#   Kubeflow training-operator (PyTorchJob), the v1 operator users run today.
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
readonly KUBEFLOW_PKG=$KUBEFLOW_MODULE/cmd/training-operator.v1@$KUBEFLOW_VERSION

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

if [[ ! -x "$bin_dir/training-operator.v1" ]]; then
    log "building Kubeflow training-operator $KUBEFLOW_VERSION ..."
    start=$SECONDS
    stage=$(mktemp -d "$bin_dir/.stage.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    (cd "$stage" && GOBIN="$stage" go install -ldflags "-s -w" "$KUBEFLOW_PKG") >"$bin_dir/build.log" 2>&1 ||
        { tail -n 40 "$bin_dir/build.log" >&2; die "FAILED to build $KUBEFLOW_PKG"; }
    mv -f "$stage/training-operator.v1" "$bin_dir/"
    log "built in $((SECONDS - start)) s"
fi
echo "$module_dir"
echo "$bin_dir"
