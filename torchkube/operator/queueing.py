"""Queueing policy: a job with a ``kueue.x-k8s.io/queue-name`` label runs only while Kueue
admits its Workload, at the size and on the ResourceFlavors Kueue admitted.

Kueue decides who runs; this module only follows its Workload, the way Kueue's jobframework
does for the kinds it integrates itself:

* no Workload yet → create it; the job is Queued and creates no pod;
* not admitted → Queued, with Kueue's own words for why (quota, the queue's order) and its
  place in line where Kueue's visibility API reports it; any pod left from before (an
  operator restart, a Workload deleted by hand) is stopped;
* admitted → the job runs, its worker count the admitted count (partial admission may admit
  fewer than ``replicas.max``, never fewer than ``replicas.min``), its pods carrying the node
  labels and tolerations of the ResourceFlavors Kueue assigned;
* evicted (preempted by a higher priority, quota reclaimed, ``spec.active: false``) → the
  workers are stopped as a suspend stops them (SIGTERM: the trainer takes its emergency
  checkpoint), not counted as a failure; once they are gone the Workload gives its quota back
  and Kueue queues it again; admitted again, training resumes from that checkpoint;
* data prepared → the prepare pod's quota is given back (``reclaimablePods``);
* resized, for a job annotated ``kueue.x-k8s.io/elastic-job`` → smaller gives quota back at
  once, larger asks for a new Workload slice that Kueue admits in place of the running one;
* finished → the Workload is marked Finished, so Kueue releases the quota at once.

Where Kueue cannot admit anything the job says so instead of waiting in silence: in a cluster
that does not serve the Workload API (Kueue not installed) it waits, Queued with the reason
``KueueNotInstalled``, and looks again every ``KUEUE_RECHECK_SECONDS``; under an operator
with the Kueue integration off (``kueue.enabled=false``) its label is ignored, with a
warning, and it runs as a job without a queue would.

Time spent Queued is left out of the job's deadlines, as time suspended is.
"""

from typing import Any

from torchkube.api import TrainingJob
from torchkube.api.spec import MANAGED_BY_MULTIKUEUE
from torchkube.api.status import TERMINAL_PHASES, QueueStatus
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator import workloads
from torchkube.operator.decision import CONTINUE, STOP, Context, Step
from torchkube.operator.workloads import QueueObservation, WorkloadState
from torchkube.policy.queue import QUEUE_LABEL, label_ignored, queue_name

RELEASE_QUEUED = "queued"
RELEASE_EVICTED = "evicted"
POSITION_REFRESH_SECONDS = 10.0
"""How often a job waiting for admission reads its place in line again, where Kueue's
visibility API reports one: places move with no change to the job's own Workload."""
KUEUE_RECHECK_SECONDS = 10.0
"""How soon a job waiting for Kueue to be installed looks again: one list request that the
apiserver answers 404 until Kueue's CRDs appear, then the job is queued within this time."""


def admitted_view(job: TrainingJob, observed: QueueObservation | None) -> TrainingJob:
    """The job as the planner should run it: at the worker count Kueue admitted, which
    partial admission may have cut below the target (spares first, then workers)."""
    state = observed.workload if observed else None
    if queue_name(job) is None or state is None or not state.admitted:
        return job
    placement = state.placements.get(workloads.WORKERS)
    if placement is None:
        return job
    replicas = job.spec.replicas
    admitted = placement.count
    if admitted >= replicas.target + replicas.spares:
        return job
    if admitted >= replicas.target:
        cut = replicas.model_copy(update={"spares": admitted - replicas.target})
    else:
        cut = replicas.model_copy(update={"desired": admitted, "spares": 0})
    spec = job.spec.model_copy(update={"replicas": cut})
    return job.model_copy(update={"spec": spec})


def flavors_to_read(job: TrainingJob, observed: QueueObservation) -> set[str]:
    """The ResourceFlavors to read before planning: those of the admitted Workload's
    placements, while the job may create pods here (it runs in this cluster, has not ended
    and is not being deleted); none for a job Kueue has not admitted."""
    state = observed.workload
    if state is None or not state.admitted or job.metadata.get("deletionTimestamp"):
        return set()
    if job.spec.managed_by == MANAGED_BY_MULTIKUEUE:
        return set()
    if job.status is not None and job.status.phase in TERMINAL_PHASES:
        return set()
    return {flavor for placement in state.placements.values() for flavor in placement.flavors}


def place(ctx: Context) -> None:
    """The planning step after every policy that may create pods: the plan's pods go where
    Kueue counted them (:func:`placed`)."""
    if ctx.plan.create_pods:
        ctx.plan.create_pods = placed(ctx.plan.create_pods, ctx.observed.queue)


def placed(pods: list[dict[str, Any]], observed: QueueObservation | None) -> list[dict[str, Any]]:
    """``pods`` with the node labels and tolerations of the ResourceFlavors Kueue assigned to
    their pod set (jobframework's ``podset.Merge``, the flavours read beforehand into
    ``observed.flavors``): the nodes Kueue counted them against; a pod set Kueue placed by
    topology also gated until Kueue names each pod's domain."""
    state = observed.workload if observed else None
    if observed is None or state is None or not state.admitted:
        return pods
    out = []
    for pod in pods:
        placement = state.placements.get(workloads.POD_SET_OF_ROLE.get(p.role(pod), ""))
        if placement is None or pod.get("kind") != "Pod":
            out.append(pod)
            continue
        selector, tolerations = workloads.flavor_constraints(placement, observed.flavors)
        spec = dict(pod["spec"])
        if selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **selector}
        if tolerations:
            present = spec.get("tolerations") or []
            spec["tolerations"] = [*present, *(t for t in tolerations if t not in present)]
        pod = {**pod, "spec": spec}
        if placement.topology is not None:
            name = workloads.POD_SET_OF_ROLE[p.role(pod)]
            pod = workloads.gated_for_topology(pod, state.name, name, placement.topology)
        out.append(pod)
    return out


def hold(ctx: Context) -> Step:
    """STOP while the job must not run (it waits for Kueue, its pods in ``ctx.owned``
    stopped); CONTINUE for a job without a queue or one Kueue admitted, which the other
    policies then run."""
    owned = ctx.owned
    queue = queue_name(ctx.job)
    if queue is None:
        return CONTINUE
    observed = ctx.observed.queue or QueueObservation()
    if observed.kueue == "disabled":
        _ignore_queue(ctx, queue)
        return CONTINUE
    if observed.kueue == "not-installed":
        _wait(ctx, owned, observed, queue, "KueueNotInstalled", _not_installed(queue))
        ctx.plan.requeue(KUEUE_RECHECK_SECONDS)
        return STOP
    state = observed.workload
    prebuilt = workloads.prebuilt_name(ctx.job)
    if prebuilt is not None and _prebuilt_missing(ctx, owned, observed, queue, prebuilt, state):
        return STOP
    if state is None:
        ctx.plan.workload_writes.append(("create", workloads.workload(ctx.job, observed.priority)))
        _wait(
            ctx,
            owned,
            observed,
            queue,
            "Queued",
            f"waiting in LocalQueue {queue}: Workload created",
        )
        return STOP
    if state.admitted and not state.being_deleted:
        _admitted(ctx, queue, state)
        _resize(ctx, state, observed)
        _reclaim(ctx, observed)
        return CONTINUE
    if state.is_true("Evicted"):
        _evicted(ctx, owned, queue, observed, state)
        return STOP
    if state.queue != queue and not state.reserved:
        ctx.plan.workload_writes.append(("spec", workloads.move(state, queue)))
    why = state.message("QuotaReserved") or "Kueue has not considered it yet"
    if state.reserved and state.checks_message():
        why = f"quota reserved; waiting for its admission checks ({state.checks_message()})"
    message = f"waiting in LocalQueue {queue} for admission: {why}"
    _wait(ctx, owned, observed, queue, "Queued", message)
    _reclaim(ctx, observed)
    return STOP


def _prebuilt_missing(
    ctx: Context,
    owned: list[dict[str, Any]],
    observed: QueueObservation,
    queue: str,
    name: str,
    state: WorkloadState | None,
) -> bool:
    """A job that comes with its Workload made (MultiKueue's copy on a worker cluster) runs
    under that one and never makes its own: while it is missing, or another job's, the job
    waits and says so; found unowned, the job adopts it (jobframework's prebuilt
    workloads). True while the job must wait for it."""
    if state is not None and state.controller_uid in ("", ctx.job.uid):
        if not state.controller_uid:
            ctx.plan.workload_writes.append(("spec", workloads.adopt(state, ctx.job)))
        return False
    label = f"{workloads.PREBUILT_LABEL}={name}"
    whose = "does not exist" if state is None else "belongs to another job"
    message = (
        f"waiting for its Workload {name} ({label}), which {whose}: the job runs under that "
        "Workload only (MultiKueue makes it before it sends the job here); it goes on once "
        "the Workload is there, or remove the label to let the job make its own"
    )
    _wait(ctx, owned, observed, queue, "WaitingForWorkload", message)
    return True


def _not_installed(queue: str) -> str:
    return (
        f"waiting in LocalQueue {queue} for Kueue, but Kueue's Workload API "
        f"({workloads.API_GROUP}/{workloads.API_VERSION}) is not served in this cluster "
        f"(Kueue is not installed, or too old): install Kueue "
        f'with "TrainingJob.v1alpha1.torchkube.io" in integrations.externalFrameworks '
        f"(docs/queueing.md), or remove the label {QUEUE_LABEL}={queue} to run the "
        f"job without a queue; it starts queueing by itself once Kueue is installed"
    )


def _ignore_queue(ctx: Context, queue: str) -> None:
    """Kueue integration off: the job runs now; its label is said to be ignored, once."""
    message = (
        label_ignored(
            queue,
            "this operator runs with kueue.enabled=false (TORCHKUBE_KUEUE_ENABLED)",
        )
        + "; to queue it, install the chart with kueue.enabled=true (docs/queueing.md)"
    )
    queued = ctx.condition(cond.QUEUED)
    if queued is None or queued.reason != "QueueingDisabled":
        ctx.event("Warning", "QueueingDisabled", message)
    ctx.set(cond.QUEUED, False, "QueueingDisabled", message)
    ctx.status.queue = None


def _evicted(
    ctx: Context,
    owned: list[dict[str, Any]],
    queue: str,
    observed: QueueObservation,
    state: WorkloadState,
) -> None:
    """Stopped as a suspend stops it; once no pod is active, the quota goes back. A resize
    waiting beside the evicted slice is what the job asks for now: the evicted slice is
    finished and the job waits in the resize's place (jobframework's ``EnsureWorkloadSlices``
    finishes an evicted old slice the same way), which may now admit it from
    ``replicas.min`` as its first Workload could: it is a start, not a resize."""
    evicted = state.condition("Evicted") or {}
    reason = str(evicted.get("reason") or "Evicted")
    message = state.message("Evicted")
    _wait(
        ctx,
        owned,
        observed,
        queue,
        "Preempted" if reason == "Preempted" else "Evicted",
        f"evicted by Kueue ({reason}: {message}); workers stopped with an emergency checkpoint, "
        f"waiting in LocalQueue {queue} to be admitted again",
        why=RELEASE_EVICTED,
    )
    if not state.reserved or _alive(owned):
        return
    waiting = observed.scale_up
    if waiting is not None:
        out_of_date = f"evicted ({reason}); the job waits for its resize {waiting.name}"
        patch = workloads.finish(state, False, out_of_date, ctx.now, workloads.OUT_OF_SYNC)
        ctx.plan.workload_writes.append(("status", patch))
        partial = workloads.with_min_count(waiting, ctx.spec.replicas.min)
        if partial is not None:
            ctx.plan.workload_writes.append(("spec", partial))
    else:
        ctx.plan.workload_writes.append(("status", workloads.release_reservation(state, ctx.now)))


def _alive(owned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods still active as a batch Job counts them (jobframework's ``IsActive``): a pod
    already terminating, writing its emergency checkpoint, does not hold the quota back, and
    one stuck Terminating on a dead node never could."""
    return [pod for pod in owned if p.state(pod) in ("pending", "running")]


def _wait(
    ctx: Context,
    owned: list[dict[str, Any]],
    observed: QueueObservation,
    queue: str,
    reason: str,
    message: str,
    why: str = RELEASE_QUEUED,
) -> None:
    """Queued: no pod, the condition says why, and the place in line where Kueue lists it
    (looked at again while Kueue's visibility API answers: places move when others are
    admitted, with no change to this job's Workload)."""
    for pod in owned:
        if p.state(pod) in ("pending", "running"):
            ctx.plan.delete(pod, why=why)
    queued = ctx.condition(cond.QUEUED)
    waiting = queued is not None and queued.status == "True" and queued.reason == reason
    if ctx.status.phase != "Queued" or not waiting:
        kind = "Warning" if reason in ("Preempted", "Evicted", "KueueNotInstalled") else "Normal"
        ctx.event(kind, reason, message)
    ctx.status.phase = "Queued"
    ctx.set(cond.QUEUED, True, reason, message)
    ctx.clear(cond.RUNNING, reason, message)
    state = observed.workload
    place = observed.position
    ctx.status.queue = QueueStatus(
        name=queue,
        workload=state.name if state else workloads.workload_name(ctx.job),
        cluster_queue=None,
        admitted_workers=None,
        position_in_local_queue=place.local_queue if place else None,
        position_in_cluster_queue=place.cluster_queue if place else None,
    )
    if observed.places_served:
        ctx.plan.requeue(POSITION_REFRESH_SECONDS)
    ctx.status.replicas = ctx.status.ready_replicas = 0
    ctx.status.workers = f"0/{ctx.spec.replicas.target}"
    ctx.status.spares = 0


def _resize(ctx: Context, state: WorkloadState, observed: QueueObservation) -> None:
    """An elastic job resized under quota, the way Kueue's workload slices work: fewer
    workers give quota back at once (the admitted Workload asks for fewer, in place); more
    ask Kueue for a new slice, admitted in place of the running one when the quota allows,
    while the job goes on at the size it has. A job that partial admission started below its
    target asks for the rest the same way, so it grows once the quota frees; one asked for
    fewer than its admitted Workload's ``minCount`` (fixed while admitted; ``replicas.min``
    lowered since) gets a new slice too, admitted in the queue's order into the quota the
    old slice frees.

    A new slice asks whole (no ``minCount``): partially admitted at the size the job
    already has, it would replace the running slice without growing it, and the job would
    ask again at once, for ever."""
    placement = state.placements.get(workloads.WORKERS)
    admitted = placement.count if placement else state.count(workloads.WORKERS)
    wanted = observed.wanted_workers
    if not workloads.elastic(ctx.job) or admitted is None or not wanted:
        return
    waiting = observed.scale_up
    in_place = wanted <= admitted and wanted >= (state.min_count(workloads.WORKERS) or 0)
    if in_place:
        if wanted < admitted:
            ctx.plan.workload_writes.append(("spec", workloads.resize(state, wanted)))
        if waiting is not None:
            withdrawn = f"resize withdrawn: the job wants {wanted} workers again"
            ctx.plan.workload_writes.append(
                ("status", workloads.finish(waiting, False, withdrawn, ctx.now))
            )
        return
    if waiting is None:
        body = workloads.workload(ctx.job, state.priority, replaces=state)
        body["spec"]["podSets"] = workloads.workers_changed(
            body["spec"]["podSets"],
            lambda s: {k: v for k, v in s.items() if k != "minCount"} | {"count": wanted},
        )
        ctx.plan.workload_writes.append(("create", body))
        reason = "ScaleUpQueued" if wanted > admitted else "ScaleDownQueued"
        ctx.event("Normal", reason, f"asking Kueue for {wanted} workers ({admitted} admitted)")
    elif waiting.count(workloads.WORKERS) != wanted and not waiting.reserved:
        ctx.plan.workload_writes.append(("spec", workloads.resize(waiting, wanted)))


def _reclaim(ctx: Context, observed: QueueObservation) -> None:
    """The prepare pod runs once, before the workers: once the data is prepared its quota
    goes back to the queue for the rest of the job's run, from the admitted Workload and
    from a resize's slice still waiting (which then asks for no more than it needs). A
    Workload this plan already writes is left for the next reconcile: both writes would
    carry the same resourceVersion."""
    data = ctx.status.data
    if data is None or data.phase != "Prepared":
        return
    written = {body["metadata"]["name"] for _, body in ctx.plan.workload_writes}
    for state in (observed.workload, observed.scale_up):
        if state is None or state.name in written or state.is_true("Finished"):
            continue
        patch = workloads.reclaim_prepare(state)
        if patch is not None:
            ctx.plan.workload_writes.append(("status", patch))


def _admitted(ctx: Context, queue: str, state: WorkloadState) -> None:
    placement = state.placements.get(workloads.WORKERS)
    workers = placement.count if placement else ctx.spec.replicas.target
    message = f"admitted by ClusterQueue {state.cluster_queue} at {workers} workers"
    queued = ctx.condition(cond.QUEUED)
    if queued is not None and queued.status == "True":
        waited = ctx.seconds_since(queued.last_transition_time) or 0.0
        ctx.status.suspended_seconds = round(ctx.status.suspended_seconds + max(waited, 0.0), 3)
        ctx.event("Normal", "Admitted", message)
    ctx.set(cond.QUEUED, False, "Admitted", message)
    ctx.status.queue = QueueStatus(
        name=queue, workload=state.name, cluster_queue=state.cluster_queue, admitted_workers=workers
    )


def finish(ctx: Context) -> None:
    """A finished job's Workload is marked Finished (once): Kueue releases its quota."""
    state = ctx.observed.queue.workload if ctx.observed.queue else None
    if queue_name(ctx.job) is None or state is None or state.is_true("Finished"):
        return
    if state.being_deleted:
        return
    finished = ctx.condition(ctx.status.phase)
    message = finished.message if finished else f"the TrainingJob {ctx.status.phase.lower()}"
    succeeded = ctx.status.phase == "Succeeded"
    waiting = ctx.observed.queue.scale_up if ctx.observed.queue else None
    for slice_ in (state, waiting):
        if slice_ is not None and not slice_.is_true("Finished"):
            patch = workloads.finish(slice_, succeeded, message, ctx.now)
            ctx.plan.workload_writes.append(("status", patch))


def job_key_of(workload: dict[str, Any]) -> tuple[str, str] | None:
    """The TrainingJob that owns a Workload (None: not one of ours)."""
    metadata = workload.get("metadata", {})
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("kind") == "TrainingJob" and owner.get("controller"):
            return str(metadata.get("namespace", "")), str(owner.get("name", ""))
    return None


def finalizer_to_remove(workload: dict[str, Any]) -> bool:
    """A Workload of ours being deleted (its job deleted, or someone deleted it) keeps Kueue's
    finalizer until the job's controller removes it, as jobframework does: it is over."""
    metadata = workload.get("metadata", {})
    return (
        job_key_of(workload) is not None
        and bool(metadata.get("deletionTimestamp"))
        and workloads.FINALIZER in (metadata.get("finalizers") or [])
    )
