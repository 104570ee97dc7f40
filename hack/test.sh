#!/usr/bin/env bash
# Install everything the test suite needs (Python env, system packages, a Kubernetes control
# plane built from source) and run all of it: lint, types, then unit → elastic → trainer →
# local → integration → e2e tests (images, Helm chart, real kubelet nodes).
# Extra arguments go to pytest, e.g. `hack/test.sh -m "not slow"` or `hack/test.sh tests/unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
stamp() { echo "== $1 ($((SECONDS - t0)) s)"; }

stamp "python environment"
VENV=$(hack/bootstrap.sh)
export PATH="$VENV/bin:$PATH"

stamp "system packages (Docker engine, debootstrap, containerd, CNI plugins, Prometheus)"
hack/install-system-deps.sh

stamp "kubernetes components (built from source, cached by their pins)"
TORCHKUBE_BIN_DIR=$(hack/build-cluster.sh all | tail -n 1)
export TORCHKUBE_BIN_DIR

stamp "lint, types and rendered figures"
ruff check .
ruff format --check .
mypy
python -m bench.report --check  # every rendered figure in README and docs matches its record

stamp "tests"
status=0
pytest "$@" || status=$?
stamp "done (pytest exit $status)"
exit "$status"
