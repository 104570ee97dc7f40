"""A real node's kubelet: its configuration. Each kubelet needs its own ``cgroupRoot`` and
``podLogsDir``, or two kubelets on one host remove each other's pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REAL_NODE_LABEL = "torchkube.dev/real-node"
CLUSTER_DOMAIN = "cluster.local"


def node_labels(name: str) -> str:
    return ",".join([f"{REAL_NODE_LABEL}=true", "type=real", f"topology.kubernetes.io/zone={name}"])


def kubelet_config(
    *,
    address: str,
    port: int,
    healthz_port: int,
    client_ca: Path,
    cgroup_root: str,
    socket: Path,
    node_dir: Path,
    dns_ip: str,
    resolv_conf: Path,
    lease_seconds: int,
) -> dict[str, Any]:
    """KubeletConfiguration for one node on this machine (cgroup v1, no swap check, tiny
    eviction thresholds, webhook authorization in earnest)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "x509": {"clientCAFile": str(client_ca)},
            "webhook": {"enabled": True},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "failSwapOn": False,
        "failCgroupV1": False,
        "podLogsDir": str(node_dir / "pod-logs"),
        "clusterDNS": [dns_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "enforceNodeAllocatable": [],
        "nodeLeaseDurationSeconds": lease_seconds,
        "nodeStatusUpdateFrequency": "5s",
        "nodeStatusReportFrequency": "10s",
        "serializeImagePulls": False,
        "volumePluginDir": str(node_dir / "volume-plugins"),
        "shutdownGracePeriod": "0s",
        "maxPods": 20,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
    }
