"""Kubeconfig files for the test control plane's users.

Credentials are embedded (``*-data``), so a kubeconfig keeps working when copied elsewhere or when
the certificate files around it are rotated or deleted.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from testbed.certs import CertPair


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render_kubeconfig(
    server: str,
    ca_cert: Path,
    client: CertPair | None = None,
    *,
    token: str | None = None,
    cluster_name: str = "torchkube-test",
    user: str = "admin",
    namespace: str | None = None,
) -> dict:
    """Return a one-context kubeconfig as a dict, authenticating by client cert or bearer token."""
    if (client is None) == (token is None):
        raise ValueError("give exactly one of a client certificate or a token")
    credentials: dict[str, str] = {}
    if client is not None:
        credentials["client-certificate-data"] = _b64(client.cert)
        credentials["client-key-data"] = _b64(client.key)
    else:
        credentials["token"] = str(token)
    context: dict[str, str] = {"cluster": cluster_name, "user": user}
    if namespace:
        context["namespace"] = namespace
    context_name = f"{user}@{cluster_name}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": context_name, "context": context}],
        "current-context": context_name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, config: dict) -> Path:
    """Write ``config`` to ``path`` readable by its owner only (it holds private keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
