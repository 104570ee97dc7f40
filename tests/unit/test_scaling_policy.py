"""Scaling policy: slots, duplicates, nodes to avoid and partitions
(torchkube/operator/scaling.py)."""

from datetime import timedelta

from planner import NOW, READY, condition, created_slots, make_job, pod, run, running_status, store

from torchkube.api.status import FailureRecord
from torchkube.api.times import format_time
from torchkube.operator import scaling
from torchkube.operator.pods import NodeHealth


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


def test_most_nodes_not_ready_at_once_is_a_partition_not_a_loss() -> None:
    down = NodeHealth(False, NOW - timedelta(minutes=5))
    nodes = {f"n{i}": down for i in range(1, 5)} | {"n5": READY}
    pods = [pod(i, node=f"n{i + 1}") for i in range(4)] + [store("n5")]
    result = run(make_job(running_status()), pods, nodes)
    assert result.delete_pods == [] and created_slots(result) == []
    assert result.status.restarts == 0
    assert condition(result, "NodesUnreachable")["status"] == "True"
    assert "NodesUnreachable" not in [e.reason for e in result.events]
    assert "Partition" in [e.reason for e in result.events]


def test_a_minority_of_nodes_lost_is_a_loss() -> None:
    down = NodeHealth(False, NOW - timedelta(minutes=5))
    nodes = {"n1": down, "n2": READY, "n3": READY, "n4": READY}
    pods = [pod(0, node="n1"), pod(1, node="n2"), pod(2, node="n3"), pod(3, node="n4")]
    result = run(make_job(running_status()), [*pods, store("n2")], nodes)
    assert result.delete_pods == [(pods[0]["metadata"]["name"], True)]
    assert scaling.partition(nodes) is None


def test_nodes_with_a_hung_or_straggling_worker_are_avoided_too() -> None:
    when = format_time(NOW - timedelta(minutes=5))
    records = [
        FailureRecord(reason="Hang", node="n4", time=when),
        FailureRecord(reason="Straggler", node="n5", time=when),
        FailureRecord(reason="ExitCode", node="n6", time=when),
    ]
    assert scaling.avoided_nodes(records, NOW) == ["n4", "n5"]


def unreachable(status: str, ago: float) -> dict[str, str]:
    return {
        "type": "NodesUnreachable",
        "status": status,
        "reason": "Partition" if status == "True" else "NodesReachable",
        "lastTransitionTime": format_time(NOW - timedelta(seconds=ago)),
    }


def test_nodes_still_down_when_a_partition_heals_get_their_grace_from_its_end() -> None:
    """A partition heals node by node: once most nodes report again, the last ones down are
    not lost at once (their NotReady is minutes old) but a full grace after the partition."""
    down = NodeHealth(False, NOW - timedelta(minutes=5))
    nodes = {"n1": down, "n2": down, "n3": READY, "n4": READY, "n5": READY}
    pods = [pod(i, node=f"n{i + 1}") for i in range(4)] + [store("n5")]
    grace = {"nodeLostGraceSeconds": 30}
    healing = make_job(running_status(conditions=[unreachable("True", 60)]), failurePolicy=grace)
    result = run(healing, pods, nodes)
    assert result.delete_pods == [] and created_slots(result) == []
    assert condition(result, "NodesUnreachable")["status"] == "False"
    assert result.requeue_after is not None and result.requeue_after <= 30

    healed = make_job(running_status(conditions=[unreachable("False", 10)]), failurePolicy=grace)
    result = run(healed, pods, nodes)
    assert result.delete_pods == []
    assert result.requeue_after is not None and result.requeue_after <= 20

    later = make_job(running_status(conditions=[unreachable("False", 31)]), failurePolicy=grace)
    result = run(later, pods, nodes)
    lost = {pods[0]["metadata"]["name"], pods[1]["metadata"]["name"]}
    assert {name for name, force in result.delete_pods if force} == lost
