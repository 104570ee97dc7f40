"""Fixtures for tests against the real control plane: the CRD and a running operator."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_jobs import JobMaker
from stub_http import Reply, StubServer

from testbed.cluster import Cluster
from testbed.crds import install_crd
from testbed.kueue import Kueue
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def crd(api_client: Any) -> dict[str, Any]:
    """manifests/crd.yaml, applied and Established."""
    return install_crd(api_client)


@pytest.fixture(scope="session")
def kueue(cluster: Cluster, crd: dict[str, Any]) -> Iterator[Kueue]:
    """The real Kueue (built by hack/build-cluster.sh kueue), one for the session, started by
    the first test that asks for it; a Kueue that cannot start fails that test, naming why."""
    started = Kueue(cluster).start()
    yield started
    started.stop()


class ProgressReports:
    """Stands in for the trainers' ``GET /progress`` endpoints, on loopback.

    KWOK pods run nothing, so the operator is pointed here (``TORCHKUBE_PROGRESS_URL``) and a
    test sets what each pod would report.
    """

    def __init__(self) -> None:
        self.reports: dict[tuple[str, str], dict[str, Any]] = {}
        self.server = StubServer(self._answer)
        self.url = f"{self.server.url}/{{namespace}}/{{pod}}"

    def _answer(self, path: str) -> Reply | None:
        parts = path.strip("/").split("/")
        report = self.reports.get((parts[0], parts[1])) if len(parts) == 2 else None
        return None if report is None else Reply(json.dumps(report).encode(), "application/json")


@pytest.fixture(scope="session")
def progress_reports() -> Iterator[ProgressReports]:
    reports = ProgressReports()
    yield reports
    reports.server.close()


@pytest.fixture(scope="session")
def operator(
    cluster: Cluster, crd: dict[str, Any], progress_reports: ProgressReports
) -> Iterator[OperatorProcess]:
    """One operator for the session; tests that kill it start it again."""
    env = {
        "TORCHKUBE_PROGRESS_URL": progress_reports.url,
        "TORCHKUBE_PROGRESS_INTERVAL_SECONDS": "1",
    }
    process = OperatorProcess(cluster.kubeconfig, cluster.log_dir / "operator.log", env).start()
    yield process
    process.stop()


@pytest.fixture
def make_job(
    api_client: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> Iterator[JobMaker]:
    maker = JobMaker(api_client, namespace, tmp_path)
    yield maker
    for volume in maker.volumes:
        delete_volume(api_client, volume)
