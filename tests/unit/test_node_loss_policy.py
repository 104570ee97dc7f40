"""Node-loss policy: when a pod on a node that stopped reporting is lost, and when most nodes
down at once are a partition instead (torchkube/operator/node_loss.py)."""

from datetime import timedelta

import pytest
from planner import NOW, READY, condition, created_slots, make_job, pod, run, running_status, store

from torchkube.api import labels as lbl
from torchkube.api.contract import TRAINING_FINISHED
from torchkube.api.times import format_time
from torchkube.operator import node_loss
from torchkube.operator.node_loss import NodeLoss
from torchkube.operator.pods import NodeHealth

GRACE = timedelta(seconds=30)


def test_node_not_ready_within_grace_waits_then_replaces_elsewhere() -> None:
    pods = [pod(0, node="n1"), pod(1, node="n2"), pod(2, node="n1"), pod(3, node="n1"), store("n1")]
    down = {"n1": READY, "n2": NodeHealth(False, NOW - timedelta(seconds=10))}
    job = make_job(running_status(), failurePolicy={"nodeLostGraceSeconds": 30})
    waiting = run(job, pods, down)
    assert created_slots(waiting) == [] and waiting.delete_pods == []
    assert waiting.requeue_after == pytest.approx(20, abs=0.01)

    lost = run(job, pods, down, now=NOW + timedelta(seconds=21))
    assert lost.delete_pods == [(pods[1]["metadata"]["name"], True)], "force-delete the lost pod"
    assert lost.status.last_failure.reason == "NodeLost"
    assert lost.status.last_failure.node == "n2"
    assert lost.status.restarts_count_towards_max == 0, "infrastructure failures are free"
    assert created_slots(lost) == [1]
    replacement = lost.create_pods[0]
    affinity = replacement["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity, (
        "a lost node is avoided by preference only: on an exact-fit pool the replacement must "
        "be able to go back once the node recovers"
    )
    preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["preference"]["matchExpressions"][0]["values"] == ["n2"]
    assert [e.reason for e in lost.events] == ["NodeLost"] and "n2" in lost.events[0].message


def test_deleted_node_loses_its_pods_at_once() -> None:
    pods = [pod(0, node="gone"), pod(1), pod(2), pod(3), store()]
    result = run(make_job(running_status()), pods, {"n1": READY})
    assert result.status.last_failure.reason == "NodeLost"
    assert created_slots(result) == [0]


@pytest.mark.parametrize("role", ["worker", "rendezvous"])
def test_a_pod_released_by_the_operator_is_not_lost_with_its_node(role: str) -> None:
    """A pod the operator deleted itself (a scale-down, a duplicate store) that is still
    Terminating when its node goes NotReady is gone by choice: force-deleted, never an
    incident."""
    job = make_job(running_status(), replicas={"min": 1, "max": 4, "desired": 2})
    released = pod(
        3 if role == "worker" else 0,
        node="n2",
        role=role,
        deleting=True,
        labels={lbl.RELEASED: "scale-down" if role == "worker" else "duplicate"},
    )
    pods = [pod(0), pod(1), store("n1"), released]
    down = {"n1": READY, "n2": NodeHealth(False, NOW - timedelta(minutes=10))}
    result = run(job, pods, down)
    assert (released["metadata"]["name"], True) in result.delete_pods, "force-deleted"
    assert result.status.restarts == 0 and result.status.last_failure is None
    assert [e.reason for e in result.events if e.type == "Warning"] == []
    assert result.create_pods == []


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
    assert node_loss.partition(nodes) is None


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


def test_a_pod_on_a_deleted_node_is_lost_at_once_one_on_a_ready_node_never() -> None:
    loss = NodeLoss({"n1": READY}, GRACE, NOW)
    assert loss.deadline("gone") == 0.0
    assert loss.deadline("n1") is None
    assert loss.deadline(None) is None, "a pod not scheduled yet has no node to lose"


def test_a_not_ready_node_loses_its_pods_after_the_grace_from_when_it_stopped() -> None:
    loss = NodeLoss({"n2": NodeHealth(False, NOW - timedelta(seconds=10))}, GRACE, NOW)
    assert loss.deadline("n2") == pytest.approx(20)
    late = NodeLoss({"n2": NodeHealth(False, NOW - timedelta(seconds=45))}, GRACE, NOW)
    assert late.deadline("n2") == pytest.approx(-15)


def test_a_node_down_when_a_partition_ended_gets_its_grace_from_the_end() -> None:
    down = NodeHealth(False, NOW - timedelta(minutes=5))
    loss = NodeLoss({"n2": down}, GRACE, NOW, partition_ended=NOW - timedelta(seconds=10))
    assert loss.deadline("n2") == pytest.approx(20)


def test_nothing_is_lost_during_a_partition() -> None:
    down = NodeHealth(False, NOW - timedelta(minutes=5))
    nodes = {f"n{i}": down for i in range(1, 5)} | {"n5": READY}
    partition = node_loss.partition(nodes)
    assert partition is not None
    assert NodeLoss(nodes, GRACE, NOW, partition).deadline("n1") is None


@pytest.mark.parametrize(("phase", "lost"), [("Running", True), ("Succeeded", False)])
def test_a_pod_that_succeeded_is_not_lost_with_its_node(phase: str, lost: bool) -> None:
    """A lost pod is force-deleted and counted; one that finished keeps its result."""
    job = make_job(running_status())
    done = {"exit_code": 0, "message": TRAINING_FINISHED} if phase == "Succeeded" else {}
    worker = pod(0, phase=phase, node="gone", **done)
    result = run(job, [worker, pod(1), pod(2), pod(3), store()], {"n1": READY})
    assert ((worker["metadata"]["name"], True) in result.delete_pods) is lost
    assert (result.status.last_failure is not None) is lost


@pytest.mark.parametrize("message", [TRAINING_FINISHED, "exited 0 without finishing"])
def test_an_ended_pod_on_a_node_past_its_grace_asks_for_no_more_plans(message: str) -> None:
    """A pod that ended keeps its result (or its logs, when the exit was a failure) on a node
    down past the grace: nothing about it changes with time, so it needs no wake-up. Before,
    every plan asked to run again after 0.05 s until the node came back."""
    job = make_job(running_status())
    ended = pod(0, phase="Succeeded", node="n2", exit_code=0, message=message)
    down = {"n1": READY, "n2": NodeHealth(False, NOW - timedelta(minutes=10))}
    result = run(job, [ended, pod(1), pod(2), pod(3), store()], down)
    assert (ended["metadata"]["name"], True) not in result.delete_pods
    assert result.requeue_after is None or result.requeue_after > 1, result.requeue_after
