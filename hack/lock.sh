#!/usr/bin/env bash
# Regenerate the lock files under requirements/ from pyproject.toml: every package pinned with
# its hashes, for Linux x86_64 and Python 3.11 (the images' Python and the oldest supported).
#
#   requirements/dev.txt       everything the tests need    (hack/bootstrap.sh installs it)
#   requirements/trainer.txt   the trainer image: dependencies + the data extra (Dockerfile)
#   requirements/torch.txt     torch and what it pulls in, at the versions of trainer.txt
#                              (the trainer image's big layer; skipped when the base has torch)
#   requirements/operator.txt  the operator image: the operator extra, no torch (Dockerfile)
#
# Run it after changing a dependency in pyproject.toml (tests/unit/test_lock.py fails while a
# lock file does not match it). uv comes from the package index into a throw-away venv.
# LOCK_CONSTRAINTS=FILE (e.g. `pip freeze` of an environment the tests passed in) pins the
# versions to that environment's wherever pyproject.toml allows them.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$work/uv"
"$work/uv/bin/pip" install --quiet "uv>=0.5"
uv=$work/uv/bin/uv

# The requirement lists, from pyproject.toml alone (hack/lock_inputs.py says which go where).
"$PYTHON" hack/lock_inputs.py "$work"
compile() { # INPUT OUTPUT [uv args]
    local input=$1 output=$2
    shift 2
    "$uv" pip compile "$input" --generate-hashes --python-version 3.11 \
        --python-platform x86_64-manylinux_2_28 --quiet --no-header \
        --custom-compile-command "hack/lock.sh" -o "$output" "$@"
}
mkdir -p requirements
pins=()
[[ -z ${LOCK_CONSTRAINTS:-} ]] || pins=(--constraint "$LOCK_CONSTRAINTS")
compile "$work/trainer.in" requirements/trainer.txt "${pins[@]}"
compile "$work/torch.in" requirements/torch.txt --constraint requirements/trainer.txt
compile "$work/operator.in" requirements/operator.txt --constraint requirements/trainer.txt
compile "$work/dev.in" requirements/dev.txt --constraint requirements/trainer.txt "${pins[@]}"
echo "lock: requirements/ written" >&2
