"""Failure policy: why a worker stopped, whether a retry can help, and what the job has spent.

One decision in one place: the operator's planner and ``torchkube run`` both classify a stop
with :func:`classify_exit` (the planner through :func:`classify_pod`) and account for it with
:func:`account`, so a job fails, or carries on, for the same reasons on a laptop and in a
cluster.

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

**Replica groups, under** ``failurePolicy.recovery: live``: a pod lost while enough other
groups train on (:func:`live_group_losses`) restarted nothing — the others went on from their
next step and the replacement copies the live state from them — so it opens no incident;
``replicaGroupLosses`` counts it. It spends nothing of ``maxRestarts`` unless its group (its
slot) crash-loops: lost again, for a reason the policy charges, without committing a step
since the slot's last failure (the pod's termination message, or its launcher's in-place
restart record, names the first step committed: ``COMMITTED_STEP``). Each such loss counts,
and past ``maxRestarts`` the job fails naming the slot; a group that committed steps between
its losses, and a first loss, stay free. Its replacement backs off like any; a permanent exit
code ends the job as always. The rendezvous store lost while groups train restarts nothing
either (each pod's torchrun world needs it only to start): a record without an incident, not
a group's loss; and the Lighthouse's loss is no failure at all (the groups wait for its
replacement at their next quorum).

**What each failure costs** is in docs/operator.md.
"""

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from torchkube.api import TrainingJob, podfields
from torchkube.api import labels as lbl
from torchkube.api.contract import (
    LIVE_MIN_REPLICA_GROUPS,
    ExitCode,
    InPlaceRestart,
    committed_step,
    without_committed_step,
)
from torchkube.api.ledger import Ledger
from torchkube.api.reasons import INFRASTRUCTURE_REASONS, FailureReason
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord, SlowestRank, TrainingJobStatus
from torchkube.api.times import format_time, parse_time
from torchkube.api.worker_launch import live
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, STOP, Context, Step

INCIDENT_WINDOW = timedelta(seconds=30)
"""Failures seen this soon after an incident's first failure are part of it."""

MESSAGE_LIMIT = 1024
"""Failure messages keep their last this many characters (the error is at the end); the
termination message alone may be 4 KiB, more than a status field may hold."""


PREEMPTION_REASONS = frozenset({"PreemptionByScheduler"})
EVICTION_REASONS = frozenset({"EvictionByEvictionAPI", "TerminationByKubelet"})
NODE_LOSS_REASONS = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})


@dataclass(frozen=True)
class Failure:
    """One stop of a worker (or of the rendezvous store), classified by the policy."""

    reason: FailureReason
    message: str
    pod: str
    node: str | None = None
    exit_code: int | None = None
    retryable: bool = True
    started: datetime | None = None
    """When the stopped worker was created; a worker born after an incident began cannot be
    part of it."""
    restart_count: int | None = None
    """For a container restarted in place (the store), or workers restarted in place by
    their launcher: which restart this was."""
    at: datetime | None = None
    """When it happened, if not when it was seen (an in-place restart is seen later)."""
    follows: bool = False
    """A consequence when it joins an incident: it charges none (a survivor's workers
    restarted because another pod's failed)."""
    step: int | None = None
    """The training step last reported when it was seen."""
    charged: bool = False
    """Spends the budget whatever its cause (a store lost again before a step was trained)."""
    survivors: int | None = None
    """recovery live: the replica groups that trained on without it. Set, this is the loss
    of one group (or of the store), not a restart of the job (:func:`live_group_losses`)."""
    slot: int | None = None
    """The worker's slot (replica index; its replica group under recovery live)."""
    committed: int | None = None
    """The first step the worker's pod committed since its last failure, as its termination
    message or its launcher's in-place restart record says (None: none)."""
    detail: str = ""
    """An in-place restart's own error, its last line (empty: none worth showing): said again
    when it joins an incident, after the cause (:func:`followed`)."""

    @property
    def infrastructure(self) -> bool:
        return self.reason in INFRASTRUCTURE_REASONS

    @property
    def group_loss(self) -> bool:
        """recovery live: the loss of one replica group, which the others trained on through
        (the store's, trained on through too, is no group's)."""
        return self.survivors is not None and self.reason != "RendezvousStoreLost"

    def counts(self, policy: FailurePolicySpec) -> bool:
        """Whether this failure spends the job's ``maxRestarts`` budget."""
        return self.charged or policy.count_infrastructure_failures or not self.infrastructure


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_LIMIT else "…" + text[-(MESSAGE_LIMIT - 1) :]


def classify_exit(
    exit_code: int,
    detail: str,
    policy: FailurePolicySpec,
    subject: str,
    *,
    node: str | None = None,
    started: datetime | None = None,
) -> Failure:
    """A worker that ended with ``exit_code``; ``detail`` is its termination message, whose
    ``COMMITTED_STEP`` line (taken out of the message) says the first step it committed."""
    found = _exit_failure(
        exit_code, without_committed_step(detail), policy, subject, node=node, started=started
    )
    return replace(found, committed=committed_step(detail))


def _exit_failure(
    exit_code: int,
    detail: str,
    policy: FailurePolicySpec,
    subject: str,
    *,
    node: str | None,
    started: datetime | None,
) -> Failure:
    lines = detail.strip().splitlines()
    tail = _tail(f": {lines[-1]}") if lines else ""
    if exit_code == 0:
        return Failure(
            "Unknown",
            f"{subject} exited 0 before the trainer reported the end of training",
            subject,
            node,
            0,
            True,
            started,
        )
    if exit_code == ExitCode.HUNG:
        return Failure(
            "Hang",
            f"{subject} hung (exit code {exit_code}){tail}",
            subject,
            node,
            exit_code,
            True,
            started,
        )
    if exit_code == ExitCode.JOIN_TIMEOUT:
        return Failure(
            "JoinTimeout",
            f"{subject} gave up waiting for the other workers to start (exit code "
            f"{exit_code}){tail}",
            subject,
            node,
            exit_code,
            True,
            started,
        )
    if exit_code == ExitCode.RENDEZVOUS_LOST:
        return Failure(
            "RendezvousFailed",
            f"{subject} lost its rendezvous (exit code {exit_code}){tail}",
            subject,
            node,
            exit_code,
            True,
            started,
        )
    permanent = policy.is_permanent_exit(exit_code)
    kind = "permanent" if permanent else "retryable"
    return Failure(
        "ExitCode",
        f"{subject} exited with code {exit_code} ({kind}){tail}",
        subject,
        node,
        exit_code,
        not permanent,
        started,
    )


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
        return Failure(reason, _tail(text), pod_name, node, exit_code, True, started)

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
            "OOMKilled",
            f"{where}: killed for exceeding its memory limit (OOMKilled)",
            pod_name,
            node,
            exit_code,
            policy.on_oom_killed == "Retry",
            started,
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
    return Failure("Unknown", _tail(f"{where}: {message}"), pod_name, node, None, True, started)


def vanished_failure(pod: dict[str, Any]) -> Failure:
    """A worker gone without ever being seen Terminating (``pods.vanished``): deleted by
    someone else with no grace period, so it wrote no emergency checkpoint. Free, like any
    delete by someone else."""
    pod_name, node = p.name(pod), p.node_name(pod)
    where = f"pod {pod_name}" + (f" on node {node}" if node else "")
    return Failure(
        "Deleted",
        f"{where} was deleted by someone else without a grace period (kubectl delete "
        "--grace-period=0 --force, a controller): no emergency checkpoint, the steps since "
        "the latest one are redone",
        pod_name,
        node,
        None,
        True,
        p.created(pod),
        slot=podfields.slot(pod),
    )


TORCH_NO_ERROR_FILE = "To enable traceback see:"
"""How torchrun's record of a failed worker begins when the worker wrote no error file (its
traceback is in the log): a link to torch's docs, nothing about this failure."""

PEER_LOSSES: frozenset[FailureReason] = frozenset(
    {"NodeLost", "Preempted", "Evicted", "Deleted", "Straggler"}
)
"""Reasons whose pod was taken away, not failed by itself: a survivor lost a peer."""


def in_place_failure(
    record: InPlaceRestart, started: datetime | None, slot: int | None = None
) -> Failure:
    """A pod's workers restarted in place by its launcher after a worker failed: counted
    like the pod's failure, unless it joins an incident another failure began (a peer's
    failure makes every survivor's workers fail too; its message then names that failure,
    :func:`followed`). ``slot``: the pod's."""
    lines = record.message.strip().splitlines()
    last = lines[-1].strip() if lines else ""
    detail = "" if last.startswith(TORCH_NO_ERROR_FILE) else last
    return Failure(
        "InPlaceRestart",
        _tail(
            f"{_where(record.pod, record.node)} restarted its workers in place (restart "
            f"{record.restart}): a worker exited with code {record.exit_code}"
            + (f": {detail}" if detail else "")
        ),
        record.pod,
        record.node,
        record.exit_code,
        True,
        started,
        record.restart,
        parse_time(record.time),
        True,
        slot=slot,
        committed=record.committed_step,
        detail=detail,
    )


def followed(failure: Failure, cause: FailureRecord) -> Failure:
    """An in-place restart that joins an incident, said as the consequence it is: the
    incident's first failure ended the round its workers trained in (a lost peer or store
    breaks every survivor's collectives). Its own record cannot say so: torchrun keeps the
    failed worker's exit code and, without an error file, a link to torch's docs."""
    if cause.reason == "RendezvousStoreLost":
        what = "the rendezvous store was lost"
    elif cause.reason in PEER_LOSSES:
        what = "a peer was lost"
    else:
        what = "a peer failed"
    because = f" ({cause.message})" if cause.message else ""
    detail = f": {failure.detail}" if failure.detail else ""
    return replace(
        failure,
        message=_tail(
            f"{_where(failure.pod, failure.node)} restarted its workers in place (restart "
            f"{failure.restart_count}) because {what}{because}, which ended the round: its "
            f"worker exited with code {failure.exit_code}{detail}"
        ),
    )


def _where(pod: str, node: str | None) -> str:
    return f"pod {pod}" + (f" on node {node}" if node else "")


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


def released_early(pod: dict[str, Any]) -> Failure:
    """A worker that left as a released spare (``STANDBY_RELEASED``) while training had not
    ended: a launcher older than the operator's, whose join timeout closed the rendezvous for
    good. Free like a join timeout, and its slot is refilled."""
    pod_name, node = p.name(pod), p.node_name(pod)
    where = f"pod {pod_name}" + (f" on node {node}" if node else "")
    return Failure(
        "JoinTimeout",
        f"{where} left as a released spare though training had not ended (a join timeout "
        "of a launcher older than the operator closes the rendezvous); replacing it. "
        "Build the trainer image from the operator's release",
        pod_name,
        node,
        0,
        True,
        p.created(pod),
        slot=podfields.slot(pod),
    )


STORE_RESTARTS_THE_WORKERS = "; the workers re-rendezvous and resume from their checkpoint"
STORE_TRAINED_THROUGH = (
    "; recovery live: the replica groups train on without it (each pod's torchrun world needs "
    "the store only to start its workers: a group that restarts its workers, or a new pod, "
    "waits for the new store), nothing restarts from a checkpoint"
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
        "RendezvousStoreLost",
        text + STORE_RESTARTS_THE_WORKERS,
        pod_name,
        node,
        None,
        True,
        None,
        p.restart_count(pod) + (1 if lost else 0),
    )


def store_loss(
    found: Failure,
    history: Sequence[FailureRecord],
    step: int | None,
    serving_since: datetime | None = None,
    *,
    crashed: bool = True,
) -> Failure:
    """A store loss seen at training step ``step`` (None: no progress report yet) while a
    store served since ``serving_since`` (None: none did). Free, unless the store itself
    ``crashed`` (its container exited and restarts in place) after an earlier store loss with
    no progress since — no step trained, or, without progress reports (``metrics.enabled``
    false, or none yet), no store serving in between. A store that crash-loops (an image
    without torchkube, a node that OOM-kills it) restarts the workers' rendezvous for ever
    while they train nothing; counting the repeats lets ``maxRestarts`` end it. A store lost
    with its node, evicted or deleted is the cluster's doing and stays free, as does one
    that crashes now and then on a job that trains."""
    previous = next((r for r in reversed(history) if r.reason == "RendezvousStoreLost"), None)
    if previous is None or not crashed:
        return replace(found, step=step)
    if step is not None:
        repeated = step <= (previous.step or 0)
    else:
        lost_at = parse_time(previous.time)
        repeated = serving_since is None or (lost_at is not None and serving_since <= lost_at)
    if not repeated:
        return replace(found, step=step)
    since = f"no step trained (step {step})" if step is not None else "no store serving"
    return replace(
        found,
        step=step,
        charged=True,
        message=f"{found.message} (it crashed again with {since} since the last loss: counts "
        "under failurePolicy.maxRestarts)",
    )


def live_group_losses(
    job: TrainingJob, failures: Sequence[Failure], running: Collection[str]
) -> list[Failure]:
    """``failures`` as the losses of their replica groups alone when the job recovers live and
    at least ``LIVE_MIN_REPLICA_GROUPS`` of its ``running`` workers (pod names) are not among
    them: torchft's quorum goes on with those from their next step. A store lost meanwhile
    is trained on through too (each group's torchrun world needs it only to start), unless
    it crashed again with nothing trained since (:func:`store_loss` charges it). Otherwise —
    restart mode, no group left to train, such a store — unchanged: the job restarts from
    its checkpoint."""
    if not live(job) or any(f.reason == "RendezvousStoreLost" and f.charged for f in failures):
        return list(failures)
    lost = {f.pod for f in failures}
    survivors = len([name for name in running if name not in lost])
    if survivors < LIVE_MIN_REPLICA_GROUPS:
        return list(failures)
    return [_trained_through(f, survivors) for f in failures]


def _trained_through(found: Failure, survivors: int) -> Failure:
    """``found`` as a loss ``survivors`` replica groups trained on through."""
    if found.reason != "RendezvousStoreLost":
        return replace(found, survivors=survivors)
    message = found.message.replace(STORE_RESTARTS_THE_WORKERS, "") + STORE_TRAINED_THROUGH
    return replace(found, survivors=survivors, message=message)


def straggler_failure(
    slowest: SlowestRank, policy: FailurePolicySpec, started: datetime | None
) -> Failure:
    """The pod of a rank the straggler policy replaces (``slowest.pod``): free, an
    infrastructure cause, and its node is avoided for a while (``scaling.avoided_nodes``)."""
    pod_name = slowest.pod or f"rank {slowest.rank}"
    where = f"pod {pod_name}" + (f" on node {slowest.node}" if slowest.node else "")
    return Failure(
        "Straggler",
        f"{where}: rank {slowest.rank} computed {slowest.slowdown:.2f}× slower than the other "
        f"ranks' median ({slowest.compute_seconds * 1e3:.1f} ms vs "
        f"{slowest.median_seconds * 1e3:.1f} ms per step) for "
        f"{policy.straggler_seconds}s or more (failurePolicy.stragglerSlowdown "
        f"{policy.straggler_slowdown}); replacing it, preferring other nodes",
        pod_name,
        slowest.node,
        None,
        True,
        started,
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


@dataclass
class Outcome:
    """What a batch of new failures does to the job."""

    restarts: int
    counted: int
    group_losses: int = 0
    records: list[FailureRecord] = field(default_factory=list)
    fail_reason: str | None = None
    fail_message: str = ""


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


def _group_loss(
    ledger: Ledger, out: "Outcome", failure: Failure, policy: FailurePolicySpec, when: datetime
) -> None:
    """recovery live: one replica group lost while the others train on. Free, unless the
    group crash-loops (:func:`crash_loop`): then it spends ``maxRestarts``, and past it the
    job fails naming the slot."""
    out.group_losses += 1
    so_far = ledger.after(out.restarts, out.counted, out.group_losses, out.records)
    previous = crash_loop(so_far, failure, policy)
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
    """Fold new failures into the job's ledger and say whether the job must fail."""
    began, charged, cause = _current_incident(ledger)
    out = Outcome(ledger.restarts, ledger.counted, ledger.group_losses)
    for failure in failures:
        if not failure.retryable:
            out.records.append(to_record(failure, now, out.restarts, False))
            out.fail_reason = "PermanentFailure"
            out.fail_message = f"{failure.message}; not retried"
            return out
        when = failure.at or now
        if failure.group_loss:
            _group_loss(ledger, out, failure, policy, when)
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


def record(ctx: Context, new: list[Failure]) -> Step:
    """Account for new failures in the job's status, label their pods once it holds them,
    and say what each new incident costs (a Warning event); STOP when the job failed."""
    if not new:
        return CONTINUE
    before = Ledger.of(ctx.status)
    outcome = account(before, new, ctx.spec.failure_policy, ctx.now)
    ctx.plan.failures.extend(new)
    after = before.after(outcome.restarts, outcome.counted, outcome.group_losses, outcome.records)
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


def incident_starts(history: Iterable[FailureRecord]) -> list[datetime]:
    """When each recorded incident began, oldest first (records without an incident number,
    written by older operators, are an incident each)."""
    starts: dict[Any, datetime] = {}
    for index, record in enumerate(history):
        when = parse_time(record.time)
        if when is None:
            continue
        incident = record.incident
        key: tuple[str, int] = ("record", index) if incident is None else ("incident", incident)
        starts[key] = min(when, starts.get(key, when))
    return sorted(starts.values())


def backoff_remaining(ledger: Ledger, policy: FailurePolicySpec, now: datetime) -> float:
    """Seconds until a replacement may be created.

    The delay doubles with each incident of an unbroken run of failures and starts again from
    ``initialSeconds`` once the job went ``backoff.resetAfterSeconds`` without one: a job that
    trained for a day is not punished for the failures of its first hour.
    """
    starts = incident_starts(ledger.history)
    if not starts:
        return 0.0
    reset = timedelta(seconds=policy.backoff.reset_after_seconds)
    streak = 1
    for earlier, later in zip(reversed(starts[:-1]), reversed(starts[1:]), strict=True):
        if later - earlier > reset:
            break
        streak += 1
    delay = policy.backoff.delay(streak - 1)
    return (starts[-1] + timedelta(seconds=delay) - now).total_seconds()
