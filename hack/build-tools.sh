#!/usr/bin/env bash
# Build the Go linters the tests run on files that are not Python (today: actionlint, for
# .github/workflows), from their pinned modules through the Go module proxy, as
# hack/build-cluster.sh builds the control plane.
#
# A folder of its own, ${TORCHKUBE_CACHE:-$HOME/.cache/torchkube}/tools/<key>/, keyed by the pins,
# this script and the Go version: changing a pin here never invalidates the Kubernetes build,
# and a second run is a no-op in well under a second.
#
# Usage: hack/build-tools.sh        The last line of stdout is the folder; the rest goes to stderr.
set -euo pipefail

readonly ACTIONLINT_PKG=github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

log() { printf 'build-tools: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "Go is not installed (need Go >= 1.24 and the Go module proxy)"
script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
key=$({ cat "$script"; go env GOVERSION GOOS GOARCH; } | sha256sum | cut -c1-16)
cache_root=${TORCHKUBE_CACHE:-$HOME/.cache/torchkube}
tools_dir="$cache_root/tools/$key"

if [[ -x "$tools_dir/actionlint" ]]; then
    log "up to date: actionlint ($tools_dir)"
    echo "$tools_dir"
    exit 0
fi

mkdir -p "$tools_dir"
exec 9>"$tools_dir/.lock"
flock 9  # two builds at once (pytest and a person) must not race on the folder
if [[ ! -x "$tools_dir/actionlint" ]]; then
    stage=$(mktemp -d "$tools_dir/.stage.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    log "building ${ACTIONLINT_PKG} ..."
    start=$SECONDS
    # The version stamp makes `actionlint -version` say the pin instead of "(devel)".
    (cd "$stage" && GOBIN="$stage" go install \
        -ldflags "-s -w -X github.com/rhysd/actionlint.version=${ACTIONLINT_PKG##*@}" \
        "$ACTIONLINT_PKG") >&2 || die "FAILED to build actionlint"
    mv -f "$stage/actionlint" "$tools_dir/actionlint"
    log "built actionlint in $((SECONDS - start)) s"
fi
echo "$tools_dir"
