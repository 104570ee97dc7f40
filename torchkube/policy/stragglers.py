"""Straggler policy: which rank computes slowest, since when, and when its worker is due to go.

The trainer's rank 0 names the slowest rank of each log window with its pod, its node and
its slowdown (its compute time per step over the other ranks' median; docs/trainer.md). The
policy keeps that in ``status.slowestRank`` with the moment it became a straggler — slower
than ``failurePolicy.stragglerSlowdown`` × the median — and keeps that moment while the same
pod stays one, so "persistently slow" survives an operator restart. With
``failurePolicy.replaceStragglers``, a pod that has been a straggler for
``stragglerSeconds`` is due for replacement (:func:`overdue`): the operator deletes its pod,
``torchkube run`` restarts its worker, and its failure is recorded as ``Straggler`` (free, like
a lost node; ``torchkube.policy.failures.straggler_failure``).

Only a fresh report is acted on: one written within ``FRESH_SECONDS``. A straggler found in
an old report (training since stopped) is shown, not acted on.
"""

from datetime import datetime, timedelta

from torchkube.api.contract import ProgressReport
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import SlowestRank
from torchkube.api.times import format_time, parse_time

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
