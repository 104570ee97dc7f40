"""Install the TrainingJob CRD (``manifests/crd.yaml``) on a test cluster and wait for it."""

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from testbed.binaries import repo_root
from testbed.wait import wait_for

CRD_MANIFEST = repo_root() / "manifests" / "crd.yaml"


def install_crd(api_client: Any, manifest: Path = CRD_MANIFEST) -> dict[str, Any]:
    """Create the CRD (AlreadyExists is fine) and return once it is Established."""
    body: dict[str, Any] = yaml.safe_load(manifest.read_text())
    ext: Any = client.ApiextensionsV1Api(api_client)
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
    return body
