"""A job dispatched by Kueue's MultiKueue: on the manager torchkube makes its Workload and
nothing else, and writes its status only until MultiKueue names the worker cluster; on the
worker the job's copy runs under the Workload MultiKueue made there and never makes its own."""

from typing import Any

from planner import condition, created_slots, make_job, run
from test_queueing_policy import ADMITTED, QUEUE, condition_of, observed, queued_job, workload_body

from torchkube.api import TrainingJob
from torchkube.api.spec import MANAGED_BY_MULTIKUEUE
from torchkube.operator import dispatch, workloads
from torchkube.operator.workloads import QueueObservation
from torchkube.policy.queue import QUEUE_LABEL

MANAGER_WORKLOAD = "trainingjob-demo-abcde"


def dispatched_job(status: dict[str, Any] | None = None, **labels: str) -> TrainingJob:
    job = queued_job(status, managedBy=MANAGED_BY_MULTIKUEUE)
    metadata = {**job.metadata, "labels": {**job.metadata["labels"], **labels}}
    return job.model_copy(update={"metadata": metadata})


def test_on_the_manager_the_job_makes_its_workload_and_no_pod_store_or_claim() -> None:
    job = dispatched_job()
    result = run(job, [], queue=observed(None))
    assert result.create_pods == [] and result.create_children == []
    [(verb, body)] = result.workload_writes
    assert verb == "create" and body["spec"]["queueName"] == QUEUE
    # MultiKueue finds its adapter by the Workload's controller: the TrainingJob.
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["controller"]) == ("TrainingJob", True)
    assert result.status.phase == "Queued" and not result.keep_status


def test_on_the_manager_a_waiting_job_says_what_multikueue_is_doing() -> None:
    job = dispatched_job()
    body = workload_body(job, condition_of("QuotaReserved", "True", message="reserved"))
    body["status"]["admissionChecks"] = [
        {"name": "multikueue", "state": "Pending", "message": "looking at worker-1, worker-2"}
    ]
    result = run(job, [], queue=observed(body))
    assert result.create_pods == [] and result.create_children == []
    queued = condition(result, "Queued")
    assert queued["status"] == "True"
    assert "multikueue: looking at worker-1, worker-2" in queued["message"]
    assert not result.keep_status


def test_once_dispatched_the_status_is_kueues_copy_from_the_worker() -> None:
    """The worker's status, copied here by MultiKueue, is not overwritten by a plan here."""
    copied = {"phase": "Running", "workers": "4/4", "replicas": 4}
    job = dispatched_job(copied)
    body = workload_body(job, *ADMITTED, workers=4)
    body["status"]["clusterName"] = "worker-1"
    result = run(job, [], queue=observed(body))
    assert result.keep_status
    assert result.create_pods == [] and result.workload_writes == [] and result.events == []
    finished = workload_body(job, *ADMITTED, condition_of("Finished", "True"), workers=4)
    assert run(job, [], queue=observed(finished)).keep_status


def test_a_worker_cluster_lost_puts_the_job_back_in_line_saying_so() -> None:
    """MultiKueue gave the Workload's reservation back (its worker was lost past
    workerLostTimeout): the copied Running status is no longer true, and the manager says
    the job waits again."""
    job = dispatched_job({"phase": "Running", "workers": "4/4"})
    result = run(job, [], queue=observed(workload_body(job, condition_of("Requeued", "True"))))
    assert not result.keep_status and result.status.phase == "Queued"
    assert condition(result, "Queued")["status"] == "True"


def test_without_a_queue_label_the_job_says_how_to_get_dispatched() -> None:
    job = make_job(managedBy=MANAGED_BY_MULTIKUEUE)
    result = run(job, [], queue=None)
    assert result.workload_writes == [] and result.create_pods == []
    queued = condition(result, "Queued")
    assert (queued["status"], queued["reason"]) == ("True", dispatch.NO_QUEUE)
    assert QUEUE_LABEL in queued["message"]


def test_an_elastic_annotated_job_is_not_dispatched_and_says_why() -> None:
    job = dispatched_job()
    metadata = {**job.metadata, "annotations": {workloads.ELASTIC_ANNOTATION: "true"}}
    result = run(job.model_copy(update={"metadata": metadata}), [], queue=observed(None))
    assert result.workload_writes == []
    assert condition(result, "Queued")["reason"] == dispatch.NOT_ELASTIC


def worker_copy(**spec: Any) -> TrainingJob:
    """The job as MultiKueue creates it on a worker: no managedBy, the prebuilt label."""
    job = queued_job(**spec)
    labels = {**job.metadata["labels"], workloads.PREBUILT_LABEL: MANAGER_WORKLOAD}
    return job.model_copy(update={"metadata": {**job.metadata, "labels": labels}})


def prebuilt_body(job: TrainingJob, *conditions: dict[str, Any], workers: int | None = None):
    """MultiKueue's copy of the manager's Workload: its name, no owner."""
    body = workload_body(job, *conditions, workers=workers)
    body["metadata"]["name"] = MANAGER_WORKLOAD
    del body["metadata"]["ownerReferences"]
    return body


def test_on_a_worker_the_job_waits_for_its_prebuilt_workload_and_makes_none() -> None:
    job = worker_copy()
    result = run(job, [], queue=observed(None))
    assert result.workload_writes == [] and result.create_pods == []
    queued = condition(result, "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "WaitingForWorkload")
    assert MANAGER_WORKLOAD in queued["message"]


def test_on_a_worker_the_job_adopts_its_prebuilt_workload_and_runs_when_admitted() -> None:
    job = worker_copy()
    result = run(job, [], queue=observed(prebuilt_body(job, *ADMITTED, workers=4)))
    [(verb, patch)] = result.workload_writes  # the adoption; no Workload of its own
    assert verb == "spec" and patch["metadata"]["name"] == MANAGER_WORKLOAD
    assert patch["metadata"]["ownerReferences"][0]["uid"] == job.metadata["uid"]
    assert created_slots(result) == [0, 1, 2, 3]


def test_on_a_worker_a_workload_owned_by_another_job_is_not_taken() -> None:
    job = worker_copy()
    body = prebuilt_body(job, *ADMITTED, workers=4)
    other = {**workloads.workload(job, workloads.Priority())["metadata"]["ownerReferences"][0]}
    body["metadata"]["ownerReferences"] = [{**other, "uid": "someone-else"}]
    result = run(job, [], queue=observed(body))
    assert result.workload_writes == [] and result.create_pods == []
    assert "belongs to another job" in condition(result, "Queued")["message"]


def test_on_a_worker_a_finished_job_finishes_the_prebuilt_workload() -> None:
    """MultiKueue finishes the manager's Workload when the worker's is Finished."""
    job = worker_copy()
    adopted = prebuilt_body(job, *ADMITTED, workers=4)
    adopted["metadata"]["ownerReferences"] = workloads.workload(job, workloads.Priority())[
        "metadata"
    ]["ownerReferences"]
    done = queued_job({"phase": "Succeeded"})
    done = done.model_copy(update={"metadata": job.metadata})
    result = run(done, [], queue=observed(adopted))
    [(verb, patch)] = result.workload_writes
    assert verb == "status" and patch["metadata"]["name"] == MANAGER_WORKLOAD
    finished = [c for c in patch["status"]["conditions"] if c["type"] == "Finished"]
    assert finished[0]["status"] == "True"


def test_back_in_line_after_running_on_a_lost_worker_it_says_what_it_resumes_from() -> None:
    copied = {
        "phase": "Running",
        "progress": {"step": 1200, "totalSteps": 5000},
        "latestCheckpoint": {"step": 1000},
    }
    job = dispatched_job(copied)
    result = run(job, [], queue=observed(workload_body(job, condition_of("Requeued", "True"))))
    queued = condition(result, "Queued")
    assert (queued["status"], queued["reason"]) == ("True", dispatch.REDISPATCH)
    for words in ("step 1200", "checkpoint of step 1000", "checkpoint.claimName", "step 0"):
        assert words in queued["message"], queued["message"]
    assert result.status.phase == "Queued" and not result.keep_status


def test_under_an_operator_without_kueue_the_job_says_it_cannot_be_dispatched() -> None:
    result = run(dispatched_job(), [], queue=QueueObservation(kueue="disabled"))
    assert result.workload_writes == [] and result.create_pods == []
    queued = condition(result, "Queued")
    assert (queued["status"], queued["reason"]) == ("True", dispatch.NO_KUEUE)
    assert "kueue.enabled=true" in queued["message"]


def test_a_dispatched_job_evicted_on_the_manager_gives_its_quota_back() -> None:
    """Preempted (or deactivated) on the manager: nothing runs here to stop, so the
    reservation goes back at once; MultiKueue then removes the worker's copy."""
    job = dispatched_job({"phase": "Running", "workers": "4/4"})
    evicted = condition_of("Evicted", "True", reason="Preempted", message="by a higher priority")
    body = workload_body(job, *ADMITTED, evicted, workers=4)
    body["status"]["clusterName"] = "worker-1"
    result = run(job, [], queue=observed(body))
    assert not result.keep_status
    [(verb, patch)] = result.workload_writes
    assert verb == "status" and patch["status"]["admission"] is None
    assert condition(result, "Queued")["reason"] == "Preempted"
