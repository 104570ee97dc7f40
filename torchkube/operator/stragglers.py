"""Straggler policy: which rank computes slowest, since when, and whether its pod goes.

The trainer's rank 0 names the slowest rank of each log window with its pod, its node and
its slowdown (its compute time per step over the other ranks' median; docs/trainer.md). The
policy keeps that in ``status.slowestRank`` with the moment it became a straggler — slower
than ``failurePolicy.stragglerSlowdown`` × the median — and keeps that moment while the same
pod stays one, so "persistently slow" survives an operator restart. With
``failurePolicy.replaceStragglers``, a pod that has been a straggler for
``stragglerSeconds`` is replaced: it is deleted gracefully (its trainer writes the emergency
checkpoint at the next step boundary), its failure is recorded as ``Straggler`` (free, like a
lost node) and its node is avoided by replacements for a while (``scaling.avoided_nodes``).

Only a fresh report is acted on: one written within ``FRESH_SECONDS``, while the job is
Running. A straggler found in an old report (training since stopped) is shown, not acted on.

Avoiding a node is only a preference: on a pool that fits exactly, the replacement lands on
the same node, straggles there, its clock starts again and it is replaced again — a free
restart every ``stragglerSeconds``, for good. So a straggler is kept (:func:`futile`) when a
straggler was already moved off its node within the avoidance window (it came back), or when
the cluster has no other node to go to; the job says so and names what would help.
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from torchkube.api.contract import ProgressReport
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord, SlowestRank
from torchkube.api.times import format_time, parse_time
from torchkube.operator import conditions as cond
from torchkube.operator import failure
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, STOP, Context, Step
from torchkube.operator.scaling import AVOID_LOST_NODES_FOR

RELEASE_STRAGGLER = "straggler"
"""Why a straggler's pod was deleted (its label): a release, never taken for a failure."""

FRESH_SECONDS = 60.0
"""How old a progress report may be for the policy to act on it."""


def track(
    previous: SlowestRank | None,
    report: ProgressReport | None,
    policy: FailurePolicySpec,
    now: datetime,
) -> SlowestRank | None:
    """``status.slowestRank`` after this report: the report's slowest rank, and since when its
    pod has been a straggler without a break (None while it is not one)."""
    timing = report.slowest_rank if report is not None else None
    if timing is None:
        return None
    straggling = timing.slowdown >= policy.straggler_slowdown
    same = previous is not None and previous.pod == timing.pod and previous.rank == timing.rank
    since = None
    if straggling:
        since = previous.straggling_since if same and previous is not None else None
        since = since or format_time(now)
    return SlowestRank(
        rank=timing.rank,
        pod=timing.pod,
        node=timing.node,
        slowdown=round(timing.slowdown, 2),
        compute_seconds=round(timing.compute_seconds, 6),
        median_seconds=round(timing.median_seconds, 6),
        straggling_since=since,
    )


def fresh(report: ProgressReport | None, now: datetime) -> bool:
    updated = parse_time(report.updated) if report is not None else None
    return updated is not None and (now - updated).total_seconds() <= FRESH_SECONDS


def overdue(slowest: SlowestRank | None, policy: FailurePolicySpec, now: datetime) -> str | None:
    """The pod to replace now, if any: with ``replaceStragglers``, one that has been a
    straggler for ``stragglerSeconds`` (the caller checks that it still runs, that the report
    is fresh and that the job is Running)."""
    if not policy.replace_stragglers or slowest is None or slowest.pod is None:
        return None
    since = parse_time(slowest.straggling_since)
    if since is None or now - since < timedelta(seconds=policy.straggler_seconds):
        return None
    return slowest.pod


def wait_seconds(
    slowest: SlowestRank | None, policy: FailurePolicySpec, now: datetime
) -> float | None:
    """Seconds until a straggler's pod is due for replacement (for a timely requeue)."""
    since = parse_time(slowest.straggling_since) if slowest is not None else None
    if not policy.replace_stragglers or since is None:
        return None
    return (since + timedelta(seconds=policy.straggler_seconds) - now).total_seconds()


def futile(
    slowest: SlowestRank,
    history: Iterable[FailureRecord],
    ready_nodes: Iterable[str],
    now: datetime,
) -> tuple[str, str] | None:
    """(reason, message) when replacing the straggler's pod cannot move it off its node:
    a straggler was replaced away from that node within ``AVOID_LOST_NODES_FOR`` and the
    replacement landed there again, or no other node is Ready. None: replace it."""
    node = slowest.node
    if node is None:
        return None
    where = f"rank {slowest.rank} (pod {slowest.pod}) straggles on node {node}"
    advice = (
        f"the straggler is kept. Cordon or repair node {node} (kubectl cordon {node}), or add "
        f"a node, then delete pod {slowest.pod} to move it"
    )
    if not any(name != node for name in ready_nodes):
        return "NoOtherNode", f"{where} and no other node is Ready: {advice}"
    for record in history:
        when = parse_time(record.time)
        if (
            record.reason == "Straggler"
            and record.node == node
            and when is not None
            and now - when < AVOID_LOST_NODES_FOR
        ):
            return "SameNode", (
                f"{where} again: a straggler's pod was replaced away from it at {record.time} "
                f"and the replacement landed there (no other node had room); {advice}"
            )
    return None


def replace(ctx: Context, live_workers: dict[int, list[dict[str, Any]]]) -> Step:
    """``status.slowestRank`` from the trainer's last report; with ``replaceStragglers``, the
    pod of a rank that stayed a straggler long enough is replaced now, and leaves
    ``live_workers`` (its slot is refilled). STOP when recording it failed the
    job."""
    policy, report = ctx.spec.failure_policy, ctx.observed.progress
    slowest = track(ctx.status.slowest_rank, report, policy, ctx.now)
    ctx.status.slowest_rank = slowest
    if ctx.status.phase != "Running" or not fresh(report, ctx.now):
        return CONTINUE
    wait = wait_seconds(slowest, policy, ctx.now)
    if wait is not None and wait > 0:
        ctx.plan.requeue(wait)
    name = overdue(slowest, policy, ctx.now)
    running = (w for pods in live_workers.values() for w in pods if p.state(w) == "running")
    pod = next((w for w in running if p.name(w) == name), None)
    if pod is None or slowest is None:
        if slowest is None or slowest.straggling_since is None:
            ctx.clear(cond.STRAGGLER_KEPT, "NoStraggler", "no rank straggles")
        return CONTINUE
    ready = [name for name, health in ctx.nodes.items() if health.ready]
    kept = futile(slowest, ctx.status.failures, ready, ctx.now)
    if kept is not None:
        ctx.warn_once(cond.STRAGGLER_KEPT, *kept)
        return CONTINUE
    if failure.record(ctx, [failure.straggler_failure(slowest, policy, p.created(pod))]) is STOP:
        return STOP
    ctx.plan.delete(pod, why=RELEASE_STRAGGLER)
    slot = live_workers[p.slot(pod)]
    slot.remove(pod)
    if not slot:
        del live_workers[p.slot(pod)]
    ctx.status.slowest_rank = slowest.model_copy(update={"straggling_since": None})
    return CONTINUE
