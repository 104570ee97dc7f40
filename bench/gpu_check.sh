#!/usr/bin/env bash
# The GPU check, prepared for one call on a lent accelerator machine (one NVIDIA GPU, torch
# installed, none of torchkube's other packages, no network), within 10 minutes:
#
#   bench/gpu_wheels.sh [NANOGPT]     # here, once: the trainer's few pure-Python needs as wheels
#                                     # (.whl/), and nanoGPT's bench files from a checkout of it
#                                     # (.nanogpt/)
#   bench/gpu_check.sh OUT              # there, from the repository's root, .whl and .nanogpt carried
#
# 1. bench.trainer_throughput --gpu: GPT-2 small (GPT-2's vocabulary) with DDP and FSDP2, eager
#    and compiled, TRIALS (3) trials of (trainer, plain loop) each, and nanoGPT's own bench.py,
#    unmodified (batch 16 × 1024, bf16, compile, random data), once per trial as the third
#    contender where .nanogpt (or NANOGPT_DIR) holds it; the record is rewritten after every
#    trial, to bench/results/ and OUT;
# 2. the GPU tests (tests/trainer/test_gpu.py) with their floors, one pytest each, so a test
#    cut off by the time limit leaves every earlier one's outcome and traceback; log to OUT.
# Each part has a time limit of its own (300 + 240 s, under 10 minutes with the install), so a
# slow one leaves the other its results. On an H200 part 1 took 240 s (3 trials with nanoGPT),
# part 2 over 170 s.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/gpu_check.sh OUT}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/torchkube-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/torchkube-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
python3 -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))' |
    tee "$out/device.txt" || exit 1
quiet="^[0-9-]* [0-9:,]* INFO torchkube: \(step\|global batch\|finished\)\|warnings.warn\|_warn_once\|UserWarning"

nanogpt=${NANOGPT_DIR:-$([[ -f .nanogpt/bench.py ]] && echo .nanogpt)}

echo "== 1. trainer throughput against the plain loop and nanoGPT's bench.py"
timeout "${BENCH_SECONDS:-300}" python3 -m bench.trainer_throughput --gpu --strategies ddp,fsdp \
    --compile both --trials "${TRIALS:-3}" ${nanogpt:+--nanogpt "$nanogpt"} 2>&1 |
    grep -v "$quiet" | tee "$out/trainer_throughput_gpu.log"
cp bench/results/trainer_throughput_gpu.json "$out/" 2>/dev/null

echo "== 2. GPU tests"
deadline=$((SECONDS + ${TESTS_SECONDS:-240}))
mapfile -t tests < <(python3 -m pytest tests/trainer/test_gpu.py --collect-only -q \
    -p no:cacheprovider | grep "::")
for test in "${tests[@]}"; do
    left=$((deadline - SECONDS))
    if ((left < 10)); then
        echo "$test: not run, out of time"
        continue
    fi
    timeout "$left" python3 -m pytest "$test" -p no:cacheprovider -s -q --tb=short 2>&1 |
        grep -v "$quiet"
done | tee "$out/gpu_tests.log"
