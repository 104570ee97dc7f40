#!/usr/bin/env bash
# Wheels of what the trainer imports beyond torch, numpy, PyYAML and prometheus-client (which
# the lent GPU machines' image has), at the versions of requirements/trainer.txt, for
# CPython 3.12 on x86-64, into .whl/ (git ignores it): bench/gpu_check.sh installs them there.
# With a checkout of nanoGPT (github.com/karpathy/nanoGPT) as its argument, also the three files
# its bench.py runs from, with the commit, into .nanogpt/ (ignored too): the lent machine has no
# network and no git.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=()
for name in pydantic pydantic-core annotated-types typing-inspection; do
    pins+=("$(grep -m1 -i "^$name==" requirements/trainer.txt | cut -d' ' -f1)")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
ls .whl
if [[ -n ${1:-} ]]; then
    rm -rf .nanogpt && mkdir -p .nanogpt
    for file in bench.py model.py configurator.py; do
        git -C "$1" show "HEAD:$file" >".nanogpt/$file"
    done
    git -C "$1" rev-parse --short HEAD >.nanogpt/REVISION
    echo ".nanogpt: nanoGPT $(cat .nanogpt/REVISION)"
fi
