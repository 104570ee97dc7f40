"""KWOK node pools: fake GPU nodes whose pods go Running, grouped into killable failure domains.

KWOK plays the kubelet for nodes that carry its annotation: it heartbeats their leases, makes them
Ready, and moves pods bound to them to Running. The harness runs one ``kwok`` process per failure
domain (it manages only nodes whose ``kwok.x-k8s.io/node`` annotation has that domain as value), so
killing one process is a realistic loss of every node in the domain: leases stop, and the real
node-lifecycle controller marks the nodes ``Ready=Unknown`` and taints them.

Everything here is pure (manifests and argv); :mod:`testbed.cluster` does the I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
"""Annotation that hands a Node to KWOK; its value is the failure domain (one kwok process each)."""

KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
KWOK_TAINT_VALUE = "fake"
"""Every fake node is tainted ``kwok.x-k8s.io/node=fake:NoSchedule``: only pods that tolerate it
(tests, the operator's workers under test) land there, never by accident."""

GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL = "torchkube.dev/pool"
DOMAIN_LABEL = "topology.kubernetes.io/zone"
"""Nodes of one failure domain share this label, so topology spread and affinity see domains."""

POD_CIDR = ipaddress.ip_network("10.244.0.0/16")
NODE_CIDR = ipaddress.ip_network("10.243.0.0/16")


@dataclass(frozen=True)
class NodePool:
    """A group of identical fake nodes.

    ``domain`` is the failure domain (default: the pool's name); pools that share a domain are
    managed by the same kwok process and are lost together.
    """

    name: str
    nodes: int = 2
    gpus_per_node: int = 8
    cpu: str = "32"
    memory: str = "256Gi"
    max_pods: int = 110
    domain: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def failure_domain(self) -> str:
        """The domain this pool's nodes belong to."""
        return self.domain or self.name

    def node_names(self) -> list[str]:
        """Names of this pool's nodes: ``<pool>-0``, ``<pool>-1``, ..."""
        return [f"{self.name}-{index}" for index in range(self.nodes)]


def default_pools(nodes: int = 4, gpus_per_node: int = 8, domains: int = 2) -> list[NodePool]:
    """``nodes`` GPU nodes spread evenly over ``domains`` failure domains (``zone-a``, ...)."""
    if domains < 1 or nodes < domains:
        raise ValueError(f"need at least one node per domain (nodes={nodes}, domains={domains})")
    pools = []
    for index in range(domains):
        count = nodes // domains + (1 if index < nodes % domains else 0)
        zone = f"zone-{chr(ord('a') + index)}"
        pools.append(
            NodePool(name=f"gpu-{zone}", nodes=count, gpus_per_node=gpus_per_node, domain=zone)
        )
    return pools


def kwok_toleration() -> dict[str, str]:
    """The toleration a pod needs to be scheduled onto KWOK nodes."""
    return {
        "key": KWOK_TAINT_KEY,
        "operator": "Equal",
        "value": KWOK_TAINT_VALUE,
        "effect": "NoSchedule",
    }


def kwok_pod_spec(node_pool: str | None = None) -> dict[str, Any]:
    """A pod-spec fragment (tolerations, optional pool selector) to merge into a test pod's spec."""
    spec: dict[str, Any] = {"tolerations": [kwok_toleration()]}
    if node_pool:
        spec["nodeSelector"] = {POOL_LABEL: node_pool}
    return spec


def node_manifest(pool: NodePool, name: str, slot: int) -> dict[str, Any]:
    """The Node object for ``name`` of ``pool``; ``slot`` (unique per cluster) picks its IPs.

    Status (capacity, addresses) is set at creation like a kubelet registering itself; KWOK keeps
    what is there and adds conditions. Each node gets its own pod CIDR so pod IPs never repeat.
    """
    pod_cidr = list(POD_CIDR.subnets(new_prefix=24))[slot]
    internal_ip = NODE_CIDR.network_address + slot + 1
    resources = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "pods": str(pool.max_pods),
        "ephemeral-storage": "1Ti",
    }
    if pool.gpus_per_node:
        resources[GPU_RESOURCE] = str(pool.gpus_per_node)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        POOL_LABEL: pool.name,
        DOMAIN_LABEL: pool.failure_domain,
        **pool.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: pool.failure_domain},
        },
        "spec": {
            "podCIDR": str(pod_cidr),
            "podCIDRs": [str(pod_cidr)],
            "taints": [{"key": KWOK_TAINT_KEY, "value": KWOK_TAINT_VALUE, "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "addresses": [
                {"type": "InternalIP", "address": str(internal_ip)},
                {"type": "Hostname", "address": name},
            ],
        },
    }


POD_STOP_DELAY_MS = (200, 300)
"""(delay, jitter) from a graceful delete to the terminal phase: a kubelet stopping the
container (SIGTERM, the launcher exits 143) takes a moment, and the operator must see the
pod in every state in between."""

KUBELET_POD_STAGES = """\
# Pod stages for KWOK nodes that behave like a kubelet >= 1.27 (kubernetes/kubernetes#115331):
# a pod deleted gracefully is stopped (exit code 143, as torchrun's launcher answers SIGTERM)
# and reported Failed *before* it is removed. KWOK's default stages delete it at once, which
# hides what a real cluster shows an operator. Written by testbed.kwok.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - {key: .status.podIP, operator: DoesNotExist}
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $m := .metadata }}
      phase: Running
      startTime: {{ $now | Quote }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName false $m.uid $m.name $m.namespace | Quote }}
      conditions:
      {{ range list "Initialized" "Ready" "ContainersReady" "PodScheduled" }}
      - {type: {{ . }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-stopped-on-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
    - {key: .status.phase, operator: In, values: [Pending, Running]}
  delay: {durationMilliseconds: DELAY, jitterDurationMilliseconds: JITTER}
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Failed
      conditions:
      {{ range list "Ready" "ContainersReady" }}
      - type: {{ . }}
        status: "False"
        reason: PodCompleted
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 143
            reason: Error
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-removed-once-terminal
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
    - {key: .status.phase, operator: In, values: [Failed, Succeeded]}
  delay: {durationMilliseconds: 100, jitterDurationMilliseconds: 100}
  next:
    finalizers: {empty: true}
    delete: true
""".replace("DELAY", str(POD_STOP_DELAY_MS[0])).replace("JITTER", str(POD_STOP_DELAY_MS[1]))


NODE_STATUS_REPORT_MS = (300_000, 330_000)
"""(delay, latest) between two status reports of a Ready node: a kubelet that renews a Lease
writes its Node status only on a change or every ``nodeStatusReportFrequency`` (5 minutes)."""

_NODE_CONDITIONS = """\
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $since | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      {{ with NodePort }}
      daemonEndpoints: {kubeletEndpoint: {Port: {{ . }}}}
      {{ end }}"""

KUBELET_NODE_STAGES = (
    """\
# Node stages for KWOK nodes that report like a kubelet with a Lease: Ready (conditions and
# node info) once registered or back from a loss, then a status report every 5 minutes; the
# Lease is the heartbeat. KWOK v0.7 picks its lease-less defaults when a lease duration *is*
# set (getDefaultNodeStages(NodeLeaseDurationSeconds == 0) in pkg/kwok/cmd/root.go) and
# rewrites every node's status every 20-25 s. Written by testbed.kwok.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
CONDITIONS
      {{ $info := .status.nodeInfo }}
      {{ $kwok := printf "kwok-%s" Version }}
      nodeInfo:
        architecture: {{ or $info.architecture "amd64" }}
        bootID: {{ or $info.bootID `""` }}
        containerRuntimeVersion: {{ or $info.containerRuntimeVersion $kwok }}
        kernelVersion: {{ or $info.kernelVersion $kwok }}
        kubeProxyVersion: {{ or $info.kubeProxyVersion $kwok }}
        kubeletVersion: {{ or $info.kubeletVersion $kwok }}
        machineID: {{ or $info.machineID `""` }}
        operatingSystem: {{ or $info.operatingSystem "linux" }}
        osImage: {{ or $info.osImage `""` }}
        systemUUID: {{ or $info.systemUUID `""` }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-status-report
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - {key: .status.phase, operator: In, values: [Running]}
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['True']
  delay: {durationMilliseconds: DELAY, jitterDurationMilliseconds: LATEST}
  next:
    statusTemplate: |
CONDITIONS
""".replace("CONDITIONS", _NODE_CONDITIONS)
    .replace("DELAY", str(NODE_STATUS_REPORT_MS[0]))
    .replace("LATEST", str(NODE_STATUS_REPORT_MS[1]))
)


def kubelet_stages_config() -> str:
    """KWOK configuration (``~/.kwok/kwok.yaml`` of each kwok process): pods and nodes staged
    like a real kubelet's (deletion semantics, Lease-era status reports)."""
    return f"{KUBELET_POD_STAGES}---\n{KUBELET_NODE_STAGES}"


def kwok_argv(binary: Path, kubeconfig: Path, domain: str, lease_duration_s: int) -> list[str]:
    """Command line of the kwok process that manages ``domain``.

    Leases renew every ``lease_duration_s / 4`` seconds, like a kubelet's. Run it with ``HOME``
    pointing at a private folder: kwok always loads ``~/.kwok/kwok.yaml`` when there is one, and
    a person's own stages must not change how the tests' nodes behave.
    """
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={domain}",
        f"--node-lease-duration-seconds={lease_duration_s}",
        "--server-address=127.0.0.1:0",
    ]
