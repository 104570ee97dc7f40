"""The straggler policy on a job's pods: ``status.slowestRank`` kept, and the pod of a rank
that straggled long enough replaced.

Which rank straggles, since when and when it is due is ``torchkube.policy.stragglers``',
shared with ``torchkube run``. Here, with ``failurePolicy.replaceStragglers``, a due pod is
deleted gracefully (its trainer writes the emergency checkpoint at the next step boundary),
while the job is Running, its failure is recorded as ``Straggler`` and its node is avoided by
replacements for a while (``scaling.avoided_nodes``).

Avoiding a node is only a preference: on a pool that fits exactly, the replacement lands on
the same node, straggles there, its clock starts again and it is replaced again — a free
restart every ``stragglerSeconds``, for good. So a straggler is kept (:func:`futile`) when a
straggler was already moved off its node within the avoidance window (it came back), or when
the cluster has no other node to go to; the job says so and names what would help.
"""

from collections.abc import Iterable
from datetime import datetime

from torchkube.api.status import FailureRecord, SlowestRank
from torchkube.api.times import parse_time
from torchkube.operator import conditions as cond
from torchkube.operator import failure
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, STOP, Context, Step
from torchkube.operator.scaling import AVOID_LOST_NODES_FOR
from torchkube.policy.failures import straggler_failure
from torchkube.policy.stragglers import fresh, overdue, track, wait_seconds

RELEASE_STRAGGLER = "straggler"
"""Why a straggler's pod was deleted (its label): a release, never taken for a failure."""


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


def replace(ctx: Context) -> Step:
    """``status.slowestRank`` from the trainer's last report; with ``replaceStragglers``, the
    pod of a rank that stayed a straggler long enough is replaced now: deleted, and left out
    of ``ctx.pods`` so that scaling refills its slot. STOP when recording it failed the
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
    running = (w for w in ctx.pods.workers if p.state(w) == "running")
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
    if failure.record(ctx, [straggler_failure(slowest, policy, p.created(pod))]) is STOP:
        return STOP
    ctx.plan.delete(pod, why=RELEASE_STRAGGLER)
    ctx.pods = ctx.pods.without(pod)
    ctx.status.slowest_rank = slowest.model_copy(update={"straggling_since": None})
    return CONTINUE
