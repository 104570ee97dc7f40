"""Kueue's Workload for a TrainingJob: built, read and updated as plain dicts, with no I/O.

A TrainingJob labelled ``kueue.x-k8s.io/queue-name`` is represented to Kueue by one Workload,
made the way Kueue's own jobframework makes one for its built-in kinds (PyTorchJob, JobSet):
named ``trainingjob-<name>-<hash>``, owned (controller) by the job, labelled with the job's UID,
one pod set per kind of pod with that pod's requests, and a priority found as jobframework
finds it (:class:`Priority`).
So ``kubectl get workloads``, Kueue's dashboards and its metrics show TrainingJobs like any
other job. The status updates are jobframework's too: a Workload whose job stopped after an
eviction gives its quota reservation back, and a finished job's Workload is marked Finished.
"""

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.times import format_time
from torchkube.api.trainingjob import GROUP, KIND
from torchkube.api.worker_launch import live
from torchkube.operator import builders
from torchkube.policy.queue import queue_name

API_GROUP = "kueue.x-k8s.io"
API_VERSION = "v1beta2"
PLURAL = "workloads"
JOB_UID_LABEL = f"{API_GROUP}/job-uid"
ELASTIC_ANNOTATION = f"{API_GROUP}/elastic-job"
"""``"true"`` on a job (and its Workloads): resized under quota by Kueue's workload slices."""
REPLACEMENT_ANNOTATION = f"{API_GROUP}/workload-slice-replacement-for"
"""On a scale-up's new slice: the ``namespace/name`` of the admitted slice it replaces."""
SLICE_NAME_ANNOTATION = f"{API_GROUP}/workload-slice-name"
PREBUILT_LABEL = f"{API_GROUP}/prebuilt-workload-name"
"""On a job whose Workload someone else made: the Workload's name. MultiKueue labels so the
copy of a job it sends to a worker cluster, after making the Workload there."""
MULTIKUEUE_CHECK = f"{API_GROUP}/multikueue"
"""The controller name of MultiKueue's admission check (it dispatches to worker clusters)."""
FINALIZER = f"{API_GROUP}/resource-in-use"
"""Kueue puts it on a Workload that holds quota; the job's controller removes it."""
TOPOLOGY_GATE = f"{API_GROUP}/topology"
"""Kueue's scheduling gate on a pod placed by topology: its TopologyUngater lifts it once it has
added the node selector of the domain the pod was assigned."""
POD_SET_LABEL = f"{API_GROUP}/podset"
WORKLOAD_ANNOTATION = f"{API_GROUP}/workload"
TOPOLOGY_ANNOTATIONS = {
    "required": f"{API_GROUP}/podset-required-topology",
    "preferred": f"{API_GROUP}/podset-preferred-topology",
}
"""What marks a pod as placed by Kueue's topology-aware scheduling (its ``IsTAS``)."""
UNCONSTRAINED_ANNOTATION = f"{API_GROUP}/podset-unconstrained-topology"
"""The mark of a pod Kueue placed by topology though its pod set asked for none (a flavour
with a Topology places every pod set it admits)."""
WORKERS, STORE, PREPARE, LIGHTHOUSE = "worker", "store", "prepare", "lighthouse"
"""Pod-set names, one per kind of pod (DNS labels, like jobframework's replica types)."""
POD_SET_OF_ROLE = {
    lbl.ROLE_WORKER: WORKERS,
    lbl.ROLE_RENDEZVOUS: STORE,
    lbl.ROLE_PREPARE: PREPARE,
    lbl.ROLE_LIGHTHOUSE: LIGHTHOUSE,
}
NAME_LIMIT = 253
HASH_LENGTH = 5


def elastic(job: TrainingJob) -> bool:
    """Whether the job is resized under quota (Kueue's ``ElasticJobsViaWorkloadSlices``)."""
    return job.metadata.get("annotations", {}).get(ELASTIC_ANNOTATION) == "true"


def workload_name(job: TrainingJob, generation: int | None = None) -> str:
    """jobframework's ``GetWorkloadNameForOwnerWithGVK``: the kind and name, cut to fit, and
    five hex digits of a SHA-1 over kind, group, name and UID (a job created again under the
    same name gets a Workload of its own); a scale-up's slice also hashes the job's
    generation (``...WithGVKAndGeneration``)."""
    extra = "" if generation is None else f"\n{generation}"
    digest = hashlib.sha1(f"{KIND}\n{GROUP}\n{job.name}\n{job.uid}{extra}".encode()).hexdigest()
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
    """Workers (``count`` replicas.max and the spares, for a job resized under quota its
    current target and spares; ``minCount`` replicas.min so Kueue's partial admission may
    admit any size in the elastic range), the rendezvous store, the Lighthouse under
    ``failurePolicy.recovery: live``, and the data-preparation pod when the job has
    ``spec.data``."""
    replicas = job.spec.replicas
    count = (replicas.target if elastic(job) else replicas.max) + replicas.spares
    workers: dict[str, Any] = {
        "name": WORKERS,
        "count": count,
        "template": _slim_template(builders.worker_pod(job, 0, "podset", ())),
    }
    if replicas.min < count:
        workers["minCount"] = replicas.min
    request = topology_request(job)
    if request is not None:
        workers["topologyRequest"] = request
    sets = [
        workers,
        {
            "name": STORE,
            "count": 1,
            "template": _slim_template(builders.rendezvous_pod(job, "podset", ())),
        },
    ]
    if live(job):
        template = _slim_template(builders.lighthouse_pod(job, "podset", ()))
        sets.append({"name": LIGHTHOUSE, "count": 1, "template": template})
    if job.spec.data is not None:
        sets.append(
            {"name": PREPARE, "count": 1, "template": _slim_template(builders.prepare_pod(job, 1))}
        )
    return sets


def topology_request(job: TrainingJob) -> dict[str, str] | None:
    """The workers' ``topologyRequest`` (jobframework's ``PodSetTopologyRequest``): the level
    required or preferred, and the label that numbers the pods, so Kueue assigns the domains'
    slots in slot order."""
    topology = job.spec.scheduling.topology
    if topology is None:
        return None
    return {topology.mode: topology.level, "podIndexLabel": lbl.REPLICA_INDEX}


def gated_for_topology(
    pod: dict[str, Any], workload: str, pod_set: str, request: dict[str, Any]
) -> dict[str, Any]:
    """``pod`` marked as Kueue's topology-aware scheduling marks its pods (jobframework's
    ``podset.FromAssignment`` with a topology assignment): its pod set, its Workload, the level
    it asked for (unconstrained where it asked for none), and the gate Kueue's TopologyUngater
    lifts after adding the assigned domain's node selector."""
    metadata = dict(pod["metadata"])
    metadata["labels"] = {**(metadata.get("labels") or {}), POD_SET_LABEL: pod_set}
    marks = {WORKLOAD_ANNOTATION: workload}
    marks |= {key: request[mode] for mode, key in TOPOLOGY_ANNOTATIONS.items() if mode in request}
    if not any(mode in request for mode in TOPOLOGY_ANNOTATIONS):
        marks[UNCONSTRAINED_ANNOTATION] = "true"
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **marks}
    spec = dict(pod["spec"])
    gates = list(spec.get("schedulingGates") or [])
    if {"name": TOPOLOGY_GATE} not in gates:
        gates.append({"name": TOPOLOGY_GATE})
    spec["schedulingGates"] = gates
    return {**pod, "metadata": metadata, "spec": spec}


PRIORITY_CLASS_LABEL = f"{API_GROUP}/priority-class"
"""On a job: the Kueue WorkloadPriorityClass it is queued by, before any PriorityClass."""


@dataclass(frozen=True)
class Priority:
    """A Workload's priority as jobframework sets it (``PrepareWorkloadPriority``): the
    WorkloadPriorityClass the job's ``kueue.x-k8s.io/priority-class`` label names, else its
    PriorityClass, else the cluster's ``globalDefault`` PriorityClass (the lowest, if several),
    else none at value 0. ``spec.priority`` is always set: Kueue's visibility server reads it
    from every pending Workload."""

    value: int = 0
    class_name: str | None = None
    kind: Literal["PriorityClass", "WorkloadPriorityClass"] = "PriorityClass"

    def ref(self) -> dict[str, str] | None:
        """``spec.priorityClassRef`` (None: no class)."""
        if not self.class_name:
            return None
        group = API_GROUP if self.kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
        return {"group": group, "kind": self.kind, "name": self.class_name}

    @classmethod
    def of(cls, spec: dict[str, Any]) -> "Priority":
        """The priority a Workload's spec carries (a scale-up's slice keeps its job's)."""
        ref = spec.get("priorityClassRef") or {}
        value, name = int(spec.get("priority") or 0), ref.get("name")
        if ref.get("kind") == "WorkloadPriorityClass":
            return cls(value, name, "WorkloadPriorityClass")
        return cls(value, name)


def workload(
    job: TrainingJob, priority: Priority, replaces: "WorkloadState | None" = None
) -> dict[str, Any]:
    """The job's Workload. An elastic job's Workload asks for its current worker count;
    ``replaces`` makes it the slice of a resize that Kueue admits in place of that admitted
    one."""
    spec: dict[str, Any] = {
        "queueName": queue_name(job),
        "podSets": pod_sets(job),
        "priority": priority.value,
    }
    ref = priority.ref()
    if ref is not None:
        spec["priorityClassRef"] = ref
    metadata: dict[str, Any] = {
        "name": workload_name(job),
        "namespace": job.namespace,
        "labels": {**lbl.job_labels(job.name), JOB_UID_LABEL: job.uid},
        "ownerReferences": [builders.owner_reference(job)],
    }
    if elastic(job):
        metadata["annotations"] = {ELASTIC_ANNOTATION: "true"}
    if replaces is not None:
        metadata["name"] = workload_name(job, job.metadata.get("generation") or 0)
        metadata.setdefault("annotations", {}).update(
            {
                REPLACEMENT_ANNOTATION: f"{job.namespace}/{replaces.name}",
                SLICE_NAME_ANNOTATION: replaces.slice_name,
            }
        )
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "Workload",
        "metadata": metadata,
        "spec": spec,
    }


@dataclass(frozen=True)
class Placement:
    """Where Kueue admitted one pod set: how many pods, on which ResourceFlavors."""

    count: int
    flavors: tuple[str, ...] = ()
    topology: dict[str, Any] | None = None
    """The pod set's ``topologyRequest`` (empty: it asked for none) when Kueue placed it by
    topology (its admission holds a ``topologyAssignment``): its pods wait for Kueue's
    TopologyUngater."""


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
    pod_sets: tuple[dict[str, Any], ...] = ()
    slice_name: str = ""
    """The first slice's name, shared by the slices that replace it."""
    replaces: str | None = None
    created: str = ""
    reclaimable: tuple[tuple[str, int], ...] = ()
    """``status.reclaimablePods``: pods of a pod set whose quota the job no longer needs."""
    priority: Priority = Priority()
    controller_uid: str = ""
    """The uid of the Workload's controller (its job); empty for a prebuilt one not adopted."""
    cluster: str = ""
    """``status.clusterName``: the worker cluster MultiKueue dispatched it to (manager side)."""
    checks: tuple[tuple[str, str, str], ...] = ()
    """``status.admissionChecks`` as (name, state, message)."""

    def _pod_set(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.pod_sets if s.get("name") == name), None)

    def count(self, pod_set: str) -> int | None:
        """The count the Workload asks for ``pod_set``."""
        found = self._pod_set(pod_set)
        return int(found.get("count", 1)) if found else None

    def min_count(self, pod_set: str) -> int | None:
        """The fewest pods of ``pod_set`` partial admission may admit (None: all of them)."""
        found = self._pod_set(pod_set)
        return int(found["minCount"]) if found and "minCount" in found else None

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

    def checks_message(self) -> str:
        """What the admission checks not yet Ready say (MultiKueue: where it looks for room)."""
        waiting = [(name, state, text) for name, state, text in self.checks if state != "Ready"]
        return "; ".join(f"{name}: {text or state}" for name, state, text in waiting)


@dataclass(frozen=True)
class QueuePosition:
    """Pending workloads ahead of a waiting Workload, as Kueue's visibility API lists them."""

    local_queue: int
    cluster_queue: int


VISIBILITY_GROUP = f"visibility.{API_GROUP}"
VISIBILITY_VERSION = "v1beta2"


def pending_workloads_path(namespace: str, queue: str) -> str:
    """Kueue's on-demand visibility API for one LocalQueue's pending workloads, in its order
    (an aggregated API served by Kueue's visibility server)."""
    return (
        f"/apis/{VISIBILITY_GROUP}/{VISIBILITY_VERSION}/namespaces/{namespace}"
        f"/localqueues/{queue}/pendingworkloads"
    )


def position_of(summary: dict[str, Any], workload: str) -> QueuePosition | None:
    """Where ``workload`` stands in a pending-workloads summary (None: not listed, e.g. not
    yet seen by Kueue's queue manager, or admitted meanwhile)."""
    for item in summary.get("items") or []:
        if (item.get("metadata") or {}).get("name") == workload:
            return QueuePosition(
                int(item.get("positionInLocalQueue") or 0),
                int(item.get("positionInClusterQueue") or 0),
            )
    return None


KueueAvailability = Literal["installed", "not-installed", "disabled"]
"""Whether a queued job's Workload can be used: ``installed``, the apiserver serves Kueue's
Workload API; ``not-installed``, it does not (Kueue's CRDs are absent, or too old to serve
``API_VERSION``); ``disabled``, this operator runs with the Kueue integration off (the chart's
``kueue.enabled=false``) and reads no Workload."""


@dataclass(frozen=True)
class QueueObservation:
    """What the controller read for a queued job: its Workload (None: none exists), a
    resize's slice waiting beside it, and the priority a Workload it creates carries."""

    workload: WorkloadState | None = None
    priority: Priority = Priority()
    scale_up: WorkloadState | None = None
    wanted_workers: int = 0
    """The worker pods the job's spec asks for now (target and spares)."""
    kueue: KueueAvailability = "installed"
    position: QueuePosition | None = None
    """Where the followed Workload waits, while it waits and Kueue lists it."""
    places_served: bool = False
    """Kueue's visibility API answered for the followed Workload's LocalQueue: places in
    line move, so the job looks again (its own Workload may not be listed yet)."""
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The ResourceFlavors of the admitted Workload's placements, by name, read while the job
    may create pods (``queueing.flavors_to_read``); a deleted one is left out."""


def observe(
    bodies: list[dict[str, Any]], priority: Priority = Priority(), wanted_workers: int = 0
) -> QueueObservation:
    """The job's unfinished Workloads as one observation: the slice admitted (else the
    oldest) is the one the job follows; a younger one is a scale-up waiting for admission."""
    states = sorted(
        (read(b) for b in bodies), key=lambda state: (not state.admitted, state.created)
    )
    live = [state for state in states if not state.is_true("Finished")] or states[-1:]
    followed = live[0] if live else None
    waiting = next((s for s in live[1:] if s.replaces), None)
    return QueueObservation(followed, priority, waiting, wanted_workers)


def _patch(state: WorkloadState, **parts: dict[str, Any]) -> dict[str, Any]:
    """A merge patch of ``state``'s Workload, refused (409) if Kueue wrote it since it was
    read: the job is reconciled again on what Kueue wrote."""
    return {"metadata": {"name": state.name, "resourceVersion": state.resource_version}, **parts}


def workers_changed(
    pod_sets: Iterable[dict[str, Any]], change: Callable[[dict[str, Any]], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``pod_sets`` with the worker pod set changed (all sent: a merge patch replaces the
    list)."""
    return [change(s) if s.get("name") == WORKERS else s for s in pod_sets]


def with_min_count(state: WorkloadState, workers: int) -> dict[str, Any] | None:
    """The patch that lets partial admission start a Workload not yet admitted at ``workers``
    (None: it already may, or asks for no more)."""
    count = state.count(WORKERS)
    if count is None or workers >= count or state.min_count(WORKERS) == workers:
        return None
    pod_sets = workers_changed(state.pod_sets, lambda s: {**s, "minCount": workers})
    return _patch(state, spec={"podSets": pod_sets})


def resize(state: WorkloadState, workers: int) -> dict[str, Any]:
    """The patch that asks ``workers`` of a Workload's worker pod set."""
    pod_sets = workers_changed(state.pod_sets, lambda s: {**s, "count": workers})
    return _patch(state, spec={"podSets": pod_sets})


def read(body: dict[str, Any]) -> WorkloadState:
    """A Workload as a :class:`WorkloadState`."""
    status = body.get("status") or {}
    admission = status.get("admission") or {}
    spec_sets = body.get("spec", {}).get("podSets", [])
    spec_counts = {s["name"]: s.get("count", 1) for s in spec_sets}
    requests = {s["name"]: s.get("topologyRequest") for s in spec_sets}
    # An elastic Workload scaled down in place asks for fewer than its admission still says.
    placements = {
        assignment["name"]: Placement(
            min(
                int(assignment.get("count", spec_counts.get(assignment["name"], 1))),
                int(spec_counts.get(assignment["name"], 1)),
            ),
            tuple(sorted(set((assignment.get("flavors") or {}).values()))),
            (requests.get(assignment["name"]) or {})
            if assignment.get("topologyAssignment")
            else None,
        )
        for assignment in admission.get("podSetAssignments") or []
    }
    metadata = body.get("metadata", {})
    annotations = metadata.get("annotations") or {}
    return WorkloadState(
        pod_sets=tuple(body.get("spec", {}).get("podSets") or []),
        slice_name=annotations.get(SLICE_NAME_ANNOTATION) or metadata.get("name", ""),
        replaces=annotations.get(REPLACEMENT_ANNOTATION),
        created=str(metadata.get("creationTimestamp", "")),
        name=metadata.get("name", ""),
        queue=str(body.get("spec", {}).get("queueName", "")),
        conditions=list(status.get("conditions") or []),
        resource_version=metadata.get("resourceVersion"),
        cluster_queue=admission.get("clusterQueue"),
        placements=placements,
        being_deleted=bool(metadata.get("deletionTimestamp")),
        reclaimable=tuple(
            (str(r.get("name", "")), int(r.get("count", 0)))
            for r in status.get("reclaimablePods") or []
        ),
        priority=Priority.of(body.get("spec") or {}),
        controller_uid=next(
            (
                str(owner.get("uid", ""))
                for owner in metadata.get("ownerReferences") or []
                if owner.get("controller")
            ),
            "",
        ),
        cluster=str(status.get("clusterName") or ""),
        checks=tuple(
            (str(c.get("name", "")), str(c.get("state", "")), str(c.get("message", "")))
            for c in status.get("admissionChecks") or []
        ),
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
    return _patch(state, status={"admission": None, "conditions": conditions})


def reclaim_prepare(state: WorkloadState) -> dict[str, Any] | None:
    """The status patch that gives the prepare pod's quota back once the data is prepared
    (Kueue's ``reclaimablePods``, as jobframework reports a batch Job's finished pods); None
    when the Workload has no prepare pod set or already says so."""
    if state.count(PREPARE) is None or dict(state.reclaimable).get(PREPARE, 0) >= 1:
        return None
    kept = [{"name": name, "count": n} for name, n in state.reclaimable if name != PREPARE]
    return _patch(state, status={"reclaimablePods": [*kept, {"name": PREPARE, "count": 1}]})


def prebuilt_name(job: TrainingJob) -> str | None:
    """The Workload made for the job by someone else (MultiKueue, on a worker cluster), named
    by its label; None for a job that makes its own."""
    name = job.metadata.get("labels", {}).get(PREBUILT_LABEL)
    return str(name) if name else None


def adopt(state: WorkloadState, job: TrainingJob) -> dict[str, Any]:
    """The patch that makes the job its prebuilt Workload's controller, as jobframework's
    ``EnsurePrebuiltWorkloadOwnership`` does: deleting the job deletes the Workload, and the
    Workload's changes reach the job's controller."""
    patch = _patch(state)
    patch["metadata"]["ownerReferences"] = [builders.owner_reference(job)]
    return patch


def move(state: WorkloadState, queue: str) -> dict[str, Any]:
    """The patch that moves a waiting Workload to another LocalQueue (the job's label
    changed), as jobframework does for a suspended job."""
    return _patch(state, spec={"queueName": queue})


OUT_OF_SYNC = "OutOfSync"
"""jobframework's reason for finishing a slice its job no longer follows."""


def finish(
    state: WorkloadState, succeeded: bool, message: str, now: datetime, reason: str = ""
) -> dict[str, Any]:
    """The status patch that marks the Workload Finished: Kueue releases its quota at once."""
    reason = reason or ("Succeeded" if succeeded else "Failed")
    conditions = _set_condition(state.conditions, "Finished", True, reason, message, now)
    return _patch(state, status={"conditions": conditions})
