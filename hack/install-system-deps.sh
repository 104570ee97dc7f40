#!/usr/bin/env bash
# Install the Debian packages the test suite needs beyond Python and Go, once per machine.
#
#   docker.io    the Docker engine (dockerd 20.10 + containerd + runc, and a matching docker
#                client with BuildKit). Never started here: testbed.docker starts a
#                private dockerd of its own.
#   debootstrap  builds the local Debian base image (no image registry is reachable, so no
#                base image can be pulled).
#   containerd, runc, containernetworking-plugins, iproute2
#                real kubelet nodes (testbed.realnodes): one containerd per node,
#                the bridge/host-local/portmap CNI plugins (/usr/lib/cni) and `ip` for bridges.
#   prometheus   the real Prometheus the observability tests scrape (testbed.prometheus
#                runs its own on a random loopback port; with systemd the package also starts
#                a system service on :9090).
#
# Idempotent and quick: already-installed packages cost one dpkg-query (well under a second);
# `apt-get update` runs only when a package has no install candidate or the install fails on
# stale package lists.
set -euo pipefail

packages=(docker.io debootstrap containerd runc containernetworking-plugins iproute2 prometheus)

log() { printf 'install-system-deps: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v dpkg-query >/dev/null && command -v apt-get >/dev/null ||
    die "needs a Debian-based system with apt-get (install ${packages[*]} by hand)"

missing=()
for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ $status == installed ]] || missing+=("$pkg")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    log "up to date: ${packages[*]}"
    exit 0
fi

sudo=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and no sudo: cannot install ${missing[*]}"
    sudo=(sudo)
fi
# Wait for another apt/dpkg (a second checkout, unattended-upgrades) instead of failing.
apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q)

has_candidate() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [^(]'; }
need_update=0
for pkg in "${missing[@]}"; do
    has_candidate "$pkg" || need_update=1
done
if [[ $need_update -eq 1 ]]; then
    log "apt-get update (no install candidate for some of: ${missing[*]})"
    "${apt[@]}" update >&2 || die "apt-get update failed"
fi

log "installing ${missing[*]}"
if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2; then
    # Package lists older than the mirror give 404s: refresh once and retry.
    log "install failed; refreshing package lists and retrying once"
    "${apt[@]}" update >&2 || die "apt-get update failed"
    "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2 ||
        die "could not install ${missing[*]}"
fi
log "installed ${missing[*]}"
