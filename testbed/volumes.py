"""PersistentVolumes for test clusters, which have no storage provisioner.

A PV pre-bound to a claim (``claimRef``) is bound by the real PV controller as soon as the claim
exists, so a job's checkpoint claim behaves as on a cluster with dynamic provisioning. The
volume is a host path: every node of a one-machine cluster sees the same directory, which makes
it ReadWriteMany by construction.
"""

from typing import Any

from kubernetes import client


def prebound_volume(api: Any, namespace: str, claim: str, path: str, capacity: str = "10Gi") -> str:
    """Create a hostPath PV reserved for ``namespace/claim``; returns the PV's name."""
    name = f"pv-{namespace}-{claim}"[:253]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"torchkube.dev/test-volume": "true"}},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": path, "type": "DirectoryOrCreate"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    client.CoreV1Api(api).create_persistent_volume(body)  # type: ignore[arg-type]
    return name


def delete_volume(api: Any, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_persistent_volume(name)
    except client.ApiException as error:
        if error.status != 404:
            raise
