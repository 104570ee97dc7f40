"""Phase policy: from the sorted pods to ``status.phase``, the replica counts, and the
conditions that say why workers are not running (unschedulable, blocked).
"""

from datetime import timedelta
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.times import format_time
from torchkube.operator import conditions as cond
from torchkube.operator import lifecycle
from torchkube.operator import pods as p
from torchkube.operator.decision import Context


def report_unschedulable(ctx: Context, workers: list[dict[str, Any]]) -> None:
    timeout = timedelta(seconds=ctx.spec.scheduling.pending_timeout_seconds)
    stuck: list[str] = []
    for pod in workers:
        message = p.unschedulable_message(pod)
        if message is None:
            continue
        born = p.created(pod) or ctx.now
        if born + timeout <= ctx.now:
            stuck.append(message)
        else:
            ctx.plan.requeue((born + timeout - ctx.now).total_seconds())
    if stuck:
        text = (
            f"{len(stuck)} of {ctx.spec.replicas.target} workers cannot be scheduled for "
            f"{int(timeout.total_seconds())}s or more: {stuck[0]}"
        )
        ctx.warn_once(cond.PODS_UNSCHEDULABLE, "Unschedulable", text)
    else:
        ctx.clear(cond.PODS_UNSCHEDULABLE, "Scheduled", "all workers are scheduled")


def blocked_pods(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the first pod that cannot start by itself, if any."""
    for pod in pods:
        blocked = p.blocked_reason(pod)
        if blocked is not None:
            reason, message = blocked
            role = "rendezvous store" if p.role(pod) == lbl.ROLE_RENDEZVOUS else "worker"
            return reason, f"{role} pod {p.name(pod)}: {reason}: {message}".strip()
    return None


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


def report_blocked(ctx: Context, problem: tuple[str, str] | None) -> None:
    """``PodsBlocked``: what keeps pods from starting, so a job that cannot start says so
    (``kubectl describe`` and a Warning event) instead of sitting Pending in silence."""
    if problem is None:
        ctx.clear(cond.PODS_BLOCKED, "NotBlocked", "nothing keeps the pods from starting")
        return
    reason, message = problem
    ctx.warn_once(cond.PODS_BLOCKED, reason, message)


def derive(ctx: Context, workers: list[dict[str, Any]]) -> None:
    running = [pod for pod in workers if p.state(pod) == "running"]
    minimum = ctx.spec.replicas.min
    ctx.plan.all_running = len(running) == ctx.spec.replicas.pods
    if len(running) >= minimum:
        if ctx.status.phase != "Running":
            ctx.event("Normal", "Running", f"{len(running)} workers running")
        ctx.status.phase = "Running"
        ctx.status.start_time = ctx.status.start_time or format_time(ctx.now)
        ctx.status.last_start_time = lifecycle.active_since(ctx) or format_time(ctx.now)
        ctx.set(cond.RUNNING, True, "WorkersRunning", f"{len(running)} workers running")
        ctx.clear(cond.RESTARTING, "WorkersRunning", "enough workers are running")
    elif ctx.status.start_time:
        ctx.status.phase = "Restarting"
        text = f"{len(running)} of at least {minimum} workers running; waiting for replacements"
        ctx.set(cond.RESTARTING, True, "WaitingForWorkers", text)
        ctx.set(cond.RUNNING, False, "WaitingForWorkers", text)
    else:
        ctx.status.phase = "Pending"


def counts(ctx: Context, workers: list[dict[str, Any]]) -> None:
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
