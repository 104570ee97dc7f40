"""Test pods for the KWOK pool, and waits on what the real controllers do to pods and nodes.

The builder is pure (a dict, like the operator's own builders); the waits poll the API through a
``kubernetes.client.ApiClient`` and say what they last saw when they time out.
"""

from __future__ import annotations

from typing import Any

from testbed.kwok import GPU_RESOURCE, kwok_pod_spec
from testbed.wait import wait_for


def kwok_pod(
    name: str,
    *,
    gpus: int = 0,
    node_pool: str | None = None,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
    restart_policy: str = "Never",
    image: str = "registry.invalid/torchkube/worker:test",
) -> dict[str, Any]:
    """A one-container Pod that tolerates the KWOK taint, optionally asking for GPUs.

    The image is never pulled (KWOK runs nothing), hence a name that cannot resolve.
    """
    container: dict[str, Any] = {"name": "worker", "image": image}
    if gpus:
        container["resources"] = {
            "limits": {GPU_RESOURCE: str(gpus)},
            "requests": {GPU_RESOURCE: str(gpus)},
        }
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 5,
        **kwok_pod_spec(node_pool),
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "torchkube-test"}},
        "spec": spec,
    }


def _core(api: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api)


def read_pod_or_none(api: Any, name: str, namespace: str) -> Any:
    """The pod, or None when it does not exist."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _core(api).read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_pod_phase(
    api: Any, name: str, namespace: str, phases: str | tuple[str, ...], timeout: float = 60
) -> Any:
    """Wait until the pod's phase is one of ``phases``; return the pod."""
    wanted = (phases,) if isinstance(phases, str) else phases
    seen: dict[str, Any] = {}

    def reached() -> Any:
        pod = read_pod_or_none(api, name, namespace)
        seen["pod"] = pod
        return pod if pod is not None and pod.status.phase in wanted else None

    def last() -> str:
        pod = seen.get("pod")
        if pod is None:
            return "pod not found"
        return f"phase={pod.status.phase} node={pod.spec.node_name}"

    return wait_for(
        reached, timeout, what=f"pod {namespace}/{name} phase in {wanted}", describe_last=last
    )


def wait_pod_gone(api: Any, name: str, namespace: str, timeout: float = 120) -> None:
    """Wait until the pod no longer exists (removed by a controller, KWOK, or a delete)."""
    seen: dict[str, Any] = {}

    def gone() -> bool:
        pod = read_pod_or_none(api, name, namespace)
        seen["pod"] = pod
        return pod is None

    def last() -> str:
        pod = seen.get("pod")
        if pod is None:
            return "gone"
        return f"phase={pod.status.phase} deletionTimestamp={pod.metadata.deletion_timestamp}"

    wait_for(
        gone, timeout, interval=0.5, what=f"pod {namespace}/{name} to be gone", describe_last=last
    )


def node_condition(api: Any, node: str, condition: str = "Ready") -> str:
    """Status ("True"/"False"/"Unknown") of a node condition, "" when absent."""
    status = _core(api).read_node_status(node).status
    for cond in status.conditions or []:
        if cond.type == condition:
            return str(cond.status)
    return ""


def wait_node_condition(
    api: Any, node: str, status: str, condition: str = "Ready", timeout: float = 90
) -> None:
    """Wait until ``condition`` of ``node`` has ``status`` (e.g. Ready=Unknown after a loss)."""
    seen: dict[str, str] = {}

    def reached() -> bool:
        seen["status"] = node_condition(api, node, condition)
        return seen["status"] == status

    wait_for(
        reached,
        timeout,
        interval=0.5,
        what=f"node {node} {condition}={status}",
        describe_last=lambda: f"{condition}={seen.get('status')}",
    )
