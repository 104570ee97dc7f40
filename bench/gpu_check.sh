#!/usr/bin/env bash
# The GPU check, prepared for one call on a lent accelerator machine (one NVIDIA GPU, torch
# installed, none of torchkube's other packages, no network), within 8 minutes:
#
#   bench/gpu_wheels.sh                 # here, once: the trainer's few pure-Python needs as wheels
#   bench/gpu_check.sh OUT              # there, from the repository's root, with .whl carried
#
# 1. bench.trainer_throughput --gpu: GPT-2 small (GPT-2's vocabulary) with DDP and FSDP2, eager
#    and compiled, one (trainer, plain loop) pair each; results to bench/results/ and OUT;
# 2. nanoGPT's own bench.py, unmodified, on the same GPU (batch 16 × 1024, bf16, compile, random
#    data), when NANOGPT_DIR names a checkout of it: the peer the trainer is held against;
# 3. the GPU tests (tests/trainer/test_gpu.py) with their floors; log to OUT.
# Each part has a time limit of its own (150 + 70 + 230 s, under 8 minutes with the install),
# so a slow one leaves the others their results. On an H200 the three took 90, 45 and 155 s.
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

echo "== 1. trainer throughput against the plain loop"
timeout "${BENCH_SECONDS:-150}" python3 -m bench.trainer_throughput --gpu --strategies ddp,fsdp \
    --compile both --trials 1 2>&1 | grep -v "$quiet" | tee "$out/trainer_throughput_gpu.log"
cp bench/results/trainer_throughput_gpu.json "$out/" 2>/dev/null

if [[ -n ${NANOGPT_DIR:-} ]]; then
    echo "== 2. nanoGPT's bench.py on the same GPU"
    (cd "$NANOGPT_DIR" && timeout "${NANOGPT_SECONDS:-70}" python3 bench.py --batch_size=16 \
        --real_data=False --compile=True) 2>&1 | grep -v "loss:" | tee "$out/nanogpt.log"
    python3 - "$out/nanogpt.log" <<'PY' | tee -a "$out/nanogpt.log"
import re, sys
found = re.search(r"time per iteration: ([0-9.]+)ms, MFU: ([0-9.]+)%", open(sys.argv[1]).read())
if found:
    ms = float(found.group(1))
    print(f"nanoGPT bench.py: {16 * 1024 / ms * 1e3:,.0f} tok/s ({ms:.2f} ms per iteration, "
          f"its own MFU {found.group(2)}%)")
PY
fi

echo "== 3. GPU tests"
timeout "${TESTS_SECONDS:-230}" python3 -m pytest tests/trainer/test_gpu.py -p no:cacheprovider \
    -s -q 2>&1 | grep -v "$quiet" | tee "$out/gpu_tests.log"
tail -n 1 "$out/gpu_tests.log"
