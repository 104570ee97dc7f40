"""A worker taken away by the cluster, against the real control plane: evicted through the
Eviction API while its node is drained, and preempted by kube-scheduler for a pod of higher
priority. Each is an infrastructure incident (docs/operator.md, "What each failure costs"):
recorded under its own reason, replaced at once, and free of ``maxRestarts``; the job says
``Restarting`` until the replacement runs, and ``WaitingForWorkers`` names the replacement and
why it is not scheduled.

Each test fills a pool of its own (a worker takes a whole node), so the replacement waits
until the test gives the node back: the wait is what the status must explain.
"""

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kube_jobs import Job
from kubernetes import client

from testbed import faults
from testbed.kwok import NodePool
from testbed.pods import kwok_pod, wait_pod_gone, wait_pod_phase
from torchkube.api import labels as lbl

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def _incident(job: Job, victim: str) -> dict[str, Any]:
    """The job's status once it recorded ``victim``'s loss and says it waits for the
    replacement."""

    def recorded() -> dict[str, Any] | None:
        status = job.status()
        last = status.get("lastFailure") or {}
        waiting = _condition(status, "Restarting").get("status") == "True"
        return status if last.get("pod") == victim and waiting else None

    status: dict[str, Any] = job.wait(recorded, 30, f"{victim} recorded, the job Restarting")
    return status


def _assert_free_incident(status: dict[str, Any], victim: str, reason: str) -> None:
    assert status["phase"] == "Restarting"
    assert status["restarts"] == 1 and status["restartsCountTowardsMax"] == 0
    last = status["lastFailure"]
    assert (last["reason"], last["pod"], last["counted"]) == (reason, victim, False)
    assert [f["pod"] for f in status["failures"]] == [victim]
    assert "waiting for replacements" in _condition(status, "Restarting")["message"]


def _waits_for_replacement(job: Job, victim: Any) -> str:
    """The replacement of ``victim``, once ``WaitingForWorkers`` names it as not scheduled
    (with the scheduler's message): what the job waits for and what would unblock it."""
    slot = int(victim.metadata.labels[lbl.REPLICA_INDEX])

    def named() -> str | None:
        found = job.replacements(slot, victim.metadata.name)
        waiting = _condition(job.status(), "WaitingForWorkers")
        message = waiting.get("message", "")
        if not found or waiting.get("status") != "True":
            return None
        replacement: str = found[0].metadata.name
        return replacement if f"pod {replacement}: not scheduled for" in message else None

    name: str = job.wait(named, 30, "WaitingForWorkers naming the unscheduled replacement")
    return name


def test_evicted_worker_on_a_drained_node_is_replaced_free(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    """``kubectl drain``: the node cordoned, then its worker evicted through the Eviction API
    (the apiserver marks it ``DisruptionTarget/EvictionByEvictionAPI``, the kubelet stops it)."""
    pool = isolated_pool(nodes=2)
    job = make_job("evicted", pool, replicas={"min": 2, "max": 2})
    victim = job.wait_running(2)[1]
    name, node = victim.metadata.name, victim.spec.node_name
    faults.cordon_node(api_client, node)
    faults.evict_pod(api_client, name, job.namespace)
    status = _incident(job, name)
    _assert_free_incident(status, name, "Evicted")
    _waits_for_replacement(job, victim)  # its node cordoned, the other one taken
    job.wait_event("Evicted", 30, containing=name)
    faults.cordon_node(api_client, node, unschedulable=False)
    job.wait_running(2)
    status = job.wait(
        lambda: _condition(job.status(), "Restarting").get("status") == "False" and job.status(),
        30,
        "Restarting=False once the replacement runs",
    )
    assert status["restarts"] == 1 and status["restartsCountTowardsMax"] == 0


@pytest.fixture
def priority_class(api_client: Any) -> Iterator[str]:
    """A PriorityClass above the workers' (they have none: priority 0), removed after."""
    scheduling = client.SchedulingV1Api(api_client)
    name = f"urgent-{secrets.token_hex(3)}"
    scheduling.create_priority_class(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": 1000,
        }
    )
    yield name
    scheduling.delete_priority_class(name)


def test_worker_preempted_by_a_higher_priority_pod_is_replaced_free(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    priority_class: str,
) -> None:
    """kube-scheduler itself preempts: a pod of higher priority that fits nowhere else takes
    a worker's node (the victim gets ``DisruptionTarget/PreemptionByScheduler``)."""
    pool = isolated_pool(nodes=2)
    job = make_job("preempted", pool, replicas={"min": 2, "max": 2})
    workers = {p.metadata.name: p for p in job.wait_running(2)}
    core = client.CoreV1Api(api_client)
    urgent = kwok_pod("urgent", gpus=8, node_pool=pool.name)
    urgent["spec"]["priorityClassName"] = priority_class
    core.create_namespaced_pod(job.namespace, urgent)

    def preempted() -> str | None:
        live = {p.metadata.name for p in job.live_workers()}
        gone = [name for name in workers if name not in live]
        return gone[0] if gone else None

    name = job.wait(preempted, 30, "a worker preempted for the urgent pod")
    status = _incident(job, name)
    _assert_free_incident(status, name, "Preempted")
    job.wait_event("Preempted", 30, containing=name)
    wait_pod_phase(api_client, "urgent", job.namespace, "Running", timeout=30)
    _waits_for_replacement(job, workers[name])  # the urgent pod holds its node
    assert job.status()["phase"] == "Restarting"
    core.delete_namespaced_pod("urgent", job.namespace, grace_period_seconds=0)
    wait_pod_gone(api_client, "urgent", job.namespace, timeout=30)
    replacement = job.wait_running(2)
    assert name not in {p.metadata.name for p in replacement}
    assert job.status()["restartsCountTowardsMax"] == 0
