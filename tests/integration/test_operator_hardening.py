"""The operator under what real clusters do and the happy path never shows: a namesake's
leftovers, values the apiserver refuses, pods that can never start, a namespace that enforces
Pod Security, a partition, bursts of events, a stale leader's write, repeated events.

Every pod here lives on KWOK nodes that follow a real kubelet's deletion semantics
(testbed/kwok.py).
"""

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kube_jobs import Job, job_manifest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed import faults
from testbed.cluster import Cluster
from testbed.kwok import POOL_LABEL, NodePool, kwok_toleration
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl
from torchkube.operator.kube import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _condition(job: Job, kind: str) -> dict[str, Any]:
    return next((c for c in job.status().get("conditions", []) if c["type"] == kind), {})


def test_recreated_job_never_adopts_its_namesakes_pods_or_children(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    cluster: Cluster,
    api_client: Any,
    tmp_path: Path,
) -> None:
    """kubectl delete tj again && kubectl apply -f again.yaml while the old pods are still
    terminating (their kubelets paused): the new job counts none of them, waits for the old
    claim to go, and then runs on children of its own."""
    pool = isolated_pool(nodes=2)
    old = make_job("again", pool, replicas={"min": 2, "max": 2})
    old.wait_running(2)
    old_uid = old.get()["metadata"]["uid"]
    cluster.kill_domain(pool.failure_domain)
    old.custom.delete_namespaced_custom_object(
        GROUP, VERSION, old.namespace, PLURAL, old.name, propagation_policy="Background"
    )
    old.wait(lambda: all(p.metadata.deletion_timestamp for p in old.pods()), 60, "GC deletes")
    for pod in old.pods():
        faults.stop_deleted_pod(api_client, pod.metadata.name, old.namespace)
    new = Job.create(
        api_client, old.namespace, job_manifest("again", pool, replicas={"min": 2, "max": 2})
    )
    new.wait(lambda: _condition(new, "Created").get("reason") == "NameConflict", 30, "conflict")
    status = new.status()
    assert status.get("restarts", 0) == 0 and "lastFailure" not in status
    assert not new.live_workers(), "no workers before the job has a claim of its own"

    cluster.restart_domain(pool.failure_domain)
    claim = f"{new.name}-checkpoints"
    core = client.CoreV1Api(api_client)

    def old_claim_gone() -> bool:
        try:
            found = core.read_namespaced_persistent_volume_claim(claim, new.namespace)
        except ApiException as error:
            return error.status == 404
        return found.metadata.owner_references[0].uid != old_uid

    new.wait(old_claim_gone, 60, "the old claim to go")
    volume = f"pv-{new.namespace}-{claim}"
    delete_volume(api_client, volume)
    wait_for(lambda: _volume_gone(core, volume), 30, what="the old volume to go")
    prebound_volume(api_client, new.namespace, claim, str(tmp_path / "again-2"))
    new.wait_running(2)
    uid = new.get()["metadata"]["uid"]
    service = core.read_namespaced_service("again", new.namespace)
    assert service.metadata.owner_references[0].uid == uid
    assert service.spec.selector[lbl.JOB_UID] == uid
    assert new.status().get("restarts", 0) == 0
    delete_volume(api_client, volume)


def _volume_gone(core: Any, name: str) -> bool:
    try:
        core.read_persistent_volume(name)
    except ApiException as error:
        return error.status == 404
    return False


def test_nan_loss_and_a_huge_termination_message_do_not_break_status_writes(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    progress_reports: Any,
    api_client: Any,
) -> None:
    """A diverged trainer reports loss NaN (not JSON); a crashing one leaves 4 KiB of
    traceback. Sent as they are, either would have the apiserver refuse every later status
    write of the job."""
    pool = isolated_pool(nodes=2)
    job = make_job("diverged", pool, replicas={"min": 2, "max": 2})
    workers = job.wait_running(2)
    for pod in workers:
        progress_reports.reports[(job.namespace, pod.metadata.name)] = {
            "step": 42,
            "loss": math.nan,
            "tokensPerSecond": math.inf,
            "updated": "2026-11-23T12:00:00Z",
        }
    job.wait(lambda: (job.status().get("progress") or {}).get("step") == 42, 30, "progress")
    assert "loss" not in job.status()["progress"]
    traceback = "Traceback (most recent call last):\n" + "  frame\n" * 700 + "ValueError: diverged"
    faults.fail_pod(api_client, workers[0].metadata.name, job.namespace, message=traceback[-4096:])
    job.wait(lambda: job.status().get("restarts") == 1, 30, "the failure recorded")
    last = job.status()["lastFailure"]
    assert last["message"].endswith("ValueError: diverged") and len(last["message"]) <= 4096
    for pod in workers:
        progress_reports.reports[(job.namespace, pod.metadata.name)]["step"] = 50
    job.wait(lambda: job.status()["progress"]["step"] == 50, 30, "status still written")


def test_quota_refusal_is_reported_and_the_job_starts_once_it_lifts(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    pool = isolated_pool(nodes=2)

    def quota(ns: str) -> None:
        core.create_namespaced_resource_quota(
            ns,
            {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}}},
        )

    job = make_job("quota", pool, replicas={"min": 2, "max": 2}, runPolicy={"suspend": True})
    namespace = job.namespace
    quota(namespace)
    job.patch({"runPolicy": {"suspend": False}})
    job.wait(
        lambda: _condition(job, "PodsBlocked").get("reason") == "PodCreateRefused",
        60,
        "the refusal reported",
    )
    blocked = _condition(job, "PodsBlocked")
    assert "exceeded quota" in blocked["message"]
    job.wait_event("PodCreateRefused")
    core.delete_namespaced_resource_quota("two-pods", namespace)
    job.wait_running(2, timeout=120)
    # The refused pod may be the store (the workers then run already): it is created at the
    # next retry of the back-off, and only then is nothing blocked any more.
    job.wait(
        lambda: _condition(job, "PodsBlocked").get("status") == "False",
        120,
        "PodsBlocked cleared once every pod was created",
    )


def test_restricted_namespace_runs_jobs_and_refuses_a_host_network_one_fast(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    first = make_job("secure", pool, replicas={"min": 1, "max": 1}, runPolicy={"suspend": True})
    core = client.CoreV1Api(api_client)
    core.patch_namespace(
        first.namespace,
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    first.patch({"runPolicy": {"suspend": False}})
    first.wait_running(1)
    assert len(first.pods("rendezvous")) == 1, "the store passes 'restricted' too"
    bad = make_job(
        "hostnet",
        pool,
        replicas={"min": 1, "max": 1},
        scheduling={
            "tolerations": [kwok_toleration()],
            "nodeSelector": {POOL_LABEL: pool.name},
            "podTemplate": {"spec": {"hostNetwork": True}},
        },
    )
    bad.wait(lambda: bad.status().get("phase") == "Failed", 30, "a fast failure")
    failed = _condition(bad, "Failed")
    assert failed["reason"] == "PodCreateRefused" and "violates PodSecurity" in failed["message"]


def test_image_that_cannot_be_pulled_is_reported_and_ends_at_the_start_deadline(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    cluster: Cluster,
    api_client: Any,
) -> None:
    pool = isolated_pool(nodes=1)
    cluster.kill_domain(pool.failure_domain)  # no kubelet to start it: we play its part
    job = make_job(
        "nopull", pool, replicas={"min": 1, "max": 1}, runPolicy={"startDeadlineSeconds": 20}
    )
    job.wait(lambda: any(p.spec.node_name for p in job.pods()), 60, "the worker bound")
    worker = next(p for p in job.pods() if p.spec.node_name)
    faults.image_pull_failing(api_client, worker.metadata.name, job.namespace)
    job.wait(
        lambda: _condition(job, "PodsBlocked").get("reason") == "ImagePullBackOff",
        30,
        "PodsBlocked",
    )
    job.wait(lambda: job.status().get("phase") == "Failed", 60, "the start deadline")
    failed = _condition(job, "Failed")
    assert failed["reason"] == "StartDeadlineExceeded" and "ImagePullBackOff" in failed["message"]
    cluster.restart_domain(pool.failure_domain)


def test_a_store_that_cannot_be_scheduled_is_reported_and_ends_at_the_start_deadline(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool]
) -> None:
    """The workers run, the store fits no node: the job has not started (the workers cannot
    rendezvous), says why with the scheduler's own message, and meets its start deadline."""
    pool = isolated_pool(nodes=1)
    job = make_job(
        "nostore",
        pool,
        replicas={"min": 1, "max": 1},
        rendezvous={"store": {"nodeSelector": {POOL_LABEL: "no-such-pool"}}},
        scheduling={"pendingTimeoutSeconds": 1},
        runPolicy={"startDeadlineSeconds": 15},
    )
    job.wait(
        lambda: _condition(job, "PodsUnschedulable").get("reason") == "StoreUnschedulable",
        30,
        "PodsUnschedulable=StoreUnschedulable",
    )
    assert "node affinity/selector" in _condition(job, "PodsUnschedulable")["message"]
    job.wait(lambda: job.status().get("readyReplicas") == 1, 10, "the worker Running")
    assert job.status()["phase"] == "Pending" and "startTime" not in job.status()
    job.wait(lambda: job.status().get("phase") == "Failed", 30, "the start deadline")
    failed = _condition(job, "Failed")
    assert failed["reason"] == "StartDeadlineExceeded"
    assert "rendezvous store" in failed["message"], failed


def test_a_crash_looping_store_is_blocked_and_its_repeats_spend_max_restarts(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    """A store whose container keeps exiting (an image without torchkube) while no step is
    trained: the first restart is free, the next spends the budget, and maxRestarts 0 ends
    the job instead of a Running job that never trains."""
    pool = isolated_pool(nodes=1)
    job = make_job(
        "storeloop", pool, replicas={"min": 1, "max": 1}, failurePolicy={"maxRestarts": 0}
    )
    job.wait_running(1)
    job.wait(lambda: job.status().get("phase") == "Running", 30, "Running")
    [store] = job.pods("rendezvous")
    faults.crash_looping(api_client, store.metadata.name, job.namespace, restarts=1)
    job.wait(
        lambda: _condition(job, "PodsBlocked").get("reason") == "CrashLoopBackOff",
        30,
        "PodsBlocked=CrashLoopBackOff",
    )
    status = job.status()
    assert (status["restarts"], status["restartsCountTowardsMax"]) == (1, 0), status
    assert status["phase"] == "Restarting"
    assert _condition(job, "Restarting")["reason"] == "WaitingForStore"
    assert "--previous" in _condition(job, "PodsBlocked")["message"]
    faults.crash_looping(api_client, store.metadata.name, job.namespace, restarts=2)
    job.wait(lambda: job.status().get("phase") == "Failed", 30, "maxRestarts spent")
    assert _condition(job, "Failed")["reason"] == "MaxRestartsExceeded"
    assert job.status()["restartsCountTowardsMax"] == 1


def test_most_nodes_lost_at_once_is_a_partition_and_nothing_is_force_deleted(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], cluster: Cluster
) -> None:
    pool = isolated_pool(nodes=8)
    # The grace must cover the spread of the nodes' NotReady marks (up to two node-monitor
    # periods here): a node lost alone for longer is lost, not partitioned.
    job = make_job(
        "split", pool, replicas={"min": 2, "max": 2}, failurePolicy={"nodeLostGraceSeconds": 15}
    )
    workers = {p.metadata.name for p in job.wait_running(2)}
    cluster.kill_domain(pool.failure_domain)
    job.wait(
        lambda: _condition(job, "NodesUnreachable").get("status") == "True", 90, "NodesUnreachable"
    )
    time.sleep(16)  # past the grace: still nothing is replaced
    assert {p.metadata.name for p in job.pods()} == workers, "nothing deleted or replaced"
    assert all(p.metadata.deletion_timestamp is None for p in job.pods())
    assert job.status().get("restarts", 0) == 0
    cluster.restart_domain(pool.failure_domain)
    job.wait(
        lambda: _condition(job, "NodesUnreachable").get("status") == "False",
        60,
        "the partition over",
    )
    assert {p.metadata.name for p in job.running_workers()} == workers


def _reconciles(operator: OperatorProcess) -> float:
    for line in operator.metrics().splitlines():
        if line.startswith("torchkube_reconcile_duration_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no reconcile metric")


def test_a_burst_of_events_leaves_the_reconcile_rate_flat(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    operator: OperatorProcess,
    api_client: Any,
) -> None:
    """Every reconcile of a running job asks to be revisited (the progress interval, 1 s
    here). The requests of one job share one timer: a timer each would make the rate grow
    with every burst of pod events and never come down."""
    pool = isolated_pool(nodes=2)
    job = make_job("burst", pool, replicas={"min": 2, "max": 2})
    workers = job.wait_running(2)
    core = client.CoreV1Api(api_client)
    for i in range(150):
        pod = workers[i % 2].metadata.name
        core.patch_namespaced_pod(pod, job.namespace, {"metadata": {"labels": {"poke": str(i)}}})
    time.sleep(3)
    before, started = _reconciles(operator), time.monotonic()
    time.sleep(10)
    rate = (_reconciles(operator) - before) / (time.monotonic() - started)
    print(f"reconciles/s after the burst: {rate:.1f}")
    assert rate < 4, f"{rate:.1f} reconciles/s for one running job"


def test_a_status_patch_from_a_stale_view_is_refused(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    """What keeps a leader that lost its Lease from overwriting the new leader's status:
    every status patch names the resourceVersion it was planned from."""
    pool = isolated_pool(nodes=1)
    job = make_job("stale", pool, replicas={"min": 1, "max": 1})
    job.wait_running(1)
    stale = job.get()["metadata"]["resourceVersion"]
    job.patch({"replicas": {"min": 1, "max": 1, "desired": 1}})
    kube = Kube(api_client, concurrency=2)
    with pytest.raises(ApiException) as refused:
        kube.patch_status(job.namespace, job.name, {"restarts": 99}, stale)
    assert refused.value.status == 409
    assert job.status().get("restarts", 0) == 0


def test_repeated_events_are_one_event_with_a_count(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=1)
    job = make_job("chatty", pool, replicas={"min": 1, "max": 1}, runPolicy={"suspend": True})
    body = job.get()
    kube = Kube(api_client, concurrency=2)
    for _ in range(3):
        kube.event(body, "Warning", "Repeated", "the same thing again")
    events = [e for e in job.events() if e.reason == "Repeated"]
    assert len(events) == 1 and events[0].count == 3
    assert json.dumps(events[0].message) == json.dumps("the same thing again")
