"""Fixtures for tests against the real control plane: the CRD and a running operator."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from torchkube.testing.cluster import Cluster
from torchkube.testing.operator import OperatorProcess
from torchkube.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crd(api_client: Any) -> dict[str, Any]:
    """manifests/crd.yaml, applied and Established."""
    body = yaml.safe_load((ROOT / "manifests" / "crd.yaml").read_text())
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as error:
        if error.status != 409:
            raise

    def established() -> bool:
        found = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(
            c.type == "Established" and c.status == "True" for c in found.status.conditions or []
        )

    wait_for(established, 30, what="the TrainingJob CRD to be Established")
    return dict(body)


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: dict[str, Any]) -> Iterator[OperatorProcess]:
    """One operator for the session; tests that kill it start it again."""
    process = OperatorProcess(cluster.kubeconfig, cluster.log_dir / "operator.log").start()
    yield process
    process.stop()
