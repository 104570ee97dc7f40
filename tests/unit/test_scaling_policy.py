"""Scaling policy: slots, duplicates, nodes to avoid and partitions
(torchkube/operator/scaling.py): its step called directly, one row per case, and whole
scenarios through the planner."""

from datetime import timedelta
from typing import Any

import pytest
from planner import NOW, by_slot, context, created_slots, make_job, pod, run, running_status, store

from torchkube.api.status import FailureRecord
from torchkube.api.times import format_time
from torchkube.operator import pods as p
from torchkube.operator import scaling
from torchkube.operator.decision import CONTINUE, SortedPods


def test_of_duplicates_the_running_pod_stays_even_when_younger() -> None:
    pending = pod(1, phase="Pending", age=100)
    running = pod(1, age=5)
    result = run(make_job(running_status()), [pod(0), pending, running, pod(2), pod(3), store()])
    assert result.delete_pods == [(pending["metadata"]["name"], False)]
    assert result.release == {pending["metadata"]["name"]: "duplicate"}


def test_avoidance_of_a_lost_node_expires() -> None:
    recent = FailureRecord(
        reason="NodeLost", node="n2", time=format_time(NOW - timedelta(minutes=5))
    )
    old = FailureRecord(reason="NodeLost", node="n3", time=format_time(NOW - timedelta(hours=2)))
    assert scaling.avoided_nodes([recent, old], NOW) == ["n2"]


def test_replacement_after_a_short_blip_can_go_back_to_an_exact_fit_pool() -> None:
    """The only node with room lost a worker an hour and a half ago: the replacement may use
    it (no required anti-affinity is ever written)."""
    lost = {
        "reason": "NodeLost",
        "node": "n1",
        "time": format_time(NOW - timedelta(minutes=90)),
        "incident": 1,
    }
    job = make_job(running_status(restarts=1, failures=[lost]))
    result = run(job, [pod(1), pod(2), pod(3), store()])
    assert created_slots(result) == [0]
    assert "affinity" not in result.create_pods[0]["spec"]


def test_nodes_with_a_hung_or_straggling_worker_are_avoided_too() -> None:
    when = format_time(NOW - timedelta(minutes=5))
    records = [
        FailureRecord(reason="Hang", node="n4", time=when),
        FailureRecord(reason="Straggler", node="n5", time=when),
        FailureRecord(reason="ExitCode", node="n6", time=when),
    ]
    assert scaling.avoided_nodes(records, NOW) == ["n4", "n5"]


# ------------------------------------------------------------------ the step, row by row

Worker = tuple[int, str, float]
"""(slot, phase, age in seconds) of a live worker."""
ALL_RUNNING: list[Worker] = [(0, "Running", 60), (1, "Running", 60), (2, "Running", 60)]


@pytest.mark.parametrize(
    ("workers", "released", "spec", "may_create", "created", "deleted", "missing", "requeue"),
    [
        pytest.param(
            [*ALL_RUNNING, (3, "Running", 60)], [], {}, True, [], {}, [], None, id="all-filled"
        ),
        pytest.param(ALL_RUNNING, [], {}, True, [3], {}, [], None, id="an-empty-slot-is-filled"),
        pytest.param(
            ALL_RUNNING, [], {}, False, [], {}, [3], None, id="creates-not-allowed-stay-missing"
        ),
        pytest.param(
            ALL_RUNNING,
            [],
            {"failurePolicy": {"backoff": {"initialSeconds": 30}}},
            True,
            [],
            {},
            [3],
            20.0,
            id="backing-off-after-a-failure-stays-missing",
        ),
        pytest.param(
            [*ALL_RUNNING, (3, "Running", 60), (4, "Running", 60)],
            [],
            {},
            True,
            [],
            {(4, "running"): "scale-down"},
            [],
            None,
            id="a-slot-above-the-target-is-let-go",
        ),
        pytest.param(
            [*ALL_RUNNING, (3, "Pending", 100), (3, "Running", 5)],
            [],
            {},
            True,
            [],
            {(3, "pending"): "duplicate"},
            [],
            None,
            id="of-duplicates-the-running-stays",
        ),
        pytest.param(
            ALL_RUNNING, [3], {}, True, [], {}, [], None, id="a-released-spare-keeps-its-slot"
        ),
    ],
)
def test_scale_workers(
    workers: list[Worker],
    released: list[int],
    spec: dict[str, Any],
    may_create: bool,
    created: list[int],
    deleted: dict[tuple[int, str], str],
    missing: list[int],
    requeue: float | None,
) -> None:
    """scaling.scale_workers on ``ctx.pods``: the slots it creates, the pods it lets go (by
    slot and state, with why), ``ctx.missing_slots`` for waiting.report, and a requeue for
    the backoff (a failure recorded 10 s ago)."""
    failed = {"reason": "ExitCode", "time": format_time(NOW - timedelta(seconds=10)), "incident": 1}
    job = make_job(running_status(restarts=1, failures=[failed]), **spec)
    pods = [pod(slot, phase=phase, age=age) for slot, phase, age in workers]
    pods += [pod(slot, phase="Succeeded", exit_code=0) for slot in released]
    ctx = context(job, pods)
    live = [worker for worker in ctx.owned if p.state(worker) in ("pending", "running")]
    ended = [worker for worker in ctx.owned if p.state(worker) == "succeeded"]
    ctx.pods = SortedPods(live_workers=by_slot(live), released=ended)
    ctx.may_create = may_create

    assert scaling.scale_workers(ctx) is CONTINUE
    assert created_slots(ctx.plan) == created
    by_name = {p.name(worker): (p.slot(worker), p.state(worker)) for worker in live}
    assert {by_name[name]: why for name, why in ctx.plan.release.items()} == deleted
    assert ctx.missing_slots == missing
    assert ctx.plan.requeue_after == requeue
