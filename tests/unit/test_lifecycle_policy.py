"""Life-cycle policy: suspension, deadlines, success and clean-up
(torchkube/operator/lifecycle.py)."""

from datetime import timedelta

from planner import NOW, condition, created_slots, healthy, make_job, pod, run, running_status

from torchkube.api.contract import TRAINING_FINISHED, finished_step, training_finished_message
from torchkube.api.times import format_time


def _suspended_at(ago: timedelta) -> dict[str, object]:
    return {
        "type": "Suspended",
        "status": "True",
        "reason": "Suspended",
        "lastTransitionTime": format_time(NOW - ago),
    }


DEADLINE = {"activeDeadlineSeconds": 3600}


def _resumed_and_running(status: dict[str, object]) -> object:
    """Resume a suspended job now; its workers run a minute later."""
    resumed = run(make_job(status, runPolicy=DEADLINE), [])
    assert resumed.status.phase != "Failed"
    assert created_slots(resumed) == [0, 1, 2, 3]
    running = run(make_job(resumed.status, runPolicy=DEADLINE), healthy(), now=NOW + MINUTE)
    assert running.status.phase == "Running"
    return running.status


MINUTE = timedelta(minutes=1)


def test_a_job_created_suspended_gets_its_whole_deadline_from_its_first_start() -> None:
    """Queued (suspended) for 2 h from its creation, as Kueue holds jobs, then started: the
    1 h deadline counts from the start, not from the creation and not minus the queueing."""
    queued = {"phase": "Suspended", "conditions": [_suspended_at(timedelta(hours=2))]}
    status = _resumed_and_running(queued)
    assert status.last_start_time == format_time(NOW + MINUTE)
    job = make_job(status, runPolicy=DEADLINE)
    before = run(job, healthy(), now=NOW + MINUTE + timedelta(minutes=59))
    assert before.status.phase == "Running"
    assert before.requeue_after is not None and before.requeue_after <= 60
    after = run(job, healthy(), now=NOW + MINUTE + timedelta(minutes=60))
    assert condition(after, "Failed")["reason"] == "DeadlineExceeded"


def test_a_suspension_stops_and_resets_the_deadline_like_a_kubernetes_job() -> None:
    """Ran 50 min of its 1 h, suspended 90 min, resumed: a Kubernetes Job's timer is stopped
    and reset by a suspension, so the job has a whole hour again from its restart."""
    status = running_status(phase="Suspended", conditions=[_suspended_at(timedelta(minutes=90))])
    status["startTime"] = format_time(NOW - timedelta(minutes=140))
    status["lastStartTime"] = status["startTime"]
    restarted = _resumed_and_running(status)
    assert restarted.start_time == status["startTime"], "the first start stays recorded"
    job = make_job(restarted, runPolicy=DEADLINE)
    assert run(job, healthy(), now=NOW + timedelta(minutes=31)).status.phase == "Running"
    late = run(job, healthy(), now=NOW + MINUTE + timedelta(minutes=60))
    assert condition(late, "Failed")["reason"] == "DeadlineExceeded"


def test_start_deadline_fails_a_job_that_never_starts_and_says_why() -> None:
    pulling = pod(0, phase="Pending", waiting=("ImagePullBackOff", "Back-off pulling image"))
    job = make_job(replicas={"min": 1, "max": 1}, runPolicy={"startDeadlineSeconds": 600})
    first = run(job, [pulling])
    assert condition(first, "PodsBlocked")["reason"] == "ImagePullBackOff"
    assert first.status.phase == "Pending"
    too_late = run(
        make_job(
            first.status, replicas={"min": 1, "max": 1}, runPolicy={"startDeadlineSeconds": 600}
        ),
        [pulling],
        now=NOW + timedelta(minutes=6),
    )
    failed = condition(too_late, "Failed")
    assert failed["reason"] == "StartDeadlineExceeded"
    assert "ImagePullBackOff" in failed["message"]


def test_cleanup_after_success_releases_what_it_deletes() -> None:
    done = pod(0, phase="Succeeded", exit_code=0, message=TRAINING_FINISHED)
    still_pending = pod(1, phase="Pending")
    result = run(make_job(running_status(), replicas={"min": 1, "max": 2}), [done, still_pending])
    assert result.status.phase == "Succeeded"
    assert result.release == {still_pending["metadata"]["name"]: "finished"}


def test_a_job_being_deleted_creates_nothing() -> None:
    """Foreground deletion: the garbage collector removes the Service and the pods while the
    job still exists; recreating them would hold the deletion up for ever."""
    job = make_job(running_status())
    job.metadata["deletionTimestamp"] = "2026-11-23T12:00:00Z"
    result = run(job, [pod(0)], children=[])
    assert result.create_children == [] and result.create_pods == []


def test_success_names_the_step_training_finished_at_not_the_last_poll() -> None:
    """Progress is polled every few seconds; the trainer's termination message has its last
    step, so a job that finished between two polls does not read "after 280 steps"."""
    done = [
        pod(i, phase="Succeeded", exit_code=0, message=training_finished_message(1000))
        for i in range(4)
    ]
    polled = running_status(progress={"step": 280, "totalSteps": 1000})
    result = run(make_job(polled), done)
    assert condition(result, "Succeeded")["message"] == "training completed after 1000 steps"
    assert result.status.progress is not None and result.status.progress.step == 1000


def test_success_without_a_final_step_keeps_the_polled_one() -> None:
    """A trainer that predates the step in its message (or a custom command) still ends the
    job; the condition then names the last step the operator saw."""
    done = [pod(i, phase="Succeeded", exit_code=0, message=TRAINING_FINISHED) for i in range(4)]
    result = run(make_job(running_status(progress={"step": 280, "totalSteps": 1000})), done)
    assert condition(result, "Succeeded")["message"] == "training completed after 280 steps"


def test_finished_step_reads_only_the_trainers_final_line() -> None:
    assert finished_step(training_finished_message(400)) == 400
    assert finished_step(f"some output\n{training_finished_message(7)}\n") == 7
    assert finished_step(TRAINING_FINISHED) is None
    assert finished_step("torchkube: standby released") is None
