#!/usr/bin/env bash
# Create (once per dependency set) the Python environment torchkube's tests and tools run in,
# then point it at this checkout. Prints the environment's path as the last line of stdout.
#
# The environment lives outside git, under ${TORCHKUBE_CACHE:-~/.cache/torchkube}, keyed by
# the Python version and the lock file requirements/dev.txt (every package pinned with its
# hashes, made by hack/lock.sh): a fresh clone reuses it in seconds, and a change to the lock
# builds a new one (torch alone is several GB, so it is never reinstalled per run).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "torchkube needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=..." >&2
  exit 1
}
CACHE=${TORCHKUBE_CACHE:-$HOME/.cache/torchkube}
# Keyed by the lock file (hack/lock.sh writes it from pyproject.toml): every machine that
# bootstraps this commit gets exactly the same packages, checked against their hashes.
LOCK=requirements/dev.txt
KEY=$({ "$PYTHON" --version; cat "$LOCK"; } | sha256sum | cut -c1-12)
VENV=$CACHE/venv-$KEY
mkdir -p "$CACHE"
exec 9>"$CACHE/.bootstrap.lock"
flock 9  # two checkouts bootstrapping at once must not build the same venv twice

if [ ! -f "$VENV/.complete" ]; then
  echo "bootstrap: creating $VENV from $LOCK (torch and friends; a few minutes the first time)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip "setuptools>=77" wheel >&2
  "$VENV/bin/pip" install -q --require-hashes -r "$LOCK" >&2
  touch "$VENV/.complete"
fi
# Re-point the editable install at this checkout (a CI clone or a second worktree).
log=$(mktemp)
"$VENV/bin/pip" install -q --no-deps --no-build-isolation -e . >"$log" 2>&1 || {
  cat "$log" >&2
  exit 1
}
rm -f "$log"
echo "$VENV"
