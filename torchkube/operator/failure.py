"""The failure policy on a job's pods: why a pod stopped, what the job already counted, and
the planner step that records new failures into the job's status.

How a stop is classified and what it costs is ``torchkube.policy`` (``failures``,
``accounting``), which ``torchkube run`` uses too, so a job fails, or carries on, for the
same reasons on a laptop and in a cluster. Here the pod decides: its disruption condition, its
termination state and message, the failure-recorded label. **What each failure costs** is in
docs/operator.md.
"""

from dataclasses import dataclass, replace
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api import podfields
from torchkube.api.contract import committed_step
from torchkube.api.ledger import Ledger
from torchkube.api.reasons import FailureReason
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.standby import stands_by
from torchkube.api.status import FailureRecord, TrainingJobStatus
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, STOP, Context, Step
from torchkube.policy.accounting import account, group_loss_message, trained_through_message
from torchkube.policy.failures import (
    STORE_RESTARTS_THE_WORKERS,
    Failure,
    classify_exit,
    clip_message,
    live_group_losses,
)

PREEMPTION_REASONS = frozenset({"PreemptionByScheduler"})
EVICTION_REASONS = frozenset({"EvictionByEvictionAPI", "TerminationByKubelet"})
NODE_LOSS_REASONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})


def classify_pod(pod: dict[str, Any], policy: FailurePolicySpec, node_lost: bool) -> Failure:
    """Why a worker pod stopped, and whether the policy retries it.

    Disruption conditions come first: a preempted or evicted pod also ends with a non-zero
    exit code (143 once the kubelet has stopped it), but the cause is the cluster, not the
    training code. A pod deleted by someone else without a disruption condition
    (``kubectl delete pod``) is ``Deleted``. The failure names the pod's slot and the first
    step it committed (its termination message's ``COMMITTED_STEP`` line), if it did.
    """
    found = _pod_failure(pod, policy, node_lost)
    return replace(
        found, slot=podfields.slot(pod), committed=committed_step(p.termination_message(pod))
    )


def _pod_failure(pod: dict[str, Any], policy: FailurePolicySpec, node_lost: bool) -> Failure:
    pod_name, node = p.name(pod), p.node_name(pod)
    where = f"pod {pod_name}" + (f" on node {node}" if node else "")
    started = p.created(pod)
    disruption = p.condition(pod, "DisruptionTarget") or {}
    disruption_reason = disruption.get("reason", "")
    terminated = p.terminated(pod)
    exit_code = terminated.get("exitCode")

    def infra(reason: FailureReason, text: str) -> Failure:
        return Failure(
            reason=reason,
            message=clip_message(text),
            pod=pod_name,
            node=node,
            exit_code=exit_code,
            started=started,
        )

    if node_lost or disruption_reason in NODE_LOSS_REASONS:
        return infra("NodeLost", f"{where}: node lost")
    if disruption_reason in PREEMPTION_REASONS:
        return infra("Preempted", f"{where}: preempted by the scheduler")
    if disruption_reason in EVICTION_REASONS or pod.get("status", {}).get("reason") == "Evicted":
        detail = disruption.get("message") or pod.get("status", {}).get("message", "")
        return infra("Evicted", f"{where}: evicted {detail}".strip())
    if p.ended_by_deletion(pod) or (p.deleting(pod) and not terminated):
        return infra("Deleted", f"{where} was deleted by someone else (kubectl, a controller)")
    if terminated.get("reason") == "OOMKilled":
        return Failure(
            reason="OOMKilled",
            message=f"{where}: killed for exceeding its memory limit (OOMKilled)",
            pod=pod_name,
            node=node,
            exit_code=exit_code,
            retryable=policy.on_oom_killed == "Retry",
            started=started,
        )
    if exit_code is not None:
        failure = classify_exit(
            int(exit_code),
            str(terminated.get("message") or ""),
            policy,
            where,
            node=node,
            started=started,
        )
        return replace(failure, pod=pod_name)
    message = pod.get("status", {}).get("message") or "failed without an exit code"
    return Failure(
        reason="Unknown",
        message=clip_message(f"{where}: {message}"),
        pod=pod_name,
        node=node,
        started=started,
    )


def vanished_failure(pod: dict[str, Any]) -> Failure:
    """A worker gone without ever being seen Terminating (``pods.vanished``): deleted by
    someone else with no grace period, so it wrote no emergency checkpoint. Free, like any
    delete by someone else."""
    pod_name, node = p.name(pod), p.node_name(pod)
    where = f"pod {pod_name}" + (f" on node {node}" if node else "")
    return Failure(
        reason="Deleted",
        message=f"{where} was deleted by someone else without a grace period (kubectl delete "
        "--grace-period=0 --force, a controller): no emergency checkpoint, the steps since "
        "the latest one are redone",
        pod=pod_name,
        node=node,
        started=p.created(pod),
        slot=podfields.slot(pod),
    )


def released_early(pod: dict[str, Any]) -> Failure:
    """A worker that left as a released spare (``STANDBY_RELEASED``) while training had not
    ended: a launcher older than the operator's, whose join timeout closed the rendezvous for
    good. Free like a join timeout, and its slot is refilled."""
    pod_name, node = p.name(pod), p.node_name(pod)
    where = f"pod {pod_name}" + (f" on node {node}" if node else "")
    return Failure(
        reason="JoinTimeout",
        message=f"{where} left as a released spare though training had not ended (a join "
        "timeout of a launcher older than the operator closes the rendezvous); replacing it. "
        "Build the trainer image from the operator's release",
        pod=pod_name,
        node=node,
        exit_code=0,
        started=p.created(pod),
        slot=podfields.slot(pod),
    )


def store_failure(pod: dict[str, Any], lost: bool) -> Failure:
    """The rendezvous store restarted in place or was lost with its node: always retryable,
    never the training code's fault. The workers re-rendezvous once (docs/operator.md)."""
    pod_name, node = p.name(pod), p.node_name(pod)
    if lost:
        text = f"rendezvous store pod {pod_name} on node {node} was lost; starting a new one"
    else:
        last = p.last_termination(pod) or p.terminated(pod)
        code = last.get("exitCode")
        how = f" (exit code {code}, {last.get('reason') or 'Error'})" if code is not None else ""
        text = f"rendezvous store pod {pod_name} restarted{how}"
    return Failure(
        reason="RendezvousStoreLost",
        message=text + STORE_RESTARTS_THE_WORKERS,
        pod=pod_name,
        node=node,
        restart_count=p.restart_count(pod) + (1 if lost else 0),
    )


@dataclass(frozen=True)
class Recorded:
    """The failures the job already counted, by pod and in-place restart: from
    ``status.failures`` and from the failure-recorded label on the pods, so that one is
    never counted twice, even by an operator that restarted between the two writes."""

    keys: frozenset[tuple[str, int]]

    @classmethod
    def of(cls, status: TrainingJobStatus) -> "Recorded":
        return cls(frozenset(record_key(r) for r in status.failures))

    def holds(self, pod: dict[str, Any], restarts: int | None = None) -> bool:
        """Whether the pod's failure (``restarts``: its in-place restart of that number) is
        counted already. The label holds ``true`` for a pod's failure, or the number of the
        last restart counted."""
        if restarts is None:
            return p.failure_recorded(pod) or (p.name(pod), 0) in self.keys
        label = pod["metadata"].get("labels", {}).get(lbl.FAILURE_RECORDED, "")
        done = int(label) if label.isdigit() else (-1 if label != "true" else restarts)
        return done >= restarts or (p.name(pod), restarts) in self.keys


def record_key(record: FailureRecord) -> tuple[str, int]:
    """What identifies a recorded failure: the pod and, for in-place restarts, which one."""
    return record.pod or "", record.restart_count or 0


def record_new(ctx: Context) -> Step:
    """Record the failures sorting found new (``ctx.pods.new_failures``): in live recovery,
    as losses of their replica groups alone while enough others train on
    (``live_group_losses``); a worker standing by trains nothing. STOP when the job failed."""
    progress = ctx.observed.progress
    training = [
        p.name(pod)
        for pod in ctx.pods.workers
        if p.state(pod) == "running"
        and not stands_by(podfields.slot(pod), podfields.created(pod), progress)
    ]
    return record(ctx, live_group_losses(ctx.job, ctx.pods.new_failures, training))


def record(ctx: Context, new: list[Failure]) -> Step:
    """Account for new failures in the job's status, label their pods once it holds them,
    and say what each new incident costs (a Warning event); STOP when the job failed. For
    the steps that find failures (:func:`record_new`, ``stragglers.replace``)."""
    if not new:
        return CONTINUE
    before = Ledger.of(ctx.status)
    outcome = account(before, new, ctx.spec.failure_policy, ctx.now)
    ctx.plan.failures.extend(new)
    after = outcome.ledger
    ctx.status.failures = list(after.history)
    ctx.status.last_failure = outcome.records[-1]
    ctx.status.restarts = after.restarts
    ctx.status.restarts_count_towards_max = after.counted
    ctx.status.replica_group_losses = after.group_losses
    for written in outcome.records:
        value = str(written.restart_count) if written.restart_count else "true"
        ctx.plan.mark_recorded[written.pod or ""] = value
    if outcome.fail_reason is not None:
        ctx.finish("Failed", outcome.fail_reason, outcome.fail_message)
        return STOP
    max_restarts = ctx.spec.failure_policy.max_restarts
    for lost, written in zip(new, outcome.records, strict=True):
        if lost.group_loss:
            spent = (outcome.counted, max_restarts) if written.counted else None
            message = group_loss_message(lost, outcome.group_losses, spent)
            ctx.event("Warning", "ReplicaGroupLost", message)
        elif lost.survivors is not None:
            ctx.event("Warning", lost.reason, trained_through_message(lost))
    for incident in range(before.restarts + 1, outcome.restarts + 1):
        members = [r for r in outcome.records if r.incident == incident]
        # A lost node names the incident whichever of its pods was seen first: it is the
        # cause of the others' failures, and what the user has to look at.
        headline = next((r for r in members if r.reason == "NodeLost"), members[0])
        first = next(f for f in new if f.pod == headline.pod and f.reason == headline.reason)
        others = f" (with {len(members) - 1} more failing together)" if len(members) > 1 else ""
        ctx.event(
            "Warning",
            first.reason
            if first.infrastructure or first.reason in ("Hang", "InPlaceRestart")
            else "WorkerFailed",
            f"{first.message}{others}; restarting from the latest checkpoint "
            f"(incident {incident}, {outcome.counted}/{max_restarts} counted)",
        )
    return CONTINUE
