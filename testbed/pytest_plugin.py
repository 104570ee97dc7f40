"""pytest fixtures for the real test control plane (loaded by ``tests/conftest.py``).

The cluster starts lazily, once per session, when the first test asks for ``cluster`` (directly
or through ``kubeconfig`` / ``api_client`` / ``namespace``); unit-test runs never import more than
this module. If the control plane cannot be built or started, every test that needs it errors with
the component and the reason -- never a skip, so a broken build cannot pass as a green run.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from testbed.cluster import Cluster
    from testbed.kwok import NodePool


def uncaptured(request: pytest.FixtureRequest) -> AbstractContextManager[Any]:
    """Let progress that takes minutes (a cold build, an image import) reach the terminal instead
    of pytest's capture."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    return capman.global_and_fixture_disabled() if capman else nullcontext()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The session's control plane: etcd, kube-apiserver, controller-manager, scheduler, KWOK."""
    yield from running_cluster(request)


def running_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The body of :func:`cluster`, for a conftest that wants the control plane for a narrower
    scope (tests/integration ends it with its package)."""
    from testbed.cluster import Cluster
    from testbed.errors import ClusterError

    messages: list[str] = []
    instance = Cluster(report=messages.append)
    failure = ""
    try:
        with uncaptured(request):
            instance.start()
    except ClusterError as exc:
        failure = str(exc)
    except Exception as exc:  # anything else is still a failure to start, never a skip
        failure = f"{type(exc).__name__}: {exc}"
    if failure:
        logs = "".join(f"\n{line}" for line in messages)
        pytest.fail(f"test cluster could not start -- {failure}{logs}", pytrace=False)
    with uncaptured(request):
        print(
            f"\n[testbed] cluster up in {instance.started_in_s:.1f}s at {instance.server}"
            f" (work dir {instance.workdir})",
            flush=True,
        )
    yield instance
    instance.stop(failed=request.session.testsfailed > 0)
    _summary.extend(messages)  # e.g. "cluster logs kept in ...", shown at the very end


_summary: list[str] = []


def report_at_end(message: str) -> None:
    """Show ``message`` in the terminal summary, after the test results (where a fixture's
    logs were kept, how long a test bed took to come up)."""
    _summary.append(message)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Repeat where the clusters' logs were kept, after the failures they help explain."""
    for line in _summary:
        terminalreporter.write_line(f"[testbed] {line}")


@pytest.fixture(scope="session")
def kubeconfig(cluster: Cluster) -> Path:
    """Path of the admin kubeconfig (for kubectl, helm, kopf, or a subprocess under test)."""
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` logged in as cluster admin."""
    yield from admin_client(cluster)


def admin_client(cluster: Cluster) -> Iterator[Any]:
    """The body of :func:`api_client` (see :func:`running_cluster`)."""
    client = cluster.api_client()
    yield client
    close = getattr(client, "close", None)
    if callable(close):
        close()


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(cluster: Cluster, api_client: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test (deleted afterwards; the namespace controller cleans up)."""
    from kubernetes import client

    from testbed.wait import wait_for

    cluster.check()
    core: Any = client.CoreV1Api(api_client)
    name = _namespace_name(request.node.name)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def has_default_service_account() -> bool:
        # Pods are rejected until the serviceaccount controller has made "default".
        return any(
            sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items
        )

    wait_for(has_default_service_account, 30, what=f"ServiceAccount {name}/default")
    yield name
    core.delete_namespace(name)


@pytest.fixture
def isolated_pool(cluster: Cluster) -> Iterator[Callable[..., NodePool]]:
    """Factory for node pools in failure domains of their own, removed after the test.

    Tests that kill, delete or cordon nodes use these, so the session's shared nodes stay healthy:
    ``pool = isolated_pool(nodes=1, gpus_per_node=8)``.
    """
    from testbed.kwok import NodePool

    created: list[str] = []

    def make(nodes: int = 1, gpus_per_node: int = 8, **kwargs: Any) -> NodePool:
        name = f"iso-{secrets.token_hex(3)}"
        pool = NodePool(name=name, nodes=nodes, gpus_per_node=gpus_per_node, **kwargs)
        created.append(name)
        cluster.add_pool(pool)
        return pool

    yield make
    for name in created:
        cluster.remove_pool(name)
