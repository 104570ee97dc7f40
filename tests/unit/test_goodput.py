"""Goodput (torchkube/operator/goodput.py): a job's status history replayed through the fold."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from planner import healthy, make_job, run, running_status
from training_jobs import NOW, training_job

from torchkube.api.contract import LiveProgress, ProgressReport
from torchkube.api.hang import HANG_MIN_SECONDS
from torchkube.api.status import TrainingJobStatus
from torchkube.operator import goodput as g
from torchkube.operator import status as st

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class History:
    """A job's observations, one per second unless told otherwise (a tiny trainer model)."""

    def __init__(self) -> None:
        self.samples: list[g.Sample] = []
        self.t = 0.0
        self.phase = "Pending"
        self.restarts = 0
        self.step: int | None = None
        self.checkpoint: int | None = None
        self.resumes: int | None = None
        self.blocking: float | None = None
        self.reporting = True
        self.groups: int | None = None
        self.target_groups: int | None = None

    def at(self, seconds: float, **changes: Any) -> "History":
        """Observe the job at T0 + ``seconds`` with the given fields changed."""
        self.t = seconds
        for key, value in changes.items():
            setattr(self, key, value)
        self.samples.append(
            g.Sample(
                time=T0 + timedelta(seconds=seconds),
                phase=self.phase,
                restarts=self.restarts,
                step=self.step,
                checkpoint_step=self.checkpoint,
                resumes=self.resumes,
                checkpoint_blocking_seconds=self.blocking,
                reporting=self.reporting,
                replica_groups=self.groups,
                target_groups=self.target_groups,
            )
        )
        return self

    def train(self, until: float, every: float = 1.0, step_seconds: float = 1.0) -> "History":
        """Step once per ``step_seconds`` until ``until``, reporting every ``every`` seconds;
        a checkpoint every 10 steps."""
        start_t, start_step = self.t, self.step or 0
        t = self.t
        while t + every <= until + 1e-9:
            t += every
            step = start_step + int((t - start_t) / step_seconds + 1e-9)
            self.at(t, step=step, checkpoint=step // 10 * 10)
        return self

    def replay(self) -> g.Goodput:
        return g.replay(T0, self.samples)


def accounted(state: g.Goodput) -> float:
    return state.productive + state.badput_total + state.excluded + state.open_seconds()


def started_job(history: History, running_at: float = 5, first_report: float = 8) -> History:
    """Pending until ``running_at``; the trainer's first report (step 0) at ``first_report``."""
    history.at(1).at(running_at, phase="Running").at(first_report, step=0, checkpoint=None)
    return history


def test_clean_run_is_scheduling_then_startup_then_productive() -> None:
    h = started_job(History()).train(until=108).at(110, phase="Succeeded")
    state = h.replay()
    assert state.badput["scheduling"] == pytest.approx(5)
    # Startup lasts until the first report that shows a step beyond the first one.
    assert state.badput["startup"] == pytest.approx(4)
    assert state.productive == pytest.approx(110 - 9, abs=1e-6)  # trained until it finished
    assert state.badput_total == pytest.approx(9)
    assert state.mode == "finished"
    assert state.ratio == pytest.approx(101 / 110)
    assert accounted(state) == pytest.approx(110)


def test_failure_costs_recovery_and_redo_until_training_passes_the_lost_step() -> None:
    h = started_job(History()).train(until=53)  # step 45 at t=53, checkpoint 40
    assert h.step == 45 and h.checkpoint == 40
    failed_at = 53.5
    h.at(failed_at, phase="Restarting", restarts=1)  # the operator records the failure
    h.at(57, phase="Running")  # replacement Running; the stale report still says 45
    h.at(60, step=40)  # the restarted trainer reports: resumed from the checkpoint
    h.train(until=80)
    state = h.replay()
    # Back at step 45 at t=65: 11.5 s lost to the failure, 5 of them re-doing steps 41-45.
    assert state.badput["redo"] == pytest.approx(5)
    assert state.badput["recovery"] == pytest.approx(65 - failed_at - 5)
    assert state.badput["recovery"] + state.badput["redo"] == pytest.approx(65 - failed_at)
    assert accounted(state) == pytest.approx(80)
    assert 0 < state.ratio < 1  # type: ignore[operator]


def test_a_lost_live_replica_group_costs_its_share_until_its_replacement_joins() -> None:
    """Live recovery, two groups: one lost at t=50, its replacement back in the quorum at
    t=70. The survivor trained on (no restart, no redo), so the loss cost 20 s of one group
    of two: 10 s of recovery. Before the second group first joined, after the job was scaled
    down to one group, scaled up again until the new group joins, and admitted again at one
    group after an eviction, training with one group costs nothing."""
    h = started_job(History())
    h.at(9, step=1, groups=1, target_groups=2).train(until=20)  # the second group not yet in
    h.at(21, step=14, groups=2).train(until=50)
    h.at(51, step=44, groups=1).train(until=70)
    h.at(71, step=65, groups=2).train(until=90)
    h.at(91, step=86, groups=1, target_groups=1).train(until=100)  # scaled down: not a loss
    h.at(101, step=96, target_groups=2).train(until=110)  # scaled up: the new one not in yet
    h.at(111, step=106, groups=2).train(until=115)  # it joined
    h.at(116, phase="Queued", checkpoint=110).at(120, phase="Running")  # evicted
    h.at(125, step=111, groups=1).train(until=140)  # admitted again at one group of two
    state = h.replay()
    assert state.restarts == 0 and state.badput["redo"] == 0
    assert state.badput["recovery"] == pytest.approx(10, abs=0.6)
    assert accounted(state) == pytest.approx(140)


def test_the_groups_come_from_the_writers_progress_report() -> None:
    job = training_job(replicas={"min": 1, "max": 4, "desired": 3})
    live = LiveProgress(replica_groups=2, grad_accum_steps=2)
    sample = g.Sample.of(job, TrainingJobStatus(), ProgressReport(step=9, live=live), T0)
    assert (sample.replica_groups, sample.target_groups) == (2, 3)
    plain = g.Sample.of(job, TrainingJobStatus(), ProgressReport(step=9), T0)
    assert (plain.replica_groups, plain.target_groups) == (None, None)


def test_failure_between_reports_counts_the_unreported_steps_as_lost() -> None:
    """Reports every 5 s: the trainer got 3 steps past its last report before it died."""
    h = started_job(History()).train(until=48, every=5)  # step 40 reported at t=48 (ckpt 40)
    h.at(51, phase="Restarting", restarts=1)
    state = h.replay()
    assert state.failed_step == 43 and state.base == 40
    assert state.productive == pytest.approx(48 - 8 - 5 + 3)


def test_restarted_trainer_is_recognised_by_its_resume_count() -> None:
    """The checkpoint is the failure step: only the resume count tells the new report apart."""
    h = started_job(History()).at(9, resumes=0).train(until=20)  # step 11 ... checkpoint 10
    h.at(20, step=10, checkpoint=10)
    h.at(21, phase="Restarting", restarts=1)
    h.at(25, phase="Running")
    h.at(26, step=10, resumes=1)  # fresh, but no step done yet
    assert h.replay().mode == "waiting"
    h.at(27, step=11)
    assert h.replay().mode == "training"


def test_suspended_time_is_left_out_and_the_resume_is_startup() -> None:
    h = started_job(History()).train(until=30)
    h.at(31, phase="Suspended").at(100)
    h.at(101, phase="Restarting").at(104, phase="Running").at(106, step=22, resumes=1)
    h.at(107, step=23).train(until=120)
    state = h.replay()
    assert state.excluded == pytest.approx(70)
    # Resumed (a step beyond the one it stopped at) with the report at t=107.
    assert state.badput["startup"] == pytest.approx(4 + (106 - 101))
    assert state.badput["recovery"] == 0
    assert accounted(state) == pytest.approx(120)


def test_without_progress_reports_running_time_is_productive() -> None:
    h = (
        History()
        .at(3, reporting=False)
        .at(5, phase="Running")
        .at(20)
        .at(21, phase="Restarting", restarts=1)
    )
    h.at(30, phase="Running").at(40)
    state = h.replay()
    assert state.badput["scheduling"] == pytest.approx(5)
    assert state.badput["recovery"] == pytest.approx(9)
    assert state.productive + state.open_seconds() == pytest.approx(16 + 10)


def test_a_hang_is_stall_after_ten_step_times_or_a_minute() -> None:
    h = started_job(History()).train(until=30).at(400).at(420, step=23)
    state = h.replay()
    assert state.badput["stall"] == pytest.approx(400 - 30 - HANG_MIN_SECONDS)
    assert accounted(state) == pytest.approx(420)


def test_a_stall_is_what_the_jobs_hang_timeout_says() -> None:
    """The operator charges ``stall`` by the rule the launcher's watchdog acts on
    (api/hang.py): a job that declares 30 s hung has stalled after 30 s, not two minutes."""
    spec: dict[str, Any] = {"failurePolicy": {"hangTimeoutSeconds": 30}}
    running = TrainingJobStatus(phase="Running", start_time="2026-01-01T00:00:00Z")
    stored = training_job(
        {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}, created=T0, **spec
    )
    state: g.Goodput | None = None
    for t in range(21):  # a step a second, then none for 60 s
        at = T0 + timedelta(seconds=t)
        state = g.track(state, stored, running, ProgressReport(step=t), at)
    state = g.track(state, stored, running, ProgressReport(step=20), T0 + timedelta(seconds=80))
    assert state.badput["stall"] == pytest.approx(60 - 30)
    off = training_job(stored.status, created=T0, failurePolicy={"hangTimeoutSeconds": 0})
    state = g.track(None, off, running, ProgressReport(step=20), T0)
    state = g.track(state, off, running, ProgressReport(step=20), T0 + timedelta(seconds=90))
    assert state.badput["stall"] == pytest.approx(90 - HANG_MIN_SECONDS)  # off: derived


def test_checkpoint_blocking_reported_by_the_trainer_moves_out_of_productive() -> None:
    h = started_job(History()).train(until=20).at(21, step=14, blocking=0.5)
    h.at(22, step=15, blocking=1.25).at(23, step=16, blocking=0.25)  # the last: new process
    state = h.replay()
    assert state.badput["checkpoint"] == pytest.approx(0.5 + 0.75 + 0.25)


def test_step_going_back_without_a_counted_failure_is_an_in_pod_restart() -> None:
    h = started_job(History()).train(until=30)  # step 22, checkpoint 20, 1 s per step
    h.at(40, step=21)  # torchrun restarted the workers in their pods; 1 step re-done
    state = h.replay()
    assert state.badput["redo"] == pytest.approx(1)
    assert state.badput["recovery"] == pytest.approx(9)
    assert state.high_water == 22


def test_the_ratio_is_written_with_other_changes_or_at_most_every_30_seconds() -> None:
    """The goodput bookkeeping (goodput.track) and when status.goodput is written
    (status.goodput_to_write), as the controller chains them."""
    written: st.GoodputWrite | None = None

    def reconcile(
        state: g.Goodput | None,
        stored: dict[str, Any],
        planned: dict[str, Any],
        progress: dict[str, Any] | None,
        at: datetime,
    ) -> tuple[g.Goodput, float | None]:
        nonlocal written
        report = ProgressReport.model_validate(progress) if progress else None
        stored_job = training_job(stored or None, created=T0)
        decided = TrainingJobStatus.model_validate(planned)
        state = g.track(state, stored_job, decided, report, at)
        written = st.goodput_to_write(state.ratio, stored_job.status, decided, written, at)
        return state, written.value

    pending = {"phase": "Pending"}
    state, value = reconcile(None, {}, pending, None, T0 + timedelta(seconds=2))
    assert value == 0.0  # first value is always written
    running = {"phase": "Running", "startTime": "2026-01-01T00:00:02Z"}
    state, value = reconcile(state, pending, running, None, T0 + timedelta(seconds=4))
    assert value == 0.0  # no progress yet: still scheduling/startup
    stored = {**running, "goodput": 0.0}
    for seconds, step in ((10, 5), (20, 10), (30, 20)):
        at = T0 + timedelta(seconds=seconds)
        state, value = reconcile(state, stored, dict(stored), {"step": step}, at)
    assert state.ratio == pytest.approx(10 / 30)
    assert value == 0.0  # nothing else changed, 26 s since it was written: kept
    at = T0 + timedelta(seconds=40)
    state, value = reconcile(state, stored, dict(stored), {"step": 30}, at)
    assert value == round(state.ratio or 0, 3) == 0.5
    changed = {**stored, "progress": {"step": 21}}
    state, value = reconcile(state, stored, changed, {"step": 21}, T0 + timedelta(seconds=41))
    assert value == round(state.ratio or 0, 3)  # written with the progress change


def test_a_restarted_operator_carries_the_ratio_over() -> None:
    status = {
        "phase": "Running",
        "startTime": "2026-01-01T00:00:10Z",
        "goodput": 0.8,
        "progress": {"step": 500},
    }
    now = T0 + timedelta(seconds=1000)
    stored = training_job(status, created=T0)
    assert stored.status is not None
    state = g.track(None, stored, stored.status, None, now)
    assert state.ratio == pytest.approx(0.8)
    assert state.productive == 0 and state.badput_total == 0  # counters restart at zero
    report = ProgressReport(step=600)
    state = g.track(state, stored, stored.status, report, now + timedelta(100))
    assert state.ratio > 0.8  # type: ignore[operator]


def test_a_job_created_again_under_the_same_name_starts_anew() -> None:
    pending = TrainingJobStatus(phase="Pending")
    state = g.track(None, training_job(created=T0), pending, None, T0 + timedelta(seconds=50))
    assert state.badput["scheduling"] == pytest.approx(50)
    again = T0 + timedelta(seconds=60)
    state = g.track(state, training_job(created=again), pending, None, again)
    assert state.badput["scheduling"] == 0


# --- the planning step (goodput.account): what the plan carries and what the status says ---


def _planned(job: Any, at: datetime, previous: g.Tracked | None = None, polled: bool = True) -> Any:
    """The plan for ``job`` with its four workers and store Running, at ``at``."""
    return run(job, healthy(), now=at, goodput=previous, progress_polled=polled)


def test_a_plan_carries_the_jobs_goodput_to_the_next_and_says_it_in_the_status() -> None:
    first = _planned(make_job(running_status()), NOW)
    assert first.goodput is not None, "the controller keeps it for the next reconcile"
    assert first.goodput.state.created == NOW - timedelta(minutes=5)
    assert first.status.goodput == first.goodput.written.value, "the first value is written"
    later = NOW + timedelta(seconds=10)
    second = _planned(make_job(first.status), later, first.goodput, polled=False)
    assert second.goodput is not None and second.goodput.state.last == later
    assert second.goodput.state.productive == pytest.approx(10), "continued, not restarted"


def test_without_progress_polling_the_running_pods_are_the_evidence_of_training() -> None:
    """An operator with no progress URL hears from no trainer: time with ``replicas.min``
    workers Running is productive; where reports are expected and none came, it is not."""
    first = _planned(make_job(running_status()), NOW)
    later = NOW + timedelta(seconds=10)
    polled = _planned(make_job(first.status), later, first.goodput, polled=True)
    unpolled = _planned(make_job(first.status), later, first.goodput, polled=False)
    assert polled.goodput is not None and unpolled.goodput is not None
    assert polled.goodput.state.productive == 0
    assert unpolled.goodput.state.productive == pytest.approx(10)


def test_the_status_keeps_its_ratio_while_nothing_else_changes_for_30_seconds() -> None:
    first = _planned(make_job(running_status(goodput=0.5)), NOW, polled=False)
    assert first.status.goodput == 0.5, "a restarted operator carries the ratio over"
    stored = make_job(first.status)
    quiet = _planned(stored, NOW + timedelta(seconds=10), first.goodput, polled=False)
    assert quiet.goodput is not None and quiet.goodput.state.ratio != 0.5
    assert quiet.status.goodput == 0.5, "a quiet job's status is not rewritten yet"
    due = _planned(stored, NOW + timedelta(seconds=40), first.goodput, polled=False)
    assert due.goodput is not None and due.goodput.state.ratio is not None
    assert due.status.goodput == round(due.goodput.state.ratio, 3) != 0.5
