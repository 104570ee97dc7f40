"""The remaining-time estimate (``status.progress.estimatedRemainingSeconds``): the step pace
measured over recent windows of the trainer's reports, and the time left at that pace.

The two pure functions first, one table each (torchkube/operator/pace.py), then the planner
carrying them out pass after pass as the operator would: the estimate appears once a window
of training was seen, survives a restart and an operator restart, and is absent or zero where
it means nothing.
"""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from planner import NOW, make_job, pod, run, running_status, store
from prometheus_client import REGISTRY

from torchkube.api.contract import ProgressReport
from torchkube.api.status import PaceWindow, ProgressRecord, TrainingJobStatus
from torchkube.api.times import format_time
from torchkube.operator import metrics
from torchkube.operator.pace import PACE_HORIZON_SECONDS, Pace, remaining_seconds, track

T0 = NOW


def at(seconds: float) -> str:
    return format_time(T0 + timedelta(seconds=seconds))


def window(step: int, seconds: float) -> PaceWindow:
    return PaceWindow(step=step, time=at(seconds))


def record(
    step: int,
    seconds: float,
    *,
    resumes: int | None = 0,
    pace: float | None = None,
    since: PaceWindow | None = None,
    total: int | None = 1000,
) -> ProgressRecord:
    """The progress record the previous pass left in the status."""
    return ProgressRecord(
        step=step,
        total_steps=total,
        updated=at(seconds),
        resumes=resumes,
        step_seconds=pace,
        pace_window=since,
    )


def report(
    step: int, seconds: float | None, *, resumes: int = 0, world: int | None = 8
) -> ProgressReport:
    """The trainer's report this pass reads (``seconds`` None: it carries no time)."""
    return ProgressReport(
        step=step,
        total_steps=1000,
        resumes=resumes,
        world_size=world,
        updated=None if seconds is None else at(seconds),
    )


def blended(old: float, elapsed: float, steps: int) -> float:
    """The pace after a window of ``elapsed`` seconds and ``steps`` steps: time over steps,
    each weighted by its age over the horizon (the old pace stands for the time before)."""
    kept = math.exp(-elapsed / PACE_HORIZON_SECONDS) * PACE_HORIZON_SECONDS
    return (kept + elapsed) / (kept / old + steps)


@dataclass(frozen=True)
class PaceCase:
    name: str
    previous: ProgressRecord | None
    report: ProgressReport
    expected: Pace
    previous_world_size: int = 8
    now: datetime = T0 + timedelta(hours=1)


PACE_CASES = [
    PaceCase(
        "the first report has nothing to be measured from",
        None,
        report(0, 0),
        Pace(None, None),
    ),
    PaceCase(
        "the same report read again opens no window",
        record(100, 0),
        report(100, 0),
        Pace(None, None),
    ),
    PaceCase(
        "steps seen advancing open a window there: start-up and the first step stay out",
        record(0, 0),
        report(10, 30),
        Pace(None, window(10, 30)),
    ),
    PaceCase(
        "a window under 20 s measures nothing yet",
        record(20, 40, since=window(10, 30)),
        report(25, 45),
        Pace(None, window(10, 30)),
    ),
    PaceCase(
        "the first full window sets the pace and starts the next window",
        record(25, 45, since=window(10, 30)),
        report(40, 60),
        Pace(1.0, window(40, 60)),
    ),
    PaceCase(
        "a slower window moves the pace by its share of the last five minutes",
        record(50, 80, pace=1.0, since=window(40, 60)),
        report(60, 100),
        Pace(pytest.approx(blended(1.0, 40, 20)), window(60, 100)),
    ),
    PaceCase(
        "a window at the same pace leaves it as it is",
        record(50, 80, pace=1.0, since=window(40, 60)),
        report(70, 90),
        Pace(pytest.approx(1.0), window(70, 90)),
    ),
    PaceCase(
        "no step in the window (a long checkpoint, a hang): pace and window stay",
        record(40, 90, pace=1.0, since=window(40, 60)),
        report(40, 120),
        Pace(1.0, window(40, 60)),
    ),
    PaceCase(
        "the step went back (resumed from a checkpoint): the pace stays, no window spans it",
        record(100, 0, pace=1.0, since=window(80, -30)),
        report(60, 90),
        Pace(1.0, None),
    ),
    PaceCase(
        "resumed at the same step (resumes changed): no window spans the restart",
        record(100, 0, pace=1.0, since=window(80, -30)),
        report(105, 90, resumes=1),
        Pace(1.0, None),
    ),
    PaceCase(
        "the resumed round seen stepping opens a window, the pace still known",
        record(60, 90, resumes=1, pace=1.0),
        report(70, 100, resumes=1),
        Pace(1.0, window(70, 100)),
    ),
    PaceCase(
        "another world size trains at another pace: unknown until measured",
        record(100, 0, pace=1.0, since=window(80, -30)),
        report(110, 30, world=4),
        Pace(None, None),
        previous_world_size=8,
    ),
    PaceCase(
        "a trainer that does not say its world size keeps the pace",
        record(100, 0, pace=1.0, since=window(80, -30)),
        report(110, 10, world=None),
        Pace(pytest.approx(blended(1.0, 40, 30)), window(110, 10)),
    ),
    PaceCase(
        "a report without a time is placed at the operator's clock",
        record(25, 45, since=window(10, 30)),
        report(40, None),
        Pace(1.0, window(40, 60)),
        now=T0 + timedelta(seconds=60),
    ),
    PaceCase(
        "time going back (another pod's clock) measures nothing",
        record(25, 45, since=window(10, 30)),
        report(40, 20),
        Pace(None, window(10, 30)),
    ),
    PaceCase(
        "a record without resumes (an older operator's) is taken as this round",
        record(25, 45, resumes=None, since=window(10, 30)),
        report(40, 60, resumes=2),
        Pace(1.0, window(40, 60)),
    ),
]


@pytest.mark.parametrize("case", PACE_CASES, ids=[c.name for c in PACE_CASES])
def test_pace(case: PaceCase) -> None:
    assert track(case.previous, case.previous_world_size, case.report, case.now) == case.expected


@dataclass(frozen=True)
class RemainingCase:
    name: str
    phase: str
    progress: ProgressRecord | None
    expected: int | None


def progress(step: int, total: int | None = 1000, pace: float | None = 2.0) -> ProgressRecord:
    return ProgressRecord(step=step, total_steps=total, step_seconds=pace)


REMAINING_CASES = [
    RemainingCase("steps left at the recent pace", "Running", progress(100), 1800),
    RemainingCase("rounded to the second", "Running", progress(997, pace=0.35), 1),
    RemainingCase("no pace measured yet: unknown", "Running", progress(100, pace=None), None),
    RemainingCase("no total steps: unknown", "Running", progress(100, total=None), None),
    RemainingCase("no progress reported: unknown", "Running", None, None),
    RemainingCase("every step done: nothing left", "Running", progress(1000), 0),
    RemainingCase("past the total: nothing left", "Running", progress(1003), 0),
    RemainingCase("restarting: recovery time unknown", "Restarting", progress(100), None),
    RemainingCase("suspended (paused)", "Suspended", progress(100), None),
    RemainingCase("queued by Kueue (paused)", "Queued", progress(100), None),
    RemainingCase("pending: not training yet", "Pending", progress(100), None),
    RemainingCase("failed: it will not finish", "Failed", progress(100), None),
    RemainingCase("succeeded: nothing left", "Succeeded", progress(100), 0),
    RemainingCase("succeeded without reports: nothing left", "Succeeded", None, 0),
]


@pytest.mark.parametrize("case", REMAINING_CASES, ids=[c.name for c in REMAINING_CASES])
def test_remaining_seconds(case: RemainingCase) -> None:
    assert remaining_seconds(case.phase, case.progress) == case.expected


# --- the planner writes it, pass after pass --------------------------------------------------


def healthy() -> list[dict[str, Any]]:
    return [pod(i) for i in range(4)] + [store()]


class Operator:
    """Plans pass after pass on the status the previous pass wrote, as the operator does;
    ``seconds`` is the operator's clock, after the tests' NOW."""

    def __init__(self, status: dict[str, Any] | TrainingJobStatus | None = None, **spec: Any):
        self.status: Any = status if status is not None else running_status()
        self.spec = spec

    def see(
        self,
        seconds: float,
        step: int | None,
        pods: list[dict[str, Any]] | None = None,
        **fields: Any,
    ) -> TrainingJobStatus:
        """One pass; ``step`` is the trainer's report, written one second before (None: the
        operator has none, as after its own restart)."""
        progress = None
        if step is not None:
            body = {"step": step, "totalSteps": 1000, "worldSize": 8, **fields}
            body.setdefault("updated", at(seconds - 1))
            progress = ProgressReport.model_validate(body)
        result = run(
            make_job(self.status, **self.spec),
            healthy() if pods is None else pods,
            now=T0 + timedelta(seconds=seconds),
            progress=progress,
        )
        self.status = result.status
        return result.status


def wire_progress(status: TrainingJobStatus) -> dict[str, Any]:
    assert status.progress is not None
    return status.progress.to_wire()


def test_the_estimate_appears_after_a_window_of_training_and_counts_down() -> None:
    op = Operator()
    op.see(10, 0)  # the round's first report: start-up, nothing to measure from
    op.see(20, 5)  # stepping: the window opens here (the first, slow steps stay out)
    first = op.see(30, 15)
    assert first.progress is not None and first.progress.estimated_remaining_seconds is None
    measured = op.see(40, 25)  # 20 s, 20 steps
    assert wire_progress(measured) | {"updated": None} == {
        "step": 25,
        "totalSteps": 1000,
        "resumes": 0,
        "updated": None,
        "stepSeconds": 1.0,
        "paceWindow": {"step": 25, "time": at(39)},
        "estimatedRemainingSeconds": 975,
        "remaining": "16m",
    }
    later = op.see(50, 35)  # the pace window is still open: the same pace, fewer steps left
    assert later.progress is not None and later.progress.estimated_remaining_seconds == 965


def test_a_restart_keeps_the_pace_and_leaves_the_downtime_out() -> None:
    op = Operator()
    for seconds, step in [(10, 0), (20, 10), (40, 30)]:
        op.see(seconds, step)
    assert op.status.progress.step_seconds == 1.0
    # A worker fails: the job restarts from its checkpoint, the last report still in memory.
    failed = [pod(0), pod(1, phase="Failed", exit_code=1), pod(2), pod(3), store()]
    restarting = op.see(45, 30, pods=failed)
    assert restarting.phase == "Restarting"
    assert restarting.progress is not None
    assert restarting.progress.estimated_remaining_seconds is None, "recovery time is unknown"
    assert restarting.progress.pace_window is None, "no window spans the restart"
    # Two minutes later the resumed trainer reports from its checkpoint, step 20.
    resumed = op.see(170, 20, resumes=1)
    assert resumed.phase == "Running"
    assert resumed.progress is not None and resumed.progress.step_seconds == 1.0
    assert resumed.progress.estimated_remaining_seconds == 980, "the known pace, not the gap"
    op.see(180, 30, resumes=1)
    after = op.see(200, 50, resumes=1)
    assert after.progress is not None and after.progress.step_seconds == pytest.approx(1.0)


def test_an_operator_restart_keeps_the_estimate() -> None:
    op = Operator()
    for seconds, step in [(10, 0), (20, 10), (40, 30)]:
        op.see(seconds, step)
    again = op.see(50, None)  # a new operator process: no report read yet
    assert again.progress is not None and again.progress.estimated_remaining_seconds == 970
    resumed = op.see(60, 50)  # its first read: the window the old process opened goes on
    assert resumed.progress is not None and resumed.progress.step_seconds == 1.0


def test_a_suspended_job_has_no_estimate() -> None:
    op = Operator()
    for seconds, step in [(10, 0), (20, 10), (40, 30)]:
        op.see(seconds, step)
    op.spec = {"runPolicy": {"suspend": True}}
    suspended = op.see(50, 30, pods=[])
    assert suspended.phase == "Suspended"
    assert suspended.progress is not None
    assert suspended.progress.estimated_remaining_seconds is None
    assert suspended.progress.remaining is None and suspended.progress.pace_window is None


def test_a_job_that_succeeded_has_nothing_left() -> None:
    op = Operator(command=["train.py"], replicas={"min": 2, "max": 2})
    done = [pod(i, phase="Succeeded", exit_code=0) for i in range(2)]
    finished = op.see(10, 990, pods=done)
    assert finished.phase == "Succeeded"
    assert finished.progress is not None
    assert finished.progress.estimated_remaining_seconds == 0
    assert finished.progress.remaining == "0s"


def test_the_operator_exports_the_estimate_while_it_is_known() -> None:
    def exported() -> float | None:
        return REGISTRY.get_sample_value(
            "torchkube_job_estimated_remaining_seconds", {"namespace": "ns", "job": "eta"}
        )

    metrics.job_seen("ns", "eta")
    try:
        assert exported() is None, "absent until known"
        metrics.job_observed("ns", "eta", 0, None, remaining=975)
        assert exported() == 975
        metrics.job_observed("ns", "eta", 0, None, remaining=None)
        assert exported() is None, "absent again while not known (restarting, suspended)"
        metrics.job_observed("ns", "eta", 0, None, remaining=0)
        assert exported() == 0, "a job that succeeded has nothing left"
    finally:
        metrics.job_gone("ns", "eta")
    assert exported() is None
