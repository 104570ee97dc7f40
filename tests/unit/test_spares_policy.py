"""Hot spares in the planner: pods beyond the target, counted in status.spares, and a spare
let go when training ended neither a failure nor a slot to refill
(torchkube/operator/scaling.py, phase.py, sorting.py)."""

from planner import created_slots, make_job, pod, run, running_status, store

from torchkube.api.contract import STANDBY_RELEASED, TRAINING_FINISHED

SPARED = {"min": 2, "max": 4, "spares": 2}


def test_a_new_job_creates_its_spares_with_its_workers() -> None:
    result = run(make_job(replicas=SPARED), [])
    assert created_slots(result) == [0, 1, 2, 3, 4, 5]


def test_running_pods_beyond_the_target_are_the_spares() -> None:
    result = run(
        make_job(running_status(), replicas=SPARED), [*(pod(i) for i in range(6)), store()]
    )
    assert result.create_pods == [] and result.delete_pods == []
    assert result.status.spares == 2 and result.status.desired_replicas == 4
    assert result.status.replicas == 6 and result.all_running
    one_pending = [*(pod(i) for i in range(5)), pod(5, phase="Pending", node=None), store()]
    assert run(make_job(running_status(), replicas=SPARED), one_pending).status.spares == 1


def test_a_spare_still_importing_torch_is_not_counted() -> None:
    """A spare pod Running but whose launcher's server has not imported torch yet (its
    container not ``started``) would take a place only after the import, seconds later than
    a warm one: counting it would promise a stand-by that is not ready."""
    cold = [*(pod(i) for i in range(5)), pod(5, warm=False), store()]
    result = run(make_job(running_status(), replicas=SPARED), cold)
    assert result.status.spares == 1 and result.status.replicas == 6
    assert result.create_pods == [] and result.delete_pods == [], "a cold spare is a spare"


def test_a_lost_worker_leaves_a_spare_fewer_and_gets_a_new_one_behind_it() -> None:
    failed = pod(1, phase="Failed", exit_code=137)
    pods = [pod(0), failed, *(pod(i) for i in range(2, 6)), store()]
    result = run(make_job(running_status(), replicas=SPARED), pods)
    assert created_slots(result) == [1]
    assert result.status.spares == 1  # five running: one of the spares trains in its place
    assert result.status.phase == "Running", "a spare takes the place: no wait for min"


def test_a_spare_released_at_the_end_is_no_failure_and_not_refilled() -> None:
    finished = [pod(i, phase="Succeeded", exit_code=0, message=TRAINING_FINISHED) for i in range(4)]
    released = pod(4, phase="Succeeded", exit_code=0, message=STANDBY_RELEASED)
    job = make_job(running_status(), replicas=SPARED)
    result = run(job, [*finished, released, pod(5), store()])
    assert result.status.restarts == 0 and result.status.last_failure is None
    assert created_slots(result) == []
    early = run(job, [pod(0), pod(1), pod(2), pod(3), released, pod(5), store()])
    assert early.status.restarts == 0 and created_slots(early) == []


def test_deleting_a_spare_from_outside_is_replaced_like_a_worker() -> None:
    pods = [*(pod(i) for i in range(5)), pod(5, deleting=True), store()]
    result = run(make_job(running_status(), replicas=SPARED), pods)
    assert created_slots(result) == [5]
    assert result.status.last_failure is not None
    assert result.status.last_failure.reason == "Deleted"
