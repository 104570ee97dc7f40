"""Failure injection for operator tests: each fault reaches the API the way the real cause would.

An operator must react to what it *sees*, so every helper here produces the same objects, status
fields and conditions a kubelet, the scheduler or a node loss would produce:

- :func:`fail_pod` / :func:`succeed_pod` write the pod's ``status`` subresource (the kubelet's
  channel) with a terminated container state, exit code and reason. KWOK does not undo this: its
  ``pod-ready`` stage only matches pods without a ``podIP``, and the helpers wait for ``Running``
  (KWOK has assigned the IP) before writing.
- :func:`delete_pod` is a user or controller delete (graceful; KWOK plays a kubelet >= 1.27: the
  pod turns ``Failed`` with exit code 143, then goes), ``force=True`` the
  ``--grace-period=0 --force`` kind. :func:`stop_deleted_pod` does the kubelet's part by hand on a
  node whose KWOK is paused.
- :func:`evict_pod` goes through the Eviction API (``kubectl drain``), honouring PDBs.
- :func:`preempt_pod` does what kube-scheduler's preemption does to a victim (see its docstring).
- :func:`make_node_not_ready` kills the node's failure domain (its kwok process): leases stop and
  the node-lifecycle controller marks the nodes ``Ready=Unknown`` -- a lost machine or partition.
  :func:`restore_domain` brings the domain back.
- :func:`delete_node` and :func:`cordon_node` are what a cloud provider / an admin would do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from testbed.pods import node_condition, wait_node_condition, wait_pod_phase
from testbed.wait import wait_for
from torchkube.api import times
from torchkube.api.contract import TRAINING_FINISHED

if TYPE_CHECKING:
    from testbed.cluster import Cluster

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

PREEMPTION_REASON = "PreemptionByScheduler"
"""``DisruptionTarget`` reason kube-scheduler gives its preemption victims."""


def _core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


def _condition(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "lastTransitionTime": times.now(),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def terminated_status_patch(
    pod: dict[str, Any],
    *,
    phase: str,
    exit_code: int,
    reason: str,
    message: str = "",
    container: str | None = None,
    pod_reason: str = "",
    pod_message: str = "",
) -> dict[str, Any]:
    """The JSON merge patch a kubelet's status update amounts to when containers terminate.

    ``pod`` is the pod as a dict (API field names). ``container`` (default: all) gets
    ``exit_code``/``reason``; other containers end with 0/Completed. Lists are replaced whole by a
    merge patch, so all conditions and container statuses are carried over; ``resourceVersion``
    makes the write fail with 409 if the pod changed in between.
    """
    now = times.now()
    status = pod.get("status") or {}
    previous = {cs["name"]: cs for cs in status.get("containerStatuses") or []}
    statuses = []
    for spec in pod["spec"]["containers"]:
        name = spec["name"]
        before = previous.get(name, {})
        started = ((before.get("state") or {}).get("running") or {}).get("startedAt") or now
        hit = container is None or name == container
        terminated: dict[str, Any] = {
            "exitCode": exit_code if hit else 0,
            "reason": reason if hit else "Completed",
            "startedAt": started,
            "finishedAt": now,
        }
        if hit and message:
            terminated["message"] = message
        statuses.append(
            {
                "name": name,
                "image": before.get("image", spec.get("image", "")),
                "imageID": before.get("imageID", ""),
                "ready": False,
                "started": False,
                "restartCount": before.get("restartCount", 0),
                "state": {"terminated": terminated},
            }
        )
    done_reason = "PodFailed" if phase == "Failed" else "PodCompleted"
    conditions = [
        c for c in status.get("conditions") or [] if c["type"] not in ("Ready", "ContainersReady")
    ]
    conditions += [
        _condition("Ready", "False", done_reason),
        _condition("ContainersReady", "False", done_reason),
    ]
    patch_status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": statuses,
    }
    if pod_reason:
        patch_status["reason"] = pod_reason
    if pod_message:
        patch_status["message"] = pod_message
    return {
        "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
        "status": patch_status,
    }


def _terminate(api: Any, name: str, namespace: str, timeout: float, **patch_args: Any) -> Any:
    from kubernetes.client.exceptions import ApiException

    core = _core(api)
    wait_pod_phase(api, name, namespace, "Running", timeout=timeout)
    for _ in range(10):
        pod = api.sanitize_for_serialization(core.read_namespaced_pod_status(name, namespace))
        patch = terminated_status_patch(pod, **patch_args)
        try:
            return core.patch_namespaced_pod_status(
                name, namespace, patch, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status != 409:  # someone (KWOK, a controller) wrote in between: retry
                raise
    raise RuntimeError(f"pod {namespace}/{name}: status kept changing, could not terminate it")


def fail_pod(
    api: Any,
    name: str,
    namespace: str,
    exit_code: int = 1,
    reason: str = "Error",
    *,
    message: str = "",
    container: str | None = None,
    pod_reason: str = "",
    timeout: float = 60,
) -> Any:
    """Make a Running pod ``Failed``, its container terminated with ``exit_code`` and ``reason``.

    Use ``reason="OOMKilled", exit_code=137`` for an out-of-memory kill, ``pod_reason="Evicted"``
    for a kubelet eviction. Returns the updated pod.
    """
    return _terminate(
        api,
        name,
        namespace,
        timeout,
        phase="Failed",
        exit_code=exit_code,
        reason=reason,
        message=message,
        container=container,
        pod_reason=pod_reason,
    )


SIGTERM_EXIT_CODE = 143


def image_pull_failing(
    api: Any, name: str, namespace: str, reason: str = "ImagePullBackOff"
) -> Any:
    """What a kubelet reports for a pod whose image cannot be pulled: still ``Pending``, its
    containers waiting with ``reason`` (ErrImagePull, then ImagePullBackOff). For a pod bound
    to a node whose KWOK is paused, so nothing overwrites it."""
    core = _core(api)
    pod = api.sanitize_for_serialization(core.read_namespaced_pod_status(name, namespace))
    waiting = {
        "reason": reason,
        "message": f'Back-off pulling image "{pod["spec"]["containers"][0]["image"]}"',
    }
    patch = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": waiting},
                }
                for c in pod["spec"]["containers"]
            ],
        }
    }
    return core.patch_namespaced_pod_status(name, namespace, patch, _content_type=MERGE_PATCH)


def crash_looping(
    api: Any, name: str, namespace: str, restarts: int, exit_code: int = 1, timeout: float = 60
) -> Any:
    """What a kubelet reports for a ``restartPolicy: Always`` container that keeps exiting
    (a rendezvous store whose image lacks torchkube): the pod still ``Running``, not Ready,
    its container restarted ``restarts`` times and waiting in ``CrashLoopBackOff``, its last
    run ended with ``exit_code``. KWOK leaves it (the pod has its IP)."""
    from kubernetes.client.exceptions import ApiException

    core = _core(api)
    wait_pod_phase(api, name, namespace, "Running", timeout=timeout)
    now = times.now()
    for _ in range(10):
        pod = api.sanitize_for_serialization(core.read_namespaced_pod_status(name, namespace))
        status = pod.get("status") or {}
        waiting = {
            "reason": "CrashLoopBackOff",
            "message": f"back-off 5m0s restarting failed container={{name}} pod={name}",
        }
        last = {"exitCode": exit_code, "reason": "Error", "startedAt": now, "finishedAt": now}
        statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": restarts,
                "state": {"waiting": {**waiting, "message": waiting["message"].format(**c)}},
                "lastState": {"terminated": last},
            }
            for c in pod["spec"]["containers"]
        ]
        conditions = [
            c
            for c in status.get("conditions") or []
            if c["type"] not in ("Ready", "ContainersReady")
        ]
        conditions += [
            _condition("Ready", "False", "ContainersNotReady"),
            _condition("ContainersReady", "False", "ContainersNotReady"),
        ]
        patch = {
            "metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]},
            "status": {"conditions": conditions, "containerStatuses": statuses},
        }
        try:
            return core.patch_namespaced_pod_status(
                name, namespace, patch, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    raise RuntimeError(f"pod {namespace}/{name}: status kept changing, could not patch it")


def stop_deleted_pod(api: Any, name: str, namespace: str, timeout: float = 60) -> Any:
    """What a kubelet >= 1.27 does to a pod being deleted: stop its container (SIGTERM; the
    launcher exits 143) and report the pod ``Failed`` before it is removed. For nodes whose
    KWOK is paused (a killed domain), where no stage does it."""
    return _terminate(
        api, name, namespace, timeout, phase="Failed", exit_code=SIGTERM_EXIT_CODE, reason="Error"
    )


def succeed_pod(
    api: Any,
    name: str,
    namespace: str,
    timeout: float = 60,
    message: str = f"{TRAINING_FINISHED} at step 1000",
) -> Any:
    """Make a Running pod ``Succeeded`` (every container exited 0, reason Completed).

    The default termination message is the built-in trainer's word that training ended (the
    operator trusts an exit 0 of the built-in trainer only with it); pass ``message=""`` to
    play a torchrun agent that ended early.
    """
    return _terminate(
        api,
        name,
        namespace,
        timeout,
        phase="Succeeded",
        exit_code=0,
        reason="Completed",
        message=message,
    )


def delete_pod(
    api: Any,
    name: str,
    namespace: str,
    *,
    force: bool = False,
    grace_period_seconds: int | None = None,
) -> None:
    """Delete a pod; ``force`` means grace period 0 (gone at once, even from a lost node)."""
    from kubernetes import client

    grace = 0 if force else grace_period_seconds
    _core(api).delete_namespaced_pod(
        name, namespace, body=client.V1DeleteOptions(grace_period_seconds=grace)
    )


def evict_pod(api: Any, name: str, namespace: str) -> None:
    """Evict through the Eviction API, like ``kubectl drain``; 429 if a PDB forbids it."""
    _core(api).create_namespaced_pod_eviction(
        name,
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        },
    )


def preempt_pod(
    api: Any,
    name: str,
    namespace: str,
    *,
    preemptor: str = "",
    scheduler_name: str = "default-scheduler",
) -> None:
    """Preempt a pod the way kube-scheduler does to a victim.

    Mirrors ``PrepareCandidate`` in kube-scheduler's ``framework/preemption``: first a
    ``DisruptionTarget=True`` condition with reason ``PreemptionByScheduler`` and message
    ``"<scheduler>: preempting to accommodate a higher priority pod"`` is patched onto the victim's
    status, then the victim is deleted with its default grace period, and a ``Preempted`` event is
    recorded. Doing real preemption (a higher-priority pod that does not fit) works on this
    cluster too, but needs the node filled first; this gives the operator the same signals.
    """
    core = _core(api)
    condition = _condition(
        "DisruptionTarget",
        "True",
        PREEMPTION_REASON,
        f"{scheduler_name}: preempting to accommodate a higher priority pod",
    )
    pod = core.patch_namespaced_pod_status(
        name,
        namespace,
        {"status": {"conditions": [condition]}},
        _content_type=STRATEGIC_MERGE_PATCH,
    )
    now = times.now()
    core.create_namespaced_event(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": pod.metadata.uid,
            },
            "reason": "Preempted",
            "message": f"Preempted by pod {preemptor or '<test>'} on node {pod.spec.node_name}",
            "type": "Normal",
            "source": {"component": scheduler_name},
            "reportingComponent": scheduler_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )
    delete_pod(api, name, namespace)


def make_node_not_ready(
    cluster: Cluster, node: str, *, wait: bool = True, timeout: float | None = None
) -> list[str]:
    """Lose ``node`` by killing its failure domain; return every node of that domain.

    All nodes of the domain go down together (one kwok process per domain). Give a node a domain
    of its own (``cluster.add_pool(NodePool(..., nodes=1))``) to lose exactly one. With ``wait``,
    return once the node-lifecycle controller has marked them all ``Ready=Unknown``.
    """
    domain = cluster.domain_of(node)
    cluster.kill_domain(domain)
    nodes = [
        n for p in cluster.pools.values() if p.failure_domain == domain for n in p.node_names()
    ]
    if wait:
        api = cluster.api_client()
        deadline = timeout or cluster.config.node_monitor_grace_period_s + 60
        for name in nodes:
            wait_node_condition(api, name, "Unknown", timeout=deadline)
    return nodes


def restore_domain(cluster: Cluster, domain: str, *, wait: bool = True) -> None:
    """Undo a domain loss: deleted nodes are re-created, kwok restarts, nodes turn Ready again."""
    cluster.restart_domain(domain, wait=wait)


def delete_node(api: Any, node: str, *, wait: bool = True, timeout: float = 30) -> None:
    """Delete a Node object (a cloud provider removing a machine); its pods are left to pod GC."""
    from kubernetes.client.exceptions import ApiException

    core = _core(api)
    core.delete_node(node)
    if not wait:
        return

    def gone() -> bool:
        try:
            core.read_node(node)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_for(gone, timeout, what=f"node {node} to be deleted")


def cordon_node(api: Any, node: str, unschedulable: bool = True) -> None:
    """Mark a node unschedulable (``kubectl cordon``); ``unschedulable=False`` uncordons it."""
    _core(api).patch_node(
        node, {"spec": {"unschedulable": unschedulable}}, _content_type=STRATEGIC_MERGE_PATCH
    )


__all__ = [
    "cordon_node",
    "delete_node",
    "delete_pod",
    "evict_pod",
    "fail_pod",
    "make_node_not_ready",
    "node_condition",
    "preempt_pod",
    "restore_domain",
    "succeed_pod",
    "terminated_status_patch",
]
