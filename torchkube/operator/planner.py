"""The planner: from what is observed to what should be done, with no I/O.

``plan()`` is a pure function of the job, its pods and children, the nodes' health, the
trainer's last report and the clock. The controller feeds it from watch caches and carries out
the returned ``Plan``; because it is level-triggered (it looks at the world, not at the event
that woke it), an operator restart in the middle of a failure simply plans the same thing
again.

The decisions live one policy per module; this file only runs them in order (``POLICIES``
is that list). Each step takes the :class:`~torchkube.operator.decision.Context` and nothing
else, writes what it decides into it (status, conditions, events, the plan, and what a later
step reads: decision.py), and returns ``STOP`` when nothing else is to be planned this pass;
a job that ended is cleaned up once, at the end.
"""

import math
from collections.abc import Callable

from torchkube.api.contract import ProgressReport
from torchkube.api.spec import MANAGED_BY_MULTIKUEUE
from torchkube.api.status import CheckpointRecord, ProgressRecord, TrainingJobStatus
from torchkube.api.times import human_duration
from torchkube.operator import (
    children,
    dispatch,
    failure,
    goodput,
    lifecycle,
    node_loss,
    pace,
    phase,
    preparation,
    queueing,
    refusals,
    scaling,
    sorting,
    stragglers,
    topology,
    waiting,
)
from torchkube.operator import pods as p
from torchkube.operator import status as st
from torchkube.operator.decision import STOP, Context, Observed, Plan, Step, random_suffix

__all__ = ["Observed", "Plan", "plan", "random_suffix"]


def plan(observed: Observed, new_suffix: Callable[[], str] = random_suffix) -> Plan:
    """Decide what to do about one TrainingJob now.

    The policies run the job at the size Kueue admitted (``queueing.admitted_view``); where
    the workers are (``topology.report``) is read after the steps, whichever one settled the
    pass, so a job suspended or held by Kueue shows its workers gone; a job that ended keeps
    the placement it last had. Progress alone is written at most every
    ``status.PROGRESS_MIN_INTERVAL``; goodput is accounted last, on the status all others
    decided."""
    ctx = Context(observed, new_suffix, queueing.admitted_view(observed.job, observed.queue))
    _apply_progress(ctx, observed.progress)
    ctx.status.observed_generation = ctx.generation
    refusals.report_operator_trouble(ctx)
    if ctx.spec.managed_by == MANAGED_BY_MULTIKUEUE:
        if not lifecycle.is_being_deleted(ctx):
            dispatch.follow(ctx)
    else:
        _run_here(ctx)
    _pace_progress(ctx)
    goodput.account(ctx)
    _note_write(ctx)
    return ctx.done()


def _run_here(ctx: Context) -> None:
    """A job this cluster runs (not one MultiKueue dispatched elsewhere)."""
    if not lifecycle.is_being_deleted(ctx):
        ctx.owned = [pod for pod in ctx.observed.pods if p.owned_by(pod, ctx.job.uid)]
        _run_policies(ctx)
        queueing.place(ctx)
        if lifecycle.is_finished(ctx):
            lifecycle.clean_up_finished(ctx)
        else:
            topology.report(ctx)
    _estimate_remaining(ctx)


POLICIES: tuple[Callable[[Context], Step], ...] = (
    children.ensure,
    queueing.hold,
    lifecycle.suspend,
    lifecycle.deadlines,
    preparation.prepare,
    sorting.sort,
    failure.record_new,
    lifecycle.prune_failed,
    node_loss.report_partition,
    lifecycle.succeed,
    refusals.fail_permanent,
    stragglers.replace,
    refusals.back_off,
    scaling.scale_workers,
    scaling.keep_store,
    scaling.keep_lighthouse,
    phase.report_unschedulable,
    waiting.report,
    phase.report_blocked,
    lifecycle.fail_unstartable,
    phase.derive,
    phase.counts,
)
"""The policies' steps in the order they run (decision.py: one signature for all)."""


def _run_policies(ctx: Context) -> None:
    """The policies in order; a step that returns STOP settles this pass."""
    if lifecycle.is_finished(ctx):
        queueing.finish(ctx)
        return
    for step in POLICIES:
        if step(ctx) is STOP:
            return


def _pace_progress(ctx: Context) -> None:
    """A change of progress alone waits for ``status.PROGRESS_MIN_INTERVAL`` after the last
    write (``status.pace_progress``); the job is planned again when it is due."""
    observed = ctx.observed
    paced = st.pace_progress(observed.job.status, ctx.status, observed.status_written, ctx.now)
    ctx.status = paced.status
    if paced.due_in is not None:
        ctx.plan.requeue(paced.due_in)


def _note_write(ctx: Context) -> None:
    """When the job's status was last written, this pass's write included, for the next
    pass's pacing."""
    stored = ctx.observed.job.status or TrainingJobStatus()
    writes = ctx.status != stored and not ctx.plan.keep_status
    ctx.plan.status_written = ctx.now if writes else ctx.observed.status_written


def _apply_progress(ctx: Context, report: ProgressReport | None) -> None:
    """Copy the trainer's last report (the contract's ProgressReport) into the status, with
    the step pace it brings (pace.track)."""
    if report is None:
        return
    previous = ctx.status.progress
    measured = pace.track(previous, ctx.status.world_size, report, ctx.now)
    ctx.status.progress = ProgressRecord(
        step=report.step,
        total_steps=report.total_steps,
        loss=_finite(report.loss),
        tokens_per_second=_finite(report.tokens_per_second),
        updated=report.updated,
        resumes=report.resumes,
        step_seconds=measured.step_seconds,
        pace_window=measured.window,
    )
    if report.world_size:
        ctx.status.world_size = report.world_size
    if report.last_checkpoint_step is not None:
        ctx.status.latest_checkpoint = CheckpointRecord(
            step=report.last_checkpoint_step, time=report.last_checkpoint_time
        )


def _estimate_remaining(ctx: Context) -> None:
    """The time left at the recent pace, for the phase this pass decided (pace.py): only a
    Running job has one, and only a Running job keeps a pace window open."""
    progress = ctx.status.progress
    if progress is None:
        return
    left = pace.remaining_seconds(ctx.status.phase, progress)
    running = ctx.status.phase == "Running"
    ctx.status.progress = progress.model_copy(
        update={
            "pace_window": progress.pace_window if running else None,
            "estimated_remaining_seconds": left,
            "remaining": None if left is None else human_duration(left),
        }
    )


def _finite(value: float | None) -> float | None:
    """A number JSON can carry: a diverged trainer's NaN or inf loss is left out."""
    return value if value is not None and math.isfinite(value) else None
