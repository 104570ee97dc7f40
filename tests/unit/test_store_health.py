"""The rendezvous store's health is part of the job's phase, conditions and restart budget:
a store that never runs must not leave a job Running for ever (torchkube/operator/phase.py,
failure.py, through the planner)."""

from datetime import timedelta
from typing import Any

from planner import NOW, READY, condition, make_job, pod, run, running_status, store

from torchkube.api.contract import ProgressReport
from torchkube.api.status import TrainingJobStatus
from torchkube.operator import pods as p

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
}
WORKERS = {"min": 2, "max": 2}


def _workers() -> list[dict[str, Any]]:
    return [pod(0), pod(1)]


def test_a_store_unschedulable_for_an_hour_is_not_running_and_says_why() -> None:
    stuck = store(phase="Pending", node=None, conditions=[UNSCHEDULABLE], age=3600)
    result = run(make_job(running_status(), replicas=WORKERS), [*_workers(), stuck])
    assert result.status.phase == "Restarting", "the workers cannot rendezvous without it"
    unschedulable = condition(result, "PodsUnschedulable")
    assert unschedulable["status"] == "True" and unschedulable["reason"] == "StoreUnschedulable"
    assert p.name(stuck) in unschedulable["message"]
    assert "didn't match Pod's node affinity/selector" in unschedulable["message"]
    assert "rendezvous.store" in unschedulable["message"], "says what would unblock it"
    restarting = condition(result, "Restarting")
    assert restarting["status"] == "True" and restarting["reason"] == "WaitingForStore"
    store_ready = condition(result, "StoreReady")
    assert store_ready["status"] == "False" and "unschedulable" in store_ready["message"]
    assert "StoreUnschedulable" in [e.reason for e in result.events]


def test_a_job_whose_store_never_runs_has_not_started_and_meets_its_start_deadline() -> None:
    stuck = store(phase="Pending", node=None, conditions=[UNSCHEDULABLE], age=600)
    job = make_job(replicas=WORKERS, runPolicy={"startDeadlineSeconds": 3600})
    first = run(job, [*_workers(), stuck])
    assert first.status.phase == "Pending" and first.status.start_time is None
    later = run(
        make_job(first.status, replicas=WORKERS, runPolicy={"startDeadlineSeconds": 3600}),
        [*_workers(), stuck],
        now=NOW + timedelta(hours=1),
    )
    failed = condition(later, "Failed")
    assert failed["reason"] == "StartDeadlineExceeded"
    assert "rendezvous store" in failed["message"]


def _crash_looping(restarts: int) -> dict[str, Any]:
    """The store's container exited 1 ``restarts`` times and waits in CrashLoopBackOff (an
    image without torchkube: No module named torchkube)."""
    looping = store(
        restarts=restarts,
        waiting=("CrashLoopBackOff", "back-off 5m0s restarting failed container=store"),
        conditions=[{"type": "Ready", "status": "False"}],
    )
    looping["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error"}
    }
    looping["metadata"]["name"] = "demo-rendezvous-abcde"
    return looping


def _rounds(
    rounds: int, max_restarts: int, steps: list[int | None] | None = None
) -> TrainingJobStatus:
    """The store crashes once every 5 minutes; ``steps[i]``: the trainer's step at round i."""
    status: Any = running_status()
    for index in range(rounds):
        step = steps[index] if steps else None
        result = run(
            make_job(status, replicas=WORKERS, failurePolicy={"maxRestarts": max_restarts}),
            [*_workers(), _crash_looping(index + 1)],
            now=NOW + timedelta(minutes=5 * index),
            progress=None if step is None else ProgressReport(step=step, updated=None),
        )
        status = result.status
        if status.phase == "Failed":
            break
    return status


def test_a_crash_looping_store_spends_the_budget_and_ends_the_job() -> None:
    status = _rounds(50, max_restarts=0)
    assert status.phase == "Failed", (status.phase, status.restarts_count_towards_max)
    assert status.restarts == 2, "the first loss is free, the next without a step counts"
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == "MaxRestartsExceeded"


def test_a_crash_looping_store_is_a_blocked_pod_that_names_its_logs() -> None:
    result = run(make_job(running_status(), replicas=WORKERS), [*_workers(), _crash_looping(3)])
    blocked = condition(result, "PodsBlocked")
    assert blocked["status"] == "True" and blocked["reason"] == "CrashLoopBackOff"
    assert "kubectl logs demo-rendezvous-abcde --previous" in blocked["message"]
    assert result.status.phase == "Restarting"


def test_store_losses_with_training_between_them_stay_free() -> None:
    status = _rounds(5, max_restarts=0, steps=[100, 200, 300, 400, 500])
    assert status.phase != "Failed"
    assert (status.restarts, status.restarts_count_towards_max) == (5, 0)


def test_the_loss_of_a_store_after_progress_is_free_again() -> None:
    """Two losses with no step between count; then training moves on and the next is free."""
    status = _rounds(4, max_restarts=5, steps=[100, 100, 150, 160])
    assert (status.restarts, status.restarts_count_towards_max) == (4, 1)
    counted = [r.counted for r in status.failures if r.reason == "RendezvousStoreLost"]
    assert counted == [False, True, False, False]


def test_without_progress_reports_a_store_that_served_between_two_crashes_stays_free() -> None:
    """No step is known (metrics off): the store serving again between two crashes is the
    progress that keeps the second free; the crash-looping store above never serves."""
    policy = {"maxRestarts": 0}
    first = run(
        make_job(running_status(), replicas=WORKERS, failurePolicy=policy),
        [*_workers(), _crash_looping(1)],
    )
    later = NOW + timedelta(minutes=10)
    served = store(restarts=1)
    served["metadata"]["name"] = "demo-rendezvous-abcde"
    back = run(
        make_job(first.status, replicas=WORKERS, failurePolicy=policy),
        [*_workers(), served],
        now=later,
    )
    assert back.status.phase == "Running"
    assert condition(back, "StoreReady")["status"] == "True"
    again = run(
        make_job(back.status, replicas=WORKERS, failurePolicy=policy),
        [*_workers(), _crash_looping(2)],
        now=later + timedelta(minutes=10),
    )
    assert again.status.phase != "Failed"
    assert (again.status.restarts, again.status.restarts_count_towards_max) == (2, 0)


def test_a_store_lost_with_its_node_again_and_again_stays_free() -> None:
    """Node losses are the cluster's doing (the replacement avoids the node): free however
    often, with or without steps between them."""
    status: Any = running_status()
    for index in range(3):
        lost = store(node=f"gone-{index}")
        result = run(
            make_job(status, replicas=WORKERS, failurePolicy={"maxRestarts": 0}),
            [*_workers(), lost],
            nodes={"n1": READY},
            now=NOW + timedelta(minutes=index),
        )
        status = result.status
    assert status.phase != "Failed"
    assert (status.restarts, status.restarts_count_towards_max) == (3, 0)
