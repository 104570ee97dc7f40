"""The reconciler's brain: from what is observed to what should be done, with no I/O.

``plan()`` is a pure function of the job, its pods, the nodes' health, the trainer's last
report and the clock. The handlers feed it from watch caches and carry out the returned
``Plan``; because it is level-triggered (it looks at the world, not at the event that woke
it), an operator restart in the middle of a failure simply plans the same thing again.

Order of the steps, each a small function below:
  finished job → clean-up and TTL; suspended → no pods; deadline; classify the pods;
  new failures → permanent? fail : record, back off, replace; success; scale to the desired
  count; keep the rendezvous store; report unschedulable pods; derive phase and status.
"""

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from torchkube.api import TrainingJob
from torchkube.api.spec import BUILTIN_TRAINER_COMMAND
from torchkube.api.status import MAX_FAILURE_HISTORY, TERMINAL_PHASES
from torchkube.elastic import TRAINING_FINISHED
from torchkube.operator import builders
from torchkube.operator import conditions as cond
from torchkube.operator import labels as lbl
from torchkube.operator import pods as p

KEEP_FAILED_PODS = 5
"""Failed worker pods kept for ``kubectl logs``; older ones are deleted."""


def random_suffix() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    job: TrainingJob
    pods: list[dict[str, Any]]
    nodes: dict[str, p.NodeHealth]
    now: datetime
    progress: dict[str, Any] | None = None
    self_deleted: frozenset[str] = frozenset()
    """Pods this operator process deleted itself (not failures, whatever they look like)."""


@dataclass
class Plan:
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[tuple[str, bool]] = field(default_factory=list)
    """(pod name, force): force skips the grace period, for pods on a lost node."""
    mark_recorded: list[str] = field(default_factory=list)
    ensure_children: bool = False
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    failures: list[p.Failure] = field(default_factory=list)
    all_running: bool = False
    """Every desired worker is Running (start-up and recovery are timed to this moment)."""

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def delete(self, pod: dict[str, Any], force: bool = False) -> None:
        if all(name != p.name(pod) for name, _ in self.delete_pods):
            self.delete_pods.append((p.name(pod), force))


@dataclass
class _Pods:
    """The job's pods, sorted into what the reconciler acts on."""

    live_workers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    live_stores: list[dict[str, Any]] = field(default_factory=list)
    succeeded: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    new_failures: list[tuple[dict[str, Any], bool]] = field(default_factory=list)
    """(pod, on a lost node) for failures not yet counted."""
    lost_stores: list[dict[str, Any]] = field(default_factory=list)
    deleting: list[dict[str, Any]] = field(default_factory=list)


class _Context:
    def __init__(self, observed: Observed, new_suffix: Callable[[], str]) -> None:
        self.job = observed.job
        self.spec = observed.job.spec
        self.now = observed.now
        self.nodes = observed.nodes
        self.generation = observed.job.metadata.get("generation")
        self.new_suffix = new_suffix
        status = observed.job.status
        self.status: dict[str, Any] = status.to_wire() if status else {}
        self.conditions: list[dict[str, Any]] = list(self.status.get("conditions", []))
        self.plan = Plan()
        self.recorded = {f["pod"] for f in self.status.get("failures", []) if f.get("pod")}

    def set(self, kind: str, status: bool, reason: str, message: str) -> None:
        self.conditions = cond.set_condition(
            self.conditions, kind, status, reason, message, self.now, self.generation
        )

    def clear(self, kind: str, reason: str, message: str = "") -> None:
        self.conditions = cond.clear(
            self.conditions, kind, reason, message, self.now, self.generation
        )

    def event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def node_lost_deadline(self, node: str | None) -> datetime | None:
        """When a pod on ``node`` counts as lost: now if the node is gone, after the grace
        once it stopped being Ready, never while it is Ready."""
        if node is None:
            return None
        health = self.nodes.get(node)
        if health is None:
            return self.now
        if health.ready:
            return None
        grace = timedelta(seconds=self.spec.failure_policy.node_lost_grace_seconds)
        return (health.since or self.now) + grace


def _sort_pods(ctx: _Context, pods: list[dict[str, Any]], self_deleted: frozenset[str]) -> _Pods:
    out = _Pods()
    for pod in pods:
        state = p.state(pod)
        deadline = ctx.node_lost_deadline(p.node_name(pod))
        lost = deadline is not None and deadline <= ctx.now and state != "succeeded"
        if deadline is not None and not lost:
            ctx.plan.requeue((deadline - ctx.now).total_seconds())
        if lost:
            ctx.plan.delete(pod, force=True)
        if p.role(pod) == lbl.ROLE_RENDEZVOUS:
            if lost or state == "failed":
                out.lost_stores.append(pod)
            elif state in ("pending", "running"):
                out.live_stores.append(pod)
            continue
        if p.role(pod) != lbl.ROLE_WORKER:
            continue
        counted = p.failure_recorded(pod) or p.name(pod) in ctx.recorded
        if state == "succeeded" and _finished_training(ctx, pod):
            out.succeeded.append(pod)
        elif state == "succeeded":
            out.failed.append(pod)
            if not counted:
                out.new_failures.append((pod, False))
        elif state == "failed" or lost:
            out.failed.append(pod)
            if not counted:
                out.new_failures.append((pod, lost))
        elif state == "deleting":
            out.deleting.append(pod)
        else:
            out.live_workers.setdefault(p.slot(pod), []).append(pod)
    for pod in out.deleting:
        counted = p.failure_recorded(pod) or p.name(pod) in ctx.recorded
        if not counted and p.name(pod) not in self_deleted and _deleted_externally(ctx, out, pod):
            out.new_failures.append((pod, False))
    return out


def _finished_training(ctx: _Context, pod: dict[str, Any]) -> bool:
    """Whether a worker that exited 0 ended the training, not just its torchrun agent.

    The built-in trainer says so in its termination message; an agent can also exit 0 when
    its rendezvous closes early, and taking that for success would end a job half-way. A
    custom command has no such message, so its exit 0 is trusted.
    """
    if ctx.spec.command != BUILTIN_TRAINER_COMMAND:
        return True
    return TRAINING_FINISHED in p.termination_message(pod)


def _deleted_externally(ctx: _Context, sorted_pods: _Pods, pod: dict[str, Any]) -> bool:
    """A worker being deleted while it was the only one in a wanted slot of a running job:
    preemption, eviction or ``kubectl delete pod``. The operator's own deletions are of
    pods outside the wanted slots, of spare duplicates, or of a job that is not running."""
    if ctx.spec.run_policy.suspend or ctx.status.get("phase") in TERMINAL_PHASES:
        return False
    index = p.slot(pod)
    return index < ctx.spec.replicas.target and index not in sorted_pods.live_workers


def _clean_up_finished(ctx: _Context, pods: list[dict[str, Any]]) -> None:
    policy = ctx.spec.run_policy.clean_pod_policy
    for pod in pods:
        state = p.state(pod)
        if state == "deleting":
            continue
        is_store = p.role(pod) == lbl.ROLE_RENDEZVOUS
        if policy == "All" or is_store or (policy == "Running" and state in ("pending", "running")):
            ctx.plan.delete(pod)
    ttl = ctx.spec.run_policy.ttl_seconds_after_finished
    finished = p.parse_time(ctx.status.get("completionTime"))
    if ttl is not None and finished is not None:
        remaining = (finished + timedelta(seconds=ttl) - ctx.now).total_seconds()
        if remaining <= 0:
            ctx.plan.delete_job = True
        else:
            ctx.plan.requeue(remaining)


def _finish(ctx: _Context, phase: str, reason: str, message: str) -> None:
    ctx.status["phase"] = phase
    ctx.status["completionTime"] = p.format_time(ctx.now)
    ctx.set(phase, True, reason, message)
    ctx.clear(cond.RUNNING, reason, message)
    ctx.clear(cond.RESTARTING, reason, message)
    ctx.event("Warning" if phase == "Failed" else "Normal", reason, message)


def _record_failures(ctx: _Context, sorted_pods: _Pods) -> bool:
    """Count new failures; returns False when the job must fail."""
    policy = ctx.spec.failure_policy
    history = list(ctx.status.get("failures", []))
    for pod, lost in sorted_pods.new_failures:
        failure = p.classify(pod, policy, lost)
        ctx.plan.failures.append(failure)
        record = {
            "reason": failure.reason,
            "message": failure.message,
            "pod": failure.pod,
            "retryable": failure.retryable,
            "time": p.format_time(ctx.now),
        }
        if failure.node:
            record["node"] = failure.node
        if failure.exit_code is not None:
            record["exitCode"] = failure.exit_code
        history.append(record)
        ctx.status["lastFailure"] = record
        ctx.plan.mark_recorded.append(failure.pod)
        if not failure.retryable:
            ctx.status["failures"] = history[-MAX_FAILURE_HISTORY:]
            _finish(ctx, "Failed", "PermanentFailure", f"{failure.message}; not retried")
            return False
        ctx.status["restarts"] = ctx.status.get("restarts", 0) + 1
        if policy.count_infrastructure_failures or not failure.infrastructure:
            ctx.status["restartsCountTowardsMax"] = ctx.status.get("restartsCountTowardsMax", 0) + 1
        counted = ctx.status.get("restartsCountTowardsMax", 0)
        reason = "NodeLost" if failure.reason == "NodeLost" else "WorkerFailed"
        ctx.event(
            "Warning",
            reason,
            f"{failure.message}; replacing it (restart {counted}/{policy.max_restarts})",
        )
        if counted > policy.max_restarts:
            ctx.status["failures"] = history[-MAX_FAILURE_HISTORY:]
            _finish(
                ctx,
                "Failed",
                "MaxRestartsExceeded",
                f"{counted} restarts exceed failurePolicy.maxRestarts ({policy.max_restarts}); "
                f"last failure: {failure.message}",
            )
            return False
    ctx.status["failures"] = history[-MAX_FAILURE_HISTORY:]
    return True


def _prune_failed(ctx: _Context, failed: list[dict[str, Any]]) -> None:
    kept = sorted(failed, key=lambda pod: p.created(pod) or ctx.now, reverse=True)
    for pod in kept[KEEP_FAILED_PODS:]:
        if p.state(pod) != "deleting":
            ctx.plan.delete(pod)


def _avoided_nodes(ctx: _Context) -> list[str]:
    """Nodes the job lost workers on: replacements stay away even if the node comes back.

    Nodes that are merely NotReady now are left to the scheduler (their taints keep pods
    off); pinning them away for good would strand capacity after a short blip."""
    return sorted(
        {
            f["node"]
            for f in ctx.status.get("failures", [])
            if f.get("reason") == "NodeLost" and f.get("node")
        }
    )


def _backoff_remaining(ctx: _Context) -> float:
    last = ctx.status.get("lastFailure")
    if not last:
        return 0.0
    delay = ctx.spec.failure_policy.backoff.delay(ctx.status.get("restarts", 1) - 1)
    failed_at = p.parse_time(last.get("time")) or ctx.now
    return (failed_at + timedelta(seconds=delay) - ctx.now).total_seconds()


def _scale_workers(ctx: _Context, sorted_pods: _Pods) -> None:
    target = ctx.spec.replicas.target
    for index, pods in sorted_pods.live_workers.items():
        ordered = sorted(pods, key=lambda pod: p.created(pod) or ctx.now)
        extras = ordered if index >= target else ordered[1:]
        for pod in extras:
            ctx.plan.delete(pod)
    missing = [i for i in range(target) if i not in sorted_pods.live_workers]
    if not missing:
        return
    wait = _backoff_remaining(ctx) if ctx.status.get("restarts") else 0.0
    if wait > 0:
        ctx.plan.requeue(wait)
        return
    avoid = _avoided_nodes(ctx)
    for index in missing:
        ctx.plan.create_pods.append(builders.worker_pod(ctx.job, index, ctx.new_suffix(), avoid))


def _keep_store(ctx: _Context, sorted_pods: _Pods) -> None:
    for pod in sorted_pods.lost_stores:
        ctx.plan.delete(pod)
        if pod["metadata"].get("deletionTimestamp") is None:
            ctx.event(
                "Warning",
                "RendezvousStoreLost",
                f"rendezvous store pod {p.name(pod)} on node {p.node_name(pod)} is gone; "
                "starting a new one (workers re-rendezvous)",
            )
    stores = sorted(sorted_pods.live_stores, key=lambda pod: p.created(pod) or ctx.now)
    for pod in stores[1:]:
        ctx.plan.delete(pod)
    if not stores:
        ctx.plan.create_pods.append(
            builders.rendezvous_pod(ctx.job, ctx.new_suffix(), _avoided_nodes(ctx))
        )


def _report_unschedulable(ctx: _Context, sorted_pods: _Pods) -> None:
    timeout = timedelta(seconds=ctx.spec.scheduling.pending_timeout_seconds)
    stuck: list[str] = []
    for pods in sorted_pods.live_workers.values():
        for pod in pods:
            message = p.unschedulable_message(pod)
            born = p.created(pod) or ctx.now
            if message is None:
                continue
            if born + timeout <= ctx.now:
                stuck.append(message)
            else:
                ctx.plan.requeue((born + timeout - ctx.now).total_seconds())
    if stuck:
        text = (
            f"{len(stuck)} of {ctx.spec.replicas.target} workers cannot be scheduled for "
            f"{int(timeout.total_seconds())}s or more: {stuck[0]}"
        )
        if not cond.is_true(ctx.conditions, cond.PODS_UNSCHEDULABLE):
            ctx.event("Warning", "PodsUnschedulable", text)
        ctx.set(cond.PODS_UNSCHEDULABLE, True, "Unschedulable", text)
    else:
        ctx.clear(cond.PODS_UNSCHEDULABLE, "Scheduled", "all workers are scheduled")


def _derive_phase(ctx: _Context, sorted_pods: _Pods) -> None:
    workers = [pod for pods in sorted_pods.live_workers.values() for pod in pods]
    running = [pod for pod in workers if p.state(pod) == "running"]
    minimum = ctx.spec.replicas.min
    ctx.plan.all_running = len(running) == ctx.spec.replicas.target
    if len(running) >= minimum:
        if ctx.status.get("phase") != "Running":
            ctx.event("Normal", "Running", f"{len(running)} workers running")
        ctx.status["phase"] = "Running"
        ctx.status.setdefault("startTime", p.format_time(ctx.now))
        ctx.set(cond.RUNNING, True, "WorkersRunning", f"{len(running)} workers running")
        ctx.clear(cond.RESTARTING, "WorkersRunning", "enough workers are running")
    elif ctx.status.get("startTime"):
        ctx.status["phase"] = "Restarting"
        text = f"{len(running)} of at least {minimum} workers running; waiting for replacements"
        ctx.set(cond.RESTARTING, True, "WaitingForWorkers", text)
        ctx.set(cond.RUNNING, False, "WaitingForWorkers", text)
    else:
        ctx.status["phase"] = "Pending"


def _counts(ctx: _Context, sorted_pods: _Pods) -> None:
    workers = [pod for pods in sorted_pods.live_workers.values() for pod in pods]
    ready = sum(1 for pod in workers if p.is_ready(pod))
    target = ctx.spec.replicas.target
    ctx.status["replicas"] = len(workers)
    ctx.status["readyReplicas"] = ready
    ctx.status["desiredReplicas"] = target
    ctx.status["workers"] = f"{ready}/{target}"
    ctx.status["selector"] = lbl.worker_selector(ctx.job.name)


def _apply_progress(ctx: _Context, progress: dict[str, Any] | None) -> None:
    """Copy the trainer's last report (docs/trainer.md: progress.json) into the status."""
    if not progress:
        return
    record: dict[str, Any] = {"step": int(progress.get("step", 0))}
    for key in ("totalSteps", "loss", "tokensPerSecond", "updated"):
        if progress.get(key) is not None:
            record[key] = progress[key]
    ctx.status["progress"] = record
    if progress.get("worldSize"):
        ctx.status["worldSize"] = int(progress["worldSize"])
    if progress.get("lastCheckpointStep") is not None:
        checkpoint: dict[str, Any] = {"step": int(progress["lastCheckpointStep"])}
        if progress.get("lastCheckpointTime"):
            checkpoint["time"] = progress["lastCheckpointTime"]
        ctx.status["latestCheckpoint"] = checkpoint


def plan(observed: Observed, new_suffix: Callable[[], str] = random_suffix) -> Plan:
    """Decide what to do about one TrainingJob now."""
    ctx = _Context(observed, new_suffix)
    job, spec = ctx.job, ctx.spec
    if not cond.is_true(ctx.conditions, cond.CREATED):
        ctx.plan.ensure_children = True
        ctx.set(cond.CREATED, True, "Created", "service and checkpoint volume created")
        ctx.event("Normal", "Created", f"created service {job.name} and checkpoint volume")
    _apply_progress(ctx, observed.progress)
    ctx.status["observedGeneration"] = ctx.generation
    ctx.status.setdefault("phase", "Pending")

    if ctx.status["phase"] in TERMINAL_PHASES:
        _clean_up_finished(ctx, observed.pods)
        return _done(ctx)

    if spec.run_policy.suspend:
        for pod in observed.pods:
            if p.state(pod) in ("pending", "running"):
                ctx.plan.delete(pod)
        if ctx.status["phase"] != "Suspended":
            ctx.event("Normal", "Suspended", "job suspended: workers deleted, checkpoints kept")
        ctx.status["phase"] = "Suspended"
        ctx.set(cond.SUSPENDED, True, "Suspended", "spec.runPolicy.suspend is true")
        ctx.clear(cond.RUNNING, "Suspended", "job is suspended")
        ctx.status.update(replicas=0, readyReplicas=0, workers=f"0/{spec.replicas.target}")
        return _done(ctx)
    if cond.is_true(ctx.conditions, cond.SUSPENDED):
        ctx.set(
            cond.SUSPENDED,
            False,
            "Resumed",
            "job resumed; training continues from the latest checkpoint",
        )
        ctx.event("Normal", "Resumed", "job resumed from the latest checkpoint")

    deadline = spec.run_policy.active_deadline_seconds
    started = p.parse_time(ctx.status.get("startTime"))
    if deadline is not None and started is not None:
        remaining = (started + timedelta(seconds=deadline) - ctx.now).total_seconds()
        if remaining <= 0:
            _finish(ctx, "Failed", "DeadlineExceeded", f"job ran longer than {deadline}s")
            _clean_up_finished(ctx, observed.pods)
            return _done(ctx)
        ctx.plan.requeue(remaining)

    sorted_pods = _sort_pods(ctx, observed.pods, observed.self_deleted)
    if not _record_failures(ctx, sorted_pods):
        _clean_up_finished(ctx, observed.pods)
        return _done(ctx)
    _prune_failed(ctx, sorted_pods.failed)

    if sorted_pods.succeeded:
        still_running = [pod for pods in sorted_pods.live_workers.values() for pod in pods]
        for pod in still_running:
            if p.state(pod) == "pending":
                ctx.plan.delete(pod)
        if not any(p.state(pod) == "running" for pod in still_running):
            steps = (ctx.status.get("progress") or {}).get("step")
            detail = f" after {steps} steps" if steps else ""
            _finish(ctx, "Succeeded", "TrainingCompleted", f"training completed{detail}")
            _clean_up_finished(ctx, observed.pods)
            _counts(ctx, _Pods())
            return _done(ctx)
        _counts(ctx, sorted_pods)
        return _done(ctx)

    _scale_workers(ctx, sorted_pods)
    _keep_store(ctx, sorted_pods)
    _report_unschedulable(ctx, sorted_pods)
    _derive_phase(ctx, sorted_pods)
    _counts(ctx, sorted_pods)
    return _done(ctx)


def _done(ctx: _Context) -> Plan:
    ctx.status["conditions"] = ctx.conditions
    ctx.plan.status = ctx.status
    return ctx.plan
