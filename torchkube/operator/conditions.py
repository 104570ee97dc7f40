"""Status conditions in metav1.Condition shape, changed only when something changed.

A condition keeps its lastTransitionTime until its status flips, so repeated reconciles with
the same outcome write nothing (jobset's updateCondition habit).
"""

from datetime import datetime

from torchkube.api.times import format_time
from torchkube.api.types import Condition

CREATED = "Created"
DATA_READY = "DataReady"
"""spec.data is on the checkpoint volume (True), being prepared, or could not be (False)."""
QUEUED = "Queued"
"""The job waits for Kueue to admit its Workload (True), or was admitted (False)."""
RUNNING = "Running"
RESTARTING = "Restarting"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PODS_UNSCHEDULABLE = "PodsUnschedulable"
PODS_BLOCKED = "PodsBlocked"
"""Pods that cannot start until something changes: an image that cannot be pulled, a missing
Secret, a claim that is not bound, a create the apiserver refused."""
WAITING_FOR_WORKERS = "WaitingForWorkers"
"""Fewer than ``replicas.min`` workers run: which pods the job waits for and why (not
scheduled, pulling its image, blocked, not created yet), and what happens at the rendezvous's
join timeout."""
STRAGGLER_KEPT = "StragglerKept"
"""With ``replaceStragglers``: a straggler is not replaced because a replacement could not
leave its node (it came back there, or there is no other node)."""
INVALID = "Invalid"
"""The job's spec or status does not validate: the operator cannot act on it."""
OPERATOR_FORBIDDEN = "OperatorForbidden"
"""The apiserver refused the operator a request this job needs (403): its RBAC lacks a
right. The job cannot advance until the right is granted."""
NODES_UNREACHABLE = "NodesUnreachable"
"""Most nodes went NotReady at once (a partition): workers there are kept, not replaced."""
TOPOLOGY_SPREAD = "TopologySpread"
"""With ``scheduling.topology``: the workers run in more than one domain of its level (a
``preferred`` job that found no room in one, a replacement placed elsewhere), so the job's
collectives cross the slower links between domains. Names the domains, the workers in each,
and the room that would pack the job again."""
STORE_READY = "StoreReady"
"""The rendezvous store serves (True), or why it does not (False): the workers meet only
through it. When it last turned True also tells whether a store lost again served between
the two losses (``torchkube.policy.failures.store_loss``)."""
LIGHTHOUSE_READY = "LighthouseReady"
"""recovery live: torchft's Lighthouse serves (True), or why it does not (False): every step of
every replica group begins with a quorum it forms, so without it the groups wait."""


def get(conditions: list[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


def is_true(conditions: list[Condition], kind: str) -> bool:
    condition = get(conditions, kind)
    return condition is not None and condition.status == "True"


def set_condition(
    conditions: list[Condition],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """A new list with ``kind`` set; the transition time moves only when the status flips."""
    value = "True" if status else "False"
    previous = get(conditions, kind)
    changed_at = format_time(now)
    if previous is not None and previous.status == value:
        changed_at = previous.last_transition_time
    updated = Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=changed_at,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == kind else c for c in conditions]


def clear(
    conditions: list[Condition],
    kind: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[Condition]:
    """Set ``kind`` to False, but only if it exists: absent conditions stay absent."""
    if get(conditions, kind) is None:
        return conditions
    return set_condition(conditions, kind, False, reason, message, now, generation)
