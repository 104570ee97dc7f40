"""Phase policy: from the sorted pods to ``status.phase``, the replica counts, and the
conditions that say why the workers, the rendezvous store or (recovery live) the Lighthouse
are not running (unschedulable, blocked, a server that does not serve).
"""

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.times import format_time
from torchkube.api.worker_launch import fewest_training_workers, live
from torchkube.operator import children, refusals, topology
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, Context, Step


def _stuck(
    ctx: Context, pods: list[dict[str, Any]], timeout: timedelta
) -> list[tuple[dict[str, Any], str]]:
    """(pod, the scheduler's message) for pods unschedulable for ``timeout`` or more; a
    requeue for when the others would be."""
    stuck: list[tuple[dict[str, Any], str]] = []
    for pod in pods:
        message = p.unschedulable_message(pod)
        if message is None:
            continue
        born = p.created(pod) or ctx.now
        if born + timeout <= ctx.now:
            stuck.append((pod, message))
        else:
            ctx.plan.requeue((born + timeout - ctx.now).total_seconds())
    return stuck


def report_unschedulable(ctx: Context) -> Step:
    """``PodsUnschedulable``: workers, the rendezvous store or the Lighthouse, that the
    scheduler could not place for ``scheduling.pendingTimeoutSeconds``. The servers come
    first: without them no worker trains, however many run."""
    pods = ctx.pods
    workers, stores, lighthouses = pods.workers, pods.live_stores, pods.live_lighthouses
    timeout = timedelta(seconds=ctx.spec.scheduling.pending_timeout_seconds)
    waited = int(timeout.total_seconds())
    stuck_workers = _stuck(ctx, workers, timeout)
    stuck_store = _stuck(ctx, stores, timeout)
    stuck_lighthouse = _stuck(ctx, lighthouses, timeout)
    placement = (
        "give it a node with rendezvous.store.nodeSelector, .tolerations and .resources (it "
        "takes none of the workers' nodeSelector or affinity)"
    )
    if stuck_store and not any(p.serving(pod) for pod in stores):
        pod, message = stuck_store[0]
        text = (
            f"the rendezvous store pod {p.name(pod)} cannot be scheduled for {waited}s or "
            f"more: {message.rstrip('. ')}. No worker trains until it runs: {placement}"
        )
        ctx.warn_once(cond.PODS_UNSCHEDULABLE, "StoreUnschedulable", text)
    elif stuck_lighthouse and not any(p.serving(pod) for pod in lighthouses):
        pod, message = stuck_lighthouse[0]
        text = (
            f"the Lighthouse pod {p.name(pod)} cannot be scheduled for {waited}s or more: "
            f"{message.rstrip('. ')}. No replica group trains until it runs (it forms every "
            f"step's quorum): {placement}; it is placed like the store"
        )
        ctx.warn_once(cond.PODS_UNSCHEDULABLE, "LighthouseUnschedulable", text)
    elif stuck_workers:
        why, hint = stuck_workers[0][1], topology.unschedulable_hint(ctx.job, workers, ctx.nodes)
        text = (
            f"{len(stuck_workers)} of {ctx.spec.replicas.target} workers cannot be scheduled "
            f"for {waited}s or more: {why.rstrip('. ') + hint if hint else why}"
        )
        ctx.warn_once(cond.PODS_UNSCHEDULABLE, "Unschedulable", text)
    else:
        ctx.clear(cond.PODS_UNSCHEDULABLE, "Scheduled", "all pods are scheduled")
    return CONTINUE


def blocked_pods(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the first pod that cannot start by itself, if any."""
    for pod in pods:
        blocked = p.blocked_reason(pod)
        if blocked is None:
            continue
        reason, message = blocked
        role = p.role(pod)
        if role not in SERVERS:
            return reason, f"worker pod {p.name(pod)}: {reason}: {message}".strip()
        what, needs = SERVERS[role]
        text = f"{what} pod {p.name(pod)}: {reason}: {message}".strip()
        if reason == "CrashLoopBackOff":
            code = p.last_termination(pod).get("exitCode")
            exited = f"it exited with code {code}" if code is not None else "it keeps exiting"
            text += f"; {exited}, see kubectl logs {p.name(pod)} --previous. {needs}"
        return reason, text
    return None


SERVERS = {
    lbl.ROLE_RENDEZVOUS: (
        "rendezvous store",
        "Its image (rendezvous.store.image, default the job's) must have torch and torchkube "
        "installed: it runs python -m torchkube.elastic.store",
    ),
    lbl.ROLE_LIGHTHOUSE: (
        "Lighthouse",
        "Its image (the job's) must have torchft and torchkube installed: it runs python -m "
        "torchkube.elastic.lighthouse",
    ),
}
"""What each server pod is called, and what its crash loop asks of its image."""


def store_problem(stores: list[dict[str, Any]]) -> str | None:
    """Why no rendezvous store serves (None: one does). The workers' agents reach each other
    only through it: without it they wait, whatever their pods' phase."""
    if not stores:
        return "no rendezvous store pod exists yet; the operator creates one"
    return _server_problem(stores, "rendezvous store")


def lighthouse_problem(lighthouses: Sequence[dict[str, Any]]) -> str | None:
    """recovery live: why no Lighthouse serves (None: one does)."""
    if not lighthouses:
        return "no Lighthouse pod runs; the operator creates one"
    return _server_problem(lighthouses, "Lighthouse")


def _server_problem(pods: Sequence[dict[str, Any]], what: str) -> str | None:
    if any(p.serving(pod) for pod in pods):
        return None
    pod = pods[0]
    blocked = p.blocked_reason(pod)
    unschedulable = p.unschedulable_message(pod)
    if blocked is not None:
        why = blocked[0]
    elif unschedulable is not None:
        why = f"unschedulable: {unschedulable}"
    else:
        why = "Running, not Ready yet" if p.state(pod) == "running" else "Pending"
    return f"the {what} pod {p.name(pod)} is not serving ({why})"


STORE_NOT_NEEDED = (
    "; recovery live: the replica groups train on without it (each pod's torchrun world needs "
    "it only to start its workers: a group that restarts its workers, and a new pod, wait "
    "for it)"
)
LIGHTHOUSE_NEEDED = (
    ". Every step of every replica group begins with a quorum it forms: the groups wait at "
    "their next quorum until a Lighthouse serves, and nothing restarts from a checkpoint. "
    "Unblocked by a Lighthouse running and Ready: the operator creates a missing one; an "
    "unschedulable one needs a node (rendezvous.store's placement), a crash-looping one an "
    "image with torchft"
)


NOT_STARTED_AFTER = timedelta(minutes=5)
"""How long a worker's trainer may run before its startup probe passes. The probe waits for
the launcher's announcement that its worker server has imported torch: seconds on a warm
node, a minute on a cold one; five minutes is something else."""


def not_started(ctx: Context, workers: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) for a worker whose trainer runs but never passed its startup probe.

    Such a pod trains, yet is never Ready nor counted as a spare, and ``workers`` reads 0/N:
    an image whose torchkube predates the operator's (its launcher never announces that
    workers start warm), or a worker server stuck in its imports. Without this the job looks
    stuck while it trains."""
    for pod in workers:
        if p.state(pod) != "running" or p.is_started(pod):
            continue
        since = p.running_since(pod)
        if since is None:
            continue
        due = since + NOT_STARTED_AFTER
        if due > ctx.now:
            ctx.plan.requeue((due - ctx.now).total_seconds())
            continue
        minutes = int((ctx.now - since).total_seconds() // 60)
        return "NotStarted", (
            f"worker pod {p.name(pod)}: its trainer has run {minutes} min without passing its "
            "startup probe (the launcher announces that its workers start warm): the image's "
            "torchkube is older than the operator's, or its worker server is stuck importing "
            f"(kubectl logs {p.name(pod)}). The pod trains, but is not Ready and not counted "
            "as a spare; build the trainer image from the operator's release"
        )
    return None


def report_blocked(ctx: Context) -> Step:
    """``PodsBlocked``: what keeps pods from starting, so a job that cannot start says so
    (``kubectl describe`` and a Warning event) instead of sitting Pending in silence. The
    first of: a create the apiserver refuses, a pod that cannot start by itself, a trainer
    that never passed its startup probe, the checkpoint claim left unbound."""
    pods = ctx.pods
    workers = pods.workers
    running = any(p.state(pod) == "running" for pod in workers)
    problem = (
        refusals.problem(ctx)
        or blocked_pods([*workers, *pods.live_stores, *pods.live_lighthouses])
        or not_started(ctx, workers)
        or children.claim_problem(ctx, ctx.observed.children, running)
    )
    if problem is None:
        ctx.clear(cond.PODS_BLOCKED, "NotBlocked", "nothing keeps the pods from starting")
        return CONTINUE
    reason, message = problem
    ctx.warn_once(cond.PODS_BLOCKED, reason, message)
    return CONTINUE


def derive(ctx: Context) -> Step:
    """``Running`` takes the workers that train (``replicas.min``; one replica group in
    live recovery, where survivors train on) *and* a serving store (and, in live recovery, a
    serving Lighthouse): a job whose store never runs has not started
    (``startDeadlineSeconds`` applies), and one whose store is lost after the start is
    ``Restarting`` until a store serves again — but for a live job, whose groups train on
    without the store once started, and wait at their next quorum without the Lighthouse."""
    pods = ctx.pods
    workers, stores, lighthouses = pods.workers, pods.live_stores, pods.live_lighthouses
    running = [pod for pod in workers if p.state(pod) == "running"]
    minimum = fewest_training_workers(ctx.job)
    no_store = store_problem(stores)
    trains_without_store = live(ctx.job) and bool(ctx.status.start_time)
    waits: tuple[str, str] | None = None
    if no_store is None:
        ctx.set(cond.STORE_READY, True, "Serving", "the rendezvous store serves")
    elif trains_without_store:
        ctx.set(cond.STORE_READY, False, "NotServing", no_store + STORE_NOT_NEEDED)
    else:
        ctx.set(cond.STORE_READY, False, "NotServing", no_store)
        waits = ("WaitingForStore", no_store)
    if live(ctx.job):
        no_lighthouse = _lighthouse_ready(ctx, lighthouses)
        if waits is None and no_lighthouse is not None:
            waits = ("WaitingForLighthouse", no_lighthouse)
    ctx.plan.all_running = len(running) == ctx.spec.replicas.pods
    if ctx.plan.all_running:
        ctx.plan.all_running_at = p.last_seen_running(running)
    if len(running) >= minimum and waits is not None:
        if ctx.status.start_time:
            reason, problem = waits
            text = f"{len(running)} workers running, but {problem}; they wait for it"
            _restarting(ctx, reason, text)
        else:
            ctx.status.phase = "Pending"
    elif len(running) >= minimum:
        if ctx.status.phase != "Running":
            ctx.event("Normal", "Running", f"{len(running)} workers running")
        ctx.status.phase = "Running"
        ctx.status.start_time = ctx.status.start_time or format_time(ctx.now)
        ctx.status.last_start_time = active_since(ctx) or format_time(ctx.now)
        ctx.set(cond.RUNNING, True, "WorkersRunning", _running_message(ctx, len(running)))
        ctx.clear(cond.RESTARTING, "WorkersRunning", "enough workers are running")
    elif ctx.status.start_time:
        text = f"{len(running)} of at least {minimum} workers running; waiting for replacements"
        _restarting(ctx, "WaitingForWorkers", text)
    else:
        ctx.status.phase = "Pending"
    return CONTINUE


def active_since(ctx: Context) -> str | None:
    """When the job last started running (:func:`derive` keeps ``status.lastStartTime``; the
    active deadline counts from it): ``status.lastStartTime``, or, in a status written before
    that field, the first start of a job that was never suspended."""
    if ctx.status.last_start_time is not None or ctx.condition(cond.SUSPENDED) is not None:
        return ctx.status.last_start_time
    return ctx.status.start_time


def _lighthouse_ready(ctx: Context, lighthouses: Sequence[dict[str, Any]]) -> str | None:
    """``LighthouseReady``, and a Warning event when a Lighthouse that served is lost; why
    none serves (None: one does)."""
    problem = lighthouse_problem(lighthouses)
    if problem is None:
        text = "the Lighthouse serves: it forms every step's quorum of the replica groups"
        ctx.set(cond.LIGHTHOUSE_READY, True, "Serving", text)
        return None
    if ctx.is_true(cond.LIGHTHOUSE_READY):
        ctx.event("Warning", "LighthouseLost", problem + LIGHTHOUSE_NEEDED)
    ctx.set(cond.LIGHTHOUSE_READY, False, "NotServing", problem + LIGHTHOUSE_NEEDED)
    return problem


def _running_message(ctx: Context, running: int) -> str:
    short = ctx.spec.replicas.target - running
    if not live(ctx.job) or short <= 0:
        return f"{running} workers running"
    return (
        f"{running} of {ctx.spec.replicas.target} replica groups running (recovery live): they "
        f"train on with the whole global batch while {short} more start and join from them"
    )


def _restarting(ctx: Context, reason: str, text: str) -> None:
    """A job that ran and now waits: Restarting, and not Running, for the same reason."""
    ctx.status.phase = "Restarting"
    ctx.set(cond.RESTARTING, True, reason, text)
    ctx.set(cond.RUNNING, False, reason, text)


def counts(ctx: Context) -> Step:
    """The replica counts of the job's live workers (:func:`count_replicas`)."""
    count_replicas(ctx, ctx.pods.workers)
    return CONTINUE


def count_replicas(ctx: Context, workers: list[dict[str, Any]]) -> None:
    """Replica counts for ``kubectl get`` and the scale subresource, and the spares: Running,
    warm worker pods beyond the target stand by (the rendezvous takes at most ``max`` into a
    round, and the target is ``max`` whenever spares are set). A spare still importing torch
    (its container not ``started``) would take a place only after that import: not counted."""
    ready = sum(1 for pod in workers if p.is_ready(pod))
    target = ctx.spec.replicas.target
    warm = sum(1 for pod in workers if p.state(pod) == "running" and p.is_started(pod))
    ctx.status.spares = min(ctx.spec.replicas.spares, max(0, warm - target))
    ctx.status.replicas = len(workers)
    ctx.status.ready_replicas = ready
    ctx.status.desired_replicas = target
    ctx.status.workers = f"{ready}/{target}"
    ctx.status.selector = lbl.worker_selector(ctx.job.name)
