"""The reconciler's state machine, one observed world at a time (no cluster needed)."""

import inspect
from datetime import timedelta
from typing import Any, get_type_hints

import pytest
from planner import (
    NOW,
    READY,
    condition,
    created_slots,
    healthy,
    make_job,
    observed,
    pod,
    run,
    running_status,
    store,
)

from torchkube.api import labels as lbl
from torchkube.api.contract import TRAINING_FINISHED, ProgressReport
from torchkube.api.times import format_time
from torchkube.operator import builders
from torchkube.operator import pods as p
from torchkube.operator.decision import Context, Step
from torchkube.operator.failure import classify_pod
from torchkube.operator.planner import POLICIES, Plan, plan
from torchkube.operator.pods import slim


def test_new_job_creates_children_workers_and_store() -> None:
    result = run(make_job(), [])
    assert [c["kind"] for c in result.create_children] == ["Service", "PersistentVolumeClaim"]
    assert created_slots(result) == [0, 1, 2, 3]
    assert sum(p["metadata"]["labels"][lbl.ROLE] == "rendezvous" for p in result.create_pods) == 1
    assert result.status.phase == "Pending"
    assert condition(result, "Created")["status"] == "True"
    assert result.status.selector == "torchkube.io/job-name=demo,torchkube.io/role=worker"


def test_all_running_is_running_and_needs_nothing() -> None:
    result = run(make_job(running_status()), healthy())
    assert result.create_pods == [] and result.delete_pods == []
    assert result.status.phase == "Running" and result.all_running
    assert result.status.workers == "4/4" and not result.create_children


def test_all_running_is_timed_to_the_last_worker_the_watch_saw_running() -> None:
    def planned(seen: list[float | None]) -> Plan:
        """The job's four workers and its store as the watch stamps them (None: unstamped)."""
        world = observed(make_job(running_status()), healthy())
        for body, at in zip(world.pods, seen, strict=True):
            if at is not None:
                body[p.RUNNING_SEEN] = at
        return plan(world, new_suffix=lambda: "s")

    result = planned([10.0, 11.0, 12.0, 13.0, 99.0])
    assert result.all_running and result.all_running_at == 13.0, "the workers', not the store's"
    unstamped = planned([10.0, 11.0, 12.0, None, 99.0])
    assert unstamped.all_running and unstamped.all_running_at is None, "not known: now"


def test_retryable_failure_is_counted_once_and_replaced() -> None:
    failed = pod(2, phase="Failed", exit_code=137)
    result = run(make_job(running_status()), [pod(0), pod(1), failed, pod(3), store()])
    assert created_slots(result) == [2]
    assert result.status.restarts == 1 and result.status.restarts_count_towards_max == 1
    last = result.status.last_failure
    assert last is not None
    assert (last.reason, last.exit_code, last.pod) == (
        "ExitCode",
        137,
        failed["metadata"]["name"],
    )
    assert result.mark_recorded == {failed["metadata"]["name"]: "true"}
    assert [e.reason for e in result.events] == ["WorkerFailed"]
    assert result.status.phase == "Restarting"

    again = run(
        make_job(result.status), [pod(0), pod(1), failed, pod(3), store(), *result.create_pods]
    )
    assert again.status.restarts == 1, "a recorded failure must not be counted again"
    assert created_slots(again) == []


def test_recorded_label_alone_prevents_double_counting() -> None:
    failed = pod(1, phase="Failed", exit_code=1, labels={lbl.FAILURE_RECORDED: "true"})
    result = run(make_job(running_status(restarts=3)), [pod(0), failed, pod(2), pod(3), store()])
    assert result.status.restarts == 3 and created_slots(result) == [1]


def test_permanent_exit_code_fails_the_job_without_restart() -> None:
    pods = [pod(0), pod(1, phase="Failed", exit_code=3), pod(2), pod(3), store()]
    result = run(make_job(running_status()), pods)
    assert result.status.phase == "Failed"
    assert condition(result, "Failed")["reason"] == "PermanentFailure"
    assert "exited with code 3 (permanent)" in condition(result, "Failed")["message"]
    assert created_slots(result) == []
    deleted = {name for name, _ in result.delete_pods}
    assert deleted == {p["metadata"]["name"] for p in pods if p["status"]["phase"] == "Running"}


def test_oom_follows_policy() -> None:
    pods = [pod(0, phase="Failed", exit_code=137, reason="OOMKilled"), pod(1), pod(2), pod(3)]
    retry = run(make_job(running_status()), pods)
    assert retry.status.last_failure.reason == "OOMKilled" and created_slots(retry) == [0]
    fail = run(make_job(running_status(), failurePolicy={"onOomKilled": "Fail"}), pods)
    assert fail.status.phase == "Failed"


def test_max_restarts_exhausted_fails_the_job() -> None:
    status = running_status(restarts=2, restartsCountTowardsMax=2)
    pods = [pod(0, phase="Failed", exit_code=1), pod(1), pod(2), pod(3), store()]
    result = run(make_job(status, failurePolicy={"maxRestarts": 2}), pods)
    assert result.status.phase == "Failed"
    assert condition(result, "Failed")["reason"] == "MaxRestartsExceeded"
    assert created_slots(result) == []


def test_backoff_delays_the_replacement() -> None:
    record = {"reason": "ExitCode", "time": format_time(NOW - timedelta(seconds=2)), "incident": 1}
    status = running_status(restarts=1, lastFailure=record, failures=[record])
    job = make_job(status, failurePolicy={"backoff": {"initialSeconds": 10, "maxSeconds": 60}})
    result = run(job, [pod(0), pod(1), pod(2), store()])
    assert created_slots(result) == []
    assert result.requeue_after == pytest.approx(8, abs=0.01)
    later = run(job, [pod(0), pod(1), pod(2), store()], now=NOW + timedelta(seconds=9))
    assert created_slots(later) == [3]


def test_lost_store_is_replaced() -> None:
    pods = [pod(0), pod(1), pod(2), pod(3), store("n2")]
    result = run(make_job(running_status()), pods, {"n1": READY})
    stores = [p for p in result.create_pods if p["metadata"]["labels"][lbl.ROLE] == "rendezvous"]
    assert len(stores) == 1
    assert (pods[-1]["metadata"]["name"], True) in result.delete_pods
    assert "RendezvousStoreLost" in [e.reason for e in result.events]


def test_scale_down_deletes_highest_slots_without_counting_failures() -> None:
    job = make_job(running_status(), replicas={"min": 1, "max": 4, "desired": 2})
    pods = healthy()
    result = run(job, pods)
    assert {name for name, _ in result.delete_pods} == {
        pods[2]["metadata"]["name"],
        pods[3]["metadata"]["name"],
    }
    terminating = [pod(0), pod(1), pod(2, deleting=True), pod(3, deleting=True), store()]
    after = run(make_job(result.status, replicas={"min": 1, "max": 4, "desired": 2}), terminating)
    assert after.status.restarts == 0 and created_slots(after) == []
    assert after.status.workers == "2/2"


def test_scale_up_creates_the_missing_slots() -> None:
    job = make_job(running_status(), replicas={"min": 1, "max": 4, "desired": 4})
    assert created_slots(run(job, [pod(0), pod(1), store()])) == [2, 3]


def test_external_deletion_is_a_failure_and_is_replaced() -> None:
    preempted = pod(
        1,
        deleting=True,
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ],
    )
    result = run(make_job(running_status()), [pod(0), preempted, pod(2), pod(3), store()])
    assert result.status.last_failure.reason == "Preempted"
    assert created_slots(result) == [1]
    own = run(
        make_job(running_status()),
        [pod(0), preempted, pod(2), pod(3), store()],
        self_deleted=frozenset({preempted["metadata"]["name"]}),
    )
    assert own.status.last_failure is None


def test_duplicate_pods_in_a_slot_keep_the_oldest() -> None:
    old, new = pod(1, age=100), pod(1, age=5)
    result = run(make_job(running_status()), [pod(0), old, new, pod(2), pod(3), store()])
    assert result.delete_pods == [(new["metadata"]["name"], False)]


def test_suspend_deletes_pods_and_resume_recreates_them() -> None:
    suspended = run(make_job(running_status(), runPolicy={"suspend": True}), healthy())
    assert len(suspended.delete_pods) == 5
    assert suspended.status.phase == "Suspended"
    assert condition(suspended, "Suspended")["status"] == "True"
    resumed = run(make_job(suspended.status), [])
    assert created_slots(resumed) == [0, 1, 2, 3]
    assert condition(resumed, "Suspended")["status"] == "False"
    assert "Resumed" in [e.reason for e in resumed.events]


def test_success_finishes_and_cleans_up() -> None:
    finished = f"{TRAINING_FINISHED} at step 1000"
    done = [pod(i, phase="Succeeded", exit_code=0, message=finished) for i in range(4)]
    done.append(store())
    result = run(make_job(running_status(), runPolicy={"ttlSecondsAfterFinished": 60}), done)
    assert result.status.phase == "Succeeded" and result.status.completion_time is not None
    assert result.delete_pods == [(done[-1]["metadata"]["name"], False)], "only the store goes"
    assert result.requeue_after == pytest.approx(60)
    expired = run(
        make_job(result.status, runPolicy={"ttlSecondsAfterFinished": 60}),
        done,
        now=NOW + timedelta(seconds=61),
    )
    assert expired.delete_job


def test_deadline_fails_a_running_job() -> None:
    result = run(make_job(running_status(), runPolicy={"activeDeadlineSeconds": 60}), healthy())
    assert result.status.phase == "Failed"
    assert condition(result, "Failed")["reason"] == "DeadlineExceeded"


def test_unschedulable_workers_are_reported_after_the_timeout() -> None:
    stuck = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    }
    pods = [pod(0), pod(1), pod(2, phase="Pending", node=None, conditions=[stuck], age=90), store()]
    result = run(make_job(running_status(), replicas={"min": 2, "max": 3}), pods)
    unsched = condition(result, "PodsUnschedulable")
    assert unsched["status"] == "True" and "Insufficient nvidia.com/gpu" in unsched["message"]
    assert result.status.phase == "Running", "elastic: training goes on at min size"


def test_elastic_job_below_min_is_restarting() -> None:
    job = make_job(running_status(), replicas={"min": 2, "max": 4})
    result = run(job, [pod(0), pod(1, phase="Pending", node=None), store()])
    assert result.status.phase == "Restarting"
    assert condition(result, "Restarting")["status"] == "True"


def test_progress_from_the_trainer_lands_in_status() -> None:
    report = {
        "step": 120,
        "totalSteps": 1000,
        "loss": 2.5,
        "worldSize": 8,
        "lastCheckpointStep": 100,
        "lastCheckpointTime": "2026-11-23T11:59:00Z",
    }
    result = run(
        make_job(running_status()), healthy(), progress=ProgressReport.model_validate(report)
    )
    assert result.status.progress.step == 120
    assert result.status.latest_checkpoint is not None
    assert result.status.latest_checkpoint.to_wire() == {
        "step": 100,
        "time": "2026-11-23T11:59:00Z",
    }
    assert result.status.world_size == 8


def test_unchanged_world_keeps_condition_times() -> None:
    first = run(make_job(running_status()), healthy())
    second = run(make_job(first.status), healthy(), now=NOW + timedelta(minutes=1))
    assert first.status.conditions == second.status.conditions


def test_exit_0_without_the_trainers_word_is_a_failure_not_success() -> None:
    """A torchrun agent can exit 0 when its rendezvous closes early; the job must go on."""
    early = pod(1, phase="Succeeded", exit_code=0, reason="Completed")
    result = run(make_job(running_status()), [pod(0), early, pod(2), pod(3), store()])
    assert result.status.phase != "Succeeded"
    assert result.status.last_failure.reason == "Unknown"
    assert "exited 0 before the trainer reported the end of training" in (
        result.status.last_failure.message
    )
    assert created_slots(result) == [1]


def test_custom_command_exit_0_is_trusted() -> None:
    done = [pod(i, phase="Succeeded", exit_code=0) for i in range(2)]
    job = make_job(running_status(), command=["train.py"], replicas={"min": 2, "max": 2})
    assert run(job, done).status.phase == "Succeeded"


def test_slim_pod_keeps_every_field_the_operator_reads_and_drops_the_spec() -> None:
    full = builders.worker_pod(make_job(), 3, "abcde", [])
    full["metadata"] |= {
        "creationTimestamp": format_time(NOW),
        "deletionTimestamp": format_time(NOW),
        "managedFields": [{"manager": "kube-scheduler"}],
        "uid": "u-1",
    }
    full["spec"]["nodeName"] = "n7"
    full["status"] = pod(3, phase="Failed", exit_code=137, reason="OOMKilled", message="oom")[
        "status"
    ] | {"podIP": "10.0.0.7", "hostIP": "192.0.2.1"}
    full["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True"})
    small = slim(full)
    policy = make_job().spec.failure_policy
    reads = (
        p.name,
        p.role,
        p.slot,
        p.node_name,
        p.created,
        p.state,
        p.termination_message,
        p.controller_uid,
        p.restart_count,
        p.ended_by_deletion,
    )
    for read in reads:
        assert read(small) == read(full), read.__name__
    assert p.owned_by(small, "u1") and p.owned_by(full, "u1")
    assert classify_pod(small, policy, False) == classify_pod(full, policy, False)
    assert small["status"]["podIP"] == "10.0.0.7" and small["metadata"]["namespace"]
    assert "containers" not in small["spec"] and "managedFields" not in small["metadata"]
    small["status"]["conditions"].clear()
    small["metadata"]["labels"].clear()
    assert full["status"]["conditions"] and full["metadata"]["labels"], "slim must copy"


def test_an_incident_with_a_lost_node_is_named_after_the_node_whatever_failed_first() -> None:
    """The store and a worker on the same lost node fail together: one incident, and its
    event says NodeLost and names the node (it said RendezvousStoreLost when the store came
    first, so a user looking for the lost node did not find it)."""
    pods = [store("n2"), pod(0, node="n1"), pod(1, node="n2"), pod(2, node="n1"), pod(3)]
    lost = run(make_job(running_status()), pods, {"n1": READY})
    assert lost.status.restarts == 1
    assert [e.reason for e in lost.events] == ["NodeLost"], lost.events
    assert "n2" in lost.events[0].message and "1 more failing together" in lost.events[0].message


@pytest.mark.parametrize("step", POLICIES, ids=lambda step: f"{step.__module__}.{step.__name__}")
def test_every_policy_step_takes_the_context_alone_and_returns_a_step(step: Any) -> None:
    """The one step contract (decision.py): what a step finds for a later one goes on the
    Context, so no step takes more than it, and every step may settle the pass."""
    hints = get_type_hints(step)
    assert list(inspect.signature(step).parameters) == ["ctx"]
    assert hints == {"ctx": Context, "return": Step}
