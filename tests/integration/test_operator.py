"""The operator against the real control plane and KWOK nodes: a job's whole life.

Each test owns a node pool of its own (a failure domain that can be killed without harming the
others) and a namespace. Workers ask for all 8 GPUs of a node, so each lands on its own node
and the test knows what a node loss takes away.
"""

import time
from collections.abc import Callable
from typing import Any

import pytest
from kube_jobs import Job
from kubernetes import client

from testbed import faults
from testbed.cluster import Cluster
from testbed.kwok import POOL_LABEL, NodePool
from testbed.operator import OperatorProcess
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_four_worker_job_gets_its_objects(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=4)
    job = make_job("four", pool, replicas={"min": 4, "max": 4}, nprocPerNode=8)
    started = time.monotonic()
    workers = job.wait_running(4)
    print(f"4 workers Running {time.monotonic() - started:.1f}s after create")
    uid = job.get()["metadata"]["uid"]
    assert sorted(int(p.metadata.labels[lbl.REPLICA_INDEX]) for p in workers) == [0, 1, 2, 3]
    assert len({p.spec.node_name for p in workers}) == 4
    for pod in workers:
        assert pod.metadata.owner_references[0].uid == uid
        command = pod.spec.containers[0].command
        assert "--nnodes=4" in command and "--nproc-per-node=8" in command
        assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
    assert len(job.pods("rendezvous")) == 1
    core = client.CoreV1Api(api_client)
    service = core.read_namespaced_service("four", job.namespace)
    assert service.spec.cluster_ip == "None"
    # The Service names the store alone (workers would make the endpoint controllers rewrite
    # the job's slices on every worker change).
    store_ip = job.wait(lambda: job.pods("rendezvous")[0].status.pod_ip, 30, "the store's IP")
    slices = client.DiscoveryV1Api(api_client)
    job.wait(
        lambda: (
            [
                address
                for found in slices.list_namespaced_endpoint_slice(
                    job.namespace, label_selector="kubernetes.io/service-name=four"
                ).items
                for endpoint in found.endpoints or []
                for address in endpoint.addresses
            ]
            == [store_ip]
        ),
        30,
        "the store's address, and only it, in the Service's EndpointSlices",
    )
    claim = core.read_namespaced_persistent_volume_claim("four-checkpoints", job.namespace)
    assert claim.metadata.owner_references[0].uid == uid
    status = job.wait(lambda: job.status().get("workers") == "4/4" and job.status(), 30, "4/4")
    assert status["selector"] == "torchkube.io/job-name=four,torchkube.io/role=worker"
    assert status["observedGeneration"] == 1 and "startTime" in status


def test_failed_worker_is_replaced_and_counted(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=4)
    job = make_job("fail1", pool, replicas={"min": 4, "max": 4})
    victim = job.wait_running(4)[1]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=137)
    failed_at = time.monotonic()
    replacement = job.wait(
        lambda: job.replacements(1, victim.metadata.name), 30, "a replacement for worker 1"
    )
    print(f"replacement created {time.monotonic() - failed_at:.2f}s after the failure")
    job.wait_running(4)
    status = job.wait(lambda: job.status().get("restarts") == 1 and job.status(), 30, "restarts=1")
    assert status["lastFailure"]["pod"] == victim.metadata.name
    assert (
        status["lastFailure"]["exitCode"] == 137 and status["lastFailure"]["reason"] == "ExitCode"
    )
    assert replacement[0].metadata.name != victim.metadata.name
    job.wait_event("WorkerFailed", 30, containing=victim.metadata.name)


@pytest.mark.parametrize("force", [True, False], ids=["force", "graceful"])
def test_deleted_young_worker_is_replaced_once_and_the_replacement_kept(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    force: bool,
) -> None:
    """A worker deleted minutes after the operator created it (kubectl delete pod, an
    eviction). The operator's memory of that create must not bring the gone pod back and
    take the replacement for a duplicate — the job would then run a worker short until the
    memory expired. The delete is recorded as ``Deleted``, free, force or not."""
    pool = isolated_pool(nodes=4)
    job = make_job(f"young-{'force' if force else 'grace'}", pool, replicas={"min": 4, "max": 4})
    victim = job.wait_running(4)[2].metadata.name
    faults.delete_pod(api_client, victim, job.namespace, force=force)
    found = job.wait(lambda: job.replacements(2, victim), 30, "a replacement for worker 2")
    replacement = found[0].metadata.name
    deadline = time.monotonic() + 8  # more than one resync of the test operator (5 s)
    while time.monotonic() < deadline:
        slot = [
            (p.metadata.name, p.metadata.deletion_timestamp is not None)
            for p in job.pods()
            if p.metadata.labels[lbl.REPLICA_INDEX] == "2" and p.metadata.name != victim
        ]
        assert slot == [(replacement, False)], f"slot 2: want {replacement} alone, has {slot}"
        time.sleep(0.5)
    job.wait_running(4)
    assert replacement in {p.metadata.name for p in job.running_workers()}
    # Recorded either way: a force-deleted pod leaves with no Terminating state to see.
    status = job.wait(
        lambda: (job.status().get("lastFailure") or {}).get("pod") == victim and job.status(),
        30,
        "the delete recorded",
    )
    assert status["lastFailure"]["reason"] == "Deleted", status["lastFailure"]
    assert status.get("restartsCountTowardsMax", 0) == 0 and status["restarts"] == 1, status


def test_permanent_failure_fails_the_job_without_restarting(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("perm", pool, replicas={"min": 2, "max": 2})
    victim = job.wait_running(2)[0]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=3)
    status = job.wait(lambda: job.status().get("phase") == "Failed" and job.status(), 30, "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PermanentFailure" and "exited with code 3" in failed["message"]
    job.wait(lambda: not job.live_workers(), 30, "the running workers to be deleted")
    assert status.get("restarts", 0) == 0
    time.sleep(3)
    assert len(job.pods()) <= 2, "no replacement may be created for a permanent failure"


def test_max_restarts_exhausted_fails_the_job(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("exhaust", pool, replicas={"min": 2, "max": 2}, failurePolicy={"maxRestarts": 1})
    victim = job.wait_running(2)[0]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=1)
    job.wait(lambda: job.status().get("restarts") == 1, 30, "the first restart")
    victim = job.wait_running(2)[0]
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=1)
    status = job.wait(lambda: job.status().get("phase") == "Failed" and job.status(), 30, "Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "MaxRestartsExceeded"


def test_node_loss_is_replaced_within_the_grace_on_another_node(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    cluster: Cluster,
    api_client: Any,
) -> None:
    """The nodes of one failure domain stop heartbeating: the workers there are replaced on
    healthy nodes once the node is NotReady for nodeLostGraceSeconds, not after 5 minutes."""
    grace = 5
    doomed = isolated_pool(nodes=1)
    spare = isolated_pool(nodes=3)
    both = {
        "nodeSelector": {},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": POOL_LABEL,
                                    "operator": "In",
                                    "values": [doomed.name, spare.name],
                                }
                            ]
                        }
                    ]
                },
                # at least one worker on the doomed node, whatever the scheduler's tie-breaks
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {"key": POOL_LABEL, "operator": "In", "values": [doomed.name]}
                            ]
                        },
                    }
                ],
            }
        },
    }
    job = make_job(
        "nodeloss",
        doomed,
        replicas={"min": 2, "max": 3},
        scheduling=both,
        failurePolicy={"nodeLostGraceSeconds": grace},
    )
    job.wait_running(3)
    lost_node = doomed.node_names()[0]
    wait_for(
        lambda: any(p.spec.node_name == lost_node for p in job.running_workers()),
        10,
        what="a worker on the doomed node",
    )
    on_lost = [p.metadata.name for p in job.running_workers() if p.spec.node_name == lost_node]
    killed_at = time.monotonic()
    faults.make_node_not_ready(cluster, lost_node, wait=True)
    not_ready_at = time.monotonic()

    def replaced() -> bool:
        running = job.running_workers()
        return len(running) == 3 and all(
            p.spec.node_name != lost_node and p.metadata.name not in on_lost for p in running
        )

    job.wait(replaced, grace + 30, "replacements on healthy nodes")
    done = time.monotonic()
    print(
        f"node NotReady {not_ready_at - killed_at:.1f}s after its heartbeats stopped; "
        f"replacements Running {done - not_ready_at:.1f}s later (grace {grace}s)"
    )
    assert done - not_ready_at <= grace + 10
    status = job.status()
    lost = [f for f in status["failures"] if f["reason"] == "NodeLost"]
    assert lost and {f["node"] for f in lost} == {lost_node}, status["failures"]
    assert status.get("restartsCountTowardsMax", 0) == 0
    assert status["restarts"] == 1, "the worker and the store (if it was there): one incident"
    job.wait_event("NodeLost", containing=lost_node)


def test_deleted_node_is_replaced(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=3)
    job = make_job("nodedel", pool, replicas={"min": 2, "max": 2})
    victim = job.wait_running(2)[0]
    faults.delete_node(api_client, victim.spec.node_name, wait=False)
    deleted_at = time.monotonic()
    job.wait(
        lambda: (
            len(job.running_workers()) == 2
            and all(p.spec.node_name != victim.spec.node_name for p in job.running_workers())
        ),
        30,
        "a replacement on another node",
    )
    print(f"replacement Running {time.monotonic() - deleted_at:.1f}s after the node was deleted")


def test_scale_down_and_up_through_the_scale_subresource(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=4)
    job = make_job("scale", pool, replicas={"min": 1, "max": 4})
    job.wait_running(4)
    custom = client.CustomObjectsApi(api_client)

    def scale(n: int) -> None:
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, job.namespace, PLURAL, job.name, {"spec": {"replicas": n}}
        )

    scale(2)
    remaining = job.wait_running(2)
    assert sorted(p.metadata.labels[lbl.REPLICA_INDEX] for p in remaining) == ["0", "1"]
    scale(4)
    job.wait_running(4)
    status = job.status()
    assert status.get("restarts", 0) == 0, "a resize is not a failure"

    def read_scale() -> dict[str, Any]:
        return dict(
            custom.get_namespaced_custom_object_scale(
                GROUP, VERSION, job.namespace, PLURAL, job.name
            )
        )

    # the pods run before the operator's next status write counts them
    job.wait(lambda: read_scale()["status"]["replicas"] == 4, 15, "status.replicas 4")
    read = read_scale()
    assert read["spec"]["replicas"] == 4 and read["status"]["replicas"] == 4


def _stopped_by_kubelet(job: Job, names: list[str]) -> None:
    """Play the kubelet of a paused node: the deleted pods turn Failed with exit code 143."""
    core = job.core
    job.wait(
        lambda: all(
            core.read_namespaced_pod(n, job.namespace).metadata.deletion_timestamp for n in names
        ),
        30,
        "the operator's deletes",
    )
    for name in names:
        faults.stop_deleted_pod(core.api_client, name, job.namespace)


def test_scale_down_with_kubelet_semantics_and_an_operator_restart_counts_no_failure(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    cluster: Cluster,
    operator: OperatorProcess,
) -> None:
    """The issue's reproducer: 4 workers, kubelets paused, scaled to 1; the three deleted pods
    turn Failed/143 as a kubelet reports them; the operator is restarted meanwhile (no memory
    of its deletes). Before the fix: restarts 3, restartsCountTowardsMax 3."""
    pool = isolated_pool(nodes=4)
    job = make_job("shrink", pool, replicas={"min": 1, "max": 4})
    workers = job.wait_running(4)
    cluster.kill_domain(pool.failure_domain)
    job.patch({"replicas": {"min": 1, "max": 4, "desired": 1}})
    doomed = [p.metadata.name for p in workers if p.metadata.labels[lbl.REPLICA_INDEX] != "0"]
    _stopped_by_kubelet(job, doomed)
    operator.kill()
    operator.start()
    time.sleep(3)
    status = job.status()
    assert status.get("restarts", 0) == 0 and status.get("restartsCountTowardsMax", 0) == 0
    assert status.get("phase") == "Running" and "lastFailure" not in status
    cluster.restart_domain(pool.failure_domain)
    job.wait_running(1)
    assert job.status().get("restarts", 0) == 0


def test_suspend_and_quick_resume_with_kubelet_semantics_counts_no_failure(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    cluster: Cluster,
    operator: OperatorProcess,
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("pause", pool, replicas={"min": 2, "max": 2})
    workers = job.wait_running(2)
    cluster.kill_domain(pool.failure_domain)
    job.patch({"runPolicy": {"suspend": True}})
    _stopped_by_kubelet(job, [p.metadata.name for p in workers])
    job.patch({"runPolicy": {"suspend": False}})
    operator.kill()
    operator.start()
    time.sleep(3)
    assert job.status().get("restarts", 0) == 0
    cluster.restart_domain(pool.failure_domain)
    job.wait_running(2)
    assert job.status().get("restarts", 0) == 0


def test_suspend_and_resume(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("susp", pool, replicas={"min": 2, "max": 2})
    job.wait_running(2)
    job.patch({"runPolicy": {"suspend": True}})
    job.wait(
        lambda: (
            job.status().get("phase") == "Suspended"
            and not job.live_workers()
            and not [p for p in job.pods("rendezvous") if p.metadata.deletion_timestamp is None]
        ),
        30,
        "Suspended with no pods",
    )
    core = client.CoreV1Api(api_client)
    assert core.read_namespaced_persistent_volume_claim("susp-checkpoints", job.namespace)
    job.patch({"runPolicy": {"suspend": False}})
    job.wait_running(2)
    job.wait_event("Resumed")
    assert job.status().get("restarts", 0) == 0


def test_unschedulable_workers_are_reported_and_elastic_job_runs_at_min(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool]
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job(
        "tight", pool, replicas={"min": 2, "max": 3}, scheduling={"pendingTimeoutSeconds": 2}
    )
    job.wait(
        lambda: len(job.running_workers()) == 2 and job.status().get("phase") == "Running",
        60,
        "two running workers",
    )

    def reported() -> dict[str, Any] | None:
        found = [c for c in job.status().get("conditions", []) if c["type"] == "PodsUnschedulable"]
        return found[0] if found and found[0]["status"] == "True" else None

    condition = job.wait(reported, 30, "PodsUnschedulable")
    assert "1 of 3 workers cannot be scheduled" in condition["message"]


def test_deleting_the_job_collects_everything(
    make_job: Callable[..., Job], isolated_pool: Callable[..., NodePool], api_client: Any
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("gone", pool, replicas={"min": 2, "max": 2})
    job.wait_running(2)
    job.custom.delete_namespaced_custom_object(
        GROUP, VERSION, job.namespace, PLURAL, job.name, propagation_policy="Foreground"
    )
    core = client.CoreV1Api(api_client)

    def collected() -> bool:
        selector = f"{lbl.JOB_NAME}=gone"
        return (
            not core.list_namespaced_pod(job.namespace, label_selector=selector).items
            and not core.list_namespaced_service(job.namespace, label_selector=selector).items
            and not core.list_namespaced_persistent_volume_claim(
                job.namespace, label_selector=selector
            ).items
        )

    wait_for(collected, 60, what="garbage collection of the job's pods, service and claim")


def test_operator_killed_mid_failure_creates_no_duplicates(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    api_client: Any,
    operator: OperatorProcess,
) -> None:
    pool = isolated_pool(nodes=4)
    job = make_job("crash", pool, replicas={"min": 4, "max": 4})
    victim = job.wait_running(4)[2]
    operator.kill()
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=1)
    operator.start()
    job.wait_running(4)
    time.sleep(3)
    live = job.live_workers()
    assert len(live) == 4
    assert sorted(p.metadata.labels[lbl.REPLICA_INDEX] for p in live) == ["0", "1", "2", "3"]
    assert job.status()["restarts"] == 1
    assert len([p for p in job.pods("rendezvous") if p.metadata.deletion_timestamp is None]) == 1

    # and again, killed right after it reacted (status written, pods maybe not yet labelled);
    # the victim is the replacement, born after the first incident: a new incident
    victim = next(p for p in live if p.metadata.labels[lbl.REPLICA_INDEX] == "2")
    faults.fail_pod(api_client, victim.metadata.name, job.namespace, exit_code=1)
    job.wait(lambda: job.status().get("restarts") == 2, 30, "the second failure counted")
    operator.kill()
    operator.start()
    job.wait_running(4)
    time.sleep(3)
    assert len(job.live_workers()) == 4 and job.status()["restarts"] == 2


def test_trainer_progress_reaches_the_status(
    make_job: Callable[..., Job],
    isolated_pool: Callable[..., NodePool],
    progress_reports: Any,
) -> None:
    pool = isolated_pool(nodes=2)
    job = make_job("progress", pool, replicas={"min": 2, "max": 2})
    workers = job.wait_running(2)
    report = {
        "step": 120,
        "totalSteps": 1000,
        "loss": 2.5,
        "tokensPerSecond": 12345.0,
        "worldSize": 16,
        "lastCheckpointStep": 100,
        "lastCheckpointTime": "2026-11-23T07:00:00Z",
        "updated": "2026-11-23T07:00:05Z",
    }
    progress_reports.reports[(job.namespace, workers[0].metadata.name)] = report
    status = job.wait(
        lambda: (job.status().get("progress") or {}).get("step") == 120 and job.status(),
        30,
        "progress in the status",
    )
    assert status["progress"]["totalSteps"] == 1000 and status["progress"]["loss"] == 2.5
    assert status["latestCheckpoint"] == {"step": 100, "time": "2026-11-23T07:00:00Z"}
    assert status["worldSize"] == 16
