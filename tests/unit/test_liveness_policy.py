"""Liveness in the planner: a job trains, or has ended, or says why it waits. A join
timeout is an incident of its own (free, the slot refilled), a pod counts as released only
once training is over, and a job short of ``replicas.min`` running workers names the pods it
waits for and why (torchkube/operator/sorting.py, failure.py, waiting.py)."""

from planner import condition, created_slots, make_job, pod, run, running_status, store

from torchkube.api.contract import JOIN_TIMED_OUT, STANDBY_RELEASED, TRAINING_FINISHED, ExitCode
from torchkube.operator import conditions as cond

TWO = {"min": 2, "max": 2}


def test_a_join_timeout_is_a_free_incident_and_its_slot_is_refilled() -> None:
    timed_out = pod(
        0,
        phase="Failed",
        exit_code=ExitCode.JOIN_TIMEOUT,
        message=f"{JOIN_TIMED_OUT} 1 of at least 2 agents came within join_timeout 600s",
    )
    pending = pod(1, phase="Pending", node=None)
    result = run(
        make_job(replicas=TWO, failurePolicy={"maxRestarts": 0}),
        [timed_out, pending, store()],
    )
    assert result.status.phase != "Failed", result.status.conditions
    last = result.status.last_failure
    assert last is not None and last.reason == "JoinTimeout", last
    assert (result.status.restarts, result.status.restarts_count_towards_max) == (1, 0)
    assert created_slots(result) == [0]
    assert "JoinTimeout" in [e.reason for e in result.events]


def test_standby_released_before_training_ended_is_refilled() -> None:
    """An older launcher closed the rendezvous at a join timeout and its agents left with
    'standby released' though nothing ever trained: the slots must not stay taken for good."""
    released = [
        pod(i, phase="Succeeded", exit_code=0, message=STANDBY_RELEASED, finished_ago=120)
        for i in range(2)
    ]
    result = run(make_job(replicas=TWO), [*released, store()])
    assert created_slots(result) == [0, 1]
    last = result.status.last_failure
    assert last is not None and last.reason == "JoinTimeout", last
    assert result.status.restarts_count_towards_max == 0


def test_standby_released_at_the_end_keeps_its_slot() -> None:
    finished = [pod(i, phase="Succeeded", exit_code=0, message=TRAINING_FINISHED) for i in (0, 1)]
    spare = pod(2, phase="Succeeded", exit_code=0, message=STANDBY_RELEASED, finished_ago=120)
    job = make_job(running_status(), replicas={"min": 2, "max": 2, "spares": 1})
    result = run(job, [*finished, spare, store()])
    assert result.status.phase == "Succeeded" and result.status.last_failure is None


def test_a_job_short_of_min_names_the_pods_it_waits_for_and_why() -> None:
    unschedulable = pod(
        1,
        phase="Pending",
        node=None,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    pulling = pod(2, phase="Pending", waiting=("ContainerCreating", ""), age=240)
    job = make_job(replicas={"min": 3, "max": 3})
    result = run(job, [pod(0), unschedulable, pulling, store()])
    waiting = condition(result, cond.WAITING_FOR_WORKERS)
    assert waiting["status"] == "True" and waiting["reason"] == "WorkersNotStarted"
    message = waiting["message"]
    assert "2 more workers" in message and "1 of at least 3" in message, message
    assert unschedulable["metadata"]["name"] in message and "Insufficient nvidia" in message
    assert pulling["metadata"]["name"] in message and "ContainerCreating for 4m" in message
    assert "joinTimeoutSeconds" in message, "what happens next must be said"

    later = make_job(result.status, replicas={"min": 3, "max": 3})
    all_up = run(later, [pod(0), pod(1), pod(2), store()])
    assert condition(all_up, cond.WAITING_FOR_WORKERS)["status"] == "False"


def test_the_wait_is_cleared_when_the_job_ends_or_is_suspended() -> None:
    job = make_job(replicas=TWO)
    waiting = run(job, [pod(0), pod(1, phase="Pending", node=None), store()])
    assert condition(waiting, cond.WAITING_FOR_WORKERS)["status"] == "True"
    suspended = run(make_job(waiting.status, replicas=TWO, runPolicy={"suspend": True}), [])
    assert condition(suspended, cond.WAITING_FOR_WORKERS)["status"] == "False"
    finished = pod(0, phase="Succeeded", exit_code=0, message=TRAINING_FINISHED)
    done = run(make_job(waiting.status, replicas=TWO), [finished, store()])
    assert done.status.phase == "Succeeded"
    assert condition(done, cond.WAITING_FOR_WORKERS)["status"] == "False"
