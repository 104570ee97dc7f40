"""Fixtures for tests against the real control plane: the CRD, a running operator, Kueue,
and Kueue's MultiKueue (the tier's cluster as manager of two worker clusters).

All of them, the control plane included, live as long as this package's tests (package
scope, hence ``__init__.py``), not the session's: idle, the control planes, Kueues, KWOK nodes
and operators still cost CPU, which the e2e tier after this one would share on a 2-core machine."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_jobs import JobMaker
from stub_http import Reply, StubServer

from testbed.cluster import Cluster
from testbed.crds import install_crd
from testbed.errors import ClusterError
from testbed.kueue import Kueue
from testbed.multikueue import MultiKueue, start_multikueue
from testbed.operator import OperatorProcess
from testbed.pytest_plugin import admin_client, report_at_end, running_cluster
from testbed.volumes import delete_volume

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="package")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The plugin's control plane (testbed/pytest_plugin.py), for this package's tests."""
    yield from running_cluster(request)


@pytest.fixture(scope="package")
def kubeconfig(cluster: Cluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="package")
def api_client(cluster: Cluster) -> Iterator[Any]:
    yield from admin_client(cluster)


@pytest.fixture(scope="package")
def crd(api_client: Any) -> dict[str, Any]:
    """manifests/crd.yaml, applied and Established."""
    return install_crd(api_client)


@pytest.fixture(scope="package")
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


@pytest.fixture(scope="package")
def progress_reports() -> Iterator[ProgressReports]:
    reports = ProgressReports()
    yield reports
    reports.server.close()


@pytest.fixture(scope="package")
def operator(
    cluster: Cluster, crd: dict[str, Any], progress_reports: ProgressReports
) -> Iterator[OperatorProcess]:
    """One operator for the session; tests that kill it start it again."""
    env = _operator_env(progress_reports)
    process = OperatorProcess(cluster.kubeconfig, cluster.log_dir / "operator.log", env).start()
    yield process
    process.stop()


def _operator_env(progress_reports: ProgressReports) -> dict[str, str]:
    return {
        "TORCHKUBE_PROGRESS_URL": progress_reports.url,
        "TORCHKUBE_PROGRESS_INTERVAL_SECONDS": "1",
    }


@pytest.fixture(scope="package")
def multikueue(
    cluster: Cluster, kueue: Kueue, request: pytest.FixtureRequest
) -> Iterator[MultiKueue]:
    """Kueue's MultiKueue: the session cluster and its Kueue as manager, dispatching the
    ClusterQueue ``multikueue.queue`` to two worker clusters (``multikueue.workers``), each
    with its own Kueue, the TrainingJob CRD and 4 KWOK nodes of 8 GPUs. Started by the first
    test that asks; a part that cannot start fails that test, naming it. Use a namespace
    through ``multikueue_namespace``."""
    messages: list[str] = []
    try:
        bed = start_multikueue(cluster, kueue, report=messages.append)
    except ClusterError as exc:
        pytest.fail(f"MultiKueue test bed could not start -- {exc}", pytrace=False)
    except Exception as exc:  # anything else is still a failure to start, never a skip
        failure = f"{type(exc).__name__}: {exc}"
        pytest.fail(f"MultiKueue test bed could not start -- {failure}", pytrace=False)
    report_at_end(f"MultiKueue workers {', '.join(bed.workers)} up in {bed.started_in_s:.1f}s")
    yield bed
    bed.stop(failed=request.session.testsfailed > 0)
    for message in messages:
        report_at_end(message)


@pytest.fixture
def multikueue_namespace(multikueue: MultiKueue, namespace: str) -> Iterator[str]:
    """The test's namespace on the manager and on every worker, each with the LocalQueue
    ``multikueue.queue`` (MultiKueue puts a job's copy in the namespace and queue of the same
    names). Workers the test stopped are restarted afterwards, once the namespace is gone
    from them: a healed worker holds no stale copies."""
    multikueue.add_namespace(namespace)
    yield namespace
    multikueue.remove_namespace(namespace)
    for name, worker in multikueue.workers.items():
        if worker.stopped:
            multikueue.restart_worker(name)


@pytest.fixture(scope="package")
def multikueue_operators(
    multikueue: MultiKueue, progress_reports: ProgressReports
) -> Iterator[dict[str, OperatorProcess]]:
    """A torchkube operator on every worker (its kubeconfig, ``operator.log`` in the worker's
    log dir), by worker name: the copy of a TrainingJob MultiKueue creates on a worker has no
    ``spec.managedBy``, so the worker's operator runs it as any queued TrainingJob. The
    manager's operator is ``operator``."""
    processes: dict[str, OperatorProcess] = {}
    try:
        for name, worker in multikueue.workers.items():
            processes[name] = OperatorProcess(
                worker.kubeconfig,
                worker.cluster.log_dir / "operator.log",
                _operator_env(progress_reports),
            ).start()
        yield processes
    finally:
        for process in processes.values():
            process.stop()


@pytest.fixture
def make_job(
    api_client: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> Iterator[JobMaker]:
    maker = JobMaker(api_client, namespace, tmp_path)
    yield maker
    for volume in maker.volumes:
        delete_volume(api_client, volume)
