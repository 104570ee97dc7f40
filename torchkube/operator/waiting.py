"""Waiting policy: a job with fewer than ``replicas.min`` running workers says which pods it
waits for and why, so a job that does not train is never silent.

The running workers' rendezvous waits ``rendezvous.joinTimeoutSeconds`` for the others; then
they leave with a join timeout (free), their slots are refilled and the wait begins again.
Nothing else changes by itself: the condition names what does — a pod scheduled (a node
added, quota freed), an image pulled, a Secret created.
"""

from typing import Any

from torchkube.api.worker_launch import fewest_training_workers
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, Context, Step

SHOWN_PODS = 5
"""Pods named in the condition; a 512-worker job's message stays readable."""


def _age(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 else f"{int(seconds)}s"


def why_not_running(ctx: Context, pod: dict[str, Any]) -> str:
    """One pod's reason for not running, in the words ``kubectl describe`` would use."""
    age = _age(max(0.0, ctx.seconds_since(pod["metadata"].get("creationTimestamp")) or 0.0))
    unschedulable = p.unschedulable_message(pod)
    if unschedulable is not None:
        return f"not scheduled for {age}: {unschedulable}"
    blocked = p.blocked_reason(pod)
    if blocked is not None:
        return f"{blocked[0]}: {blocked[1]}".rstrip(": ")
    node = p.node_name(pod)
    if node is None:
        return f"waiting for the scheduler for {age}"
    waiting = p.waiting_reason(pod)
    if waiting == "ContainerCreating":
        return f"ContainerCreating for {age} on {node} (pulling its image or mounting volumes)"
    return f"{waiting or 'starting'} for {age} on {node}"


def report(ctx: Context) -> Step:
    """``WaitingForWorkers``: True while fewer workers run than train (``replicas.min``; one
    replica group in live recovery), naming the live ones not running and how many wanted
    workers have no pod yet (``ctx.missing_slots``: backing off after a failure, a refused
    create)."""
    workers, missing = ctx.pods.workers, len(ctx.missing_slots)
    minimum = fewest_training_workers(ctx.job)
    running = sum(1 for pod in workers if p.state(pod) == "running")
    if running >= minimum:
        ctx.clear(cond.WAITING_FOR_WORKERS, "WorkersRunning", "enough workers are running")
        return CONTINUE
    starting = [pod for pod in workers if p.state(pod) == "pending"]
    reasons = [f"pod {p.name(pod)}: {why_not_running(ctx, pod)}" for pod in starting]
    if len(reasons) > SHOWN_PODS:
        reasons = [*reasons[:SHOWN_PODS], f"{len(reasons) - SHOWN_PODS} more"]
    if missing:
        reasons.append(
            f"{missing} not created yet (backing off after a failure, or the create is "
            "refused: see PodsBlocked)"
        )
    needed = minimum - running
    named = "; ".join(reasons).rstrip(".") or "none created yet"
    timeout = ctx.spec.rendezvous.join_timeout_seconds
    ctx.set(
        cond.WAITING_FOR_WORKERS,
        True,
        "WorkersNotStarted",
        f"waiting for {needed} more worker{'s' if needed > 1 else ''} to start ({running} of at "
        f"least {minimum} running): {named}. Training "
        "starts once they run; a running worker waits rendezvous.joinTimeoutSeconds "
        f"({timeout}s) for them, then leaves and is replaced (free)",
    )
    return CONTINUE
