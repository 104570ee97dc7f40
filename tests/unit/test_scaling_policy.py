"""Scaling policy: slots, duplicates, nodes to avoid and partitions
(torchkube/operator/scaling.py)."""

from datetime import timedelta

from planner import NOW, created_slots, make_job, pod, run, running_status, store

from torchkube.api.status import FailureRecord
from torchkube.api.times import format_time
from torchkube.operator import scaling


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
