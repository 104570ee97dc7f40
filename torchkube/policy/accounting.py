"""What a batch of failures costs a job: incidents, the ``maxRestarts`` budget, the ledger.

**Incidents, not pods.** Workers that stop together share one cause seen N times: a lost
rendezvous store, a network blip, a join that timed out with fewer than ``replicas.min``
agents. A failure joins the current incident when it happened within ``INCIDENT_WINDOW`` of the
incident's first failure and its worker already existed then (a replacement that crashes is a
new incident, so a crash loop still spends the budget). Workers restarted in place by their
launcher count the same way; such a restart that joins an incident is its consequence and
charges nothing. ``status.restarts`` counts incidents
(each one restart of training from a checkpoint); ``restartsCountTowardsMax`` counts those
that involve a failure the policy charges (infrastructure failures are free unless
``countInfrastructureFailures``).

**Replica groups, under** ``failurePolicy.recovery: live``: a group's loss
(:func:`torchkube.policy.failures.live_group_losses`) opens no incident;
``replicaGroupLosses`` counts it. It spends nothing of ``maxRestarts`` unless its group (its
slot) crash-loops: lost again, for a reason the policy charges, without committing a step
since the slot's last failure (the pod's termination message, or its launcher's in-place
restart record, names the first step committed: ``COMMITTED_STEP``). Each such loss counts,
and past ``maxRestarts`` the job fails naming the slot; a group that committed steps between
its losses, and a first loss, stay free. Its replacement backs off like any; a permanent exit
code ends the job as always. The store's loss trained on through is a record without an
incident, not a group's loss; and the Lighthouse's loss is no failure at all (the groups wait
for its replacement at their next quorum).

The operator folds the result into the job's status, ``torchkube run`` into the ledger it
keeps in memory: both take :attr:`Outcome.ledger`. **What each failure costs** is in
docs/operator.md.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from torchkube.api.contract import InPlaceRestart
from torchkube.api.ledger import Ledger
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord
from torchkube.api.times import format_time, parse_time
from torchkube.policy.failures import Failure, followed, in_place_failure

INCIDENT_WINDOW = timedelta(seconds=30)
"""Failures seen this soon after an incident's first failure are part of it."""


def in_place_due(
    records: Iterable[InPlaceRestart],
    started: Mapping[str, datetime | None],
    recorded: Callable[[str, int], bool],
    now: datetime,
    slots: Mapping[str, int | None] | None = None,
) -> tuple[list[Failure], float | None]:
    """The in-place restarts to account now, oldest first, and the seconds until the next
    one is due (None: none waits).

    Only restarts of live workers (``started``: their creation, by pod name; ``slots``: their
    slots) that are not ``recorded`` yet: a pod gone since is counted by its own failure or
    its release. Each waits ``INCIDENT_WINDOW`` after it happened, so that a pod failure that
    caused it, seen sooner or later, is recorded first and it joins that incident free."""
    due: list[Failure] = []
    wait: float | None = None
    for record in records:
        if record.pod not in started or recorded(record.pod, record.restart):
            continue
        at = parse_time(record.time) or now
        left = (at + INCIDENT_WINDOW - now).total_seconds()
        if left > 0:
            wait = left if wait is None else min(wait, left)
        else:
            slot = (slots or {}).get(record.pod)
            due.append(in_place_failure(record, started[record.pod], slot))
    return sorted(due, key=lambda found: found.at or now), wait


@dataclass(kw_only=True)
class Outcome:
    """What a batch of new failures does to the job: the totals and records it brings to the
    ledger it was accounted against, and why the job must fail, if it must."""

    before: Ledger
    restarts: int
    counted: int
    group_losses: int
    records: list[FailureRecord] = field(default_factory=list)
    fail_reason: str | None = None
    fail_message: str = ""

    @classmethod
    def against(cls, ledger: Ledger) -> "Outcome":
        """Nothing added yet to ``ledger``."""
        return cls(
            before=ledger,
            restarts=ledger.restarts,
            counted=ledger.counted,
            group_losses=ledger.group_losses,
        )

    @property
    def ledger(self) -> Ledger:
        """The ledger with the batch folded in: what the job's status holds next (in the
        operator) or the run keeps in memory (``torchkube run``)."""
        return self.before.after(self.restarts, self.counted, self.group_losses, self.records)


def _current_incident(ledger: Ledger) -> tuple[datetime | None, bool, FailureRecord | None]:
    """(when the newest incident began, whether it already spends the budget, its first
    failure)."""
    members = [r for r in ledger.history if r.incident == ledger.restarts]
    if not members or ledger.restarts == 0:
        return None, False, None
    first = min(members, key=lambda r: parse_time(r.time) or datetime.max)
    began = parse_time(first.time) or datetime.max
    return began, any(r.counted is not False for r in members), first


def to_record(
    failure: Failure, now: datetime, incident: int | None, counted: bool
) -> FailureRecord:
    """A failure as ``status.failures`` stores it."""
    return FailureRecord(
        reason=failure.reason,
        message=failure.message,
        pod=failure.pod,
        node=failure.node,
        exit_code=failure.exit_code,
        retryable=failure.retryable,
        time=format_time(now),
        incident=incident,
        counted=counted,
        restart_count=failure.restart_count or None,
        step=failure.step,
        replica_group_loss=True if failure.group_loss else None,
        replica_index=failure.slot,
    )


def crash_loop(ledger: Ledger, failure: Failure, policy: FailurePolicySpec) -> FailureRecord | None:
    """The previous failure of the slot of ``failure``, a replica group's loss, when the group
    failed again without committing a step since it (``failure.committed`` None): it
    crash-loops, and the loss counts. None when it committed one, when the slot has no
    failure on record (a first loss), or when the policy charges nothing for this cause (a
    lost node, a preemption: the cluster's doing)."""
    if failure.slot is None or failure.committed is not None or not failure.counts(policy):
        return None
    return ledger.last_failure_of(failure.slot)


def _group_loss(out: Outcome, failure: Failure, policy: FailurePolicySpec, when: datetime) -> None:
    """recovery live: one replica group lost while the others train on. Free, unless the
    group crash-loops (:func:`crash_loop`): then it spends ``maxRestarts``, and past it the
    job fails naming the slot."""
    out.group_losses += 1
    previous = crash_loop(out.ledger, failure, policy)
    if previous is None:
        out.records.append(to_record(failure, when, None, False))
        return
    out.counted += 1
    looping = replace(
        failure,
        message=f"{failure.message} (slot {failure.slot} lost again without "
        f"committing a step since its last failure, {previous.reason} at {previous.time}: "
        "counts under failurePolicy.maxRestarts)",
    )
    out.records.append(to_record(looping, when, None, True))
    if out.counted > policy.max_restarts:
        out.fail_reason = "MaxRestartsExceeded"
        out.fail_message = (
            f"replica group of slot {failure.slot} crash-loops: {out.counted} counted failures "
            f"exceed failurePolicy.maxRestarts ({policy.max_restarts}); last failure: "
            f"{looping.message}"
        )


def account(
    ledger: Ledger, failures: Iterable[Failure], policy: FailurePolicySpec, now: datetime
) -> Outcome:
    """Account for new failures against the job's ledger (the result's :attr:`Outcome.ledger`
    holds them) and say whether the job must fail."""
    began, charged, cause = _current_incident(ledger)
    out = Outcome.against(ledger)
    for failure in failures:
        if not failure.retryable:
            out.records.append(to_record(failure, now, out.restarts, False))
            out.fail_reason = "PermanentFailure"
            out.fail_message = f"{failure.message}; not retried"
            return out
        when = failure.at or now
        if failure.group_loss:
            _group_loss(out, failure, policy, when)
            if out.fail_reason is not None:
                return out
            continue
        if failure.survivors is not None:  # the store, trained on through: free, no incident
            out.records.append(to_record(failure, when, None, False))
            continue
        joins = (
            began is not None
            and abs(when - began) <= INCIDENT_WINDOW
            and (failure.started is None or failure.started < began)
        )
        if not joins:
            out.restarts += 1
            began, charged, cause = when, False, None
        elif failure.follows and cause is not None:
            failure = followed(failure, cause)
        counts = failure.counts(policy) and not (failure.follows and joins)
        if counts and not charged:
            out.counted += 1
            charged = True
        out.records.append(to_record(failure, when, out.restarts, counts))
        cause = cause or out.records[-1]
        if out.counted > policy.max_restarts:
            out.fail_reason = "MaxRestartsExceeded"
            out.fail_message = (
                f"{out.counted} restarts exceed failurePolicy.maxRestarts "
                f"({policy.max_restarts}); last failure: {failure.message}"
            )
            return out
    return out


def group_loss_message(lost: Failure, losses: int, spent: tuple[int, int] | None = None) -> str:
    """What the loss of one replica group did, for the user: the job did not restart.
    ``spent``: (counted, maxRestarts) when the loss counted, the group lost again before
    committing a step (:func:`crash_loop`)."""
    others = lost.survivors or 0
    trains = "group trains" if others == 1 else "groups train"
    cost = "nothing spent of maxRestarts"
    if spent is not None:
        cost = (
            f"lost again before committing a step since its last failure, so it counts: "
            f"{spent[0]}/{spent[1]} of maxRestarts"
        )
    return (
        f"{lost.message}; its replica group is lost: the {others} other replica {trains} on "
        "from the next step, and its replacement copies the live state from them and joins "
        f"(recovery live: no restart, {cost}; replica groups lost so far: {losses})"
    )


def trained_through_message(lost: Failure) -> str:
    """What the loss of the store did to a live job, for the user: nothing restarted."""
    others = lost.survivors or 0
    groups = "replica group" if others == 1 else "replica groups"
    return (
        f"{lost.message} ({others} {groups} running; not a restart, nothing spent of maxRestarts)"
    )
