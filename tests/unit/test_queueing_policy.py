"""Queueing policy (torchkube/operator/queueing.py) and the Workload it keeps
(torchkube/operator/workloads.py): a job with a queue-name label runs only while Kueue admits
its Workload, at the admitted size and on the admitted flavors."""

import dataclasses
from datetime import timedelta
from typing import Any

from planner import NOW, condition, created_slots, healthy, make_job, pod, run, running_status

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.times import format_time
from torchkube.operator import queueing, workloads
from torchkube.operator.workloads import QueueObservation
from torchkube.policy.queue import QUEUE_LABEL, label_ignored, queue_name

QUEUE = "team-a"


def queued_job(status: dict[str, Any] | None = None, **spec: Any) -> TrainingJob:
    job = make_job(status, **spec)
    metadata = {**job.metadata, "labels": {QUEUE_LABEL: QUEUE}}
    return job.model_copy(update={"metadata": metadata})


def condition_of(kind: str, status: str, reason: str = "", message: str = "", ago: int = 60):
    return {
        "type": kind,
        "status": status,
        "reason": reason or kind,
        "message": message,
        "lastTransitionTime": format_time(NOW - timedelta(seconds=ago)),
    }


def workload_body(
    job: TrainingJob, *conditions: dict[str, Any], workers: int | None = None
) -> dict[str, Any]:
    body = workloads.workload(job, workloads.Priority())
    body["metadata"]["resourceVersion"] = "7"
    status: dict[str, Any] = {"conditions": list(conditions)}
    if workers is not None:
        status["admission"] = {
            "clusterQueue": "gpus",
            "podSetAssignments": [
                {"name": "worker", "count": workers, "flavors": {"nvidia.com/gpu": "h100"}},
                {"name": "store", "count": 1, "flavors": {"cpu": "cpu-nodes"}},
            ],
        }
    body["status"] = status
    return body


def observed(body: dict[str, Any] | None) -> QueueObservation:
    return QueueObservation(workload=workloads.read(body) if body else None)


ADMITTED = (condition_of("QuotaReserved", "True"), condition_of("Admitted", "True"))


def test_workload_names_are_kueues() -> None:
    """The names Kueue v0.17.0's own ``jobframework.GetWorkloadNameForOwnerWithGVK`` gives
    these owners (printed by a Go program calling it), so Kueue's tools find the Workload
    where they look for a job's."""
    job = make_job()
    assert workloads.workload_name(job) == "trainingjob-demo-e4f44"
    assert workloads.workload_name(job, 3) == "trainingjob-demo-8eb6f"  # ...AndGeneration
    metadata = {**job.metadata, "name": "llama-70b-pretrain"}
    metadata["uid"] = "0b8f6c1e-3a2d-4d8e-9b1a-2f5c7d9e1a3b"
    renamed = job.model_copy(update={"metadata": metadata})
    assert workloads.workload_name(renamed) == "trainingjob-llama-70b-pretrain-8ac7d"


def test_a_job_without_a_queue_label_is_not_held() -> None:
    job = make_job()
    assert queueing.admitted_view(job, None) is job
    assert created_slots(run(job, [])) == [0, 1, 2, 3]


def test_a_queued_job_without_a_workload_creates_one_and_no_pod() -> None:
    job = queued_job(replicas={"min": 2, "max": 4, "spares": 1}, resources={"gpus": 8})
    result = run(job, [], queue=observed(None))
    assert result.create_pods == [] and result.status.phase == "Queued"
    assert condition(result, "Queued")["status"] == "True"
    [(verb, body)] = result.workload_writes
    assert verb == "create"
    assert body["metadata"]["name"] == workloads.workload_name(job)
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["metadata"]["labels"][workloads.JOB_UID_LABEL] == "u1"
    assert body["spec"]["queueName"] == QUEUE
    sets = {s["name"]: s for s in body["spec"]["podSets"]}
    assert set(sets) == {"worker", "store"}
    assert (sets["worker"]["count"], sets["worker"]["minCount"]) == (5, 2)
    worker = sets["worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert sets["store"]["template"]["spec"]["containers"][0]["resources"]["requests"]


def test_where_kueue_is_not_installed_the_job_waits_saying_so_and_looks_again() -> None:
    """The Workload API is not served (Kueue's CRDs are absent): nothing to create, and no
    pretending that a Workload was; the job says what would unblock it and checks again."""
    job = queued_job()
    missing = QueueObservation(kueue="not-installed")
    result = run(job, [], queue=missing)
    assert result.create_pods == [] and result.workload_writes == []
    assert result.status.phase == "Queued"
    queued = condition(result, "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "KueueNotInstalled")
    for words in ("not served", "TrainingJob.v1alpha1.torchkube.io", "externalFrameworks"):
        assert words in queued["message"]
    assert f"{QUEUE_LABEL}={QUEUE}" in queued["message"]  # or drop the label
    warnings = [(e.type, e.reason) for e in result.events if e.reason == "KueueNotInstalled"]
    assert warnings == [("Warning", "KueueNotInstalled")]
    assert result.requeue_after is not None
    assert result.requeue_after <= queueing.KUEUE_RECHECK_SECONDS
    again = run(queued_job(result.status.to_wire()), [], queue=missing)
    assert again.events == [] and condition(again, "Queued")["reason"] == "KueueNotInstalled"
    installed = run(queued_job(again.status.to_wire()), [], queue=observed(None))
    [(verb, _)] = installed.workload_writes
    assert verb == "create" and condition(installed, "Queued")["reason"] == "Queued"


def test_an_operator_with_kueue_disabled_runs_a_queue_labelled_job_at_once() -> None:
    """kueue.enabled=false: the label is ignored, loudly (once), and the job is not held."""
    job = queued_job()
    disabled = QueueObservation(kueue="disabled")
    result = run(job, [], queue=disabled)
    assert created_slots(result) == [0, 1, 2, 3] and result.workload_writes == []
    queued = condition(result, "Queued")
    assert (queued["status"], queued["reason"]) == ("False", "QueueingDisabled")
    assert "kueue.enabled=false" in queued["message"] and QUEUE in queued["message"]
    assert "kueue.enabled=true" in queued["message"]  # how to turn it on
    assert [(e.type, e.reason) for e in result.events if e.reason == "QueueingDisabled"] == [
        ("Warning", "QueueingDisabled")
    ]
    assert result.status.queue is None
    again = run(
        queued_job(running_status(conditions=result.status.to_wire()["conditions"])),
        healthy(),
        queue=disabled,
    )
    assert not [e for e in again.events if e.reason == "QueueingDisabled"]
    assert again.status.phase == "Running"


def test_torchkube_run_says_it_ignores_the_queue_label_as_a_kueue_less_operator_does() -> None:
    from torchkube.local.cli import _queue_note

    note = _queue_note(queued_job())
    assert note is not None
    assert label_ignored(QUEUE, "torchkube run has no Kueue to admit it") in note
    assert _queue_note(make_job()) is None


def test_the_prepare_pod_has_a_pod_set_of_its_own() -> None:
    job = queued_job(data={"source": {"path": "/corpus"}})
    names = [s["name"] for s in workloads.pod_sets(job)]
    assert names == ["worker", "store", "prepare"]


def test_a_live_job_s_lighthouse_has_a_pod_set_of_its_own() -> None:
    """recovery live: the Lighthouse's pod is counted against the quota like the store's."""
    job = queued_job(replicas={"min": 2, "max": 2}, failurePolicy={"recovery": "live"})
    sets = {s["name"]: s for s in workloads.pod_sets(job)}
    assert list(sets) == ["worker", "store", "lighthouse"]
    (container,) = sets["lighthouse"]["template"]["spec"]["containers"]
    assert sets["lighthouse"]["count"] == 1 and container["name"] == "lighthouse"
    assert [c["name"] for c in sets["store"]["template"]["spec"]["containers"]] == ["store"]


def test_prepared_data_gives_the_prepare_pods_quota_back_once() -> None:
    """The prepare pod runs once before the workers: once the data is Prepared its pod set
    is reported reclaimable, so Kueue can admit others into its quota for the rest of the
    run; before that, or once said, nothing is written."""
    data = {"source": {"path": "/corpus"}}
    preparing = queued_job({"data": {"phase": "Preparing"}}, data=data)
    body = workload_body(preparing, *ADMITTED, workers=4)
    assert run(preparing, [], queue=observed(body)).workload_writes == []
    prepared = queued_job({"data": {"phase": "Prepared"}}, data=data)
    [(verb, patch)] = run(prepared, [], queue=observed(body)).workload_writes
    assert verb == "status"
    assert patch["status"] == {"reclaimablePods": [{"name": "prepare", "count": 1}]}
    assert patch["metadata"]["resourceVersion"] == "7"
    body["status"]["reclaimablePods"] = [{"name": "prepare", "count": 1}]
    assert run(prepared, [], queue=observed(body)).workload_writes == []
    without_data = queued_job({"data": {"phase": "Prepared"}})
    plain = workload_body(without_data, *ADMITTED, workers=4)
    assert run(without_data, [], queue=observed(plain)).workload_writes == []


def test_a_fixed_size_job_asks_for_no_partial_admission() -> None:
    [workers, _] = workloads.pod_sets(queued_job(replicas={"min": 4, "max": 4}))
    assert workers["count"] == 4 and "minCount" not in workers


def test_priority_class_and_its_value_go_into_the_workload() -> None:
    """As jobframework sets them: always a priority (0 without a class), since Kueue's
    visibility server dereferences it for every pending Workload."""
    job = queued_job(scheduling={"priorityClassName": "high"})
    spec = workloads.workload(job, workloads.Priority(1000, "high"))["spec"]
    assert spec["priority"] == 1000
    assert spec["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    unclassed = workloads.workload(queued_job(), workloads.Priority())["spec"]
    assert unclassed["priority"] == 0 and "priorityClassRef" not in unclassed


def test_waiting_for_quota_creates_nothing_and_says_why() -> None:
    job = queued_job()
    pending = condition_of("QuotaReserved", "False", "Pending", "insufficient quota for gpu")
    result = run(job, [], queue=observed(workload_body(job, pending)))
    assert result.create_pods == [] and result.workload_writes == []
    queued = condition(result, "Queued")
    assert QUEUE in queued["message"] and "insufficient quota for gpu" in queued["message"]
    assert result.status.queue is not None and result.status.queue.name == QUEUE


def test_a_waiting_job_says_its_place_in_line_and_reads_it_again() -> None:
    """Kueue's visibility API lists the queue's pending workloads in its order; the job's
    status carries its place (0: next) and it looks again, since places move when others
    are admitted, with no change to its own Workload; also before Kueue lists it, and when
    it waits again after an eviction. Where that API does not answer: no place, no poll."""
    job = queued_job()
    pending = condition_of("QuotaReserved", "False", "Pending", "insufficient quota for gpu")
    body = workload_body(job, pending)
    summary = {
        "items": [
            {"metadata": {"name": "trainingjob-other-aaaaa"}, "positionInLocalQueue": 0},
            {
                "metadata": {"name": body["metadata"]["name"]},
                "positionInLocalQueue": 1,
                "positionInClusterQueue": 3,
            },
        ]
    }
    position = workloads.position_of(summary, body["metadata"]["name"])
    assert position == workloads.QueuePosition(local_queue=1, cluster_queue=3)
    assert workloads.position_of(summary, "trainingjob-absent-bbbbb") is None
    state = workloads.read(body)
    placed = QueueObservation(workload=state, position=position, places_served=True)
    result = run(job, [], queue=placed)
    queue = result.status.queue
    assert queue is not None
    assert (queue.position_in_local_queue, queue.position_in_cluster_queue) == (1, 3)
    assert result.requeue_after == queueing.POSITION_REFRESH_SECONDS
    not_listed_yet = run(job, [], queue=QueueObservation(workload=state, places_served=True))
    assert not_listed_yet.status.queue is not None
    assert not_listed_yet.status.queue.position_in_local_queue is None
    assert not_listed_yet.requeue_after == queueing.POSITION_REFRESH_SECONDS
    unserved = run(job, [], queue=observed(body))
    assert unserved.requeue_after is None  # the Workload's own changes wake it
    evicted = condition_of("Evicted", "True", "Preempted", "preempted by a higher priority")
    requeued = workload_body(job, pending, evicted)
    again = QueueObservation(workload=workloads.read(requeued), position=position)
    back_in_line = run(job, [], queue=again).status.queue
    assert back_in_line is not None and back_in_line.position_in_local_queue == 1


def test_a_waiting_job_moved_to_another_queue_moves_its_workload() -> None:
    job = queued_job()
    body = workload_body(job)
    body["spec"]["queueName"] = "old-queue"
    [(verb, patch)] = run(job, [], queue=observed(body)).workload_writes
    assert (verb, patch["spec"]) == ("spec", {"queueName": QUEUE})


def test_a_job_whose_queue_label_is_removed_stays_under_kueue() -> None:
    waiting = run(queued_job(), [], queue=observed(None)).status
    unlabelled = make_job(waiting.to_wire())
    assert queue_name(unlabelled) == QUEUE
    result = run(unlabelled, [], queue=observed(workload_body(unlabelled)))
    assert result.create_pods == [] and result.status.phase == "Queued"


def test_pods_of_a_job_not_admitted_are_stopped_as_released() -> None:
    """An operator restart, or a Workload deleted by hand: what runs without admission stops."""
    job = queued_job(running_status())
    result = run(job, healthy(), queue=observed(workload_body(job)))
    assert len(result.delete_pods) == 5  # the workers and the store
    assert set(result.release.values()) == {queueing.RELEASE_QUEUED}
    assert result.failures == [] and result.status.restarts == 0


def test_an_admitted_job_runs_at_the_admitted_size_on_the_admitted_flavors() -> None:
    """The planner runs the job at the size Kueue admitted (``admitted_view``) and places the
    pods it creates on the flavours read beforehand (``flavors_to_read``, ``place``)."""
    job = queued_job(replicas={"min": 2, "max": 4})
    queue = observed(workload_body(job, *ADMITTED, workers=2))
    assert queueing.flavors_to_read(job, queue) == {"h100", "cpu-nodes"}
    flavors = {
        "h100": {"spec": {"nodeLabels": {"gpu": "h100"}, "tolerations": [{"key": "gpu"}]}},
        "cpu-nodes": {"spec": {"nodeLabels": {"pool": "cpu"}}},
    }
    result = run(job, [], queue=dataclasses.replace(queue, flavors=flavors))
    assert created_slots(result) == [0, 1]
    assert condition(result, "Queued")["status"] == "False"
    assert result.status.queue is not None and result.status.queue.admitted_workers == 2
    roles = {p["metadata"]["labels"][lbl.ROLE]: p["spec"] for p in result.create_pods}
    assert roles["worker"]["nodeSelector"]["gpu"] == "h100"
    assert {"key": "gpu"} in roles["worker"]["tolerations"]
    assert roles["rendezvous"]["nodeSelector"]["pool"] == "cpu"


def test_time_queued_is_left_out_of_the_deadlines() -> None:
    queued = condition_of("Queued", "True", "Queued", ago=3600)
    job = queued_job({"phase": "Queued", "conditions": [queued]})
    queue = observed(workload_body(job, *ADMITTED, workers=4))
    result = run(queueing.admitted_view(job, queue), [], queue=queue)
    assert result.status.suspended_seconds == 3600
    assert [e.reason for e in result.events].count("Admitted") == 1


def test_eviction_stops_the_workers_uncounted_then_gives_the_quota_back() -> None:
    job = queued_job(running_status())
    evicted = condition_of("Evicted", "True", "Preempted", "preempted by a higher priority")
    body = workload_body(job, *ADMITTED, evicted, workers=4)
    stopping = run(job, healthy(), queue=observed(body))
    assert len(stopping.delete_pods) == 5  # the workers and the store
    assert set(stopping.release.values()) == {queueing.RELEASE_EVICTED}
    assert stopping.failures == [] and stopping.status.phase == "Queued"
    assert condition(stopping, "Queued")["reason"] == "Preempted"
    assert stopping.workload_writes == []  # not while a worker is still active
    terminating = [pod(i, deleting=True) for i in range(4)]  # checkpointing, or on a dead node
    gone = run(job, terminating, queue=observed(body))
    [(verb, patch)] = gone.workload_writes
    assert verb == "status" and patch["status"]["admission"] is None
    states = {c["type"]: (c["status"], c["reason"]) for c in patch["status"]["conditions"]}
    assert states["QuotaReserved"] == ("False", "Pending")
    assert states["Requeued"] == ("True", "Preempted")
    assert patch["metadata"] == {"name": body["metadata"]["name"], "resourceVersion": "7"}


def test_an_evicted_slice_with_a_resize_waiting_is_finished_for_it() -> None:
    """As jobframework's ``EnsureWorkloadSlices`` does: the job waits in its resize's place
    (one Workload queued for it, not two)."""
    job = elastic_job(4, running_status())
    evicted = condition_of("Evicted", "True", "Preempted", "preempted by a higher priority")
    old = workload_body(elastic_job(2), *ADMITTED, evicted, workers=2)
    old["metadata"]["creationTimestamp"] = format_time(NOW - timedelta(minutes=10))
    resize = workloads.workload(job, workloads.Priority(), replaces=workloads.read(old))
    resize["metadata"]["creationTimestamp"] = format_time(NOW)
    del resize["spec"]["podSets"][0]["minCount"]  # a resize asks whole
    queue = workloads.observe([old, resize], workloads.Priority(), 4)
    assert run(job, healthy(2), queue=queue).workload_writes == []  # not while pods are active
    [(verb, patch), (spec, partial)] = run(job, [], queue=queue).workload_writes
    assert verb == "status" and patch["metadata"]["name"] == old["metadata"]["name"]
    finished = {c["type"]: (c["status"], c["reason"]) for c in patch["status"]["conditions"]}
    assert finished["Finished"] == ("True", "OutOfSync")
    assert spec == "spec" and partial["metadata"]["name"] == resize["metadata"]["name"]
    [workers, _] = partial["spec"]["podSets"]
    assert (workers["count"], workers["minCount"]) == (4, 1)  # a start again: from min


def test_a_finished_job_marks_its_workload_finished_once() -> None:
    status = running_status(phase="Succeeded", completionTime=format_time(NOW))
    job = queued_job(status)
    body = workload_body(job, *ADMITTED, workers=4)
    [(verb, patch)] = run(job, [], queue=observed(body)).workload_writes
    finished = next(c for c in patch["status"]["conditions"] if c["type"] == "Finished")
    assert (verb, finished["status"], finished["reason"]) == ("status", "True", "Succeeded")
    done = workload_body(job, *ADMITTED, condition_of("Finished", "True"), workers=4)
    assert run(job, [], queue=observed(done)).workload_writes == []


def test_a_workload_of_ours_being_deleted_loses_kueues_finalizer() -> None:
    job = queued_job()
    body = workload_body(job)
    assert queueing.job_key_of(body) == ("ns", "demo")
    assert not queueing.finalizer_to_remove(body)
    body["metadata"] |= {"deletionTimestamp": format_time(NOW), "finalizers": [workloads.FINALIZER]}
    assert queueing.finalizer_to_remove(body)
    body["metadata"]["ownerReferences"] = []
    assert not queueing.finalizer_to_remove(body)


def elastic_job(desired: int, status: dict[str, Any] | None = None) -> TrainingJob:
    job = queued_job(status, replicas={"min": 1, "max": 6, "desired": desired})
    metadata = {**job.metadata, "annotations": {workloads.ELASTIC_ANNOTATION: "true"}}
    return job.model_copy(update={"metadata": metadata})


def elastic_observed(job: TrainingJob, admitted: int, *more: dict[str, Any]) -> QueueObservation:
    """The job's slice admitted at ``admitted`` workers, and ``more`` Workloads beside it."""
    slice_ = workload_body(elastic_job(admitted), *ADMITTED, workers=admitted)
    slice_["metadata"]["creationTimestamp"] = format_time(NOW - timedelta(minutes=10))
    replicas = job.spec.replicas
    return workloads.observe(
        [slice_, *more], workloads.Priority(), replicas.target + replicas.spares
    )


def test_an_elastic_jobs_workload_asks_for_its_current_size() -> None:
    body = workloads.workload(elastic_job(2), workloads.Priority())
    assert body["metadata"]["annotations"] == {workloads.ELASTIC_ANNOTATION: "true"}
    [workers, _] = body["spec"]["podSets"]
    assert (workers["count"], workers["minCount"]) == (2, 1)  # partial admission from min


def test_an_elastic_job_started_below_its_target_asks_for_the_rest() -> None:
    """Partial admission granted 2 of the 4 workers its first Workload asked: the job runs
    at 2 and asks for 4 with a whole scale-up slice, which Kueue admits once quota frees."""
    job = elastic_job(4, running_status())
    first = workload_body(job, *ADMITTED, workers=2)
    queue = workloads.observe([first], workloads.Priority(), 4)
    result = run(queueing.admitted_view(job, queue), healthy(2), queue=queue)
    assert result.create_pods == [] and result.delete_pods == []
    [(verb, body)] = result.workload_writes
    assert verb == "create" and body["metadata"]["annotations"][workloads.REPLACEMENT_ANNOTATION]
    [workers, _] = body["spec"]["podSets"]
    assert workers["count"] == 4 and "minCount" not in workers


def test_scaling_an_elastic_job_up_asks_kueue_for_a_slice_and_runs_on_meanwhile() -> None:
    job = elastic_job(4, running_status())
    queue = elastic_observed(job, 2)
    result = run(queueing.admitted_view(job, queue), healthy(2), queue=queue)
    assert result.create_pods == [] and result.delete_pods == []  # still 2, as admitted
    [(verb, body)] = result.workload_writes
    old = queue.workload
    assert verb == "create" and old is not None
    annotations = body["metadata"]["annotations"]
    assert annotations[workloads.REPLACEMENT_ANNOTATION] == f"ns/{old.name}"
    assert annotations[workloads.SLICE_NAME_ANNOTATION] == old.name
    assert body["metadata"]["name"] != old.name
    assert body["spec"]["podSets"][0]["count"] == 4
    waiting = dict(body, metadata={**body["metadata"], "creationTimestamp": format_time(NOW)})
    again = elastic_observed(elastic_job(5, running_status()), 2, waiting)
    [(verb, patch)] = run(elastic_job(5, running_status()), healthy(2), queue=again).workload_writes
    assert (verb, patch["spec"]["podSets"][0]["count"]) == ("spec", 5)
    withdrawn = elastic_observed(elastic_job(2, running_status()), 2, waiting)
    [(verb, patch)] = run(elastic_job(2), healthy(2), queue=withdrawn).workload_writes
    assert verb == "status" and patch["metadata"]["name"] == body["metadata"]["name"]


def test_scaling_an_elastic_job_down_gives_quota_back_at_once() -> None:
    job = elastic_job(2, running_status())
    queue = elastic_observed(job, 4)
    result = run(queueing.admitted_view(job, queue), healthy(4), queue=queue)
    assert len([n for n, _ in result.delete_pods if "worker" in n]) == 2
    [(verb, patch)] = result.workload_writes
    assert verb == "spec" and patch["spec"]["podSets"][0]["count"] == 2
    assert [s["name"] for s in patch["spec"]["podSets"]] == ["worker", "store"]
    shrunk = workload_body(elastic_job(2), *ADMITTED, workers=4)  # admission not yet updated
    shrunk["spec"]["podSets"][0]["count"] = 2
    placement = workloads.read(shrunk).placements["worker"]
    assert placement.count == 2


def test_asked_for_fewer_than_the_admitted_min_count_an_elastic_job_gets_a_new_slice() -> None:
    """``minCount`` cannot change while the Workload is admitted, and Kueue refuses a count
    below it: with ``replicas.min`` lowered below it, a smaller slice (whole) replaces it."""
    job = queued_job(running_status(), replicas={"min": 1, "max": 6, "desired": 1})
    job = job.model_copy(
        update={"metadata": {**job.metadata, "annotations": {workloads.ELASTIC_ANNOTATION: "true"}}}
    )
    admitted = workload_body(elastic_job(3), *ADMITTED, workers=3)
    admitted["spec"]["podSets"][0]["minCount"] = 2
    queue = workloads.observe([admitted], workloads.Priority(), 1)
    [(verb, body)] = run(
        queueing.admitted_view(job, queue), healthy(3), queue=queue
    ).workload_writes
    assert verb == "create"
    [workers, _] = body["spec"]["podSets"]
    assert workers["count"] == 1 and "minCount" not in workers


def test_a_resize_keeps_the_priority_of_the_slice_it_replaces() -> None:
    job = elastic_job(4, running_status())
    slice_ = workload_body(elastic_job(2), *ADMITTED, workers=2)
    slice_["spec"]["priority"] = 500
    slice_["spec"]["priorityClassRef"] = {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "research",
    }
    queue = workloads.observe([slice_], workloads.Priority(), 4)
    [(_, body)] = run(queueing.admitted_view(job, queue), healthy(2), queue=queue).workload_writes
    assert body["spec"]["priority"] == 500
    assert body["spec"]["priorityClassRef"] == slice_["spec"]["priorityClassRef"]


def test_the_prepare_pods_quota_is_given_back_by_a_waiting_resize_too() -> None:
    data = {"source": {"path": "/corpus"}}
    status = {**running_status(), "data": {"phase": "Prepared"}}
    job = queued_job(status, replicas={"min": 1, "max": 6, "desired": 4}, data=data)
    job = job.model_copy(
        update={"metadata": {**job.metadata, "annotations": {workloads.ELASTIC_ANNOTATION: "true"}}}
    )
    admitted = workload_body(job, *ADMITTED, workers=2)
    admitted["status"]["reclaimablePods"] = [{"name": "prepare", "count": 1}]
    admitted["metadata"]["creationTimestamp"] = format_time(NOW - timedelta(minutes=10))
    resize = workloads.workload(job, workloads.Priority(), replaces=workloads.read(admitted))
    resize["metadata"].update(creationTimestamp=format_time(NOW), resourceVersion="9")
    queue = workloads.observe([admitted, resize], workloads.Priority(), 4)
    writes = run(queueing.admitted_view(job, queue), healthy(2), queue=queue).workload_writes
    assert writes == [
        (
            "status",
            {
                "metadata": {"name": resize["metadata"]["name"], "resourceVersion": "9"},
                "status": {"reclaimablePods": [{"name": "prepare", "count": 1}]},
            },
        )
    ]
