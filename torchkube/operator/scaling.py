"""Scaling policy: which worker slots should be filled, which pods are one too many, and where
replacements should not go.

A job's workers fill slots ``0 .. target-1`` (``replicas.target``: ``desired`` or ``max``).
Each slot holds one pod; a replacement gets a new name, so it never waits for a predecessor
stuck ``Terminating`` on a dead node.
"""

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from torchkube.api import TrainingJob
from torchkube.api.ledger import Ledger
from torchkube.api.status import FailureRecord
from torchkube.api.times import parse_time
from torchkube.api.worker_launch import live as live_recovery
from torchkube.operator import builders
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, Context, Step
from torchkube.policy.backoff import backoff_remaining

AVOID_LOST_NODES_FOR = timedelta(hours=1)
"""How long replacements prefer other nodes than one that lost a worker, had a hung one or
a straggler."""
AVOIDED_REASONS = frozenset({"NodeLost", "Hang", "Straggler"})
"""Failures that say something about the node: it died, a worker hung on it (a wedged GPU,
a dead mount) or computed far slower there than elsewhere."""

RELEASE_SCALE_DOWN = "scale-down"
RELEASE_DUPLICATE = "duplicate"

_STATE_RANK = {"running": 0, "pending": 1}


def surplus_and_missing(
    live: dict[int, list[dict[str, Any]]],
    target: int,
    now: datetime,
    occupied: Iterable[int] = (),
) -> tuple[list[dict[str, Any]], list[int]]:
    """Pods to delete (slots above the target, and all but one pod per slot) and the slots
    that have no pod (``occupied`` ones excepted: a spare released at the end keeps its
    slot, refilling it would only start a pod that finds the rendezvous closed).

    Of several pods in one slot (a create whose answer was lost and retried, an operator
    restarted mid-create) the Running one stays — it may be training — and among equals
    the oldest."""
    surplus: list[dict[str, Any]] = []
    for index, pods in live.items():
        ordered = sorted(
            pods, key=lambda pod: (_STATE_RANK.get(p.state(pod), 2), p.created(pod) or now)
        )
        surplus += ordered if index >= target else ordered[1:]
    taken = set(live) | set(occupied)
    missing = [index for index in range(target) if index not in taken]
    return surplus, missing


def avoided_nodes(history: Iterable[FailureRecord], now: datetime) -> list[str]:
    """Nodes that lost a worker of the job, or had a hung or straggling one, within
    ``AVOID_LOST_NODES_FOR``."""
    nodes = set()
    for record in history:
        when = parse_time(record.time)
        if (
            record.reason in AVOIDED_REASONS
            and record.node
            and when is not None
            and now - when < AVOID_LOST_NODES_FOR
        ):
            nodes.add(record.node)
    return sorted(nodes)


def scale_workers(ctx: Context) -> Step:
    """Deletes the surplus of ``ctx.pods.live_workers`` and creates the missing workers
    (when ``ctx.may_create``, once the failure backoff allows); ``ctx.missing_slots``: the
    slots left without a pod. A spare released at the end (``ctx.pods.released``) keeps its
    slot."""
    pods = ctx.spec.replicas.pods
    surplus, missing = surplus_and_missing(
        ctx.pods.live_workers,
        pods,
        ctx.now,
        occupied=[p.slot(pod) for pod in ctx.pods.released],
    )
    for pod in surplus:
        ctx.plan.delete(pod, why=RELEASE_SCALE_DOWN if p.slot(pod) >= pods else RELEASE_DUPLICATE)
    ctx.missing_slots = missing
    if not missing or not ctx.may_create:
        return CONTINUE
    ledger = Ledger.of(ctx.status)
    wait = backoff_remaining(ledger, ctx.spec.failure_policy, ctx.now)
    if wait > 0:
        ctx.plan.requeue(wait)
        return CONTINUE
    avoid = avoided_nodes(ledger.history, ctx.now)
    for index in missing:
        ctx.plan.create_pods.append(builders.worker_pod(ctx.job, index, ctx.new_suffix(), avoid))
    ctx.missing_slots = []
    return CONTINUE


def keep_store(ctx: Context) -> Step:
    """One rendezvous store: of several (``ctx.pods.live_stores``), the running one (else the
    oldest) stays; none, a new one away from the nodes to avoid."""
    _keep_one(ctx, ctx.pods.live_stores, builders.rendezvous_pod)
    return CONTINUE


def keep_lighthouse(ctx: Context) -> Step:
    """recovery live: one Lighthouse, kept like the store (a job in restart mode has none)."""
    if live_recovery(ctx.job):
        _keep_one(ctx, ctx.pods.live_lighthouses, builders.lighthouse_pod)
    return CONTINUE


def _keep_one(
    ctx: Context,
    live: list[dict[str, Any]],
    build: Callable[[TrainingJob, str, Iterable[str]], dict[str, Any]],
) -> None:
    """Of several pods of one server, the running one (else the oldest) stays; none, a new
    one away from the nodes to avoid."""
    kept = sorted(
        live,
        key=lambda pod: (p.state(pod) != "running", p.created(pod) or ctx.now),
    )
    for pod in kept[1:]:
        ctx.plan.delete(pod, why=RELEASE_DUPLICATE)
    if not kept and ctx.may_create:
        avoid = avoided_nodes(ctx.status.failures, ctx.now)
        ctx.plan.create_pods.append(build(ctx.job, ctx.new_suffix(), avoid))
