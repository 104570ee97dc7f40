"""Read what the operator needs from a Pod or Node body, and classify worker failures.

Bodies are the raw dicts from the watch stream; these helpers keep the dictionary digging in
one place so the reconciler reads as policy.
"""

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from torchkube.api.spec import FailurePolicySpec, FailureReason
from torchkube.operator import labels as lbl

PodState = Literal["pending", "running", "succeeded", "failed", "deleting"]

PREEMPTION_REASONS = {"PreemptionByScheduler"}
EVICTION_REASONS = {"EvictionByEvictionAPI", "TerminationByKubelet"}
NODE_LOSS_REASONS = {"DeletionByTaintManager", "DeletionByPodGC"}
INFRASTRUCTURE_REASONS: frozenset[str] = frozenset({"NodeLost", "Preempted", "Evicted"})


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_KEPT_METADATA = ("name", "namespace", "uid", "labels", "creationTimestamp", "deletionTimestamp")
_KEPT_STATUS = ("phase", "reason", "message", "podIP", "conditions", "containerStatuses")


def slim(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of a pod holding only the fields read here: what the watch cache keeps.

    A 512-worker job's pods pass through every reconcile; copying whole pod specs (command,
    env, volumes, managed fields) made copying the operator's main cost and its memory grow
    with the size of the pod template. The kept fields are copied deeply (the watch's raw
    dict is not ours to share); the result is never mutated after.
    """
    metadata, status = pod.get("metadata", {}), pod.get("status") or {}
    return {
        "metadata": {
            key: dict(value) if key == "labels" else value
            for key, value in metadata.items()
            if key in _KEPT_METADATA
        },
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": copy.deepcopy({key: status[key] for key in _KEPT_STATUS if key in status}),
    }


def name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def role(pod: dict[str, Any]) -> str:
    return str(pod["metadata"].get("labels", {}).get(lbl.ROLE, ""))


def slot(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["labels"][lbl.REPLICA_INDEX])


def node_name(pod: dict[str, Any]) -> str | None:
    return pod.get("spec", {}).get("nodeName")


def created(pod: dict[str, Any]) -> datetime | None:
    return parse_time(pod["metadata"].get("creationTimestamp"))


def failure_recorded(pod: dict[str, Any]) -> bool:
    return pod["metadata"].get("labels", {}).get(lbl.FAILURE_RECORDED) == "true"


def state(pod: dict[str, Any]) -> PodState:
    phase = pod.get("status", {}).get("phase", "Pending")
    if phase == "Succeeded":
        return "succeeded"
    if phase == "Failed":
        return "failed"
    if pod["metadata"].get("deletionTimestamp"):
        return "deleting"
    return "running" if phase == "Running" else "pending"


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    condition = _condition(pod, "Ready")
    return condition is not None and condition.get("status") == "True"


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's explanation when it could not place the pod, else None."""
    condition = _condition(pod, "PodScheduled")
    if (
        condition
        and condition.get("status") == "False"
        and condition.get("reason") == ("Unschedulable")
    ):
        return str(condition.get("message", "unschedulable"))
    return None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in pod.get("status", {}).get("containerStatuses", []) or []:
        if status.get("name") == lbl.TRAINER_CONTAINER:
            terminated = status.get("state", {}).get("terminated")
            return dict(terminated) if terminated else None
    return None


def termination_message(pod: dict[str, Any]) -> str:
    return str((_terminated(pod) or {}).get("message") or "")


@dataclass(frozen=True)
class Failure:
    """One worker failure, classified by the job's failure policy."""

    reason: FailureReason
    message: str
    pod: str
    node: str | None
    exit_code: int | None
    retryable: bool

    @property
    def infrastructure(self) -> bool:
        return self.reason in INFRASTRUCTURE_REASONS


def classify(pod: dict[str, Any], policy: FailurePolicySpec, node_lost: bool) -> Failure:
    """Why a worker stopped, and whether the policy retries it.

    Disruption conditions come first: a preempted or evicted pod also ends with a non-zero
    exit code, but the cause is the cluster, not the training code.
    """
    pod_name, node = name(pod), node_name(pod)
    where = f"pod {pod_name}" + (f" on node {node}" if node else "")
    disruption = _condition(pod, "DisruptionTarget")
    disruption_reason = (disruption or {}).get("reason", "")
    terminated = _terminated(pod) or {}
    exit_code = terminated.get("exitCode")
    if node_lost or disruption_reason in NODE_LOSS_REASONS:
        return Failure("NodeLost", f"{where}: node lost", pod_name, node, exit_code, True)
    if disruption_reason in PREEMPTION_REASONS:
        return Failure(
            "Preempted", f"{where}: preempted by the scheduler", pod_name, node, exit_code, True
        )
    if disruption_reason in EVICTION_REASONS or pod.get("status", {}).get("reason") == "Evicted":
        detail = (disruption or {}).get("message") or pod.get("status", {}).get("message", "")
        return Failure(
            "Evicted", f"{where}: evicted {detail}".strip(), pod_name, node, exit_code, True
        )
    if terminated.get("reason") == "OOMKilled":
        return Failure(
            "OOMKilled",
            f"{where}: killed for exceeding its memory limit (OOMKilled)",
            pod_name,
            node,
            exit_code,
            policy.on_oom_killed == "Retry",
        )
    if exit_code == 0:
        return Failure(
            "Unknown",
            f"{where} exited 0 before the trainer reported the end of training",
            pod_name,
            node,
            0,
            True,
        )
    if exit_code is not None:
        detail = (terminated.get("message") or "").strip().splitlines()
        tail = f": {detail[-1]}" if detail else ""
        permanent = policy.is_permanent_exit(int(exit_code))
        kind = "permanent" if permanent else "retryable"
        return Failure(
            "ExitCode",
            f"{where} exited with code {exit_code} ({kind}){tail}",
            pod_name,
            node,
            int(exit_code),
            not permanent,
        )
    if pod["metadata"].get("deletionTimestamp"):
        return Failure("Unknown", f"{where} was deleted", pod_name, node, None, True)
    message = pod.get("status", {}).get("message") or "failed without an exit code"
    return Failure("Unknown", f"{where}: {message}", pod_name, node, None, True)


@dataclass(frozen=True)
class NodeHealth:
    """Whether a node can run pods, and since when it could not."""

    ready: bool
    since: datetime | None


def node_health(node: dict[str, Any]) -> NodeHealth:
    for condition in node.get("status", {}).get("conditions", []) or []:
        if condition.get("type") == "Ready":
            return NodeHealth(
                condition.get("status") == "True",
                parse_time(condition.get("lastTransitionTime")),
            )
    return NodeHealth(False, None)
