"""Phase policy and pods that cannot start: PodsBlocked, invalid images
(torchkube/operator/phase.py, lifecycle.py)."""

from planner import (
    child,
    condition,
    lighthouse,
    make_job,
    own_children,
    pod,
    run,
    running_status,
    store,
)

from torchkube.operator.pods import name


def test_image_pull_failure_is_a_condition_and_one_warning() -> None:
    pulling = pod(0, phase="Pending", waiting=("ErrImagePull", "pull access denied"))
    job = make_job(replicas={"min": 1, "max": 1})
    first = run(job, [pulling])
    blocked = condition(first, "PodsBlocked")
    assert blocked["status"] == "True" and "pull access denied" in blocked["message"]
    assert [e.reason for e in first.events].count("ErrImagePull") == 1
    again = run(make_job(first.status, replicas={"min": 1, "max": 1}), [pulling])
    assert "ErrImagePull" not in [e.reason for e in again.events], "said once, not per reconcile"
    healthy = run(make_job(again.status, replicas={"min": 1, "max": 1}), [pod(0)])
    assert condition(healthy, "PodsBlocked")["status"] == "False"


def test_invalid_image_name_fails_at_once() -> None:
    bad = pod(0, phase="Pending", waiting=("InvalidImageName", 'invalid reference "A B"'))
    result = run(make_job(replicas={"min": 1, "max": 1}), [bad])
    assert condition(result, "Failed")["reason"] == "InvalidImageName"


def test_a_claim_that_is_never_bound_is_reported() -> None:
    claim = child(
        "PersistentVolumeClaim", "demo-checkpoints", creationTimestamp="2026-11-23T11:50:00Z"
    )
    claim["status"]["phase"] = "Pending"
    result = run(
        make_job(), [pod(i, phase="Pending") for i in range(4)], children=[own_children()[0], claim]
    )
    blocked = condition(result, "PodsBlocked")
    assert blocked["reason"] == "ClaimPending" and "demo-checkpoints" in blocked["message"]


def test_a_worker_that_never_passes_its_startup_probe_is_reported_once() -> None:
    """An image whose launcher predates the warm announcement: the pod trains, but is never
    started, Ready or counted; after five minutes the job says so instead of reading 0/1."""
    spec = {"replicas": {"min": 1, "max": 1}}
    young = run(make_job(**spec), [pod(0, warm=False, running_for=30), store()])
    assert "PodsBlocked" not in [c.type for c in young.status.conditions]
    assert young.requeue_after is not None and 269 <= young.requeue_after <= 270, "checked again"
    cold = pod(0, warm=False, running_for=301)
    late = run(make_job(young.status, **spec), [cold, store()])
    blocked = condition(late, "PodsBlocked")
    assert blocked["status"] == "True" and blocked["reason"] == "NotStarted"
    assert name(cold) in blocked["message"] and "older than the operator" in blocked["message"]
    assert [e.reason for e in late.events].count("NotStarted") == 1
    again = run(make_job(late.status, **spec), [cold, store()])
    assert "NotStarted" not in [e.reason for e in again.events], "said once, not per reconcile"
    warm = run(make_job(again.status, **spec), [pod(0, running_for=400), store()])
    assert condition(warm, "PodsBlocked")["status"] == "False"


def test_a_live_job_that_lost_a_replica_group_is_running_while_the_replacement_starts() -> None:
    """recovery live: the surviving groups train on from the next step (torchft's quorum needs
    one group), so the job is Running, not Restarting, and its goodput counts that time;
    WaitingForWorkers does not claim that training waits. A restart-mode job with the same
    pods is Restarting: its round needs replicas.min workers."""
    pods = [pod(0), pod(1, phase="Pending"), store(), lighthouse()]
    for recovery, phase in (("live", "Running"), ("restart", "Restarting")):
        job = make_job(
            running_status(), replicas={"min": 2, "max": 2}, failurePolicy={"recovery": recovery}
        )
        result = run(job, pods)
        assert result.status.phase == phase, recovery
        waiting = [c for c in result.status.conditions if c.type == "WaitingForWorkers"]
        assert (bool(waiting) and waiting[0].status == "True") is (recovery == "restart")
    live = make_job(
        running_status(), replicas={"min": 2, "max": 2}, failurePolicy={"recovery": "live"}
    )
    said = condition(run(live, pods), "Running")["message"]
    assert said.startswith("1 of 2 replica groups running (recovery live)"), said
