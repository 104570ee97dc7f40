"""A planner's world in a few lines: jobs, pods, children and nodes as the operator's watch
cache keeps them, ``run`` to plan on them, and ``context`` to call one policy step on them
alone. Shared by the policy tests in tests/unit."""

from collections.abc import Callable
from datetime import datetime, timedelta
from itertools import count
from typing import Any

from training_jobs import NOW, training_job

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.status import TrainingJobStatus
from torchkube.api.times import format_time
from torchkube.operator import pods as p
from torchkube.operator.decision import Context
from torchkube.operator.planner import Observed, Plan, plan
from torchkube.operator.pods import NodeHealth, slim

READY = NodeHealth(True, NOW - timedelta(hours=1))


def make_job(status: TrainingJobStatus | dict[str, Any] | None = None, **spec: Any) -> TrainingJob:
    """A job of four workers unless ``spec`` says otherwise."""
    spec.setdefault("replicas", {"min": 4, "max": 4})
    return training_job(status, **spec)


def running_status(**extra: Any) -> dict[str, Any]:
    return {
        "phase": "Running",
        "startTime": format_time(NOW - timedelta(minutes=4)),
        "conditions": [
            {
                "type": "Created",
                "status": "True",
                "reason": "Created",
                "lastTransitionTime": format_time(NOW - timedelta(minutes=5)),
            }
        ],
        **extra,
    }


_ids = count()


def pod(
    slot: int,
    phase: str = "Running",
    node: str | None = "n1",
    role: str = "worker",
    exit_code: int | None = None,
    reason: str | None = None,
    message: str = "",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    age: float = 60,
    conditions: list[dict[str, Any]] | None = None,
    owner: str | None = "u1",
    deleted_ago: float = 0,
    grace: int = 30,
    finished_ago: float | None = None,
    restarts: int = 0,
    waiting: tuple[str, str] | None = None,
    warm: bool = True,
    running_for: float | None = None,
) -> dict[str, Any]:
    """A pod of job ``demo`` (uid u1) in slot ``slot``.

    ``deleting``: a graceful delete was asked for ``deleted_ago`` seconds ago (``grace``
    seconds of grace); ``finished_ago``: when its container ended; ``warm``: a Running pod's
    container passed its startup probe (its launcher can start workers warm); ``running_for``:
    seconds since its container's current run began (no running state unless given)."""
    name = f"demo-{role}-{slot}-{next(_ids)}"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "creationTimestamp": format_time(NOW - timedelta(seconds=age)),
        "labels": {**lbl.worker_labels("demo", slot, "u1"), lbl.ROLE: role, **(labels or {})},
        "ownerReferences": (
            [{"uid": owner, "controller": True, "kind": "TrainingJob"}] if owner else []
        ),
    }
    if deleting:
        meta["deletionTimestamp"] = format_time(NOW - timedelta(seconds=deleted_ago - grace))
        meta["deletionGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if phase == "Running":
        status["conditions"].append({"type": "Ready", "status": "True"})
    container: dict[str, Any] = {"name": role_container(role), "restartCount": restarts}
    if exit_code is not None or reason is not None:
        terminated: dict[str, Any] = {
            "exitCode": exit_code or 0,
            "reason": reason or "Error",
            "message": message,
        }
        if finished_ago is not None:
            terminated["finishedAt"] = format_time(NOW - timedelta(seconds=finished_ago))
        container["state"] = {"terminated": terminated}
    elif waiting is not None:
        container["state"] = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    if phase == "Running":
        container["started"] = warm
        if running_for is not None:
            began = format_time(NOW - timedelta(seconds=running_for))
            container["state"] = {"running": {"startedAt": began}}
    if restarts or "state" in container or phase == "Running":
        status["containerStatuses"] = [container]
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": status}


def role_container(role: str) -> str:
    return {"rendezvous": "store", "lighthouse": "lighthouse"}.get(role, "trainer")


def kubelet_stopped(slot: int, released: str | None = None, **kw: Any) -> dict[str, Any]:
    """A worker deleted gracefully and stopped by a kubelet >= 1.27: Failed with exit code 143
    (the launcher's answer to SIGTERM) before the pod goes. ``released`` is the operator's
    label for a deletion of its own."""
    labels = {lbl.RELEASED: released} if released else None
    return pod(
        slot,
        phase="Failed",
        exit_code=143,
        deleting=True,
        deleted_ago=5,
        finished_ago=1,
        labels=labels,
        **kw,
    )


def store(node: str = "n1", phase: str = "Running", **kw: Any) -> dict[str, Any]:
    return pod(0, phase=phase, node=node, role="rendezvous", **kw)


def lighthouse(node: str = "n1", phase: str = "Running", **kw: Any) -> dict[str, Any]:
    """recovery live: the job's Lighthouse pod."""
    return pod(0, phase=phase, node=node, role="lighthouse", **kw)


def child(kind: str, name: str, owner: str | None = "u1", **meta: Any) -> dict[str, Any]:
    """A Service or claim as the operator's watch cache keeps it."""
    refs = [{"uid": owner, "controller": True}] if owner else []
    selector = None
    if kind == "Service":  # as builders.service_selector makes it
        role = lbl.ROLE_LIGHTHOUSE if name.endswith("-lighthouse") else lbl.ROLE_RENDEZVOUS
        selector = {lbl.JOB_NAME: "demo", lbl.ROLE: role, lbl.JOB_UID: "u1"}
    body = {
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "ownerReferences": refs, **meta},
        "spec": {"selector": selector},
        "status": {"phase": "Bound" if kind == "PersistentVolumeClaim" else None},
    }
    return p.slim_child(body)


def own_children(live: bool = False) -> list[dict[str, Any]]:
    """The job's Service and claim (``live``: and its Lighthouse's Service)."""
    services = [child("Service", "demo")]
    if live:
        services.append(child("Service", "demo-lighthouse"))
    return [*services, child("PersistentVolumeClaim", "demo-checkpoints")]


def observed(
    job: TrainingJob,
    pods: list[dict[str, Any]],
    nodes: dict[str, NodeHealth] | None = None,
    now: datetime = NOW,
    **kw: Any,
) -> Observed:
    """What the planner sees: the job's own children unless ``children`` says otherwise, two
    Ready nodes unless ``nodes`` does."""
    kw.setdefault("children", own_children() if job.status else [])
    return Observed(  # the operator plans on slimmed pods (its watch cache keeps no more)
        job=job,
        pods=[slim(pod) for pod in pods],
        nodes=nodes or {"n1": READY, "n2": READY},
        now=now,
        **kw,
    )


def _suffixes() -> Callable[[], str]:
    names = (f"s{i}" for i in count())
    return lambda: next(names)


def run(
    job: TrainingJob,
    pods: list[dict[str, Any]],
    nodes: dict[str, NodeHealth] | None = None,
    now: datetime = NOW,
    **kw: Any,
) -> Plan:
    """The whole planner on this world."""
    return plan(observed(job, pods, nodes, now, **kw), new_suffix=_suffixes())


def context(
    job: TrainingJob,
    pods: list[dict[str, Any]],
    nodes: dict[str, NodeHealth] | None = None,
    now: datetime = NOW,
    **kw: Any,
) -> Context:
    """A planning pass before any policy step ran, to call one step directly: ``ctx.owned``
    holds the job's own pods, as the planner sets it. What earlier steps would have found
    (``ctx.pods``, ``ctx.children_ready``, ``ctx.may_create``...) the test sets itself."""
    seen = observed(job, pods, nodes, now, **kw)
    ctx = Context(seen, _suffixes())
    ctx.owned = [pod for pod in seen.pods if p.owned_by(pod, job.uid)]
    return ctx


def by_slot(pods: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Live workers as ``SortedPods.live_workers`` holds them."""
    live: dict[int, list[dict[str, Any]]] = {}
    for worker in pods:
        live.setdefault(p.slot(worker), []).append(worker)
    return live


def created_slots(result: Plan) -> list[int]:
    return sorted(
        int(p["metadata"]["labels"][lbl.REPLICA_INDEX])
        for p in result.create_pods
        if p["metadata"]["labels"][lbl.ROLE] == "worker"
    )


def condition(result: Plan, kind: str) -> dict[str, Any]:
    """The condition as the status stores it (camelCase)."""
    return next(c.to_wire() for c in result.status.conditions if c.type == kind)


def healthy(n: int = 4) -> list[dict[str, Any]]:
    return [pod(i) for i in range(n)] + [store()]
