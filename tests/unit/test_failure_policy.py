"""Failure policy: what counts as a failure, how failures group into incidents, and what a job
spends (torchkube/policy/, and torchkube/operator/failure.py through the planner where the pods
decide)."""

from datetime import timedelta
from typing import Any

import pytest
from planner import (
    NOW,
    condition,
    created_slots,
    lighthouse,
    make_job,
    pod,
    run,
    running_status,
    store,
)
from planner import (
    kubelet_stopped as stopped,
)

from torchkube.api.contract import ExitCode, InPlaceRestart, committed_step_line
from torchkube.api.labels import RELEASED
from torchkube.api.ledger import Ledger
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import FailureRecord
from torchkube.api.times import format_time
from torchkube.operator.planner import Plan
from torchkube.policy import failures
from torchkube.policy.accounting import account
from torchkube.policy.backoff import backoff_remaining
from torchkube.policy.failures import Failure, classify_exit

ELASTIC = {"min": 1, "max": 32}


def test_scale_down_under_kubelet_semantics_counts_no_failure() -> None:
    """32 → 16: the kubelet stops the 16 deleted workers and reports them Failed/143 before
    they go. With the default maxRestarts (10) counting them ended the job Failed."""
    job = make_job(running_status(), replicas={**ELASTIC, "desired": 16})
    pods = [pod(i) for i in range(16)]
    pods += [stopped(i, released="scale-down") for i in range(16, 32)]
    result = run(job, [*pods, store()])
    assert result.status.restarts == 0
    assert result.status.phase == "Running"
    assert result.status.last_failure is None


def test_operator_restarted_mid_scale_down_still_counts_no_failure() -> None:
    """Without the release label a restarted operator has no memory of its deletes: the label
    (set before each delete) is what tells a released worker from a lost one."""
    job = make_job(running_status(), replicas={**ELASTIC, "desired": 2})
    pods = [pod(0), pod(1), stopped(2, released="scale-down"), stopped(3, released="scale-down")]
    assert run(job, [*pods, store()]).status.restarts == 0


def test_suspend_then_quick_resume_counts_no_failure() -> None:
    suspended = run(make_job(running_status(), runPolicy={"suspend": True}), [pod(0), store()])
    assert suspended.release == {name: "suspended" for name, _ in suspended.delete_pods}
    terminating = [stopped(i, released="suspended") for i in range(4)]
    resumed = run(make_job(suspended.status), terminating)
    assert resumed.status.restarts == 0
    assert created_slots(resumed) == [0, 1, 2, 3]


def test_scale_down_labels_what_it_deletes() -> None:
    job = make_job(running_status(), replicas={**ELASTIC, "desired": 2})
    pods = [pod(i) for i in range(4)]
    result = run(job, [*pods, store()])
    assert result.release == {
        pods[2]["metadata"]["name"]: "scale-down",
        pods[3]["metadata"]["name"]: "scale-down",
    }


def test_pod_that_failed_with_its_own_code_while_deleted_is_a_failure() -> None:
    """Exit code 1, not the delete's SIGTERM (143): it crashed; the delete came after."""
    crashed = pod(1, phase="Failed", exit_code=1, deleting=True, deleted_ago=5, finished_ago=20)
    result = run(make_job(running_status()), [pod(0), crashed, pod(2), pod(3), store()])
    assert result.status.last_failure.reason == "ExitCode"
    assert result.status.last_failure.exit_code == 1


def test_kubectl_delete_pod_is_a_free_deleted_failure() -> None:
    """The kubelet's final delete (no grace) rewrites the deletion timestamp to after the
    container's end: only the exit code (143: SIGTERM) tells that the delete ended it."""
    final = stopped(1)
    final["metadata"]["deletionTimestamp"] = format_time(NOW)
    final["metadata"]["deletionGracePeriodSeconds"] = 0
    result = run(make_job(running_status()), [pod(0), final, pod(2), pod(3), store()])
    last = result.status.last_failure
    assert last is not None and last.reason == "Deleted" and last.counted is False
    assert result.status.restarts == 1 and result.status.restarts_count_towards_max == 0
    assert created_slots(result) == [1]


def test_workers_failing_together_are_one_incident() -> None:
    """Every agent exits at once (a network blip): one restart, one count, one event."""
    job = make_job(running_status(), failurePolicy={"maxRestarts": 2})
    pods = [pod(i, phase="Failed", exit_code=1) for i in range(4)]
    result = run(job, [*pods, store()])
    assert result.status.phase != "Failed"
    assert result.status.restarts == 1 and result.status.restarts_count_towards_max == 1
    assert {r.incident for r in result.status.failures} == {1}
    assert [e.reason for e in result.events].count("WorkerFailed") == 1
    assert "with 3 more failing together" in result.events[0].message


def test_failures_seen_in_later_reconciles_join_the_incident() -> None:
    first = run(make_job(running_status()), [pod(0, phase="Failed", exit_code=1), pod(1), store()])
    later = NOW + timedelta(seconds=4)
    second = run(
        make_job(first.status),
        [pod(1, phase="Failed", exit_code=1), *first.create_pods, store()],
        now=later,
    )
    assert second.status.restarts == 1 and second.status.restarts_count_towards_max == 1


def test_a_crashing_replacement_is_a_new_incident() -> None:
    first = run(make_job(running_status()), [pod(0, phase="Failed", exit_code=1), store()])
    replacement = pod(0, phase="Failed", exit_code=1, age=-2)  # born after the incident began
    second = run(make_job(first.status), [replacement, store()], now=NOW + timedelta(seconds=5))
    assert second.status.restarts == 2 and second.status.restarts_count_towards_max == 2


def test_store_restart_in_place_is_one_free_incident_with_the_agents_that_failed() -> None:
    """The store crashed and restarted; every agent lost it and exited 75 (the launcher's
    'rendezvous store unreachable'). One incident, nothing spent of maxRestarts."""
    job = make_job(running_status(), failurePolicy={"maxRestarts": 1})
    agents = [pod(i, phase="Failed", exit_code=ExitCode.RENDEZVOUS_LOST) for i in range(4)]
    restarted = store(restarts=1)
    result = run(job, [*agents, restarted])
    assert result.status.phase != "Failed"
    assert result.status.restarts == 1 and result.status.restarts_count_towards_max == 0
    reasons = {r.reason for r in result.status.failures}
    assert reasons == {"RendezvousStoreLost", "RendezvousFailed"}
    assert result.mark_recorded[restarted["metadata"]["name"]] == "1"
    again = run(
        make_job(result.status),
        [restarted, *result.create_pods],
        now=NOW + timedelta(seconds=1),
    )
    assert again.status.restarts == 1, "the same restart is not counted twice"


def test_store_deleted_by_someone_is_replaced_and_recorded_once() -> None:
    gone = store(phase="Failed", exit_code=143, deleting=True, deleted_ago=1, finished_ago=0)
    result = run(make_job(running_status()), [pod(i) for i in range(4)] + [gone])
    stores = [
        p
        for p in result.create_pods
        if p["metadata"]["labels"]["torchkube.io/role"] == "rendezvous"
    ]
    assert len(stores) == 1
    assert result.status.last_failure.reason == "RendezvousStoreLost"
    assert result.status.restarts_count_towards_max == 0


def test_max_restarts_counts_incidents() -> None:
    status = running_status(restarts=2, restartsCountTowardsMax=2)
    job = make_job(status, failurePolicy={"maxRestarts": 2})
    result = run(job, [pod(0, phase="Failed", exit_code=1), pod(1), pod(2), pod(3), store()])
    assert condition(result, "Failed")["reason"] == "MaxRestartsExceeded"


def test_long_termination_messages_are_cut_to_their_tail() -> None:
    message = "x" * 5000 + "\nRuntimeError: the real cause"
    failed = pod(0, phase="Failed", exit_code=1, message=message)
    result = run(make_job(running_status()), [failed, pod(1), pod(2), pod(3), store()])
    text = result.status.last_failure.message
    assert len(text) <= failures.MESSAGE_LIMIT and text.endswith("RuntimeError: the real cause")


def _record(seconds_ago: float, incident: int) -> FailureRecord:
    when = format_time(NOW - timedelta(seconds=seconds_ago))
    return FailureRecord(reason="ExitCode", time=when, incident=incident)


def test_backoff_doubles_within_a_streak_and_resets_after_a_healthy_period() -> None:
    policy = FailurePolicySpec.model_validate(
        {"backoff": {"initialSeconds": 10, "maxSeconds": 1000, "resetAfterSeconds": 600}}
    )
    streak = Ledger(3, 3, (_record(300, 1), _record(200, 2), _record(1, 3)))
    assert backoff_remaining(streak, policy, NOW) == 40 - 1
    healed = Ledger(3, 3, (_record(5000, 1), _record(4000, 2), _record(1, 3)))
    assert backoff_remaining(healed, policy, NOW) == 10 - 1


def test_account_is_what_the_local_runner_uses_too() -> None:
    policy = FailurePolicySpec(max_restarts=1)
    crash = classify_exit(1, "boom", policy, "worker 0")
    assert crash.reason == "ExitCode" and crash.retryable
    outcome = account(Ledger(), [crash, classify_exit(1, "", policy, "worker 1")], policy, NOW)
    assert (outcome.restarts, outcome.counted, outcome.fail_reason) == (1, 1, None)
    later = NOW + timedelta(minutes=5)
    more = account(Ledger(1, 1, tuple(outcome.records)), [crash], policy, later)
    assert more.fail_reason == "MaxRestartsExceeded"
    permanent = classify_exit(3, "bad config", policy, "worker 0")
    assert account(Ledger(), [permanent], policy, NOW).fail_reason == "PermanentFailure"


def test_a_store_crash_and_the_in_place_restarts_it_caused_are_one_incident_counted_once() -> None:
    """Two rules decide what an incident charges: a store that crashed again without progress
    is charged (``store_loss``), and an in-place restart that joins an incident is its
    consequence (``follows``). Together: one incident, counted once if the store's crash is
    charged, free if it is not; never a second count for the workers it restarted."""
    policy = FailurePolicySpec(max_restarts=5)
    earlier = FailureRecord(
        reason="RendezvousStoreLost", time=format_time(NOW - timedelta(minutes=5)), step=40
    )
    crash = Failure(
        reason="RendezvousStoreLost", message="store restarted", pod="demo-rendezvous-x"
    )
    restarted = failures.in_place_failure(
        InPlaceRestart(
            pod="demo-worker-0-a",
            restart=1,
            exit_code=1,
            time=format_time(NOW + timedelta(seconds=2)),
        ),
        NOW - timedelta(hours=1),
    )
    for step, counted in ((40, 1), (90, 0)):
        lost = failures.store_loss(crash, [earlier], step)
        outcome = account(Ledger(1, 0, (earlier,)), [lost, restarted], policy, NOW)
        assert (outcome.restarts, outcome.counted) == (2, counted), step
        assert [r.counted for r in outcome.records] == [bool(counted), False], step


def test_rendezvous_exit_is_infrastructure() -> None:
    lost = classify_exit(ExitCode.RENDEZVOUS_LOST, "", FailurePolicySpec(), "worker 0")
    assert lost.reason == "RendezvousFailed" and lost.infrastructure
    assert not lost.counts(FailurePolicySpec())
    assert isinstance(lost, Failure)


def test_a_hang_is_its_own_retryable_reason_and_spends_the_budget() -> None:
    found = classify_exit(
        ExitCode.HUNG,
        "torchkube: hang: rank 3 (pid 9, stopped by a signal) finished no step for 61s",
        FailurePolicySpec(),
        "pod w-1",
    )
    assert (found.reason, found.retryable, found.infrastructure) == ("Hang", True, False)
    assert "rank 3" in found.message and found.counts(FailurePolicySpec())


def test_a_hung_pod_is_recorded_with_its_ranks_once_and_replaced() -> None:
    message = "torchkube: hang: rank 1 (pid 7, stopped by a signal) finished no step for 62s"
    hung = pod(1, phase="Failed", exit_code=int(ExitCode.HUNG), message=message)
    result = run(make_job(running_status()), [pod(0), hung, pod(2), pod(3), store()])
    last = result.status.last_failure
    assert last is not None and last.reason == "Hang" and "rank 1" in last.message
    assert result.status.restarts == result.status.restarts_count_towards_max == 1
    assert [e.reason for e in result.events] == ["Hang"]
    assert created_slots(result) == [1]
    again = run(make_job(result.status), [pod(0), hung, pod(2), pod(3), store()])
    assert again.status.restarts == 1, "counted once"


def test_a_straggler_replacement_is_free() -> None:
    from torchkube.api.status import SlowestRank

    slowest = SlowestRank(rank=2, pod="w-2", node="n2", slowdown=2.5)
    found = failures.straggler_failure(slowest, FailurePolicySpec(), None)
    assert found.reason == "Straggler" and found.infrastructure
    assert not found.counts(FailurePolicySpec())
    assert found.counts(FailurePolicySpec(count_infrastructure_failures=True))


def test_a_worker_that_vanished_is_deleted_free_once_and_replaced() -> None:
    """Force-deleted between two plans: the planner gets its last known body only."""
    gone = pod(1)
    job = make_job(running_status())
    result = run(job, [pod(0), pod(2), pod(3), store()], vanished=[gone])
    last = result.status.last_failure
    assert last is not None and (last.reason, last.pod) == ("Deleted", gone["metadata"]["name"])
    assert (result.status.restarts, result.status.restarts_count_towards_max) == (1, 0)
    assert created_slots(result) == [1]
    again = run(make_job(result.status), [pod(0), pod(2), pod(3), store()], vanished=[gone])
    assert again.status.restarts == 1, "recorded once"
    ours = run(
        job,
        [pod(0), pod(2), pod(3), store()],
        vanished=[pod(1, labels={RELEASED: "scale-down"})],
    )
    assert ours.status.last_failure is None, "a pod the operator let go is no failure"


LIVE = {"replicas": {"min": 2, "max": 2}, "failurePolicy": {"recovery": "live", "maxRestarts": 1}}


def test_a_live_job_that_loses_one_replica_group_counts_a_group_loss_not_a_restart() -> None:
    """recovery live: worker 1 dies while worker 0 trains on through torchft's quorum. Nothing
    restarted from a checkpoint, so ``restarts`` and maxRestarts stay untouched; the loss is
    recorded as one group's, said in a Warning event, and the slot refilled."""
    job = make_job(running_status(), **LIVE)
    result = run(job, [pod(0), pod(1, phase="Failed", exit_code=137), store(), lighthouse()])
    status = result.status
    assert status.phase == "Running"
    assert (status.restarts, status.restarts_count_towards_max) == (0, 0), status
    assert status.replica_group_losses == 1
    assert status.last_failure.replica_group_loss is True and status.last_failure.incident is None
    warnings = [e for e in result.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["ReplicaGroupLost"], warnings
    assert "1 other replica group trains on" in warnings[0].message, warnings[0].message
    assert "restarting from the latest checkpoint" not in warnings[0].message
    assert created_slots(result) == [1]


def test_a_live_group_loss_is_free_but_a_permanent_exit_still_ends_the_job() -> None:
    status = running_status(replicaGroupLosses=5)
    crashed = pod(1, phase="Failed", exit_code=1)
    again = run(make_job(status, **LIVE), [pod(0), crashed, store(), lighthouse()])
    assert again.status.phase == "Running" and again.status.replica_group_losses == 6
    assert again.status.restarts_count_towards_max == 0
    permanent = pod(1, phase="Failed", exit_code=3)
    ended = run(make_job(status, **LIVE), [pod(0), permanent, store(), lighthouse()])
    assert condition(ended, "Failed")["reason"] == "PermanentFailure"


BOOM = "workers failed with exit code 1: ValueError: bad shard"
SECONDS_5 = timedelta(seconds=5)


def crashed(step: int | None = None) -> dict[str, Any]:
    """Slot 1's pod, failed with exit code 1; ``step``: the first step it had committed."""
    said = BOOM if step is None else f"{BOOM}\n{committed_step_line(step)}\n"
    return pod(1, phase="Failed", exit_code=1, message=said)


def oom_killed() -> dict[str, Any]:
    return pod(1, phase="Failed", exit_code=137, reason="OOMKilled")


def hung() -> dict[str, Any]:
    return pod(1, phase="Failed", exit_code=int(ExitCode.HUNG), message="torchkube: hang: …")


def preempted() -> dict[str, Any]:
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    return pod(1, phase="Failed", exit_code=143, conditions=[disruption])


def lose_slot_1(losses: list[dict[str, Any]], max_restarts: int = 5) -> list[Plan]:
    """Slot 1's pods lost one after the other (each its predecessor's replacement) while slot
    0 trains on: the plan after each loss."""
    spec = {**LIVE, "failurePolicy": {"recovery": "live", "maxRestarts": max_restarts}}
    status: Any = running_status()
    plans = []
    for k, lost in enumerate(losses):
        result = run(
            make_job(status, **spec), [pod(0), lost, store(), lighthouse()], now=NOW + k * SECONDS_5
        )
        plans.append(result)
        status = result.status
    return plans


@pytest.mark.parametrize(
    ("losses", "counted"),
    [
        pytest.param([crashed(), crashed(), crashed()], [0, 1, 2], id="crashes-at-start"),
        pytest.param([crashed(), crashed(7), crashed(90)], [0, 0, 0], id="trains-in-between"),
        pytest.param([crashed(7), crashed()], [0, 1], id="trained-before-its-first-loss-only"),
        pytest.param([crashed(), oom_killed()], [0, 1], id="oom-killed-before-a-step"),
        pytest.param([crashed(), hung()], [0, 1], id="hung-before-a-step"),
        pytest.param([preempted(), preempted()], [0, 0], id="the-clusters-doing"),
        pytest.param([crashed(), preempted()], [0, 0], id="preempted-after-a-crash"),
    ],
)
def test_a_live_group_lost_again_before_committing_a_step_spends_max_restarts(
    losses: list[dict[str, Any]], counted: list[int]
) -> None:
    """recovery live: a replica group that fails again without committing a step since its
    last failure (its termination message says the first step it committed) crash-loops: it
    spends maxRestarts, so the job ends instead of replacing it for ever while the others
    train. A group that committed steps in between, or a loss that is the cluster's doing,
    stays free; none restarts the job."""
    plans = lose_slot_1(losses)
    seen = [plan.status.restarts_count_towards_max for plan in plans]
    records = [(r.reason, r.counted) for r in plans[-1].status.failures]
    assert seen == counted, records
    assert all(plan.status.phase == "Running" for plan in plans), plans[-1].status
    assert plans[-1].status.restarts == 0
    assert plans[-1].status.replica_group_losses == len(losses)


def test_a_crash_looping_live_group_ends_the_job_naming_its_slot_pod_and_exit() -> None:
    """maxRestarts 1: the first loss is free, the second counts, the third is one too many."""
    losses = [crashed(), crashed(), crashed()]
    first, second, third = lose_slot_1(losses, max_restarts=1)
    assert first.status.restarts_count_towards_max == 0
    assert second.status.phase == "Running"
    warning = next(e for e in second.events if e.reason == "ReplicaGroupLost")
    assert "before committing a step" in warning.message, warning.message
    assert "1/1 of maxRestarts" in warning.message, warning.message
    ended = condition(third, "Failed")
    assert ended["reason"] == "MaxRestartsExceeded", ended
    name = losses[2]["metadata"]["name"]
    for said in ("replica group of slot 1", name, "exited with code 1", "maxRestarts (1)"):
        assert said in ended["message"], ended["message"]
    assert third.status.restarts == 0 and third.status.replica_group_losses == 3


def test_another_groups_loss_does_not_reset_a_crash_loop() -> None:
    """Slot 1 lost, then slot 0 (while slot 1's replacement runs), then slot 1 again before
    committing a step: slot 1 is the one that crash-loops, slot 0's first loss is free."""
    spec = {**LIVE, "failurePolicy": {"recovery": "live", "maxRestarts": 5}}
    first = run(make_job(running_status(), **spec), [pod(0), crashed(), store()])
    other = pod(0, phase="Failed", exit_code=1, message=BOOM)
    second = run(make_job(first.status, **spec), [other, pod(1), store()], now=NOW + SECONDS_5)
    assert second.status.restarts_count_towards_max == 0
    third = run(
        make_job(second.status, **spec), [pod(0), crashed(), store()], now=NOW + 2 * SECONDS_5
    )
    assert third.status.restarts_count_towards_max == 1, third.status.failures


def test_a_live_job_that_loses_every_group_restarts_from_its_checkpoint() -> None:
    """No group trains on (both lost together, or the survivor lost while the replacement
    has not started): the job restarts from the volume's checkpoint, one incident."""
    job = make_job(running_status(), **LIVE)
    both = [pod(i, phase="Failed", exit_code=137) for i in range(2)]
    together = run(job, [*both, store(), lighthouse()])
    assert (together.status.restarts, together.status.replica_group_losses) == (1, 0)
    first = run(job, [pod(0), pod(1, phase="Failed", exit_code=137), store(), lighthouse()])
    pending = pod(1, phase="Pending", age=-2)
    survivor_lost = run(
        make_job(first.status, **LIVE),
        [pod(0, phase="Failed", exit_code=137), pending, store(), lighthouse()],
        now=NOW + timedelta(seconds=5),
    )
    assert survivor_lost.status.restarts == 1 and survivor_lost.status.replica_group_losses == 1
    assert survivor_lost.status.phase == "Restarting"


def test_a_restart_mode_job_that_loses_one_worker_restarts() -> None:
    restart = {**LIVE, "failurePolicy": {"recovery": "restart", "maxRestarts": 1}}
    result = run(
        make_job(running_status(), **restart),
        [pod(0), pod(1, phase="Failed", exit_code=137), store(), lighthouse()],
    )
    assert (result.status.restarts, result.status.replica_group_losses) == (1, 0)
