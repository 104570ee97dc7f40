"""Kueue's Workload for a TrainingJob: built, read and updated as plain dicts, with no I/O.

A TrainingJob labelled ``kueue.x-k8s.io/queue-name`` is represented to Kueue by one Workload,
made the way Kueue's own jobframework makes one for its built-in kinds (PyTorchJob, JobSet):
named ``trainingjob-<name>-<hash>``, owned (controller) by the job, labelled with the job's UID,
one pod set per kind of pod with that pod's requests, the job's PriorityClass and its value.
So ``kubectl get workloads``, Kueue's dashboards and its metrics show TrainingJobs like any
other job. The status updates are jobframework's too: a Workload whose job stopped after an
eviction gives its quota reservation back, and a finished job's Workload is marked Finished.
"""

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.times import format_time
from torchkube.api.trainingjob import GROUP, KIND
from torchkube.operator import builders

API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
PLURAL = "workloads"
QUEUE_LABEL = f"{API_GROUP}/queue-name"
JOB_UID_LABEL = f"{API_GROUP}/job-uid"
FINALIZER = f"{API_GROUP}/resource-in-use"
"""Kueue puts it on a Workload that holds quota; the job's controller removes it."""
WORKERS, STORE, PREPARE = "worker", "store", "prepare"
"""Pod-set names, one per kind of pod (DNS labels, like jobframework's replica types)."""
POD_SET_OF_ROLE = {lbl.ROLE_WORKER: WORKERS, lbl.ROLE_RENDEZVOUS: STORE, lbl.ROLE_PREPARE: PREPARE}
NAME_LIMIT = 253
HASH_LENGTH = 5


def queue_name(job: TrainingJob) -> str | None:
    """The LocalQueue the job waits in, or None for a job Kueue does not admit. A job once
    under Kueue stays there (in its last queue) when its label is removed: dropping the
    label must not start it past the quota. Moving it is changing the label."""
    labelled = job.metadata.get("labels", {}).get(QUEUE_LABEL)
    if labelled:
        return str(labelled)
    return job.status.queue.name if job.status and job.status.queue else None


def workload_name(job: TrainingJob) -> str:
    """jobframework's ``GetWorkloadNameForOwnerWithGVK``: the kind and name, cut to fit, and
    five hex digits of a SHA-1 over kind, group, name and UID (a job created again under the
    same name gets a Workload of its own)."""
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job.name}\n{job.uid}".encode()).hexdigest()
    prefix = f"{KIND.lower()}-{job.name}"[: NAME_LIMIT - 1 - HASH_LENGTH]
    return f"{prefix}-{digest[:HASH_LENGTH]}"


def _slim_template(pod: dict[str, Any]) -> dict[str, Any]:
    """What Kueue reads of a pod (its requests, where it may run, its priority), without the
    env, probes and volumes that only the pods themselves need."""
    spec = pod["spec"]

    def containers(key: str) -> list[dict[str, Any]]:
        return [
            {"name": c["name"], "image": c["image"], "resources": c.get("resources") or {}}
            for c in spec.get(key) or []
        ]

    slim: dict[str, Any] = {"containers": containers("containers")}
    if spec.get("initContainers"):
        slim["initContainers"] = containers("initContainers")
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "overhead"):
        if spec.get(key):
            slim[key] = spec[key]
    return {"spec": slim}


def pod_sets(job: TrainingJob) -> list[dict[str, Any]]:
    """Workers (``count`` replicas.max and the spares, ``minCount`` replicas.min so Kueue's
    partial admission may admit any size in the elastic range), the rendezvous store, and the
    data-preparation pod when the job has ``spec.data``."""
    replicas = job.spec.replicas
    count = replicas.max + replicas.spares
    workers: dict[str, Any] = {
        "name": WORKERS,
        "count": count,
        "template": _slim_template(builders.worker_pod(job, 0, "podset", ())),
    }
    if replicas.min < count:
        workers["minCount"] = replicas.min
    sets = [
        workers,
        {
            "name": STORE,
            "count": 1,
            "template": _slim_template(builders.rendezvous_pod(job, "podset", ())),
        },
    ]
    if job.spec.data is not None:
        sets.append(
            {"name": PREPARE, "count": 1, "template": _slim_template(builders.prepare_pod(job, 1))}
        )
    return sets


def workload(job: TrainingJob, priority: int | None) -> dict[str, Any]:
    """The job's Workload; ``priority`` is the value of its PriorityClass (None: none)."""
    spec: dict[str, Any] = {"queueName": queue_name(job), "podSets": pod_sets(job)}
    priority_class = job.spec.scheduling.priority_class_name
    if priority_class and priority is not None:
        spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": priority_class,
        }
        spec["priority"] = priority
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "namespace": job.namespace,
            "labels": {**lbl.job_labels(job.name), JOB_UID_LABEL: job.uid},
            "ownerReferences": [builders.owner_reference(job)],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class Placement:
    """Where Kueue admitted one pod set: how many pods, on which ResourceFlavors."""

    count: int
    flavors: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkloadState:
    """A Workload as the job's controller reads it."""

    name: str
    queue: str
    conditions: list[dict[str, Any]]
    resource_version: str | None
    cluster_queue: str | None
    placements: dict[str, Placement]
    being_deleted: bool = False

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == kind), None)

    def is_true(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.get("status") == "True"

    @property
    def admitted(self) -> bool:
        return self.is_true("Admitted") and not self.is_true("Evicted")

    @property
    def reserved(self) -> bool:
        return self.is_true("QuotaReserved")

    def message(self, kind: str) -> str:
        found = self.condition(kind)
        return str(found.get("message", "")) if found else ""


@dataclass(frozen=True)
class QueueObservation:
    """What the controller read for a queued job: its Workload (None: none exists) and the
    value of its PriorityClass (for the Workload it creates)."""

    workload: WorkloadState | None = None
    priority: int | None = None


def read(body: dict[str, Any]) -> WorkloadState:
    """A Workload as a :class:`WorkloadState`."""
    status = body.get("status") or {}
    admission = status.get("admission") or {}
    spec_counts = {s["name"]: s.get("count", 1) for s in body.get("spec", {}).get("podSets", [])}
    placements = {
        assignment["name"]: Placement(
            int(assignment.get("count", spec_counts.get(assignment["name"], 1))),
            tuple(sorted(set((assignment.get("flavors") or {}).values()))),
        )
        for assignment in admission.get("podSetAssignments") or []
    }
    metadata = body.get("metadata", {})
    return WorkloadState(
        name=metadata.get("name", ""),
        queue=str(body.get("spec", {}).get("queueName", "")),
        conditions=list(status.get("conditions") or []),
        resource_version=metadata.get("resourceVersion"),
        cluster_queue=admission.get("clusterQueue"),
        placements=placements,
        being_deleted=bool(metadata.get("deletionTimestamp")),
    )


def flavor_constraints(
    placement: Placement, flavors: dict[str, dict[str, Any]]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The node labels and tolerations of a pod set's ResourceFlavors."""
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for name in placement.flavors:
        spec = (flavors.get(name) or {}).get("spec") or {}
        selector |= spec.get("nodeLabels") or {}
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return selector, tolerations


def _set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
) -> list[dict[str, Any]]:
    wanted = "True" if status else "False"
    out = []
    found = False
    for condition in conditions:
        if condition.get("type") != kind:
            out.append(condition)
            continue
        found = True
        moved = condition.get("status") != wanted
        out.append(
            {
                **condition,
                "status": wanted,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": format_time(now)
                if moved
                else condition.get("lastTransitionTime", format_time(now)),
            }
        )
    if not found:
        out.append(
            {
                "type": kind,
                "status": wanted,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": format_time(now),
            }
        )
    return out


def release_reservation(state: WorkloadState, now: datetime) -> dict[str, Any]:
    """The status patch that gives an evicted Workload's quota back once its pods are gone
    (jobframework's ``UnsetQuotaReservationWithCondition``): Kueue then queues it again."""
    evicted = state.condition("Evicted") or {}
    reason, message = str(evicted.get("reason", "")), str(evicted.get("message", ""))
    conditions = _set_condition(state.conditions, "QuotaReserved", False, "Pending", message, now)
    conditions = _set_condition(conditions, "Admitted", False, "NoReservation", message, now)
    requeued = reason in ("Preempted", "NodeFailures")
    conditions = _set_condition(conditions, "Requeued", requeued, reason or "Pending", message, now)
    return {
        "metadata": {"name": state.name, "resourceVersion": state.resource_version},
        "status": {"admission": None, "conditions": conditions},
    }


def move(state: WorkloadState, queue: str) -> dict[str, Any]:
    """The patch that moves a waiting Workload to another LocalQueue (the job's label
    changed), as jobframework does for a suspended job."""
    return {
        "metadata": {"name": state.name, "resourceVersion": state.resource_version},
        "spec": {"queueName": queue},
    }


def finish(state: WorkloadState, succeeded: bool, message: str, now: datetime) -> dict[str, Any]:
    """The status patch that marks the Workload Finished: Kueue releases its quota at once."""
    reason = "Succeeded" if succeeded else "Failed"
    conditions = _set_condition(state.conditions, "Finished", True, reason, message, now)
    return {
        "metadata": {"name": state.name, "resourceVersion": state.resource_version},
        "status": {"conditions": conditions},
    }
