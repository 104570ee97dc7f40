"""Straggler policy: the slowest rank in status, since when it straggles, and its pod
replaced when it stays one (torchkube/policy/stragglers.py, and torchkube/operator/stragglers.py:
its step called directly, one row per case, and whole scenarios through the planner)."""

from datetime import timedelta
from typing import Any

import pytest
from planner import (
    NOW,
    READY,
    by_slot,
    context,
    created_slots,
    make_job,
    pod,
    run,
    running_status,
    store,
)

from torchkube.api import labels as lbl
from torchkube.api.contract import ProgressReport
from torchkube.api.spec import FailurePolicySpec
from torchkube.api.status import SlowestRank
from torchkube.api.times import format_time
from torchkube.operator import pods as p
from torchkube.operator import stragglers as straggler_step
from torchkube.operator.decision import CONTINUE, SortedPods
from torchkube.operator.pods import NodeHealth
from torchkube.policy import stragglers

REPLACE = {"replaceStragglers": True, "stragglerSeconds": 120}


def report(pod_name: str, slowdown: float, age: float = 5, rank: int = 2) -> ProgressReport:
    return ProgressReport.model_validate(
        {
            "step": 500,
            "updated": format_time(NOW - timedelta(seconds=age)),
            "slowestRank": {
                "rank": rank,
                "pod": pod_name,
                "node": "n2",
                "computeSeconds": 0.3 * slowdown,
                "medianSeconds": 0.3,
                "slowdown": slowdown,
            },
        }
    )


def slow_since(seconds: float, pod_name: str, rank: int = 2) -> dict[str, Any]:
    return SlowestRank(
        rank=rank,
        pod=pod_name,
        node="n2",
        slowdown=2.0,
        straggling_since=format_time(NOW - timedelta(seconds=seconds)),
    ).to_wire()


def test_a_straggler_is_timed_from_when_it_first_was_one() -> None:
    policy = FailurePolicySpec()
    first = stragglers.track(None, report("p2", 2.0), policy, NOW)
    assert first is not None and first.straggling_since == format_time(NOW)
    later = stragglers.track(first, report("p2", 1.8), policy, NOW + timedelta(minutes=3))
    assert later is not None and later.straggling_since == format_time(NOW)
    another = stragglers.track(later, report("p3", 1.9, rank=3), policy, NOW + timedelta(minutes=4))
    assert another is not None and another.straggling_since == format_time(
        NOW + timedelta(minutes=4)
    )
    recovered = stragglers.track(later, report("p2", 1.2), policy, NOW + timedelta(minutes=4))
    assert recovered is not None and recovered.straggling_since is None
    assert recovered.slowdown == 1.2 and recovered.node == "n2"
    assert stragglers.track(later, None, policy, NOW) is None


def test_only_a_straggler_past_its_time_is_due_and_only_with_the_policy_on() -> None:
    slow = SlowestRank.model_validate(slow_since(130, "p2"))
    assert stragglers.overdue(slow, FailurePolicySpec(**REPLACE), NOW) == "p2"
    assert stragglers.overdue(slow, FailurePolicySpec(), NOW) is None
    young = SlowestRank.model_validate(slow_since(60, "p2"))
    assert stragglers.overdue(young, FailurePolicySpec(**REPLACE), NOW) is None


def test_a_persistent_straggler_is_replaced_gracefully_and_its_node_avoided() -> None:
    workers = [pod(i, node="n2" if i == 2 else "n1") for i in range(4)]
    victim = workers[2]["metadata"]["name"]
    job = make_job(running_status(slowestRank=slow_since(125, victim)), failurePolicy=REPLACE)
    result = run(job, [*workers, store()], progress=report(victim, 2.0))
    assert result.delete_pods == [(victim, False)], "graceful: the emergency checkpoint"
    assert result.release == {victim: "straggler"}
    assert created_slots(result) == [2]
    last = result.status.last_failure
    assert last is not None and (last.reason, last.pod, last.node) == ("Straggler", victim, "n2")
    assert "2.00× slower" in last.message and result.status.restarts_count_towards_max == 0
    assert [e.reason for e in result.events] == ["Straggler"]
    assert result.status.slowest_rank is not None
    assert result.status.slowest_rank.straggling_since is None
    affinity = result.create_pods[0]["spec"]["affinity"]["nodeAffinity"]
    avoided = affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]
    assert avoided["matchExpressions"][0]["values"] == ["n2"]

    # Next pass: the pod is going (released), the old report still names it: nothing more.
    going = pod(2, node="n2", deleting=True, labels={lbl.RELEASED: "straggler"})
    going["metadata"]["name"] = victim
    again = run(
        make_job(result.status, failurePolicy=REPLACE),
        [workers[0], workers[1], going, workers[3], *result.create_pods, store()],
        progress=report(victim, 2.0),
    )
    assert again.status.restarts == result.status.restarts and again.delete_pods == []


def test_without_the_policy_a_straggler_is_only_reported() -> None:
    workers = [pod(i) for i in range(4)]
    victim = workers[2]["metadata"]["name"]
    job = make_job(running_status(slowestRank=slow_since(3600, victim)))
    result = run(job, [*workers, store()], progress=report(victim, 3.0))
    assert result.delete_pods == [] and result.status.restarts == 0
    slowest = result.status.slowest_rank
    assert slowest is not None and slowest.pod == victim and slowest.slowdown == 3.0


def test_a_stale_report_is_shown_not_acted_on() -> None:
    workers = [pod(i) for i in range(4)]
    victim = workers[2]["metadata"]["name"]
    job = make_job(running_status(slowestRank=slow_since(600, victim)), failurePolicy=REPLACE)
    result = run(job, [*workers, store()], progress=report(victim, 2.0, age=300))
    assert result.delete_pods == []


def test_the_straggler_is_replaced_on_time_not_at_the_next_resync() -> None:
    workers = [pod(i) for i in range(4)]
    victim = workers[2]["metadata"]["name"]
    job = make_job(running_status(slowestRank=slow_since(100, victim)), failurePolicy=REPLACE)
    result = run(job, [*workers, store()], progress=report(victim, 2.0))
    assert result.delete_pods == [] and result.requeue_after == 20


def _straggler_on_n2(history: list[dict[str, Any]], nodes: dict[str, Any] | None = None) -> Any:
    others = "n2" if nodes is not None and list(nodes) == ["n2"] else "n1"
    workers = [pod(i, node="n2" if i == 2 else others) for i in range(4)]
    victim = workers[2]["metadata"]["name"]
    status = running_status(slowestRank=slow_since(125, victim), failures=history)
    job = make_job(status, failurePolicy=REPLACE)
    return run(job, [*workers, store(node=others)], nodes=nodes, progress=report(victim, 2.0))


def _replaced_on_n2(minutes_ago: float) -> dict[str, Any]:
    return {
        "reason": "Straggler",
        "message": "rank 2 computed 2.00× slower",
        "pod": "demo-worker-2-old",
        "node": "n2",
        "time": format_time(NOW - timedelta(minutes=minutes_ago)),
        "incident": 1,
        "counted": False,
    }


def test_a_straggler_back_on_the_node_it_was_moved_off_is_kept_and_said_so() -> None:
    """Node avoidance is a preference: on a pool that fits exactly the replacement lands on
    the same node, straggles again, and was replaced every stragglerSeconds for ever."""
    result = _straggler_on_n2([_replaced_on_n2(minutes_ago=10)])
    assert result.delete_pods == [] and created_slots(result) == []
    assert result.status.restarts == 0
    kept = next(c for c in result.status.conditions if c.type == "StragglerKept")
    assert (kept.status, kept.reason) == ("True", "SameNode")
    assert "n2" in kept.message and "cordon" in kept.message
    assert [e.reason for e in result.events] == ["SameNode"]


def test_a_straggler_is_kept_when_the_job_has_no_other_node() -> None:
    from planner import READY

    result = _straggler_on_n2([], nodes={"n2": READY})
    assert result.delete_pods == []
    kept = next(c for c in result.status.conditions if c.type == "StragglerKept")
    assert (kept.status, kept.reason) == ("True", "NoOtherNode")


def test_a_node_left_long_ago_may_be_left_again() -> None:
    result = _straggler_on_n2([_replaced_on_n2(minutes_ago=120)])
    assert len(result.delete_pods) == 1 and created_slots(result) == [2]


# ------------------------------------------------------------------ the step, row by row


@pytest.mark.parametrize(
    ("phase", "policy", "since", "others_ready", "duplicate", "replaced", "slot_after", "kept"),
    [
        pytest.param(
            "Running", REPLACE, None, True, False, False, ["running"], None, id="no-report"
        ),
        pytest.param(
            "Running", REPLACE, 60, True, False, False, ["running"], None, id="not-due-yet"
        ),
        pytest.param("Running", REPLACE, 125, True, False, True, [], None, id="due-replaced"),
        pytest.param(
            "Running",
            REPLACE,
            125,
            True,
            True,
            True,
            ["pending"],
            None,
            id="due-replaced-its-slots-other-pod-stays",
        ),
        pytest.param("Running", {}, 125, True, False, False, ["running"], None, id="policy-off"),
        pytest.param(
            "Running",
            REPLACE,
            125,
            False,
            False,
            False,
            ["running"],
            "NoOtherNode",
            id="no-other-node-kept",
        ),
        pytest.param(
            "Restarting", REPLACE, 125, True, False, False, ["running"], None, id="not-running"
        ),
    ],
)
def test_replace(
    phase: str,
    policy: dict[str, Any],
    since: float | None,
    others_ready: bool,
    duplicate: bool,
    replaced: bool,
    slot_after: list[str],
    kept: str | None,
) -> None:
    """stragglers.replace on ``ctx.pods``: the pod of slot 2, on n2, straggles for ``since``
    seconds (None: no report; due after 120). Replaced, it is deleted gracefully, its failure
    recorded, and it leaves ``ctx.pods`` so that scaling refills its slot (``slot_after``:
    the states of the pods its slot holds then); kept, ``StragglerKept`` says why."""
    workers = [pod(i, node="n2" if i == 2 else "n1") for i in range(4)]
    if duplicate:
        workers.append(pod(2, phase="Pending", node=None))
    victim = workers[2]["metadata"]["name"]
    slowest = {} if since is None else {"slowestRank": slow_since(since, victim)}
    status = {**running_status(**slowest), "phase": phase}
    nodes = {"n1": NodeHealth(others_ready, NOW - timedelta(hours=1)), "n2": READY}
    progress = None if since is None else report(victim, 2.0)
    ctx = context(make_job(status, failurePolicy=policy), workers, nodes, progress=progress)
    ctx.pods = SortedPods(live_workers=by_slot(ctx.owned))

    assert straggler_step.replace(ctx) is CONTINUE
    assert ctx.plan.delete_pods == ([(victim, False)] if replaced else [])
    assert ctx.plan.release == ({victim: "straggler"} if replaced else {})
    assert [p.state(worker) for worker in ctx.pods.live_workers.get(2, [])] == slot_after
    assert sorted(ctx.pods.live_workers) == ([0, 1, 2, 3] if slot_after else [0, 1, 3])
    last = ctx.status.last_failure
    assert (last.reason if last else None) == ("Straggler" if replaced else None)
    tracked = ctx.status.slowest_rank
    assert (tracked is None) == (since is None)
    assert tracked is None or (tracked.straggling_since is None) == replaced, "its clock ends"
    held = next((c for c in ctx.status.conditions if c.type == "StragglerKept"), None)
    assert (held.reason if held and held.status == "True" else None) == kept
    assert ctx.plan.requeue_after == (60.0 if since == 60 and phase == "Running" else None)
