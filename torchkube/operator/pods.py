"""Read what the operator needs from a Pod, Node or other child body.

Bodies are the raw dicts from the watch stream (or their slim copies); these helpers keep the
dictionary digging in one place so the policies read as policy.
"""

import copy
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from torchkube.api import labels as lbl
from torchkube.api import podfields
from torchkube.api.podfields import created, deleting, name, role
from torchkube.api.times import parse_time

__all__ = ["created", "deleting", "name", "role"]
"""The shared readers (torchkube/api/podfields.py) the operator's modules use as ``p.*``;
what is defined below is the operator's own."""

PodState = Literal["pending", "running", "succeeded", "failed", "deleting"]

WAITING_BLOCKED = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
"""Container waiting reasons that keep a pod from ever running until something changes (a
container that keeps exiting: the store's, restarted in place, in an image without
torchkube)."""


_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "labels",
    "creationTimestamp",
    "deletionTimestamp",
)
_KEPT_STATUS = ("phase", "reason", "message", "podIP", "conditions", "containerStatuses")


RUNNING_SEEN = "runningSeenAt"
"""A slim pod's own key (beside metadata, spec and status): the wall time (``time.time()``)
the operator's pod watch first showed it Running (:class:`~torchkube.operator.informer.PodIndex`).
The reconcile that sees a job's last worker run may come a calm spacing after its event
(``controller.CALM_SPACING``): start-up and recovery are timed to this instead."""


def last_seen_running(pods: Iterable[dict[str, Any]]) -> float | None:
    """When the last of ``pods`` was first seen Running; None when one was not seen turn
    Running by this process (listed already running, or created and not yet watched)."""
    seen: list[float] = []
    for pod in pods:
        at = pod.get(RUNNING_SEEN)
        if at is None:
            return None
        seen.append(float(at))
    return max(seen, default=None)


def _slim_owners(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"uid": ref.get("uid"), "controller": bool(ref.get("controller"))}
        for ref in metadata.get("ownerReferences") or []
    ]


def slim(pod: dict[str, Any], *, owned: bool = False) -> dict[str, Any]:
    """A copy of a pod holding only the fields read here: what the watch cache keeps.

    A 512-worker job's pods pass through every reconcile; copying whole pod specs (command,
    env, volumes, managed fields) made copying the operator's main cost and its memory grow
    with the size of the pod template. The kept fields are copied deeply unless the caller
    ``owned`` the body (parsed it itself and drops it after); the result is never mutated.
    """
    metadata, status = pod.get("metadata", {}), pod.get("status") or {}
    kept: dict[str, Any] = {
        key: dict(value) if key == "labels" else value
        for key, value in metadata.items()
        if key in _KEPT_METADATA
    }
    kept["ownerReferences"] = _slim_owners(metadata)
    kept_status = {key: status[key] for key in _KEPT_STATUS if key in status}
    return {
        "metadata": kept,
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": kept_status if owned else copy.deepcopy(kept_status),
    }


def slim_child(body: dict[str, Any]) -> dict[str, Any]:
    """What the operator reads of a Service or PersistentVolumeClaim it owns."""
    metadata = body.get("metadata", {})
    return {
        "kind": body.get("kind", ""),
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "deletionTimestamp": metadata.get("deletionTimestamp"),
            "creationTimestamp": metadata.get("creationTimestamp"),
            "ownerReferences": _slim_owners(metadata),
        },
        "spec": {"selector": (body.get("spec") or {}).get("selector")},
        "status": {"phase": (body.get("status") or {}).get("phase")},
    }


def uid(body: dict[str, Any]) -> str:
    return str(body["metadata"].get("uid") or "")


def controller_uid(body: dict[str, Any]) -> str | None:
    """The UID of the object's controlling owner (``ownerReferences[].controller``)."""
    for ref in body["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def owned_by(body: dict[str, Any], owner_uid: str) -> bool:
    """Whether the object is controlled by the owner with ``owner_uid``: a job's pods are
    told apart from a deleted namesake's (same name, same labels) and from a user's pod that
    merely carries the job's label."""
    return bool(owner_uid) and controller_uid(body) == owner_uid


def slot(pod: dict[str, Any]) -> int:
    """A worker's slot (the operator only asks workers, which always carry it)."""
    index = podfields.slot(pod)
    if index is None:
        raise ValueError(f"pod {name(pod)} has no {lbl.REPLICA_INDEX} label")
    return index


def node_name(pod: dict[str, Any]) -> str | None:
    return pod.get("spec", {}).get("nodeName")


def failure_recorded(pod: dict[str, Any]) -> bool:
    return pod["metadata"].get("labels", {}).get(lbl.FAILURE_RECORDED) == "true"


SIGNAL_EXIT_CODES = frozenset({143, 137})
"""SIGTERM (what a delete sends first; the launcher exits 143) and SIGKILL (at the end of the
grace period)."""


def ended_by_deletion(pod: dict[str, Any]) -> bool:
    """Whether a terminal pod that is being deleted stopped *because* of the delete.

    Since Kubernetes 1.27 the kubelet moves a gracefully deleted pod to a terminal phase
    before it is removed (kubernetes/kubernetes#115331): a worker deleted on a scale-down is
    ``Failed`` with exit code 143 for a moment. Such a pod is a deletion, not a failure. The
    operator's own deletions carry the ``released`` label; anyone else's show as a container
    ended by the delete's signal. (The deletion timestamp cannot tell: the kubelet's final
    delete with no grace rewrites it.) A container that ended with its own code, or OOMKilled,
    failed on its own before or while it was deleted.
    """
    if not deleting(pod):
        return False
    if lbl.RELEASED in pod["metadata"].get("labels", {}):
        return True
    ended = terminated(pod)
    if not ended:
        return True
    return ended.get("exitCode") in SIGNAL_EXIT_CODES and ended.get("reason") != "OOMKilled"


def state(pod: dict[str, Any]) -> PodState:
    phase = pod.get("status", {}).get("phase", "Pending")
    if deleting(pod) and (phase not in ("Succeeded", "Failed") or ended_by_deletion(pod)):
        return "deleting"
    if phase == "Succeeded":
        return "succeeded"
    if phase == "Failed":
        return "failed"
    return "running" if phase == "Running" else "pending"


def progress_only(change: str, pod: dict[str, Any]) -> bool:
    """Whether a watch event shows no more than a live pod moving on (created, bound,
    started, ready or not), which only the job's status reports. A pod gone, going or ended,
    or with a container that ended (a store restarted in place), is news a decision acts on:
    a replacement, a restart, the job's end (``controller.CALM_SPACING``)."""
    if change == "DELETED" or deleting(pod):
        return False
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    return not any(
        "terminated" in (entry.get("state") or {}) or "terminated" in (entry.get("lastState") or {})
        for entry in status.get("containerStatuses") or []
    )


def condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for entry in pod.get("status", {}).get("conditions", []) or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    entry = condition(pod, "Ready")
    return entry is not None and entry.get("status") == "True"


def is_started(pod: dict[str, Any]) -> bool:
    """The trainer container passed its startup probe: its launcher can start workers warm."""
    return bool(_container_status(pod, lbl.TRAINER_CONTAINER).get("started"))


def running_since(pod: dict[str, Any]) -> datetime | None:
    """When the trainer container's current run began; None unless it runs."""
    state = _container_status(pod, lbl.TRAINER_CONTAINER).get("state") or {}
    return parse_time((state.get("running") or {}).get("startedAt"))


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's explanation when it could not place the pod, else None."""
    entry = condition(pod, "PodScheduled")
    if entry and entry.get("status") == "False" and entry.get("reason") == "Unschedulable":
        return str(entry.get("message", "unschedulable"))
    return None


def _container_status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        if status.get("name") == container:
            return dict(status)
    return {}


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    status = _container_status(pod, lbl.TRAINER_CONTAINER) or _first_container_status(pod)
    terminated = status.get("state", {}).get("terminated")
    return dict(terminated) if terminated else None


def _first_container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses", []) or []
    return dict(statuses[0]) if statuses else {}


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The main container's terminated state (exit code, reason, message), or {}."""
    return _terminated(pod) or {}


def termination_message(pod: dict[str, Any]) -> str:
    return str(terminated(pod).get("message") or "")


def restart_count(pod: dict[str, Any]) -> int:
    """Restarts of the pod's first container (the store restarts in place)."""
    return int(_first_container_status(pod).get("restartCount") or 0)


def last_termination(pod: dict[str, Any]) -> dict[str, Any]:
    """Why the first container's previous run ended (a container restarted in place)."""
    state_ = _first_container_status(pod).get("lastState") or {}
    return dict(state_.get("terminated") or {})


def serving(pod: dict[str, Any]) -> bool:
    """A rendezvous store that takes connections: Running and Ready (its probe connects)."""
    return state(pod) == "running" and is_ready(pod)


def blocked_reason(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when a container waits for something that will not come by itself:
    an image that cannot be pulled, a missing Secret or ConfigMap, a refused container."""
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in WAITING_BLOCKED:
            return str(waiting["reason"]), str(waiting.get("message") or "")
    return None


def waiting_reason(pod: dict[str, Any]) -> str | None:
    """Why the first waiting container of a pod waits (``ContainerCreating``, ...), if one
    does."""
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    return None


def live_workers(
    pods: Iterable[dict[str, Any]], unseen: Collection[str] = ()
) -> dict[str, dict[str, Any]]:
    """The Pending and Running worker pods by name, but ``unseen`` ones (created, not yet
    shown by the watch): what a later snapshot is compared with (:func:`vanished`)."""
    return {
        name(pod): pod
        for pod in pods
        if role(pod) == lbl.ROLE_WORKER
        and state(pod) in ("pending", "running")
        and name(pod) not in unseen
    }


def vanished(
    before: Mapping[str, dict[str, Any]], pods: Iterable[dict[str, Any]], ours: Collection[str]
) -> list[dict[str, Any]]:
    """Workers live at the last plan and gone now without ever being seen Terminating, nor
    deleted by this operator (``ours``): force-deleted (``--grace-period=0 --force``), or
    deleted and removed while the watch was away. Their last known bodies."""
    now = {name(pod) for pod in pods}
    return [pod for key, pod in before.items() if key not in now and key not in ours]


@dataclass(frozen=True)
class NodeHealth:
    """Whether a node can run pods, since when it could not, and its labels: the topology
    domains it is in (``scheduling.topology.level`` is one of their keys, any job's)."""

    ready: bool
    since: datetime | None
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)


def node_health(node: dict[str, Any]) -> NodeHealth:
    """What the node cache keeps of a node, built once per node event and shared by every
    reconcile that reads it. Label keys and values are interned: a 4,000-node fleet shares
    one copy of each key and of each rack or zone name instead of holding one per node."""
    labels = {
        sys.intern(key): sys.intern(value)
        for key, value in ((node.get("metadata") or {}).get("labels") or {}).items()
    }
    for entry in node.get("status", {}).get("conditions", []) or []:
        if entry.get("type") == "Ready":
            return NodeHealth(
                entry.get("status") == "True",
                parse_time(entry.get("lastTransitionTime")),
                labels,
            )
    return NodeHealth(False, None, labels)
