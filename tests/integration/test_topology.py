"""scheduling.topology without Kueue, against the real scheduler and KWOK nodes labelled by
rack: the workers land in one rack, a replacement lands beside them, and a full rack is named.

Each rack is a node pool of its own; a worker takes a whole node (8 GPUs), so where each one
runs says what the scheduler was asked. Without the topology term the scheduler spreads them:
three workers on three racks of four empty nodes share one rack by chance 6 % of the time.
"""

import time
from collections.abc import Callable
from typing import Any

import pytest
from kube_jobs import Job

from testbed import faults
from testbed.kwok import NodePool
from torchkube.api import labels as lbl

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RACK = "example.com/rack"


def rack_of(node: str, pools: list[NodePool]) -> str:
    return next(pool.name for pool in pools if node in pool.node_names())


def test_workers_share_a_rack_and_a_replacement_lands_beside_them(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pools = [isolated_pool(nodes=4, labels={RACK: f"rack-{i}"}) for i in range(3)]
    job = make_job(
        "packed", pools, replicas={"min": 3, "max": 3}, scheduling={"topology": {"level": RACK}}
    )
    workers = job.wait_running(3)
    placed = {rack_of(w.spec.node_name, pools) for w in workers}
    assert len(placed) == 1, f"workers spread over racks: {sorted(placed)}"

    victim = workers[0]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=137)
    failed_at = time.monotonic()
    slot = int(victim.metadata.labels[lbl.REPLICA_INDEX])
    job.wait(lambda: job.replacements(slot, victim.metadata.name), 30, "a replacement")
    workers = job.wait_running(3)
    print(f"replacement Running {time.monotonic() - failed_at:.1f}s after the failure")
    now = {rack_of(w.spec.node_name, pools) for w in workers}
    assert now == placed, f"the replacement left the job's rack: {sorted(now)} != {sorted(placed)}"


def test_a_full_rack_is_named_in_the_condition(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool]
) -> None:
    pools = [isolated_pool(nodes=2, labels={RACK: f"rack-{i}"}) for i in range(2)]
    job = make_job(
        "crowded",
        pools,
        replicas={"min": 2, "max": 3},
        scheduling={"topology": {"level": RACK}, "pendingTimeoutSeconds": 2},
    )
    workers = job.wait(
        lambda: len(job.running_workers()) == 2 and job.running_workers(), 60, "two running"
    )
    assert len({rack_of(w.spec.node_name, pools) for w in workers}) == 1

    def reported() -> dict[str, Any] | None:
        found = [c for c in job.status().get("conditions", []) if c["type"] == "PodsUnschedulable"]
        return found[0] if found and found[0]["status"] == "True" else None

    message = job.wait(reported, 60, "PodsUnschedulable")["message"]
    assert "1 of 3 workers cannot be scheduled" in message, message
    assert "pod affinity" in message, message
    assert f"the {RACK} domain of the nodes the job's workers run on" in message, message
    for worker in workers:
        assert worker.spec.node_name in message, message
