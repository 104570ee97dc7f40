"""Kueue's MultiKueue between real clusters (testbed.multikueue): a batch/v1 Job queued on the
manager is admitted there, runs on one worker, reports back, and leaves nothing behind.

The Job is Kueue's own MultiKueue integration (``spec.managedBy: kueue.x-k8s.io/multikueue``):
these tests show the plumbing (kubeconfig Secrets, MultiKueueClusters, the admission check,
the queues of the same name in the same namespace on every cluster) that a TrainingJob's
dispatch relies on too."""

import datetime as dt
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.faults import succeed_pod
from testbed.kwok import GPU_RESOURCE
from testbed.multikueue import CONTROLLER, KUEUE_API, QUEUE, QUEUE_LABEL, MultiKueue, Worker
from testbed.wait import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def batch_job(name: str, queue: str, gpus: int = 1) -> dict[str, Any]:
    """A one-pod Job for MultiKueue: queued by label, suspended as Kueue requires of a queued
    job created without its webhook, and managed by MultiKueue (the manager's job controller
    leaves it alone). Its pods get the KWOK toleration from the worker's flavor."""
    container = {
        "name": "main",
        "image": "registry.invalid/torchkube/worker:test",
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi", GPU_RESOURCE: str(gpus)},
            "limits": {GPU_RESOURCE: str(gpus)},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "managedBy": CONTROLLER,
            "suspend": True,
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {"spec": {"containers": [container], "restartPolicy": "Never"}},
        },
    }


def read_job(api: Any, name: str, namespace: str) -> Any:
    """The Job, or None when it does not exist."""
    try:
        return client.BatchV1Api(api).read_namespaced_job(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def read_workload(api: Any, name: str, namespace: str) -> dict[str, Any] | None:
    """The Workload, or None when it does not exist."""
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            *KUEUE_API, namespace, "workloads", name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def condition(obj: dict[str, Any] | None, type_: str) -> bool:
    """Whether the object (a Workload, as a dict) has condition ``type_`` True."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == type_ and c["status"] == "True" for c in conditions)


def running_pod(worker: Worker, job: str, namespace: str) -> Any:
    """The Job's pod once Running on the worker (on one of its pool's nodes)."""
    core = client.CoreV1Api(worker.api_client())

    def running() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    pod = wait_for(running, 60, what=f"a Running pod of job {job} on {worker.name}")
    assert pod.spec.node_name in worker.pool.node_names()
    return pod


def dispatch(
    multikueue: MultiKueue, namespace: str, name: str
) -> tuple[Any, dict[str, Any], Worker]:
    """Create the Job on the manager; return it, its Workload there, and the worker that
    admitted its copy, once that copy is admitted and unsuspended there."""
    manager = multikueue.manager.api_client()
    job = client.BatchV1Api(manager).create_namespaced_job(
        namespace, batch_job(name, multikueue.queue)
    )
    worker = multikueue.workers[multikueue.wait_dispatched(namespace, job.metadata.uid)]
    workload = wait_for(
        lambda: (
            (found := multikueue.workload(namespace, job.metadata.uid))
            and condition(found, "Admitted")
            and found
        ),
        30,
        what=f"the manager's Workload of Job {name} to be admitted",
    )
    remote = worker.api_client()
    name_of_workload = workload["metadata"]["name"]
    wait_for(
        lambda: condition(read_workload(remote, name_of_workload, namespace), "Admitted"),
        30,
        what=f"the copy of Workload {name_of_workload} to be admitted on {worker.name}",
    )
    copy = wait_for(
        lambda: (found := read_job(remote, name, namespace)) and not found.spec.suspend and found,
        30,
        what=f"the copy of Job {name} to be unsuspended on {worker.name}",
    )
    assert copy.spec.managed_by is None  # the worker's job controller runs it
    others = [w for w in multikueue.workers.values() if w is not worker]
    wait_for(
        lambda: all(
            read_workload(w.api_client(), name_of_workload, namespace) is None for w in others
        ),
        30,
        what="the copies on the other workers to be removed",
    )
    return job, workload, worker


def test_a_job_queued_on_the_manager_runs_on_one_worker_and_reports_back(
    multikueue: MultiKueue, multikueue_namespace: str
) -> None:
    namespace = multikueue_namespace
    manager = multikueue.manager.api_client()
    job, workload, worker = dispatch(multikueue, namespace, "dispatched")
    remote = worker.api_client()
    pod = running_pod(worker, "dispatched", namespace)

    succeed_pod(remote, pod.metadata.name, namespace, message="")

    def completed() -> bool:
        found = read_job(manager, "dispatched", namespace)
        return any(
            c.type == "Complete" and c.status == "True" for c in found.status.conditions or []
        )

    wait_for(completed, 60, what="the manager's Job to report Complete")
    wait_for(
        lambda: condition(multikueue.workload(namespace, job.metadata.uid), "Finished"),
        30,
        what="the manager's Workload to be Finished",
    )
    wait_for(
        lambda: (
            read_job(remote, "dispatched", namespace) is None
            and read_workload(remote, workload["metadata"]["name"], namespace) is None
        ),
        30,
        what=f"the finished copies on {worker.name} to be removed",
    )


def test_deleting_a_dispatched_job_on_the_manager_removes_its_copy_on_the_worker(
    multikueue: MultiKueue, multikueue_namespace: str
) -> None:
    namespace = multikueue_namespace
    _, workload, worker = dispatch(multikueue, namespace, "deleted")
    running_pod(worker, "deleted", namespace)
    client.BatchV1Api(multikueue.manager.api_client()).delete_namespaced_job(
        "deleted", namespace, propagation_policy="Background"
    )
    remote = worker.api_client()
    wait_for(
        lambda: (
            read_job(remote, "deleted", namespace) is None
            and read_workload(remote, workload["metadata"]["name"], namespace) is None
        ),
        30,
        what=f"the copies on {worker.name} to be removed",
    )


def test_a_job_on_a_lost_worker_runs_on_another_once_the_worker_lost_timeout_has_passed(
    multikueue: MultiKueue, multikueue_namespace: str
) -> None:
    namespace = multikueue_namespace
    job, workload, lost = dispatch(multikueue, namespace, "moved")
    running_pod(lost, "moved", namespace)
    [check] = workload["status"]["admissionChecks"]
    assert (check["name"], check["state"]) == (QUEUE, "Ready"), check
    ready_at = dt.datetime.fromisoformat(check["lastTransitionTime"]).timestamp()
    multikueue.stop_worker(lost.name)

    def elsewhere() -> str | None:
        workload = multikueue.workload(namespace, job.metadata.uid) or {}
        name = (workload.get("status") or {}).get("clusterName")
        return name if name and name != lost.name else None

    timeout = multikueue.worker_lost_timeout_s
    other = multikueue.workers[
        wait_for(elsewhere, timeout + 60, what="the job to be dispatched to another worker")
    ]
    # The job was kept for the lost worker until then (the times have whole seconds).
    assert time.time() - ready_at >= timeout - 1
    running_pod(other, "moved", namespace)
    # Cut off, not dead: the lost worker runs its copy on (the fixture heals the partition
    # after deleting the namespace everywhere, so the copies never meet again).
    assert read_job(lost.api_client(), "moved", namespace) is not None
