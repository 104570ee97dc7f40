"""The planner: from what is observed to what should be done, with no I/O.

``plan()`` is a pure function of the job, its pods and children, the nodes' health, the
trainer's last report and the clock. The controller feeds it from watch caches and carries out
the returned ``Plan``; because it is level-triggered (it looks at the world, not at the event
that woke it), an operator restart in the middle of a failure simply plans the same thing
again.

The decisions live one policy per module; this file only sorts the pods and runs the policies
in order:

  being deleted: nothing (``lifecycle``) → children (``children``) → finished: clean-up and
  TTL (``lifecycle``), the Workload Finished (``queueing``) → waiting for Kueue (``queueing``)
  → suspended
  (``lifecycle``) → deadlines (``lifecycle``) → ``spec.data`` prepared, else the prepare pod
  and nothing more (``preparation``) → sort the job's own pods → new failures
  (``failure``): permanent or over budget → Failed, else record, back off, replace → success
  (``lifecycle``) → refused creates → the slowest rank, a straggler replaced (``stragglers``)
  → scale to the target and its spares (``scaling``) → keep the store → blocked and
  unschedulable pods, the workers a job short of ``replicas.min`` waits for (``waiting``),
  phase, counts and spares (``phase``). New failures include workers restarted in place
  (the trainer's report) and workers gone since the last plan (``Observed.vanished``).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from torchkube.api import labels as lbl
from torchkube.api.contract import STANDBY_RELEASED, ProgressReport
from torchkube.api.status import CheckpointRecord, ProgressRecord
from torchkube.api.times import parse_time
from torchkube.operator import (
    builders,
    children,
    failure,
    lifecycle,
    node_loss,
    phase,
    preparation,
    queueing,
    scaling,
    stragglers,
    waiting,
)
from torchkube.operator import conditions as cond
from torchkube.operator import pods as p
from torchkube.operator.decision import STOP, Context, Observed, Plan, random_suffix
from torchkube.operator.failure import Failure, Ledger

__all__ = ["Observed", "Plan", "plan", "random_suffix"]

KEEP_FAILED_PODS = 5
"""Failed worker pods kept for ``kubectl logs``; older ones are deleted."""

RELEASE_SCALE_DOWN = "scale-down"
RELEASE_DUPLICATE = "duplicate"
RELEASE_CONFIRM = timedelta(seconds=60)
"""How long a worker that left as a released spare keeps its slot without a sign that
training is over."""


@dataclass
class _Pods:
    """The job's own pods, sorted into what the policies act on."""

    live_workers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    live_stores: list[dict[str, Any]] = field(default_factory=list)
    succeeded: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    new_failures: list[Failure] = field(default_factory=list)
    deleting: list[dict[str, Any]] = field(default_factory=list)
    released: list[dict[str, Any]] = field(default_factory=list)
    """Spares that exited 0 when the rendezvous closed at the end of training."""
    lost_store: bool = False

    @property
    def workers(self) -> list[dict[str, Any]]:
        return [pod for pods in self.live_workers.values() for pod in pods]


class _Sorter:
    """Sorts the job's pods and finds the failures not counted yet."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.recorded = failure.Recorded.of(ctx.status)
        self.node_loss = node_loss.NodeLoss.of(ctx)
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
        return failure.store_loss(found, self.ctx.status.failures, step, since, crashed=not lost)

    def sort(self, owned: list[dict[str, Any]]) -> _Pods:
        out = _Pods()
        self.training_over = _training_over(self.ctx, owned)
        for pod in owned:
            state = p.state(pod)
            lost = self.node_loss.lost(self.ctx, pod)
            # A pod the operator let go (scale-down, duplicate, suspend) was leaving by choice:
            # its node's loss only ends the wait for its kubelet.
            lost = lost and not self._released_by_operator(pod)
            if p.role(pod) == lbl.ROLE_RENDEZVOUS:
                self._store(out, pod, state, lost)
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

    def _worker(self, out: _Pods, pod: dict[str, Any], state: str, lost: bool) -> None:
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

    def _in_place_restarts(self, out: _Pods) -> list[Failure]:
        """The trainer's report of workers restarted in place, due and not counted yet."""
        report = self.ctx.observed.progress
        if report is None:
            return []
        live = {p.name(pod): pod for pod in out.workers}
        due, wait = failure.in_place_due(
            report.in_place_restarts,
            {name: p.created(pod) for name, pod in live.items()},
            lambda name, restart: self.recorded.holds(live[name], restart),
            self.ctx.now,
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

    def _store(self, out: _Pods, pod: dict[str, Any], state: str, lost: bool) -> None:
        """A store that restarted in place is one incident per restart; a lost or failed one
        is replaced (and is one incident) unless the operator itself deleted it."""
        gone = lost or state in ("failed", "succeeded")
        deleted_by_someone = state == "deleting" and self._released_by_someone(pod)
        if gone or deleted_by_someone:
            out.lost_store = True
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

    def _deleted_externally(self, out: _Pods, pod: dict[str, Any]) -> bool:
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


def _prune_failed(ctx: Context, failed: list[dict[str, Any]]) -> None:
    kept = sorted(failed, key=lambda pod: p.created(pod) or ctx.now, reverse=True)
    for pod in kept[KEEP_FAILED_PODS:]:
        if p.state(pod) != "deleting":
            ctx.plan.delete(pod)


def _creates_allowed(ctx: Context) -> bool:
    """False while the apiserver's last refusal of a pod create is being backed off."""
    refused = ctx.observed.refused
    if refused is None:
        return True
    wait = (refused.at - ctx.now).total_seconds() + refused.retry_after
    if wait > 0:
        ctx.plan.requeue(wait)
        return False
    return True


def _scale_workers(ctx: Context, sorted_pods: _Pods, may_create: bool) -> list[int]:
    """Deletes the surplus and creates the missing workers; the slots left without a pod."""
    pods = ctx.spec.replicas.pods
    surplus, missing = scaling.surplus_and_missing(
        sorted_pods.live_workers,
        pods,
        ctx.now,
        occupied=[p.slot(pod) for pod in sorted_pods.released],
    )
    for pod in surplus:
        ctx.plan.delete(pod, why=RELEASE_SCALE_DOWN if p.slot(pod) >= pods else RELEASE_DUPLICATE)
    if not missing or not may_create:
        return missing
    ledger = Ledger.of(ctx.status)
    wait = failure.backoff_remaining(ledger, ctx.spec.failure_policy, ctx.now)
    if wait > 0:
        ctx.plan.requeue(wait)
        return missing
    avoid = scaling.avoided_nodes(ledger.history, ctx.now)
    for index in missing:
        ctx.plan.create_pods.append(builders.worker_pod(ctx.job, index, ctx.new_suffix(), avoid))
    return []


def _keep_store(ctx: Context, sorted_pods: _Pods, may_create: bool) -> None:
    stores = sorted(
        sorted_pods.live_stores,
        key=lambda pod: (p.state(pod) != "running", p.created(pod) or ctx.now),
    )
    for pod in stores[1:]:
        ctx.plan.delete(pod, why=RELEASE_DUPLICATE)
    if not stores and may_create:
        avoid = scaling.avoided_nodes(ctx.status.failures, ctx.now)
        ctx.plan.create_pods.append(builders.rendezvous_pod(ctx.job, ctx.new_suffix(), avoid))


def _refusal(ctx: Context) -> tuple[str, str] | None:
    refused = ctx.observed.refused
    if refused is None:
        return None
    return (
        "PodCreateRefused" if refused.what == "a pod" else "CreateRefused",
        f"the apiserver refused to create {refused.what} ({refused.code} {refused.reason}): "
        f"{refused.message}; retrying every {int(refused.retry_after)}s",
    )


def plan(observed: Observed, new_suffix: Callable[[], str] = random_suffix) -> Plan:
    """Decide what to do about one TrainingJob now."""
    ctx = Context(observed, new_suffix)
    _apply_progress(ctx, observed.progress)
    ctx.status.observed_generation = ctx.generation
    if lifecycle.is_being_deleted(ctx):
        return ctx.done()
    owned = [pod for pod in observed.pods if p.owned_by(pod, ctx.job.uid)]
    _run_policies(ctx, owned)
    if lifecycle.is_finished(ctx):
        lifecycle.clean_up_finished(ctx, owned)
    return ctx.done()


def _run_policies(ctx: Context, owned: list[dict[str, Any]]) -> None:
    """The policies in order; a step that returns STOP settles this pass. A job that ended,
    before or during the pass, is cleaned up afterwards (``plan``)."""
    if lifecycle.is_finished(ctx):
        queueing.finish(ctx)
        return
    children_ready = children.ensure(ctx, ctx.observed.children)
    if queueing.hold(ctx, owned) is STOP:
        return
    if lifecycle.suspend(ctx, owned) is STOP:
        return
    if lifecycle.deadlines(ctx) is STOP:
        return
    if preparation.prepare(ctx, owned, children_ready) is STOP:
        return

    sorter = _Sorter(ctx)
    sorted_pods = sorter.sort(owned)
    if failure.record(ctx, sorted_pods.new_failures) is STOP:
        return
    _prune_failed(ctx, sorted_pods.failed)
    node_loss.report_partition(ctx, sorter.node_loss)

    if lifecycle.succeed(ctx, sorted_pods.succeeded, sorted_pods.workers) is STOP:
        phase.counts(ctx, [] if lifecycle.is_finished(ctx) else sorted_pods.workers)
        return

    refused = ctx.observed.refused
    if refused is not None and refused.permanent:
        ctx.finish(
            "Failed",
            "PodCreateRefused",
            f"the apiserver refused the worker pod ({refused.code} {refused.reason}): "
            f"{refused.message}. This pod spec can never be created here; fix "
            "scheduling.podTemplate or the namespace's policy and create the job again",
        )
        return
    if stragglers.replace(ctx, sorted_pods.live_workers) is STOP:
        return
    may_create = children_ready and _creates_allowed(ctx)
    missing = _scale_workers(ctx, sorted_pods, may_create)
    _keep_store(ctx, sorted_pods, may_create)
    workers = sorted_pods.workers
    running = any(p.state(pod) == "running" for pod in workers)
    phase.report_unschedulable(ctx, workers, sorted_pods.live_stores)
    waiting.report(ctx, workers, len(missing))
    phase.report_blocked(
        ctx,
        _refusal(ctx)
        or phase.blocked_pods([*workers, *sorted_pods.live_stores])
        or phase.not_started(ctx, workers)
        or children.claim_problem(ctx, ctx.observed.children, running),
    )
    if ctx.status.phase == "Pending" or not ctx.status.start_time:
        _fail_unstartable(ctx, workers)
    if lifecycle.is_finished(ctx):
        return
    phase.derive(ctx, workers, sorted_pods.live_stores)
    phase.counts(ctx, workers)


def _fail_unstartable(ctx: Context, workers: list[dict[str, Any]]) -> None:
    """An image name that can never be pulled fails the job at once (the image is
    immutable); everything else that blocks a start waits for startDeadlineSeconds."""
    for pod in workers:
        blocked = p.blocked_reason(pod)
        if blocked is not None and blocked[0] == "InvalidImageName":
            ctx.finish(
                "Failed",
                "InvalidImageName",
                f"image {ctx.spec.image!r} is not a valid image reference: {blocked[1]}",
            )
            return


def _apply_progress(ctx: Context, report: ProgressReport | None) -> None:
    """Copy the trainer's last report (the contract's ProgressReport) into the status."""
    if report is None:
        return
    ctx.status.progress = ProgressRecord(
        step=report.step,
        total_steps=report.total_steps,
        loss=_finite(report.loss),
        tokens_per_second=_finite(report.tokens_per_second),
        updated=report.updated,
    )
    if report.world_size:
        ctx.status.world_size = report.world_size
    if report.last_checkpoint_step is not None:
        ctx.status.latest_checkpoint = CheckpointRecord(
            step=report.last_checkpoint_step, time=report.last_checkpoint_time
        )


def _finite(value: float | None) -> float | None:
    """A number JSON can carry: a diverged trainer's NaN or inf loss is left out."""
    return value if value is not None and math.isfinite(value) else None
