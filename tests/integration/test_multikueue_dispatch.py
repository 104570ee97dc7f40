"""TrainingJobs dispatched by Kueue's MultiKueue (testbed.multikueue: the session cluster as
manager, two worker clusters, the real Kueue on each, a torchkube operator on each).

A job submitted on the manager with ``spec.managedBy: kueue.x-k8s.io/multikueue`` gets its
Workload there and nothing else; MultiKueue sends a copy to a worker with quota, whose operator
runs it under the Workload MultiKueue made there, and copies the worker's status back."""

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_jobs import Job
from kubernetes import client
from training_jobs import manifest

from testbed.faults import succeed_pod
from testbed.multikueue import QUEUE, QUEUE_LABEL, MultiKueue, Worker
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import labels as lbl
from torchkube.api.spec import MANAGED_BY_MULTIKUEUE
from torchkube.operator import workloads

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

WORKERS = 4
"""Workers of one job: each takes a whole 8-GPU node, so one job fills one worker cluster."""


def dispatched(name: str) -> dict[str, Any]:
    body = manifest(
        name,
        {
            "managedBy": MANAGED_BY_MULTIKUEUE,
            "replicas": {"min": WORKERS, "max": WORKERS},
            "resources": {"gpus": 8},
        },
    )
    body["metadata"]["labels"] = {QUEUE_LABEL: QUEUE}
    return body


Submit = Callable[[str], tuple[Job, Worker, Job]]


@pytest.fixture
def submit(multikueue: MultiKueue, multikueue_namespace: str, tmp_path: Path) -> Iterator[Submit]:
    """Create a job on the manager; return it, the worker it was sent to, and its copy there
    once all its workers run. Every worker has a volume for its checkpoint claim (these
    clusters provision none), as a StorageClass would give one wherever it lands."""
    made: list[tuple[Worker, str]] = []

    def create(name: str) -> tuple[Job, Worker, Job]:
        claim = f"{name}-checkpoints"
        for worker in multikueue.workers.values():
            path = str(tmp_path / worker.name / claim)
            volume = prebound_volume(worker.api_client(), multikueue_namespace, claim, path)
            made.append((worker, volume))
        return _submit(multikueue, multikueue_namespace, name)

    yield create
    for worker, volume in made:
        delete_volume(worker.api_client(), volume)


def _submit(multikueue: MultiKueue, namespace: str, name: str) -> tuple[Job, Worker, Job]:
    manager = Job.create(multikueue.manager.api_client(), namespace, dispatched(name))
    uid = manager.get()["metadata"]["uid"]
    worker = multikueue.workers[multikueue.wait_dispatched(namespace, uid, timeout=90)]
    copy = Job(worker.api_client(), namespace, name)
    copy.wait_running(WORKERS, timeout=90)
    return manager, worker, copy


def torchkube(multikueue: MultiKueue, *args: str) -> str:
    """``torchkube ARGS`` against the manager, as a user runs it."""
    command = [sys.executable, "-m", "torchkube.cli", *args]
    command += ["--kubeconfig", str(multikueue.manager.kubeconfig)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def report_progress(progress_reports: Any, copy: Job, manager: Job, report: dict[str, Any]) -> None:
    """The copy's workers report ``report``; return once the manager's status shows its step
    (the worker's operator read it, Kueue copied the status back)."""
    for pod in copy.live_workers():
        progress_reports.reports[(copy.namespace, pod.metadata.name)] = report
    manager.wait(
        lambda: (manager.status().get("progress") or {}).get("step") == report["step"],
        60,
        "the worker's progress copied to the manager",
    )


def test_a_job_submitted_on_the_manager_runs_on_a_worker_and_reports_back(
    operator: OperatorProcess,
    multikueue: MultiKueue,
    multikueue_namespace: str,
    multikueue_operators: dict[str, OperatorProcess],
    progress_reports: Any,
    submit: Submit,
) -> None:
    namespace = multikueue_namespace
    manager, worker, copy = submit("sent")

    # The copy runs under the Workload MultiKueue made on the worker, adopted, and no other.
    body = copy.get()
    prebuilt = body["metadata"]["labels"][workloads.PREBUILT_LABEL]
    assert "managedBy" not in body["spec"]
    listed = client.CustomObjectsApi(worker.api_client()).list_namespaced_custom_object(
        workloads.API_GROUP, workloads.API_VERSION, namespace, workloads.PLURAL
    )["items"]
    assert [w["metadata"]["name"] for w in listed] == [prebuilt]
    [owner] = listed[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("TrainingJob", body["metadata"]["uid"])

    # The manager runs nothing of it, and shows the worker's status.
    assert manager.pods(role=lbl.ROLE_WORKER) == [] and manager.pods(role=lbl.ROLE_RENDEZVOUS) == []
    manager.wait(
        lambda: (
            manager.status().get("phase") == "Running"
            and manager.status().get("workers") == f"{WORKERS}/{WORKERS}"
        ),
        60,
        "the worker's Running status copied to the manager",
    )

    def running_condition(job: Job) -> dict[str, Any]:
        conditions: list[dict[str, Any]] = job.status().get("conditions") or []
        return next((c for c in conditions if c["type"] == "Running"), {})

    manager.wait(  # the worker's own words, copied
        lambda: (
            running_condition(manager).get("status") == "True"
            and running_condition(manager) == running_condition(copy)
        ),
        30,
        "the worker's Running condition on the manager",
    )
    report = {"step": 70, "totalSteps": 100, "loss": 2.5, "lastCheckpointStep": 50}
    report_progress(progress_reports, copy, manager, report)
    listing = torchkube(multikueue, "status", "-n", namespace)
    assert f"Running (on {worker.name})" in listing, listing
    described = torchkube(multikueue, "describe", "sent", "-n", namespace)
    assert f"Runs on:    worker cluster {worker.name}, dispatched by MultiKueue" in described

    for pod in copy.live_workers():
        succeed_pod(worker.api_client(), pod.metadata.name, namespace)
    manager.wait(
        lambda: manager.status().get("phase") == "Succeeded",
        60,
        "the worker's Succeeded copied to the manager",
    )
    wait_for(
        lambda: _condition(
            multikueue.workload(namespace, manager.get()["metadata"]["uid"]), "Finished"
        ),
        60,
        what="the manager's Workload Finished",
    )
    wait_for(lambda: copy.get_or_none() is None, 60, what="the finished copy removed")


def test_a_second_job_goes_to_the_worker_with_room_and_deleting_it_cleans_up_there(
    operator: OperatorProcess,
    multikueue: MultiKueue,
    multikueue_namespace: str,
    multikueue_operators: dict[str, OperatorProcess],
    submit: Submit,
) -> None:
    _, first, _ = submit("first")
    manager, second, copy = submit("second")
    assert second.name != first.name, "the first worker has no room left"

    manager.delete()
    wait_for(
        lambda: copy.get_or_none() is None and copy.live_workers() == [],
        60,
        what=f"the copy and its workers gone from {second.name}",
    )


def test_a_job_on_a_lost_worker_says_what_it_reached_and_runs_on_the_other(
    operator: OperatorProcess,
    multikueue: MultiKueue,
    multikueue_namespace: str,
    multikueue_operators: dict[str, OperatorProcess],
    progress_reports: Any,
    submit: Submit,
) -> None:
    namespace = multikueue_namespace
    manager, lost, copy = submit("moved")
    report = {"step": 40, "totalSteps": 100, "lastCheckpointStep": 30}
    report_progress(progress_reports, copy, manager, report)
    multikueue.stop_worker(lost.name)

    def waiting_again() -> dict[str, Any] | None:
        conditions: list[dict[str, Any]] = manager.status().get("conditions") or []
        queued = next((c for c in conditions if c["type"] == "Queued"), {})
        return queued if queued.get("reason") == "WaitingForRedispatch" else None

    said = manager.wait(
        waiting_again,
        multikueue.worker_lost_timeout_s + 60,
        "the manager to say the job waits to be dispatched again",
    )
    for words in ("step 40", "checkpoint of step 30", "checkpoint.claimName"):
        assert words in said["message"], said["message"]
    uid = manager.get()["metadata"]["uid"]
    other = multikueue.workers[multikueue.wait_dispatched(namespace, uid, timeout=90)]
    assert other.name != lost.name
    Job(other.api_client(), namespace, "moved").wait_running(WORKERS, timeout=90)
    manager.wait(
        lambda: manager.status().get("phase") == "Running",
        60,
        "the new worker's status copied to the manager",
    )


def test_a_dispatched_job_deactivated_on_the_manager_stops_on_the_worker_and_waits(
    operator: OperatorProcess,
    multikueue: MultiKueue,
    multikueue_namespace: str,
    multikueue_operators: dict[str, OperatorProcess],
    submit: Submit,
) -> None:
    """Evicted on the manager (here ``spec.active: false``, as a preemption there evicts it):
    the manager's operator gives the quota back — nothing runs on the manager to stop — and
    MultiKueue removes the copy from the worker; the job says it waits."""
    namespace = multikueue_namespace
    manager, worker, copy = submit("paused")
    workload = multikueue.workload(namespace, manager.get()["metadata"]["uid"])
    assert workload is not None
    client.CustomObjectsApi(multikueue.manager.api_client()).patch_namespaced_custom_object(
        workloads.API_GROUP,
        workloads.API_VERSION,
        namespace,
        workloads.PLURAL,
        workload["metadata"]["name"],
        {"spec": {"active": False}},
    )
    wait_for(
        lambda: copy.get_or_none() is None and copy.live_workers() == [],
        90,
        what=f"the copy and its workers gone from {worker.name}",
    )
    released = manager.wait(
        lambda: manager.status().get("phase") == "Queued" and manager.status(),
        60,
        "the manager's job Queued again",
    )
    queued = next(c for c in released["conditions"] if c["type"] == "Queued")
    assert queued["status"] == "True" and queued["reason"] == "Evicted", queued
    wait_for(
        lambda: (
            not _condition(
                multikueue.workload(namespace, manager.get()["metadata"]["uid"]), "QuotaReserved"
            )
        ),
        60,
        what="the manager's Workload to give its quota back",
    )


def _condition(workload: dict[str, Any] | None, kind: str) -> bool:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)
