"""recovery live: torchft's Lighthouse in a pod and Service of its own, created, watched and
replaced like the rendezvous store; and the store's loss, which the replica groups train on
through, restarts nothing (torchkube/operator/sorting.py, scaling.py, phase.py, failure.py)."""

from datetime import timedelta
from typing import Any

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
from training_jobs import NOW

from torchkube.api import labels as lbl
from torchkube.operator import conditions as cond

LIVE = {"replicas": {"min": 2, "max": 2}, "failurePolicy": {"recovery": "live"}}


def live_job(status: dict[str, Any] | None = None, **spec: Any) -> Any:
    return make_job(status, **{**LIVE, **spec})


def created(result: Any, role: str) -> list[dict[str, Any]]:
    return [p for p in result.create_pods if p["metadata"]["labels"][lbl.ROLE] == role]


def warnings(result: Any) -> list[str]:
    return [e.reason for e in result.events if e.type == "Warning"]


def test_a_live_job_gets_a_lighthouse_pod_and_service_a_restart_job_none() -> None:
    result = run(live_job(), [])
    (made,) = created(result, lbl.ROLE_LIGHTHOUSE)
    assert made["metadata"]["name"].startswith("demo-lighthouse-")
    services = [c["metadata"]["name"] for c in result.create_children if c["kind"] == "Service"]
    assert services == ["demo", "demo-lighthouse"]
    restart = run(make_job(replicas=LIVE["replicas"]), [])
    assert created(restart, lbl.ROLE_LIGHTHOUSE) == []
    assert [c["metadata"]["name"] for c in restart.create_children if c["kind"] == "Service"] == [
        "demo"
    ]


def test_a_lighthouse_service_of_another_object_is_a_name_conflict() -> None:
    """A job named ``demo-lighthouse`` owns the Service this live job's Lighthouse needs."""
    children = [*own_children(), child("Service", "demo-lighthouse", owner="someone")]
    result = run(live_job(), [], children=children)
    created_ = condition(result, "Created")
    assert created_["status"] == "False" and created_["reason"] == "NameConflict"
    assert "demo-lighthouse" in created_["message"]
    assert result.create_pods == []


def test_a_live_job_is_running_only_with_its_lighthouse_serving() -> None:
    """The groups' first step is a quorum: without a Lighthouse nothing trains, so a live job
    is not Running (Pending before its start) and LighthouseReady says why."""
    workers = [pod(0), pod(1), store()]
    waiting = run(live_job(), [*workers, lighthouse(phase="Pending")], children=own_children(True))
    assert waiting.status.phase == "Pending"
    ready = condition(waiting, cond.LIGHTHOUSE_READY)
    assert ready["status"] == "False" and ready["reason"] == "NotServing"
    assert "demo-lighthouse-" in ready["message"] and "Pending" in ready["message"]
    serving = run(live_job(), [*workers, lighthouse()], children=own_children(True))
    assert serving.status.phase == "Running"
    assert condition(serving, cond.LIGHTHOUSE_READY)["status"] == "True"
    restart = run(make_job(replicas=LIVE["replicas"]), workers)
    assert restart.status.phase == "Running"
    assert all(c.type != cond.LIGHTHOUSE_READY for c in restart.status.conditions)


def test_a_lost_lighthouse_pauses_the_groups_and_is_replaced_without_a_restart() -> None:
    """Someone deleted the Lighthouse's pod (or it failed): the groups wait for a new one at
    their next quorum. Nothing restarts from a checkpoint, nothing is spent; the status says
    what the job waits for, a Warning event says it once, and a new Lighthouse is created."""
    first = run(live_job(), [pod(0), pod(1), store(), lighthouse()], children=own_children(True))
    deleted = lighthouse(deleting=True, deleted_ago=1)
    for gone in (deleted, lighthouse(phase="Failed", exit_code=1)):
        result = run(
            live_job(first.status.to_wire()),
            [pod(0), pod(1), store(), gone],
            children=own_children(True),
        )
        status = result.status
        assert (status.restarts, status.replica_group_losses, status.last_failure) == (0, 0, None)
        assert status.phase == "Restarting", status.phase
        restarting = condition(result, cond.RESTARTING)
        assert restarting["reason"] == "WaitingForLighthouse", restarting
        ready = condition(result, cond.LIGHTHOUSE_READY)
        assert ready["status"] == "False"
        assert "no Lighthouse pod" in ready["message"] and "next quorum" in ready["message"]
        assert warnings(result) == ["LighthouseLost"], result.events
        assert len(created(result, lbl.ROLE_LIGHTHOUSE)) == 1
        assert created(result, lbl.ROLE_WORKER) == [] and created(result, lbl.ROLE_RENDEZVOUS) == []
    failed = lighthouse(phase="Failed", exit_code=1)
    result = run(live_job(first.status.to_wire()), [pod(0), pod(1), store(), failed])
    assert failed["metadata"]["name"] in [name for name, _ in result.delete_pods]
    again = run(
        live_job(result.status.to_wire()),
        [pod(0), pod(1), store(), lighthouse(phase="Pending", age=1)],
        children=own_children(True),
    )
    assert warnings(again) == [], "said once"


def test_a_lighthouse_lost_with_its_node_is_force_deleted_and_replaced() -> None:
    from torchkube.operator.pods import NodeHealth

    nodes = {"n1": NodeHealth(True, NOW), "n2": NodeHealth(False, NOW - timedelta(minutes=10))}
    job = live_job(running_status())
    on_lost = lighthouse(node="n2")
    result = run(job, [pod(0), pod(1), store(), on_lost], nodes=nodes)
    assert (on_lost["metadata"]["name"], True) in result.delete_pods
    assert len(created(result, lbl.ROLE_LIGHTHOUSE)) == 1
    assert result.status.restarts == 0 and result.status.last_failure is None


def test_one_lighthouse_of_two_is_let_go() -> None:
    older, newer = lighthouse(age=120), lighthouse(phase="Pending", age=5)
    result = run(live_job(running_status()), [pod(0), pod(1), store(), older, newer])
    assert [name for name, _ in result.delete_pods] == [newer["metadata"]["name"]]
    assert result.release[newer["metadata"]["name"]] == "duplicate"
    assert created(result, lbl.ROLE_LIGHTHOUSE) == []


def test_an_unschedulable_or_crash_looping_lighthouse_says_so() -> None:
    unschedulable = lighthouse(
        phase="Pending",
        node=None,
        age=600,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient cpu.",
            }
        ],
    )
    result = run(live_job(), [pod(0), pod(1), store(), unschedulable])
    stuck = condition(result, cond.PODS_UNSCHEDULABLE)
    assert stuck["reason"] == "LighthouseUnschedulable", stuck
    assert unschedulable["metadata"]["name"] in stuck["message"]
    assert "rendezvous.store" in stuck["message"] and "Insufficient cpu" in stuck["message"]
    looping = lighthouse(phase="Running", waiting=("CrashLoopBackOff", "back-off 40s"))
    looping["status"]["conditions"] = []
    blocked = condition(run(live_job(), [pod(0), pod(1), store(), looping]), cond.PODS_BLOCKED)
    assert blocked["reason"] == "CrashLoopBackOff"
    assert "Lighthouse pod" in blocked["message"] and "torchft" in blocked["message"]


def test_a_finished_live_job_lets_its_lighthouse_go() -> None:
    finished = running_status(phase="Succeeded", completionTime="2026-11-23T11:59:00Z")
    light = lighthouse()
    result = run(live_job(finished), [store(), light])
    assert light["metadata"]["name"] in [name for name, _ in result.delete_pods]


def test_a_live_job_that_loses_its_store_trains_on_and_restarts_nothing() -> None:
    """Each pod is a torchrun world of its own, which needs the store only to start: the
    groups train on while a new store starts. Not an incident, nothing spent; the store is
    replaced, the job stays Running, and StoreReady says what waits for the store."""
    job = live_job(running_status(), failurePolicy={"recovery": "live", "maxRestarts": 0})
    for lost in (store(phase="Failed", exit_code=137), store(deleting=True, deleted_ago=1)):
        result = run(job, [pod(0), pod(1), lost, lighthouse()], children=own_children(True))
        status = result.status
        assert status.phase == "Running", status.conditions
        assert (status.restarts, status.restarts_count_towards_max) == (0, 0)
        assert status.replica_group_losses == 0, "the store is no replica group"
        assert status.last_failure is not None
        assert status.last_failure.reason == "RendezvousStoreLost"
        assert status.last_failure.incident is None and status.last_failure.counted is False
        assert "restarting from the latest checkpoint" not in " ".join(
            e.message for e in result.events
        )
        assert len(created(result, lbl.ROLE_RENDEZVOUS)) == 1
        assert created(result, lbl.ROLE_WORKER) == []
        ready = condition(result, cond.STORE_READY)
        assert ready["status"] == "False" and "train on" in ready["message"], ready
    crashed = store(restarts=1)
    crashed["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error"}
    }
    in_place = run(job, [pod(0), pod(1), crashed, lighthouse()], children=own_children(True))
    assert in_place.status.restarts == 0 and in_place.status.phase == "Running"
    assert in_place.mark_recorded == {crashed["metadata"]["name"]: "1"}, "counted once"


def test_a_live_job_whose_store_is_lost_with_every_group_restarts() -> None:
    """No group trains on: the store's loss is part of the job's restart, as before."""
    job = live_job(running_status())
    both = [pod(i, phase="Failed", exit_code=137) for i in range(2)]
    result = run(job, [*both, store(phase="Failed", exit_code=137), lighthouse()])
    assert result.status.restarts == 1


def test_a_live_job_whose_store_never_served_does_not_start() -> None:
    """Before the start the workers need the store for their first rendezvous."""
    result = run(live_job(), [pod(0), pod(1), store(phase="Pending"), lighthouse()])
    assert result.status.phase == "Pending"
    assert condition(result, cond.STORE_READY)["status"] == "False"
