"""The test control plane behaves like a real cluster: scheduling, node loss, pod GC, RBAC,
owner-reference GC, optimistic concurrency -- and the fault helpers produce what real causes do.

Destructive tests use ``isolated_pool`` (a node pool in a failure domain of its own), so the
session's shared nodes stay healthy for every other test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from testbed import faults
from testbed.cluster import Cluster
from testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from testbed.kwok import GPU_RESOURCE, POOL_LABEL
from testbed.pods import (
    kwok_pod,
    node_condition,
    read_pod_or_none,
    wait_pod_gone,
    wait_pod_phase,
)
from testbed.wait import wait_for

pytestmark = pytest.mark.cluster


def _core(api: Any) -> Any:
    return client.CoreV1Api(api)


def _create_pod(api: Any, namespace: str, manifest: dict[str, Any]) -> Any:
    return _core(api).create_namespaced_pod(namespace, manifest)


def _events_for(api: Any, namespace: str, name: str) -> list[Any]:
    events = _core(api).list_namespaced_event(namespace).items
    return [e for e in events if e.involved_object.name == name]


# ------------------------------------------------------------------------------------ scheduling
def test_pod_on_kwok_pool_is_scheduled_and_running(api_client: Any, namespace: str) -> None:
    _create_pod(api_client, namespace, kwok_pod("plain"))
    pod = wait_pod_phase(api_client, "plain", namespace, "Running", timeout=60)
    node = _core(api_client).read_node(pod.spec.node_name)
    assert node.metadata.labels["type"] == "kwok"
    assert pod.status.pod_ip, "KWOK assigns a pod IP from the node's pod CIDR"
    assert pod.status.container_statuses[0].state.running is not None


def test_gpu_pod_runs_and_oversized_request_stays_pending(api_client: Any, namespace: str) -> None:
    _create_pod(api_client, namespace, kwok_pod("gpu-8", gpus=8))
    pod = wait_pod_phase(api_client, "gpu-8", namespace, "Running", timeout=60)
    node = _core(api_client).read_node(pod.spec.node_name)
    assert node.status.allocatable[GPU_RESOURCE] == "8"

    _create_pod(api_client, namespace, kwok_pod("gpu-too-many", gpus=9))

    def failed_scheduling() -> list[Any]:
        return [
            e
            for e in _events_for(api_client, namespace, "gpu-too-many")
            if e.reason == "FailedScheduling"
        ]

    events = wait_for(failed_scheduling, 60, what="a FailedScheduling event")
    assert f"Insufficient {GPU_RESOURCE}" in events[0].message
    assert (
        _core(api_client).read_namespaced_pod("gpu-too-many", namespace).status.phase == "Pending"
    )


def test_pod_without_kwok_toleration_is_not_scheduled(api_client: Any, namespace: str) -> None:
    manifest = kwok_pod("untolerated")
    del manifest["spec"]["tolerations"]
    _create_pod(api_client, namespace, manifest)
    events = wait_for(
        lambda: [
            e
            for e in _events_for(api_client, namespace, "untolerated")
            if e.reason == "FailedScheduling"
        ],
        60,
        what="a FailedScheduling event",
    )
    assert "untolerated taint" in events[0].message


# ------------------------------------------------------------------------------------ node loss
@pytest.mark.slow
def test_deleted_node_pods_are_removed_by_pod_gc(
    api_client: Any, namespace: str, isolated_pool: Any
) -> None:
    pool = isolated_pool(nodes=1)
    _create_pod(api_client, namespace, kwok_pod("orphan", node_pool=pool.name))
    pod = wait_pod_phase(api_client, "orphan", namespace, "Running", timeout=60)
    assert pod.spec.node_name == pool.node_names()[0]

    faults.delete_node(api_client, pod.spec.node_name)
    # Nothing here deletes the pod: the pod-GC controller does, after its orphan quarantine.
    started = time.monotonic()
    wait_pod_gone(api_client, "orphan", namespace, timeout=150)
    print(f"pod GC removed the orphaned pod {time.monotonic() - started:.0f}s after node deletion")


@pytest.mark.slow
def test_killed_domain_makes_node_unknown_and_pods_stick_terminating(
    cluster: Cluster, api_client: Any, namespace: str, isolated_pool: Any
) -> None:
    pool = isolated_pool(nodes=1)
    node = pool.node_names()[0]
    _create_pod(api_client, namespace, kwok_pod("stranded", node_pool=pool.name))
    wait_pod_phase(api_client, "stranded", namespace, "Running", timeout=60)

    started = time.monotonic()
    lost = faults.make_node_not_ready(cluster, node)
    print(f"node Ready=Unknown {time.monotonic() - started:.0f}s after its kwok was killed")
    assert lost == [node]
    assert node_condition(api_client, node) == "Unknown"
    # The node-lifecycle controller taints it: NoSchedule at once, NoExecute (eviction) next.
    wait_for(
        lambda: [
            t
            for t in _core(api_client).read_node(node).spec.taints or []
            if t.key == "node.kubernetes.io/unreachable" and t.effect == "NoExecute"
        ],
        30,
        what="the unreachable:NoExecute taint",
    )

    # A graceful delete waits for a kubelet that never answers: the pod stays Terminating.
    faults.delete_pod(api_client, "stranded", namespace)
    time.sleep(5)
    pod = read_pod_or_none(api_client, "stranded", namespace)
    assert pod is not None and pod.metadata.deletion_timestamp is not None
    faults.delete_pod(api_client, "stranded", namespace, force=True)
    wait_pod_gone(api_client, "stranded", namespace, timeout=30)

    faults.restore_domain(cluster, pool.failure_domain)
    assert node_condition(api_client, node) == "True"


def _ready_heartbeat(api: Any, node: str) -> Any:
    conditions = _core(api).read_node_status(node).status.conditions or []
    return next(c.last_heartbeat_time for c in conditions if c.type == "Ready")


def test_node_heartbeats_with_its_lease_and_reports_status_rarely(
    api_client: Any, isolated_pool: Any
) -> None:
    """Like a kubelet with a Lease: the Lease is renewed every quarter of its duration and the
    Node status written only on a change or every 5 minutes, so a controller watching nodes
    sees a quiet stream. KWOK's defaults rewrote every node's status every 20-25 s."""
    node = isolated_pool(nodes=1).node_names()[0]
    leases: Any = client.CoordinationV1Api(api_client)
    reported = _ready_heartbeat(api_client, node)
    renewed = leases.read_namespaced_lease(node, "kube-node-lease").spec.renew_time
    time.sleep(30)
    assert _ready_heartbeat(api_client, node) == reported
    assert leases.read_namespaced_lease(node, "kube-node-lease").spec.renew_time > renewed
    assert node_condition(api_client, node) == "True"


def test_cordoned_node_takes_no_new_pods(
    api_client: Any, namespace: str, isolated_pool: Any
) -> None:
    pool = isolated_pool(nodes=1)
    node = pool.node_names()[0]
    faults.cordon_node(api_client, node)
    _create_pod(api_client, namespace, kwok_pod("waits", node_pool=pool.name))
    events = wait_for(
        lambda: [
            e for e in _events_for(api_client, namespace, "waits") if e.reason == "FailedScheduling"
        ],
        60,
        what="a FailedScheduling event",
    )
    assert "unschedulable" in events[0].message
    faults.cordon_node(api_client, node, unschedulable=False)
    wait_pod_phase(api_client, "waits", namespace, "Running", timeout=60)


# ------------------------------------------------------------------------------------ pod faults
def test_failed_pod_shows_exit_code_and_stays_failed(api_client: Any, namespace: str) -> None:
    _create_pod(api_client, namespace, kwok_pod("crash"))
    wait_pod_phase(api_client, "crash", namespace, "Running", timeout=60)
    faults.fail_pod(api_client, "crash", namespace, exit_code=3, reason="Error", message="boom")

    time.sleep(3)  # give KWOK every chance to flip it back
    pod = _core(api_client).read_namespaced_pod("crash", namespace)
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 3
    assert terminated.reason == "Error"
    assert terminated.message == "boom"
    ready = {c.type: c.status for c in pod.status.conditions}["Ready"]
    assert ready == "False"


def test_succeeded_pod(api_client: Any, namespace: str) -> None:
    _create_pod(api_client, namespace, kwok_pod("done"))
    wait_pod_phase(api_client, "done", namespace, "Running", timeout=60)
    faults.succeed_pod(api_client, "done", namespace)
    pod = wait_pod_phase(api_client, "done", namespace, "Succeeded", timeout=10)
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def _history_until_gone(api: Any, namespace: str, name: str, since: str) -> list[tuple[str, Any]]:
    """Every (event type, pod) the watch shows from resource version ``since`` until the pod is
    deleted: the states a kubelet moves a pod through, replayed."""
    seen: list[tuple[str, Any]] = []
    stream = watch.Watch().stream(
        _core(api).list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={name}",
        resource_version=since,
        timeout_seconds=30,
    )
    for event in stream:
        seen.append((event["type"], event["object"]))
        if event["type"] == "DELETED":
            break
    return seen


def test_deleted_pod_is_stopped_and_reported_failed_before_it_goes(
    api_client: Any, namespace: str
) -> None:
    """As a kubelet >= 1.27 does (kubernetes/kubernetes#115331): a gracefully deleted pod moves
    to a terminal phase, its container ended by SIGTERM (143), and only then is removed."""
    _create_pod(api_client, namespace, kwok_pod("bye"))
    running = wait_pod_phase(api_client, "bye", namespace, "Running", timeout=60)
    faults.delete_pod(api_client, "bye", namespace)
    seen = _history_until_gone(api_client, namespace, "bye", running.metadata.resource_version)
    assert seen[-1][0] == "DELETED"
    terminal = [pod for _, pod in seen if pod.status.phase == "Failed"]
    assert terminal, [(kind, pod.status.phase) for kind, pod in seen]
    assert terminal[0].metadata.deletion_timestamp is not None
    assert terminal[0].status.container_statuses[0].state.terminated.exit_code == 143
    wait_pod_gone(api_client, "bye", namespace, timeout=30)


def test_preempted_pod_carries_disruption_target_then_goes(api_client: Any, namespace: str) -> None:
    _create_pod(api_client, namespace, kwok_pod("victim"))
    running = wait_pod_phase(api_client, "victim", namespace, "Running", timeout=60)
    faults.preempt_pod(api_client, "victim", namespace, preemptor="high-priority")
    # KWOK (as kubelet) removes the pod soon; replay its history from before the preemption.
    history = _history_until_gone(
        api_client, namespace, "victim", running.metadata.resource_version
    )
    seen = [
        (kind, {c.type: c.reason for c in pod.status.conditions or []}) for kind, pod in history
    ]
    assert seen[-1][0] == "DELETED"
    assert any(c.get("DisruptionTarget") == faults.PREEMPTION_REASON for _, c in seen)
    reasons = {e.reason for e in _events_for(api_client, namespace, "victim")}
    assert "Preempted" in reasons


def test_evicted_pod_goes_away(api_client: Any, namespace: str) -> None:
    _create_pod(api_client, namespace, kwok_pod("evictee"))
    wait_pod_phase(api_client, "evictee", namespace, "Running", timeout=60)
    faults.evict_pod(api_client, "evictee", namespace)
    wait_pod_gone(api_client, "evictee", namespace, timeout=30)


# ------------------------------------------------------------------------------------ API server
def test_rbac_denies_service_account_without_rights(
    cluster: Cluster, api_client: Any, namespace: str, tmp_path: Any
) -> None:
    core = _core(api_client)
    core.create_namespaced_service_account(
        namespace, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}}
    )
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"audiences": [], "expirationSeconds": 600}}
    ).status.token
    assert cluster.pki is not None
    path = write_kubeconfig(
        tmp_path / "nobody.kubeconfig",
        render_kubeconfig(cluster.server, cluster.pki.ca_cert, token=token, user="nobody"),
    )
    from kubernetes import config

    nobody = config.new_client_from_config(config_file=str(path))
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(nobody).list_namespaced_pod(namespace)
    assert denied.value.status == 403  # authenticated (not 401), but not authorized
    assert f"system:serviceaccount:{namespace}:nobody" in str(denied.value.body)


def test_owner_reference_garbage_collection(api_client: Any, namespace: str) -> None:
    core = _core(api_client)
    parent = core.create_namespaced_config_map(
        namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "parent"}}
    )
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "parent",
        "uid": parent.metadata.uid,
    }
    core.create_namespaced_config_map(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "child", "ownerReferences": [owner]},
        },
    )
    core.delete_namespaced_config_map("parent", namespace)

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(child_gone, 60, what="the garbage collector to delete the owned ConfigMap")


def test_resource_version_conflict_is_409(api_client: Any, namespace: str) -> None:
    core = _core(api_client)
    core.create_namespaced_config_map(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cas"},
            "data": {"v": "0"},
        },
    )
    stale = api_client.sanitize_for_serialization(core.read_namespaced_config_map("cas", namespace))
    first = {**stale, "data": {"v": "1"}}
    core.replace_namespaced_config_map("cas", namespace, first)
    second = {**stale, "data": {"v": "2"}}
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_config_map("cas", namespace, second)
    assert conflict.value.status == 409
    assert core.read_namespaced_config_map("cas", namespace).data == {"v": "1"}


def test_session_pools_are_healthy(cluster: Cluster, api_client: Any) -> None:
    nodes = _core(api_client).list_node(label_selector=POOL_LABEL).items
    shared = [n for n in nodes if not n.metadata.labels[POOL_LABEL].startswith("iso-")]
    assert len(shared) == sum(p.nodes for p in cluster.config.pools)
    assert all(node_condition(api_client, n.metadata.name) == "True" for n in shared)


def test_component_pids_name_every_running_component(cluster: Cluster) -> None:
    """The benchmarks charge the cluster's CPU time to these pids: each must be a live
    process of the component it is named after, every KWOK domain included."""
    pids = cluster.component_pids()
    for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        assert name in pids, f"{name} missing from {sorted(pids)}"
    domains = {pool.failure_domain for pool in cluster.config.pools}
    assert {f"kwok-{domain}" for domain in domains} <= set(pids), sorted(pids)
    for name, pid in pids.items():
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        binary = "kwok" if name.startswith("kwok-") else name
        assert Path(command.decode()).name == binary, (name, command)
