#!/usr/bin/env bash
# Load images built on this machine into a cluster's nodes, so pods run them with no registry
# in between (docs/images.md, "Images on your own cluster").
#
#   hack/load-images.sh --containerd SOCKET [--containerd SOCKET ...] IMAGE...
#       each node's containerd, through `ctr` in the CRI namespace (k8s.io): kubeadm nodes,
#       k3s/RKE2 (/run/k3s/containerd/containerd.sock), the test suite's real nodes
#   hack/load-images.sh --kind CLUSTER IMAGE...       kind:     `kind load docker-image`
#   hack/load-images.sh --k3d CLUSTER IMAGE...        k3d:      `k3d image import`
#   hack/load-images.sh --minikube PROFILE IMAGE...   minikube: `minikube image load`
#
# IMAGE is a tag in the local Docker engine (DOCKER_HOST is honoured; DOCKER names another
# client binary, CTR another ctr). For containerd, a node that already holds the same image ID
# under that name is skipped (the ID is kept as a label on the image), and the image is saved
# from Docker once and streamed into the nodes in parallel (no copy on disk); an older build
# under that name is removed first with its layers, so a node keeps one build of each tag (a
# node needs free space for the image twice: its layers and their unpacked copy). Pods then use
# the image with
# `imagePullPolicy: IfNotPresent` (or Never):
#
#   docker build --target operator -t torchkube/operator:dev .
#   docker build --target trainer  -t torchkube/trainer:dev .
#   hack/load-images.sh --kind kind torchkube/operator:dev torchkube/trainer:dev
#   helm install torchkube charts/torchkube -n torchkube-system --create-namespace \
#     --set image.repository=torchkube/operator,image.tag=dev
#
# One line per image and node on stdout: "imported IMAGE SOCKET SECONDS" or "present IMAGE SOCKET".
set -euo pipefail

readonly ID_LABEL=io.torchkube.docker-image-id

log() { printf 'load-images: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

docker=${DOCKER:-docker}
ctr=${CTR:-ctr}
sockets=()
mode=""
cluster=""
images=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --containerd) [[ $# -ge 2 ]] || usage; mode=containerd; sockets+=("$2"); shift 2 ;;
        --kind | --k3d | --minikube) [[ $# -ge 2 ]] || usage; mode=${1#--}; cluster=$2; shift 2 ;;
        -h | --help) usage 0 ;;
        -*) log "unknown option $1"; usage ;;
        *) images+=("$1"); shift ;;
    esac
done
[[ -n $mode && ${#images[@]} -gt 0 ]] || usage

command -v "$docker" >/dev/null || die "no Docker client '$docker' (set DOCKER=/path/to/docker)"
declare -A image_id
for image in "${images[@]}"; do
    image_id[$image]=$("$docker" image inspect --format '{{.Id}}' "$image" 2>/dev/null) ||
        die "image $image is not in the Docker engine: build it first (docs/images.md)"
done

case $mode in
    kind) exec kind load docker-image --name "$cluster" "${images[@]}" ;;
    k3d) exec k3d image import --cluster "$cluster" "${images[@]}" ;;
    minikube)
        for image in "${images[@]}"; do minikube --profile "$cluster" image load "$image"; done
        exit 0
        ;;
esac

command -v "$ctr" >/dev/null || die "no '$ctr' (containerd's client; set CTR=/path/to/ctr)"

# The name containerd and the kubelet give a Docker tag: docker.io/[library/]NAME:TAG unless
# the first part is a registry host.
containerd_ref() {
    local ref=$1 first=${1%%/*}
    if [[ $ref != */* ]]; then
        ref=docker.io/library/$ref
    elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
        ref=docker.io/$ref
    fi
    [[ ${ref##*/} == *:* || $ref == *@* ]] || ref=$ref:latest
    echo "$ref"
}

nodes_ctr() { # SOCKET ARGS...: ctr against one node, in the CRI namespace
    local socket=$1
    shift
    "$ctr" --address "$socket" --namespace k8s.io "$@"
}

has_image() { # SOCKET REF ID: the node holds REF with our ID label
    nodes_ctr "$1" images list --quiet "name==$2,labels.\"$ID_LABEL\"==$3" 2>/dev/null |
        grep -qx "$2"
}

remove_earlier_build() { # SOCKET REF
    # containerd's CRI plugin gives every imported image a second name, its ID (sha256:...).
    # Removing only REF would leave that name holding the earlier build's layers (6 GB per
    # trainer rebuild and node), so its ID names go too, unless another tag still wants it.
    local digest names=() others=()
    digest=$(nodes_ctr "$1" images list "name==$2" 2>/dev/null | awk 'NR == 2 {print $3}')
    [[ -n $digest ]] || return 0
    mapfile -t names < <(nodes_ctr "$1" images list --quiet "target.digest==$digest")
    mapfile -t others < <(printf '%s\n' "${names[@]}" | grep -v -x -e "$2" -e 'sha256:[0-9a-f]*')
    if [[ ${#others[@]} -gt 0 ]]; then
        names=("$2")
    fi
    # --sync waits for containerd's garbage collection, so the space is free on return.
    nodes_ctr "$1" images rm --sync "${names[@]}" >/dev/null 2>&1 || true
}

import_into() { # SOCKET STREAM REF ID
    local started=$SECONDS
    remove_earlier_build "$1" "$3"
    nodes_ctr "$1" images import "$2" >/dev/null || die "ctr images import into $1 failed"
    nodes_ctr "$1" images label "$3" "$ID_LABEL=$4" >/dev/null || die "ctr images label on $1 failed"
    echo "imported $3 $1 $((SECONDS - started))"
}

# The archive is streamed from `docker save` into every node at once (one pipe per node, fed by
# tee): no copy of it on disk, which for the trainer image would be another 6 GB.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for image in "${images[@]}"; do
    ref=$(containerd_ref "$image")
    id=${image_id[$image]}
    need=()
    for socket in "${sockets[@]}"; do
        [[ -S $socket ]] || die "no containerd socket at $socket"
        if has_image "$socket" "$ref" "$id"; then
            echo "present $ref $socket"
        else
            need+=("$socket")
        fi
    done
    [[ ${#need[@]} -gt 0 ]] || continue
    log "docker save $image (${id:7:12}) into ${#need[@]} node(s)"
    pids=()
    pipes=()
    for i in "${!need[@]}"; do
        pipes+=("$work/node$i")
        mkfifo "${pipes[$i]}"
        import_into "${need[$i]}" "${pipes[$i]}" "$ref" "$id" &
        pids+=($!)
    done
    "$docker" save "$image" | tee "${pipes[@]}" >/dev/null ||
        die "docker save $image into the nodes failed (see above)"
    for pid in "${pids[@]}"; do
        wait "$pid" || die "loading $image failed (see above)"
    done
    rm -f "${pipes[@]}"
done
