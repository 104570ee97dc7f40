"""A stop of a worker (or of the rendezvous store), as the failure policy sees it: a
:class:`Failure`, and how a launcher's exit code, an in-place restart, a store loss or a
straggler becomes one.

Whether a retry can help is decided here (a permanent exit code cannot); what the job spends
for it is :mod:`torchkube.policy.accounting`'s. Under ``failurePolicy.recovery: live`` a pod
lost while enough other groups train on (:func:`live_group_losses`) is the loss of its
replica group alone: the others go on from their next step and the replacement copies the
live state from them. The rendezvous store lost while groups train restarts nothing either
(each pod's torchrun world needs it only to start).
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from torchkube.api import TrainingJob
from torchkube.api.contract import (
    LIVE_MIN_REPLICA_GROUPS,
    ExitCode,
    InPlaceRestart,
    committed_step,
    without_committed_step,
)
from torchkube.api.reasons import INFRASTRUCTURE_REASONS, FailureReason
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord, SlowestRank
from torchkube.api.times import parse_time
from torchkube.api.worker_launch import live

MESSAGE_LIMIT = 1024
"""Failure messages keep their last this many characters (the error is at the end); the
termination message alone may be 4 KiB, more than a status field may hold."""


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One stop of a worker (or of the rendezvous store), classified by the policy. Built with
    keywords only: its many flags and numbers cannot be told apart by position."""

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


def clip_message(text: str) -> str:
    """``text`` cut to its last ``MESSAGE_LIMIT`` characters, where an error says what it was."""
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
    tail = clip_message(f": {lines[-1]}") if lines else ""

    def ended(reason: FailureReason, message: str, retryable: bool = True) -> Failure:
        return Failure(
            reason=reason,
            message=message,
            pod=subject,
            node=node,
            exit_code=exit_code,
            retryable=retryable,
            started=started,
        )

    if exit_code == 0:
        return ended(
            "Unknown", f"{subject} exited 0 before the trainer reported the end of training"
        )
    if exit_code == ExitCode.HUNG:
        return ended("Hang", f"{subject} hung (exit code {exit_code}){tail}")
    if exit_code == ExitCode.JOIN_TIMEOUT:
        return ended(
            "JoinTimeout",
            f"{subject} gave up waiting for the other workers to start (exit code "
            f"{exit_code}){tail}",
        )
    if exit_code == ExitCode.RENDEZVOUS_LOST:
        return ended(
            "RendezvousFailed", f"{subject} lost its rendezvous (exit code {exit_code}){tail}"
        )
    permanent = policy.is_permanent_exit(exit_code)
    kind = "permanent" if permanent else "retryable"
    return ended(
        "ExitCode",
        f"{subject} exited with code {exit_code} ({kind}){tail}",
        retryable=not permanent,
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
        reason="InPlaceRestart",
        message=clip_message(
            f"{_where(record.pod, record.node)} restarted its workers in place (restart "
            f"{record.restart}): a worker exited with code {record.exit_code}"
            + (f": {detail}" if detail else "")
        ),
        pod=record.pod,
        node=record.node,
        exit_code=record.exit_code,
        started=started,
        restart_count=record.restart,
        at=parse_time(record.time),
        follows=True,
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
        message=clip_message(
            f"{_where(failure.pod, failure.node)} restarted its workers in place (restart "
            f"{failure.restart_count}) because {what}{because}, which ended the round: its "
            f"worker exited with code {failure.exit_code}{detail}"
        ),
    )


def _where(pod: str, node: str | None) -> str:
    return f"pod {pod}" + (f" on node {node}" if node else "")


STORE_RESTARTS_THE_WORKERS = "; the workers re-rendezvous and resume from their checkpoint"
STORE_TRAINED_THROUGH = (
    "; recovery live: the replica groups train on without it (each pod's torchrun world needs "
    "the store only to start its workers: a group that restarts its workers, or a new pod, "
    "waits for the new store), nothing restarts from a checkpoint"
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
        reason="Straggler",
        message=f"{where}: rank {slowest.rank} computed {slowest.slowdown:.2f}× slower than "
        f"the other ranks' median ({slowest.compute_seconds * 1e3:.1f} ms vs "
        f"{slowest.median_seconds * 1e3:.1f} ms per step) for "
        f"{policy.straggler_seconds}s or more (failurePolicy.stragglerSlowdown "
        f"{policy.straggler_slowdown}); replacing it, preferring other nodes",
        pod=pod_name,
        node=slowest.node,
        started=started,
    )
