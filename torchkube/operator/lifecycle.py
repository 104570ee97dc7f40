"""Life-cycle policy: suspension, deadlines, a start that can never happen, success,
clean-up and time-to-live.

Each step takes the planning :class:`~torchkube.operator.decision.Context`, writes what it
decides into it, and either settles the pass (``STOP``) or leaves the job to the next policy
(``CONTINUE``).
"""

from datetime import timedelta
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.contract import TRAINING_FINISHED, finished_step
from torchkube.api.spec import BUILTIN_TRAINER_COMMAND
from torchkube.api.status import TERMINAL_PHASES
from torchkube.api.times import parse_time
from torchkube.operator import conditions as cond
from torchkube.operator import phase
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, STOP, Context, Step

KEEP_FAILED_PODS = 5
"""Failed worker pods kept for ``kubectl logs``; older ones are deleted."""

RELEASE_FINISHED = "finished"
RELEASE_SUSPENDED = "suspended"


def is_being_deleted(ctx: Context) -> bool:
    """A job being deleted creates nothing: garbage collection is removing its children
    (with foreground deletion, before the job itself), and recreating them would hold the
    deletion up for ever."""
    return bool(ctx.job.metadata.get("deletionTimestamp"))


def is_finished(ctx: Context) -> bool:
    return ctx.status.phase in TERMINAL_PHASES


def clean_up_finished(ctx: Context) -> None:
    """After the end: delete pods per ``cleanPodPolicy`` (the store and the Lighthouse always),
    and the job itself once ``ttlSecondsAfterFinished`` has passed."""
    policy = ctx.spec.run_policy.clean_pod_policy
    for pod in ctx.owned:
        state = p.state(pod)
        if state == "deleting":
            continue
        is_server = p.role(pod) in (lbl.ROLE_RENDEZVOUS, lbl.ROLE_LIGHTHOUSE)
        if (
            policy == "All"
            or is_server
            or (policy == "Running" and state in ("pending", "running"))
        ):
            ctx.plan.delete(pod, why=RELEASE_FINISHED)
    ttl = ctx.spec.run_policy.ttl_seconds_after_finished
    finished = parse_time(ctx.status.completion_time)
    if ttl is not None and finished is not None:
        remaining = (finished + timedelta(seconds=ttl) - ctx.now).total_seconds()
        if remaining <= 0:
            ctx.plan.delete_job = True
        else:
            ctx.plan.requeue(remaining)


def _suspended_since(ctx: Context) -> float:
    """Seconds the current suspension has lasted (0 when not suspended)."""
    condition = ctx.condition(cond.SUSPENDED)
    if condition is None or condition.status != "True":
        return 0.0
    return max(0.0, ctx.seconds_since(condition.last_transition_time) or 0.0)


def suspend(ctx: Context) -> Step:
    """``runPolicy.suspend``: no pods, checkpoints kept. A suspension resets the active
    deadline's clock (``status.lastStartTime``); on resume the time spent suspended is added
    to ``status.suspendedSeconds``, which the start deadline leaves out."""
    if ctx.spec.run_policy.suspend:
        ctx.status.last_start_time = None
        for pod in ctx.owned:
            if p.state(pod) in ("pending", "running"):
                ctx.plan.delete(pod, why=RELEASE_SUSPENDED)
        if ctx.status.phase != "Suspended":
            ctx.event("Normal", "Suspended", "job suspended: workers deleted, checkpoints kept")
        ctx.status.phase = "Suspended"
        ctx.set(cond.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true")
        ctx.clear(cond.RUNNING, "Suspended", "job is suspended")
        ctx.status.replicas = ctx.status.ready_replicas = 0
        ctx.status.workers = f"0/{ctx.spec.replicas.target}"
        ctx.clear(cond.WAITING_FOR_WORKERS, "Suspended", "job is suspended")
        return STOP
    if ctx.is_true(cond.SUSPENDED):
        ctx.status.last_start_time = None
        spent = _suspended_since(ctx)
        ctx.status.suspended_seconds = round(ctx.status.suspended_seconds + spent, 3)
        ctx.set(
            cond.SUSPENDED,
            False,
            "Resumed",
            "job resumed; training continues from the latest checkpoint",
        )
        ctx.event("Normal", "Resumed", "job resumed from the latest checkpoint")
    return CONTINUE


def prune_failed(ctx: Context) -> Step:
    """Failed workers (``ctx.pods.failed``) are kept for ``kubectl logs``, the newest
    ``KEEP_FAILED_PODS``."""
    kept = sorted(ctx.pods.failed, key=lambda pod: p.created(pod) or ctx.now, reverse=True)
    for pod in kept[KEEP_FAILED_PODS:]:
        if p.state(pod) != "deleting":
            ctx.plan.delete(pod)
    return CONTINUE


def deadlines(ctx: Context) -> Step:
    """STOP when the job just failed a deadline.

    ``activeDeadlineSeconds`` counts from ``status.lastStartTime``, when the job first ran
    (``phase.derive``, ``phase.active_since``) since the creation or the last resume: a
    Kubernetes Job's timer is stopped and reset by a suspension, and a job queued suspended
    (Kueue) gets its whole deadline once it runs. ``startDeadlineSeconds`` counts from the
    creation, without the time spent suspended."""
    policy = ctx.spec.run_policy
    suspended = ctx.status.suspended_seconds
    since = phase.active_since(ctx)
    running = ctx.seconds_since(since)
    if policy.active_deadline_seconds is not None and running is not None:
        remaining = policy.active_deadline_seconds - running
        if remaining <= 0:
            ctx.finish(
                "Failed",
                "DeadlineExceeded",
                f"job ran longer than runPolicy.activeDeadlineSeconds "
                f"({policy.active_deadline_seconds}s since it started at {since}; a "
                "suspension resets this clock)",
            )
            return STOP
        ctx.plan.requeue(remaining)
    started = ctx.seconds_since(ctx.status.start_time)
    created = ctx.seconds_since(ctx.job.metadata.get("creationTimestamp"))
    if policy.start_deadline_seconds is not None and started is None and created is not None:
        remaining = policy.start_deadline_seconds - (created - suspended)
        if remaining <= 0:
            waits = (cond.PODS_BLOCKED, cond.PODS_UNSCHEDULABLE)
            blocked = next((c for c in map(ctx.condition, waits) if c and c.status == "True"), None)
            why = f": {blocked.message}" if blocked else ""
            ctx.finish(
                "Failed",
                "StartDeadlineExceeded",
                f"replicas.min ({ctx.spec.replicas.min}) workers and the rendezvous store did "
                f"not run within runPolicy.startDeadlineSeconds "
                f"({policy.start_deadline_seconds}s){why}",
            )
            return STOP
        ctx.plan.requeue(remaining)
    return CONTINUE


def fail_unstartable(ctx: Context) -> Step:
    """An image name that can never be pulled fails a job that has not started at once (the
    image is immutable): STOP. Everything else that blocks a start waits for
    startDeadlineSeconds."""
    if ctx.status.phase != "Pending" and ctx.status.start_time:
        return CONTINUE
    for pod in ctx.pods.workers:
        blocked = p.blocked_reason(pod)
        if blocked is not None and blocked[0] == "InvalidImageName":
            ctx.finish(
                "Failed",
                "InvalidImageName",
                f"image {ctx.spec.image!r} is not a valid image reference: {blocked[1]}",
            )
            return STOP
    return CONTINUE


def finished_training(ctx: Context, pod: dict[str, Any]) -> bool:
    """Whether a worker that exited 0 ended the training, not just its torchrun agent.

    The built-in trainer says so in its termination message; an agent can also exit 0 when
    its rendezvous closes early, and taking that for success would end a job half-way. A
    custom command has no such message, so its exit 0 is trusted.
    """
    if ctx.spec.command != BUILTIN_TRAINER_COMMAND:
        return True
    return TRAINING_FINISHED in p.termination_message(pod)


def succeed(ctx: Context) -> Step:
    """A worker finished training (``ctx.pods.succeeded``): pending workers go; the job
    succeeds once none runs, and nothing else is planned meanwhile (STOP) but the replica
    counts: the workers still running, none once the job succeeded."""
    succeeded, live = ctx.pods.succeeded, ctx.pods.workers
    if not succeeded:
        return CONTINUE
    for pod in live:
        if p.state(pod) == "pending":
            ctx.plan.delete(pod, why=RELEASE_FINISHED)
    if not any(p.state(pod) == "running" for pod in live):
        progress = ctx.status.progress
        reported = [finished_step(p.termination_message(pod)) for pod in succeeded]
        final = max((step for step in reported if step is not None), default=None)
        if final is not None and progress is not None:
            ctx.status.progress = progress.model_copy(update={"step": final})
        steps = final if final is not None else (progress.step if progress else None)
        detail = f" after {steps} steps" if steps else ""
        ctx.finish("Succeeded", "TrainingCompleted", f"training completed{detail}")
    phase.count_replicas(ctx, [] if is_finished(ctx) else live)
    return STOP
