#!/usr/bin/env bash
# Build the test control plane (Kubernetes, etcd, KWOK, Helm, optionally CoreDNS and Kueue) from
# source.
#
# This machine has no image registry and no release downloads, only the Go module proxy, so every
# component is compiled from its pinned module. Binaries land in
#   ${TORCHKUBE_CACHE:-$HOME/.cache/torchkube}/bin/<key>/
# where <key> hashes the pins (hack/cluster go.mod/go.sum/sources, this script, the Go version):
# change a pin and a fresh folder is built; keep them and a second run is a no-op in about a second.
# GOCACHE and GOMODCACHE stay at Go's defaults so warm rebuilds on the same machine are fast.
#
# Usage: hack/build-cluster.sh [COMPONENT...]
#   components: kubernetes etcd kwok helm coredns kueue; "all" means every one of them.
#   default: kubernetes etcd kwok helm (CoreDNS is only needed by real nodes, Kueue by the queueing
#   tests, so they are opt-in).
# The last line of stdout is the bin folder; everything else goes to stderr.
set -euo pipefail

readonly KUBE_VERSION=v1.34.4
readonly KUBE_MINOR=34
readonly KWOK_PKG=sigs.k8s.io/kwok/cmd/kwok@v0.7.0
readonly HELM_PKG=helm.sh/helm/v3/cmd/helm@v3.19.0
readonly COREDNS_PKG=github.com/coredns/coredns@v1.12.4
readonly KUEUE_MODULE=sigs.k8s.io/kueue
readonly KUEUE_VERSION=v0.17.0

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod_dir="$repo_root/hack/cluster"
script="$repo_root/hack/build-cluster.sh"

log() { printf 'build-cluster: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "Go is not installed (need Go >= 1.24 and the Go module proxy)"
command -v sha256sum >/dev/null || die "sha256sum is missing (coreutils)"

# --- which components --------------------------------------------------------------------------
all_components=(kubernetes etcd kwok helm coredns kueue)
components=()
if [[ $# -eq 0 ]]; then
    components=(kubernetes etcd kwok helm)
else
    for arg in "$@"; do
        case "$arg" in
            all) components=("${all_components[@]}") ;;
            kubernetes | etcd | kwok | helm | coredns | kueue) components+=("$arg") ;;
            -h | --help) sed -n '2,15p' "$script" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
            *) die "unknown component '$arg' (known: ${all_components[*]} all)" ;;
        esac
    done
fi

binaries_of() {
    case "$1" in
        kubernetes) echo "kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet" ;;
        etcd) echo "etcd" ;;
        kwok) echo "kwok" ;;
        helm) echo "helm" ;;
        coredns) echo "coredns" ;;
        # Kueue's CRDs and webhook configurations travel with its binary: they must match it.
        kueue) echo "kueue kueue-config" ;;
    esac
}

# --- cache key: the pins, this script, and the toolchain ----------------------------------------
go_version=$(go env GOVERSION)
key=$(
    {
        cd "$repo_root"
        cat hack/cluster/go.mod hack/cluster/go.sum hack/cluster/tools.go \
            hack/cluster/etcd/go.mod hack/cluster/etcd/go.sum hack/cluster/etcd/main.go \
            hack/build-cluster.sh
        echo "$go_version $(go env GOOS)/$(go env GOARCH)"
    } | sha256sum | cut -c1-16
)
cache_root=${TORCHKUBE_CACHE:-$HOME/.cache/torchkube}
bin_dir="$cache_root/bin/$key"
log_dir="$cache_root/logs/$key"

have_all() {
    local component bin
    for component in "$@"; do
        for bin in $(binaries_of "$component"); do
            [[ -x "$bin_dir/$bin" ]] || return 1
        done
    done
}

if have_all "${components[@]}"; then
    touch "$bin_dir" # marks the folder as in use for the pruning below
    log "up to date: ${components[*]} ($bin_dir)"
    echo "$bin_dir"
    exit 0
fi

mkdir -p "$bin_dir" "$log_dir"
# Two builds at once (pytest and a person, two CI jobs) would race on the same folder: serialise.
exec 9>"$bin_dir/.lock"
if command -v flock >/dev/null; then
    flock 9
fi

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$KUBE_MINOR"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

# run_step COMPONENT CMD...: run a build step, log to a file, name the component if it fails.
run_step() {
    local component=$1
    shift
    local logfile="$log_dir/$component.log" start=$SECONDS
    log "building $component ..."
    if ! "$@" >"$logfile" 2>&1; then
        log "---- last lines of $logfile ----"
        tail -n 40 "$logfile" >&2 || true
        die "FAILED to build $component (full log: $logfile)"
    fi
    log "built $component in $((SECONDS - start)) s"
}

# Each builder writes into a private staging folder, then moves finished binaries into bin_dir,
# so an interrupted build never leaves a half-written binary that looks complete.
stage=$(mktemp -d "$bin_dir/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# Builders run in subshells ( ... ) so their cd never leaks into the main script.
build_kubernetes() (
    cd "$mod_dir" &&
        go build -ldflags "$ldflags" -o "$stage/" \
            k8s.io/kubernetes/cmd/kube-apiserver \
            k8s.io/kubernetes/cmd/kube-controller-manager \
            k8s.io/kubernetes/cmd/kube-scheduler \
            k8s.io/kubernetes/cmd/kubectl \
            k8s.io/kubernetes/cmd/kubelet
)

build_etcd() (
    cd "$mod_dir/etcd" &&
        go build -ldflags "-s -w" -o "$stage/etcd" .
)

# `go install pkg@version` resolves the tool's own go.mod (checked against sum.golang.org),
# independently of any module in this repository.
go_install() (
    cd "$stage" &&
        GOBIN="$stage" go install -ldflags "-s -w ${2:-}" "$1"
)
build_kwok() { go_install "$KWOK_PKG"; }
# Stamped as Helm's Makefile does: without it `helm version` says "v3.19" and `helm template` /
# `helm lint` assume Kubernetes v1.20, so charts with a `kubeVersion` constraint would not render.
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=${HELM_PKG##*@}"
helm_ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in pkg/chartutil pkg/lint/rules; do
    helm_ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1"
    helm_ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$KUBE_MINOR"
done
build_helm() { go_install "$HELM_PKG" "$helm_ldflags"; }
build_coredns() { go_install "$COREDNS_PKG"; }
# Static, as Kueue's own image is built (CGO_ENABLED=0): the test bed runs it in a folder of its
# own as its root, where its visibility server's fixed certificate folder (/visibility) lands.
build_kueue() {
    CGO_ENABLED=0 go_install "$KUEUE_MODULE/cmd/kueue@$KUEUE_VERSION" &&
        local source &&
        source=$(cd "$stage" && go mod download -json "$KUEUE_MODULE@$KUEUE_VERSION" |
            sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') &&
        [[ -d "$source/config/components" ]] &&
        mkdir -p "$stage/kueue-config" &&
        cp "$source"/config/components/crd/bases/*.yaml "$stage/kueue-config/" &&
        cp "$source/config/components/webhook/manifests.yaml" "$stage/kueue-config/webhooks.yaml" &&
        cp "$source/config/components/visibility/apiservice_v1beta2.yaml" \
            "$stage/kueue-config/visibility-apiservice.yaml" &&
        chmod -R u+w "$stage/kueue-config"
}

for component in "${components[@]}"; do
    if have_all "$component"; then
        continue
    fi
    run_step "$component" "build_$component"
    for bin in $(binaries_of "$component"); do
        [[ -x "$stage/$bin" ]] || die "FAILED to build $component: $bin was not produced"
        rm -rf "${bin_dir:?}/$bin" # a folder (kueue-config) would be moved into the old one
        mv -f "$stage/$bin" "$bin_dir/$bin"
    done
done

# Old pins leave ~700 MB folders behind: drop those nobody has used for two weeks.
find "$cache_root/bin" -mindepth 1 -maxdepth 1 -type d ! -path "$bin_dir" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true

log "ready: ${components[*]}"
echo "$bin_dir"
