"""Sorting the job's pods: which worker holds which slot, which store is live, which pods
ended and how (finished the training, failed, left as a released spare), and which of those
are failures not counted yet.

A failure is new until ``status.failures`` or the pod's failure-recorded label holds it
(``failure.Recorded``): pods that failed or were lost with their node (``node_loss``), a store
lost or restarted in place, a worker deleted by someone else (seen Terminating, or gone
without a trace: ``Observed.vanished``), and workers their launcher restarted in place (the
trainer's report). What the operator let go itself (scale-down, duplicates, suspend: its
release label) is never a failure.
"""

from datetime import timedelta
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.contract import STANDBY_RELEASED
from torchkube.api.times import parse_time
from torchkube.operator import conditions as cond
from torchkube.operator import failure, lifecycle
from torchkube.operator import pods as p
from torchkube.operator.decision import CONTINUE, Context, SortedPods, Step
from torchkube.operator.node_loss import NodeLoss
from torchkube.policy.accounting import in_place_due
from torchkube.policy.failures import Failure, store_loss

RELEASE_CONFIRM = timedelta(seconds=60)
"""How long a worker that left as a released spare keeps its slot without a sign that
training is over."""


def sort(ctx: Context) -> Step:
    """``ctx.pods``: the job's own pods (``ctx.owned``) sorted, with the failures among them
    not counted yet; pods lost with their node (judged now, ``NodeLoss``) are force-deleted,
    a failed store deleted."""
    ctx.pods = _Sorter(ctx, NodeLoss.of(ctx)).sort(ctx.owned)
    return CONTINUE


class _Sorter:
    """Sorts the job's pods and finds the failures not counted yet."""

    def __init__(self, ctx: Context, loss: NodeLoss) -> None:
        self.ctx = ctx
        self.recorded = failure.Recorded.of(ctx.status)
        self.node_loss = loss
        self.policy = ctx.spec.failure_policy

    def _store_failure(self, pod: dict[str, Any], lost: bool) -> Failure | None:
        """The store's failure if it is new: each in-place restart is one, and its loss
        (node lost, evicted, deleted by someone) one more."""
        found = failure.store_failure(pod, lost)
        if self.recorded.holds(pod, found.restart_count or 0):
            return None
        progress = self.ctx.status.progress
        step = progress.step if progress is not None else None
        served = self.ctx.condition(cond.STORE_READY)
        since = None
        if served is not None and served.status == "True":
            since = parse_time(served.last_transition_time)
        return store_loss(found, self.ctx.status.failures, step, since, crashed=not lost)

    def sort(self, owned: list[dict[str, Any]]) -> SortedPods:
        out = SortedPods()
        self.training_over = _training_over(self.ctx, owned)
        for pod in owned:
            state = p.state(pod)
            lost = self.node_loss.lost(self.ctx, pod)
            # A pod the operator let go (scale-down, duplicate, suspend) was leaving by choice:
            # its node's loss only ends the wait for its kubelet.
            lost = lost and not self._released_by_operator(pod)
            if p.role(pod) == lbl.ROLE_RENDEZVOUS:
                self._store(out, pod, state, lost)
            elif p.role(pod) == lbl.ROLE_LIGHTHOUSE:
                self._lighthouse(out, pod, state, lost)
            elif p.role(pod) == lbl.ROLE_WORKER:
                self._worker(out, pod, state, lost)
        for pod in out.deleting:
            if not self.recorded.holds(pod) and self._deleted_externally(out, pod):
                out.new_failures.append(failure.classify_pod(pod, self.policy, False))
        out.new_failures[:0] = self._in_place_restarts(out)
        for pod in self.ctx.observed.vanished:
            if not self.recorded.holds(pod) and self._deleted_externally(out, pod):
                out.new_failures.append(failure.vanished_failure(pod))
        return out

    def _worker(self, out: SortedPods, pod: dict[str, Any], state: str, lost: bool) -> None:
        if state == "succeeded" and lifecycle.finished_training(self.ctx, pod):
            out.succeeded.append(pod)
        elif state == "succeeded" and STANDBY_RELEASED in p.termination_message(pod):
            if self._released_at_the_end(pod):
                out.released.append(pod)
            else:
                out.failed.append(pod)
                if not self.recorded.holds(pod):
                    out.new_failures.append(failure.released_early(pod))
        elif state in ("succeeded", "failed") or lost:
            out.failed.append(pod)
            if not self.recorded.holds(pod):
                out.new_failures.append(failure.classify_pod(pod, self.policy, lost))
        elif state == "deleting":
            out.deleting.append(pod)
        else:
            out.live_workers.setdefault(p.slot(pod), []).append(pod)

    def _in_place_restarts(self, out: SortedPods) -> list[Failure]:
        """The trainer's report of workers restarted in place, due and not counted yet."""
        report = self.ctx.observed.progress
        if report is None:
            return []
        live = {p.name(pod): pod for pod in out.workers}
        due, wait = in_place_due(
            report.in_place_restarts,
            {name: p.created(pod) for name, pod in live.items()},
            lambda name, restart: self.recorded.holds(live[name], restart),
            self.ctx.now,
            {name: p.slot(pod) for name, pod in live.items()},
        )
        if wait is not None:
            self.ctx.plan.requeue(wait)
        return due

    def _released_at_the_end(self, pod: dict[str, Any]) -> bool:
        """A spare is released only when training is over: only the end closes the
        rendezvous (``elastic/torchrun.py``). The workers that finished may be seen a moment
        after it, so it keeps its slot for ``RELEASE_CONFIRM`` before it is taken for
        what an older launcher's join timeout left behind. One the operator let go (its
        label) is released whenever it ends."""
        if self.training_over or lbl.RELEASED in pod["metadata"].get("labels", {}):
            return True
        ended = parse_time(p.terminated(pod).get("finishedAt")) or self.ctx.now
        wait = (ended + RELEASE_CONFIRM - self.ctx.now).total_seconds()
        if wait > 0:
            self.ctx.plan.requeue(wait)
        return wait > 0

    def _store(self, out: SortedPods, pod: dict[str, Any], state: str, lost: bool) -> None:
        """A store that restarted in place is one incident per restart; a lost or failed one
        is replaced (and is one incident) unless the operator itself deleted it."""
        gone = lost or state in ("failed", "succeeded")
        deleted_by_someone = state == "deleting" and self._released_by_someone(pod)
        if gone or deleted_by_someone:
            found = self._store_failure(pod, lost=True) if self._running_job() else None
            if found is not None:
                out.new_failures.append(found)
            if gone and not lost:
                self.ctx.plan.delete(pod)
            return
        if state in ("pending", "running"):
            out.live_stores.append(pod)
            found = self._store_failure(pod, lost=False) if p.restart_count(pod) else None
            if found is not None:
                out.new_failures.append(found)

    def _lighthouse(self, out: SortedPods, pod: dict[str, Any], state: str, lost: bool) -> None:
        """The Lighthouse holds no training state and its loss restarts nothing (the groups
        wait for a new one at their next quorum: ``phase`` says so): a failed one is deleted,
        one lost with its node was force-deleted (``node_loss``), one being deleted is let
        go, and a new one is created (``scaling.keep_lighthouse``); no failure is recorded."""
        if state in ("failed", "succeeded") and not lost:
            self.ctx.plan.delete(pod)
        elif state in ("pending", "running") and not lost:
            out.live_lighthouses.append(pod)

    def _running_job(self) -> bool:
        return not self.ctx.spec.run_policy.suspend and not lifecycle.is_finished(self.ctx)

    def _released_by_operator(self, pod: dict[str, Any]) -> bool:
        """Deleted by this operator on purpose: it labels what it lets go, and remembers."""
        return (
            lbl.RELEASED in pod["metadata"].get("labels", {})
            or p.name(pod) in self.ctx.observed.self_deleted
        )

    def _released_by_someone(self, pod: dict[str, Any]) -> bool:
        """Deleted, but not by this operator."""
        return not self._released_by_operator(pod)

    def _deleted_externally(self, out: SortedPods, pod: dict[str, Any]) -> bool:
        """A worker being deleted by someone else while it was the only one in a wanted slot
        of a running job: preemption, eviction or ``kubectl delete pod``."""
        index = p.slot(pod)
        return (
            self._running_job()
            and self._released_by_someone(pod)
            and index < self.ctx.spec.replicas.pods
            and index not in out.live_workers
        )


def _training_over(ctx: Context, owned: list[dict[str, Any]]) -> bool:
    """A worker ended the training, or the trainer reported its last step."""
    progress = ctx.status.progress
    if progress is not None and progress.total_steps and progress.step >= progress.total_steps:
        return True
    return any(
        p.role(pod) == lbl.ROLE_WORKER
        and p.state(pod) == "succeeded"
        and lifecycle.finished_training(ctx, pod)
        for pod in owned
    )
