#!/usr/bin/env bash
# Run one benchmark with the project's environment: bench/run.sh NAME [ARGS...]
#   NAME: operator_scale, operator_cost, queued_start, multikueue_start, topology_placement,
#         operator_recovery, recovery_e2e, real_node_recovery, trainer_throughput, trainer_memory,
#         checkpoint_cost, live_recovery, live_sustained, quickstart, or all (each of them, one
#         after the other, with ARGS ignored). GPU machine: bench/gpu_check.sh.
# Then render bench/results/*.json into docs/benchmarks.md and README.md (python -m bench.report).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  sed -n '2,6p' "$0"
  exit 2
fi
name=$1
shift
VENV=$(hack/bootstrap.sh)
export PATH="$VENV/bin:$PATH"
case "$name" in
  operator_scale | operator_cost | operator_recovery)
    TORCHKUBE_BIN_DIR=$(hack/build-cluster.sh | tail -n 1)
    export TORCHKUBE_BIN_DIR
    ;;
  queued_start | multikueue_start | topology_placement) # Kueue too
    TORCHKUBE_BIN_DIR=$(hack/build-cluster.sh kubernetes etcd kwok helm kueue | tail -n 1)
    export TORCHKUBE_BIN_DIR
    ;;
  all | real_node_recovery) # real kubelet nodes: Docker, containerd, the kubelet
    hack/install-system-deps.sh
    TORCHKUBE_BIN_DIR=$(hack/build-cluster.sh all | tail -n 1)
    export TORCHKUBE_BIN_DIR
    ;;
esac
if [ "$name" = all ]; then
  for one in operator_scale operator_cost queued_start multikueue_start topology_placement \
    operator_recovery recovery_e2e real_node_recovery trainer_throughput trainer_memory \
    checkpoint_cost live_recovery live_sustained quickstart; do
    python -m "bench.$one"
  done
  # torchft's steady cost again at a step about 5× longer (more micro-batches per step)
  python -m bench.live_recovery --steady-only --global-batch 64 --trials 3 --steps 150 \
    --from-step 30
  # a crash restarted in place: the cheapest loss for restart, where live saves nothing
  python -m bench.live_recovery --crash
else
  python -m "bench.$name" "$@"
fi
python -m bench.report
