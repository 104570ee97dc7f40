"""Which rank is slow (torchkube/trainer/stragglers.py): the rule on numbers, then real
torchrun with gloo and one rank held to a fifth of a CPU by a cgroup quota — rank 0 names it in
its progress report, with its pod and node, and the fast rank's time shows up as wait."""

import urllib.request
from pathlib import Path

import pytest
from trainer_harness import Torchrun, read_progress, spec_args, wait_for

from testbed.throttle import throttle_cpu
from torchkube.local.ports import free_port
from torchkube.trainer.stragglers import slowest


def test_the_slowest_rank_is_measured_against_the_median_of_the_others() -> None:
    where = [("p0", "n0"), ("p1", "n1"), ("p2", "n2")]
    found = slowest([0.10, 0.30, 0.12], where)
    assert found is not None
    assert (found.rank, found.pod, found.node, found.slowdown) == (1, "p1", "n1", 2.727)
    assert found.median_seconds == 0.11
    two = slowest([0.2, 0.1], where[:2])  # with two ranks: against the other one
    assert two is not None and (two.rank, two.slowdown) == (0, 2.0)
    assert slowest([0.1], where[:1]) is None and slowest([0.0, 0.0], where[:2]) is None


@pytest.mark.slow
def test_a_throttled_rank_is_named_with_its_pod_and_node(
    torchrun: Torchrun, token_data: Path, tmp_path: Path
) -> None:
    ckpt, port = tmp_path / "ckpt", free_port()
    args = spec_args(token_data, steps=100000, strategy="ddp", deterministic=False)
    launch = torchrun.start(
        2,
        [*args, "--checkpoint-interval-steps=0", "--checkpoint-interval-seconds=3600"],
        checkpoint_dir=ckpt,
        env={"POD_NAME": "pod-a", "NODE_NAME": "node-a", "TORCHKUBE_METRICS_PORT": str(port)},
    )
    wait_for(lambda: read_progress(ckpt).get("step", 0) >= 20, 180, "training", [launch])
    rank1 = launch.workers()[1]
    with throttle_cpu(rank1, share=0.15):
        start = read_progress(ckpt)["step"]

        def named() -> dict | None:
            report = read_progress(ckpt)
            found = report.get("slowestRank") or {}
            late = report.get("step", 0) >= start + 15
            return found if late and found.get("rank") == 1 and found["slowdown"] >= 2 else None

        found = wait_for(named, 180, "rank 1 named as the slowest", [launch])
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    assert (found["pod"], found["node"]) == ("pod-a", "node-a")
    assert found["computeSeconds"] > 2 * found["medianSeconds"]
    wait = next(
        line for line in metrics.splitlines() if line.startswith("torchkube_train_step_wait")
    )
    assert float(wait.split()[-1]) > 0, "rank 0 waits for rank 1 in the all-reduce"
    assert "torchkube_train_slowest_rank_slowdown" in metrics
