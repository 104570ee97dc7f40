"""Goodput: the share of a job's wall time that made training progress the job kept.

The decomposition is Google's ML Goodput (docs/metrics.md, notes/perf-targets.md §7): every
second between the job's creation and now is either *productive* (steps that moved training
past the furthest step it had reached) or *badput*, charged to one cause:

=============  ===========================================================================
scheduling     created, but fewer than ``replicas.min`` workers Running yet
startup        workers Running, the trainer not stepping yet (image start, rendezvous,
               model build, checkpoint load); also after a resume from suspension
recovery       from a worker failure until the restarted trainer steps again
               (replacement pod, re-rendezvous, checkpoint restore, backoff); in live
               recovery, the lost replica groups' share of the time trained short of them
redo           re-doing steps that were done before a failure but not checkpointed
checkpoint     training blocked by checkpoint saves (when the trainer reports it)
data_loading   training blocked waiting for input (when the trainer reports it)
stall          Running, but no step for longer than the job's hang timeout (api/hang.py)
=============  ===========================================================================

Time while the job is suspended or after it finished counts for neither side. Per failure,
recovery + redo is exactly "the time from the failure until training passes the step it
stopped at", the figure ``torchkube run`` prints.

A live job (``failurePolicy.recovery: live``) loses one replica group, not its training: the
survivors go on, so a loss costs "N seconds of one group". Time trained with fewer groups
than the job has had (and still wants: its target) is productive only in the share of the
groups that trained; the rest is ``recovery`` until the replacement joins.

Everything here is pure: :func:`advance` folds one :class:`Sample` (what one reconcile saw)
into a :class:`Goodput` accumulator, so unit tests replay a job's status history through
:func:`replay`. The operator keeps one accumulator per job in memory and exports it
(torchkube/operator/metrics.py); only the ratio lives in ``status.goodput``, which is also
what a restarted operator continues from. The resolution is the progress poll interval
(``TORCHKUBE_PROGRESS_INTERVAL_SECONDS``): time between two reports is split by the steps
they show. Without progress reports (metrics disabled) goodput falls back to the share of
time with at least ``replicas.min`` workers Running.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from torchkube.api import TrainingJob
from torchkube.api.contract import ProgressReport
from torchkube.api.hang import derived_timeout, hang_timeout
from torchkube.api.status import TrainingJobStatus
from torchkube.api.times import parse_time
from torchkube.operator.status import GoodputWrite, goodput_to_write

if TYPE_CHECKING:  # the planning step reads and writes a Context
    from torchkube.operator.decision import Context

CAUSES = (
    "scheduling",
    "startup",
    "recovery",
    "redo",
    "checkpoint",
    "data_loading",
    "stall",
)
"""Badput causes, the values of the ``cause`` label."""

Mode = Literal["scheduling", "waiting", "training", "paused", "finished"]
_EXCLUDED_PHASES = ("Succeeded", "Failed")
PAUSED_PHASES = ("Suspended", "Queued")
"""Left out of the wall time: the user paused the job, or Kueue has not admitted it (yet or
again); neither is time the job lost."""


@dataclass(frozen=True)
class Sample:
    """What one reconcile saw of a job, in the terms of its status and progress report."""

    time: datetime
    phase: str
    restarts: int = 0
    """``status.restarts``: retryable worker failures so far."""
    step: int | None = None
    checkpoint_step: int | None = None
    resumes: int | None = None
    """The trainer's count of resumes from a checkpoint (progress ``restarts``)."""
    checkpoint_blocking_seconds: float | None = None
    """Cumulative seconds this trainer process was blocked by checkpoint saves."""
    data_wait_seconds: float | None = None
    """Cumulative seconds this trainer process waited for input batches."""
    reporting: bool = True
    """Whether progress reports are expected (trainer metrics on and the operator polling);
    without them, time with enough workers Running is all the evidence of training."""
    hang_timeout_seconds: float | None = None
    """``failurePolicy.hangTimeoutSeconds`` (None: derived from the step time, 0: off)."""
    collective_timeout_seconds: float | None = None
    """``trainer.collectiveTimeoutSeconds``, which a derived hang timeout stays below."""
    replica_groups: int | None = None
    """Live recovery: the replica groups in the last step's quorum (None: not live)."""
    target_groups: int | None = None
    """Live recovery: the groups the job wants now (one per worker pod: replicas.target)."""

    @classmethod
    def of(
        cls,
        job: TrainingJob,
        status: TrainingJobStatus,
        progress: ProgressReport | None,
        now: datetime,
        reporting: bool = True,
    ) -> Sample:
        """A sample from the status the reconcile decided and the trainer's last report."""
        step = progress.step if progress else (status.progress.step if status.progress else None)
        checkpoint = (
            progress.last_checkpoint_step
            if progress and progress.last_checkpoint_step is not None
            else (status.latest_checkpoint.step if status.latest_checkpoint else None)
        )
        return cls(
            time=now,
            phase=status.phase,
            restarts=status.restarts,
            step=step,
            checkpoint_step=checkpoint,
            resumes=progress.resumes if progress else None,
            checkpoint_blocking_seconds=progress.checkpoint_blocking_seconds if progress else None,
            data_wait_seconds=progress.data_wait_seconds if progress else None,
            reporting=reporting,
            hang_timeout_seconds=job.spec.failure_policy.hang_timeout_seconds,
            collective_timeout_seconds=job.spec.trainer.collective_timeout_seconds,
            replica_groups=progress.live.replica_groups if progress and progress.live else None,
            target_groups=job.spec.replicas.target if progress and progress.live else None,
        )


@dataclass(frozen=True)
class Goodput:
    """The running decomposition of one job's wall time (seconds)."""

    last: datetime
    """Time accounted up to."""
    created: datetime | None = None
    """The job's creation time (a job deleted and created again under its name starts anew)."""
    mode: Mode = "scheduling"
    productive: float = 0.0
    badput: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    carried_productive: float = 0.0
    carried_badput: float = 0.0
    """What an earlier operator process accounted (from ``status.goodput``): in the ratio,
    not in the exported counters, which restart with the process as counters do."""
    excluded: float = 0.0
    """Suspended or finished: neither good nor bad."""
    # --- what the trainer last reported
    step: int | None = None
    high_water: int | None = None
    """The furthest step training has reached: steps up to it that are done again are redo."""
    checkpoint_step: int | None = None
    resumes: int | None = None
    blocking: float | None = None
    data_wait: float | None = None
    restarts: int = 0
    peak_groups: int | None = None
    """Live recovery: the most replica groups that trained together since training last
    (re)started, capped by the groups the job wants."""
    # --- training: time since the last new step is charged once the next step shows
    open_since: datetime | None = None
    open_stall: float = 0.0
    step_seconds: float | None = None
    # --- waiting: what the wait is charged to and where training restarts from
    cause: str = "startup"
    base: int | None = None
    failed_step: int | None = None
    failed_resumes: int | None = None

    @property
    def badput_total(self) -> float:
        return sum(self.badput.values())

    def open_seconds(self) -> float:
        """The uncharged training time since the last new step (provisionally productive)."""
        if self.mode != "training" or self.open_since is None:
            return 0.0
        return max(0.0, (self.last - self.open_since).total_seconds() - self.open_stall)

    @property
    def ratio(self) -> float | None:
        """Goodput now: productive / (productive + badput), None before any time passed."""
        good = self.productive + self.carried_productive + self.open_seconds()
        total = good + self.badput_total + self.carried_badput
        if total <= 0:
            return None
        return min(1.0, max(0.0, good / total))


def start(created: datetime) -> Goodput:
    """The accumulator of a job first seen before it started: accounting from creation."""
    return Goodput(last=created, created=created)


_MODE_OF_PHASE: Mapping[str, Mode] = {
    "Running": "training",
    "Restarting": "waiting",
    "Suspended": "paused",
    "Queued": "paused",
    "Succeeded": "finished",
    "Failed": "finished",
}


def resume(status: TrainingJobStatus, created: datetime, now: datetime) -> Goodput:
    """The accumulator of a job already under way when this operator process first sees it.

    The ratio an earlier process wrote to ``status.goodput`` is carried over for the wall
    time so far; the mode follows the phase.
    """
    wall = max(0.0, (now - created).total_seconds())
    ratio = status.goodput
    carried = (0.0, 0.0) if ratio is None else (ratio * wall, (1 - ratio) * wall)
    step = status.progress.step if status.progress else None
    checkpoint = status.latest_checkpoint.step if status.latest_checkpoint else None
    mode = _MODE_OF_PHASE.get(status.phase, "scheduling")
    return Goodput(
        last=now,
        created=created,
        mode=mode,
        carried_productive=carried[0],
        carried_badput=carried[1],
        step=step,
        high_water=step,
        checkpoint_step=checkpoint,
        restarts=status.restarts,
        open_since=now if mode == "training" else None,
        cause="recovery",
        base=checkpoint or 0,
        failed_step=step,
    )


# ---------------------------------------------------------------------------- the fold


class _Book:
    """Mutable scratch for one :func:`advance`: charges, then one ``replace``."""

    def __init__(self, state: Goodput) -> None:
        self.productive = state.productive
        self.badput = dict(state.badput)
        self.excluded = state.excluded

    def charge(self, cause: str, seconds: float) -> None:
        if seconds > 0:
            self.badput[cause] = self.badput.get(cause, 0.0) + seconds

    def steps(self, seconds: float, old: int, new: int, high_water: int | None) -> float:
        """``seconds`` of training that took the step from ``old`` to ``new``: the part that
        re-did steps up to ``high_water`` is redo, the rest productive (returned)."""
        if seconds <= 0:
            return 0.0
        done = new - old
        redo = 0 if high_water is None or done <= 0 else min(max(high_water - old, 0), done)
        share = redo / done if done > 0 else 0.0
        self.charge("redo", seconds * share)
        self.productive += seconds * (1 - share)
        return seconds * (1 - share)

    def blocked(self, cause: str, seconds: float) -> None:
        """Move time the trainer says it was blocked out of productive time."""
        moved = min(max(seconds, 0.0), self.productive)
        self.productive -= moved
        self.charge(cause, moved)


def _delta(new: float | None, old: float | None) -> float:
    """Growth of a per-process cumulative value (a restarted trainer starts again at 0)."""
    if new is None:
        return 0.0
    if old is None or new < old:
        return new
    return new - old


def _stall_after(state: Goodput, sample: Sample) -> float:
    """Seconds without a new step after which training time is ``stall``: the job's hang
    timeout, the rule the launcher's watchdog acts on. With hang detection off the derived
    timeout still applies here: nothing is restarted, but a step-less hour is no progress."""
    timeout = hang_timeout(
        sample.hang_timeout_seconds, state.step_seconds, sample.collective_timeout_seconds
    )
    return derived_timeout(state.step_seconds) if timeout is None else timeout


def _resumed(state: Goodput, sample: Sample) -> bool:
    """Whether training runs again after a wait (start-up, failure, suspension)."""
    if not sample.reporting:
        return sample.phase == "Running"  # workers Running is the best evidence there is
    if sample.step is None:
        return False
    if state.failed_step is not None and sample.step > state.failed_step:
        return True  # past where it stopped (or it never stopped)
    fresh = (
        state.failed_step is None
        or sample.step < state.failed_step
        or (
            sample.resumes is not None
            and state.failed_resumes is not None
            and sample.resumes != state.failed_resumes
        )
    )
    base = state.base if state.base is not None else sample.step
    return fresh and sample.step > base


def advance(state: Goodput, sample: Sample) -> Goodput:
    """Fold one observation into the accumulator: charge the time since the last one by what
    the job was doing, then follow the job into its next mode."""
    now = max(sample.time, state.last)
    dt = (now - state.last).total_seconds()
    book = _Book(state)
    changes: dict[str, Any] = {}

    if state.mode in ("paused", "finished"):
        book.excluded += dt
    elif state.mode == "scheduling":
        book.charge("scheduling", dt)
    elif state.mode == "waiting":
        if _resumed(state, sample):
            trained = 0.0
            base = state.base if state.base is not None else state.step
            if sample.step is not None and base is not None and state.step_seconds:
                trained = min(dt, max(sample.step - base, 0) * state.step_seconds)
                book.steps(trained, base, sample.step, state.high_water)
            book.charge(state.cause, dt - trained)
            changes.update(mode="training", open_since=now, open_stall=0.0)
        else:
            book.charge(state.cause, dt)
            if state.base is None and sample.step is not None:
                changes["base"] = sample.step  # the first report after a fresh start
    elif state.mode == "training":
        changes.update(_train(state, sample, now, book))

    high_water = state.high_water
    if sample.step is not None:
        high_water = max(high_water or 0, sample.step)
    mode: Mode = changes.get("mode", state.mode)
    open_since = changes.get("open_since", state.open_since)
    open_stall = changes.get("open_stall", state.open_stall)

    # --- transitions, from what this sample says happened
    failed = sample.restarts > state.restarts
    leaving = (
        sample.phase in _EXCLUDED_PHASES
        or sample.phase in PAUSED_PHASES
        or failed
        or sample.phase == "Restarting"
    )
    if mode == "training" and leaving:
        # The training since the last new step ends here. Steps done after that report
        # were lost with the workers: they will be done again, so they count as reached.
        seconds = _open(replace(state, open_since=open_since), now) - open_stall
        book.productive += max(seconds, 0.0)
        lost = (failed or sample.phase == "Restarting") and sample.phase not in PAUSED_PHASES
        if state.step_seconds and lost:
            high_water = (high_water or 0) + int(max(seconds, 0.0) // state.step_seconds)
    if sample.phase in _EXCLUDED_PHASES:
        mode = "finished"
    elif sample.phase in PAUSED_PHASES:
        mode = "paused"
    elif mode == "paused" or (mode == "training" and leaving):
        checkpoint = sample.checkpoint_step
        if checkpoint is None:
            checkpoint = state.checkpoint_step
        changes.update(
            cause="startup" if mode == "paused" else "recovery",
            base=checkpoint or 0,
            failed_step=high_water,
            failed_resumes=state.resumes if sample.resumes is None else sample.resumes,
        )
        mode = "waiting"
    elif mode == "waiting" and failed:
        changes.update(cause="recovery", failed_step=high_water)
    elif mode == "scheduling" and sample.phase in ("Running", "Restarting"):
        changes.update(cause="startup", base=None, failed_step=None)
        mode = "waiting"
        if not sample.reporting:  # Running is all there is to go by
            changes.update(open_since=now, open_stall=0.0)
            mode = "training"
    changes.update(mode=mode, high_water=high_water)
    if mode != "training":
        changes.update(open_since=None, open_stall=0.0)

    return replace(
        state,
        last=now,
        productive=book.productive,
        badput=book.badput,
        excluded=book.excluded,
        step=sample.step if sample.step is not None else state.step,
        checkpoint_step=(
            sample.checkpoint_step if sample.checkpoint_step is not None else state.checkpoint_step
        ),
        resumes=sample.resumes if sample.resumes is not None else state.resumes,
        blocking=(
            sample.checkpoint_blocking_seconds
            if sample.checkpoint_blocking_seconds is not None
            else state.blocking
        ),
        data_wait=(
            sample.data_wait_seconds if sample.data_wait_seconds is not None else state.data_wait
        ),
        restarts=max(sample.restarts, state.restarts),
        peak_groups=_peak_groups(state, sample, mode),
        **changes,
    )


def _open(state: Goodput, now: datetime) -> float:
    if state.open_since is None:
        return 0.0
    return max(0.0, (now - state.open_since).total_seconds())


def _peak_groups(state: Goodput, sample: Sample, mode: Mode) -> int | None:
    """The most groups that trained together since training last (re)started, and no more
    than the job wants now: a job scaled down, or admitted again at fewer, lost nothing."""
    if mode != "training":
        return None
    peak = max(state.peak_groups or 0, sample.replica_groups or 0)
    if sample.target_groups is not None:
        peak = min(peak, max(sample.target_groups, sample.replica_groups or 0))
    return peak or None


def _groups_short(state: Goodput, sample: Sample) -> float:
    """Live recovery: the share of the job's replica groups lost and not yet back (groups
    it has had together and still wants, less those in the last step's quorum)."""
    if sample.replica_groups is None or not state.peak_groups:
        return 0.0
    wanted = min(state.peak_groups, sample.target_groups or state.peak_groups)
    if wanted <= 0:
        return 0.0
    return max(0, wanted - sample.replica_groups) / wanted


def _train(state: Goodput, sample: Sample, now: datetime, book: _Book) -> dict[str, Any]:
    """Charge training time: the span since the last new step once a new step shows, split
    into redo and productive by the steps it covered; a span beyond the stall limit is
    charged to ``stall`` as it grows."""
    span = _open(state, now)
    if not sample.reporting:
        book.productive += span - state.open_stall
        return {"open_since": now, "open_stall": 0.0}
    if sample.step is None or state.step is None or sample.step == state.step:
        overdue = max(0.0, span - _stall_after(state, sample)) - state.open_stall
        book.charge("stall", overdue)
        return {"open_stall": state.open_stall + max(overdue, 0.0)}
    seconds = span - state.open_stall
    changes: dict[str, Any] = {"open_since": now, "open_stall": 0.0}
    if sample.step > state.step:
        done = sample.step - state.step
        productive = book.steps(seconds, state.step, sample.step, state.high_water)
        book.blocked("recovery", productive * _groups_short(state, sample))
        rate = seconds / done
        changes["step_seconds"] = (
            rate if state.step_seconds is None else 0.5 * state.step_seconds + 0.5 * rate
        )
    else:
        # The step went back with no failure counted: torchrun restarted the workers inside
        # their pods (a crashed process, a re-rendezvous after scaling). Steps since the
        # checkpoint are known to be redone; the rest of the span was recovery.
        base = sample.checkpoint_step if sample.checkpoint_step is not None else 0
        redo = min(seconds, max(sample.step - base, 0) * (state.step_seconds or 0.0))
        book.charge("redo", redo)
        book.charge("recovery", seconds - redo)
    book.blocked("checkpoint", _delta(sample.checkpoint_blocking_seconds, state.blocking))
    book.blocked("data_loading", _delta(sample.data_wait_seconds, state.data_wait))
    return changes


def replay(created: datetime, samples: Iterable[Sample]) -> Goodput:
    """The accumulator after a job's whole history (what the operator computes incrementally)."""
    state = start(created)
    for sample in samples:
        state = advance(state, sample)
    return state


# ---------------------------------------------------------------------------- operator side


@dataclass(frozen=True)
class Tracked:
    """What the operator carries of a job's goodput from one reconcile to the next: the
    accumulator, and what ``status.goodput`` was last given (``status.goodput_to_write``)."""

    state: Goodput
    written: GoodputWrite


def account(ctx: Context) -> None:
    """The planning step, run last (it samples the status every other step decided): the
    job's accumulator advanced to now, kept in ``Plan.goodput`` for the next reconcile, and
    what ``status.goodput`` says. Progress counts as evidence only where reports are expected
    (the job's trainer metrics on, and the operator polling them)."""
    observed = ctx.observed
    job, previous = observed.job, observed.goodput
    reporting = job.spec.metrics.enabled and observed.progress_polled
    state = track(
        previous.state if previous else None,
        job,
        ctx.status,
        observed.progress,
        ctx.now,
        reporting=reporting,
    )
    last = previous.written if previous else None
    written = goodput_to_write(state.ratio, job.status, ctx.status, last, ctx.now)
    ctx.status.goodput = written.value
    ctx.plan.goodput = Tracked(state, written)


def track(
    state: Goodput | None,
    job: TrainingJob,
    status: TrainingJobStatus,
    progress: ProgressReport | None,
    now: datetime,
    reporting: bool = True,
) -> Goodput:
    """One reconcile's update. ``job`` is the job as stored (its status what an earlier
    reconcile wrote), ``status`` the one the plan decided, ``progress`` the trainer's last
    report, ``reporting`` whether reports are expected at all. When ``status.goodput`` is
    written is the status module's business."""
    created = parse_time(job.metadata.get("creationTimestamp")) or now
    if state is None or state.created != created:
        previous = job.status or TrainingJobStatus()
        under_way = previous.start_time or previous.phase != "Pending"
        state = resume(previous, created, now) if under_way else start(created)
    return advance(state, Sample.of(job, status, progress, now, reporting))
