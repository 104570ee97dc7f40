"""Status conditions in metav1.Condition shape, changed only when something changed.

A condition keeps its lastTransitionTime until its status flips, so repeated reconciles with
the same outcome write nothing (jobset's updateCondition habit).
"""

from datetime import datetime
from typing import Any

from torchkube.operator.pods import format_time

CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PODS_UNSCHEDULABLE = "PodsUnschedulable"
PODS_BLOCKED = "PodsBlocked"
"""Pods that cannot start until something changes: an image that cannot be pulled, a missing
Secret, a claim that is not bound, a create the apiserver refused."""
INVALID = "Invalid"
"""The job's spec or status does not validate: the operator cannot act on it."""
NODES_UNREACHABLE = "NodesUnreachable"
"""Most nodes went NotReady at once (a partition): workers there are kept, not replaced."""


def get(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(conditions: list[dict[str, Any]], kind: str) -> bool:
    condition = get(conditions, kind)
    return condition is not None and condition.get("status") == "True"


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """A new list with ``kind`` set; the transition time moves only when the status flips."""
    value = "True" if status else "False"
    previous = get(conditions, kind)
    updated: dict[str, Any] = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": format_time(now),
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    if previous is not None and previous.get("status") == value:
        updated["lastTransitionTime"] = previous["lastTransitionTime"]
    others = [c for c in conditions if c.get("type") != kind]
    return (
        [*others, updated]
        if previous is None
        else [updated if c.get("type") == kind else c for c in conditions]
    )


def clear(
    conditions: list[dict[str, Any]],
    kind: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Set ``kind`` to False, but only if it exists: absent conditions stay absent."""
    if get(conditions, kind) is None:
        return conditions
    return set_condition(conditions, kind, False, reason, message, now, generation)
