"""Kueue's MultiKueue on one machine: a manager cluster that dispatches jobs to worker clusters,
each a real control plane of its own with its own Kueue and KWOK GPU nodes.

What MultiKueue does happens between clusters: the manager's Kueue reserves quota, copies the
job's Workload to every worker, keeps the copy on the first worker whose own Kueue admits it,
creates the job there without ``spec.managedBy`` (so the worker's controller runs it), copies
its status back, and removes the copies when the job finishes or is deleted. A lost worker is
given up after ``workerLostTimeout`` and the job goes to another. Only real clusters show
whether a job kind (a batch/v1 Job, a TrainingJob) survives that round trip.

The layout:

- the manager is a :class:`~testbed.cluster.Cluster` with a :class:`~testbed.kueue.Kueue` (in
  the tests: the session's), holding per worker a kubeconfig Secret in ``kueue-system`` and a
  ``MultiKueueCluster``, a ``MultiKueueConfig`` listing them, an ``AdmissionCheck`` of
  MultiKueue's controller, and a ClusterQueue with that check whose quota is the workers' sum;
- each worker is a cluster with one KWOK pool, its own Kueue, the TrainingJob CRD, and a
  ClusterQueue whose flavor steers pods onto the pool;
- the manager reaches each worker through a link of its own, a TCP forwarder to the worker's
  apiserver (:mod:`testbed.apiproxy`): :meth:`MultiKueue.stop_worker` kills it, a network
  partition that loses the worker for the manager while the worker goes on running its jobs
  (and comes back whole with :meth:`MultiKueue.restart_worker`).

MultiKueue creates a job's copy in the namespace of the same name on the worker, queued to the
LocalQueue of the same name, so a namespace is used through :meth:`MultiKueue.add_namespace`:
it exists on every cluster with the LocalQueue :data:`QUEUE`. Every queue object of the layout
is called :data:`QUEUE`.
"""

from __future__ import annotations

import base64
import contextlib
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.binaries import repo_root
from testbed.cluster import Cluster, ClusterConfig
from testbed.crds import install_crd
from testbed.errors import ClusterError
from testbed.kubeconfig import render_kubeconfig
from testbed.kueue import NAMESPACE as KUEUE_NAMESPACE
from testbed.kueue import Kueue
from testbed.kwok import GPU_RESOURCE, POOL_LABEL, NodePool, kwok_toleration
from testbed.process import Process
from testbed.wait import WaitTimeout, wait_for
from torchkube.local.ports import free_port

KUEUE_API = ("kueue.x-k8s.io", "v1beta2")
CONTROLLER = "kueue.x-k8s.io/multikueue"
"""MultiKueue's admission-check controller, and the ``spec.managedBy`` of a job it dispatches."""
QUEUE = "multikueue"
"""Name of the layout's ResourceFlavor, ClusterQueue and LocalQueues on every cluster, and of
the manager's AdmissionCheck and MultiKueueConfig. Jobs carry it as their queue-name label."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKERS = ("worker-1", "worker-2")
RECONNECT_ANNOTATION = "testbed.torchkube.dev/reconnect"
"""Set on a worker's kubeconfig Secret to make MultiKueue reconnect at once (any change of the
Secret does): after a loss it otherwise retries with a back-off of up to 5m20s."""


@dataclass(frozen=True)
class MultiKueueLayout:
    """The worker clusters to start: their names (also their MultiKueueClusters') and nodes."""

    workers: Sequence[str] = WORKERS
    nodes_per_worker: int = 4
    gpus_per_node: int = 8
    timeout_s: float = 120.0
    """Deadline of each component's start, and of MultiKueue's connection to the workers."""
    workdir: Path | None = None
    """Where the workers' work dirs go (``<workdir>/<name>``); temporary folders when None."""


@dataclass
class Worker:
    """One worker cluster: its control plane, its Kueue, its KWOK pool, and the manager's
    link to it."""

    name: str
    cluster: Cluster
    kueue: Kueue
    pool: NodePool
    link: Process
    """The forwarder the manager reaches the worker's apiserver through."""
    link_port: int

    @property
    def kubeconfig(self) -> Path:
        """The worker's admin kubeconfig, straight to its apiserver (for tests and operators)."""
        return self.cluster.kubeconfig

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for the worker, as cluster admin."""
        return self.cluster.api_client()

    def manager_kubeconfig(self) -> bytes:
        """The kubeconfig the manager's Secret holds: the worker's admin, through the link
        (the apiserver's certificate names 127.0.0.1, whatever the port)."""
        pki = self.cluster.pki
        assert pki is not None, "worker not started"
        server = f"https://127.0.0.1:{self.link_port}"
        config = render_kubeconfig(server, pki.ca_cert, pki.admin, cluster_name=self.name)
        return yaml.safe_dump(config).encode()

    @property
    def stopped(self) -> bool:
        """Whether the manager is cut off from the worker (:meth:`MultiKueue.stop_worker`)."""
        return not self.link.alive()

    def start_link(self, timeout: float) -> None:
        """Start the link (again, on the same port) and return once it accepts connections."""
        self.link.start()

        def listening() -> bool:
            self.link.check_alive()
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.link_port), timeout=1),
            ):
                return True
            return False

        try:
            wait_for(listening, timeout, interval=0.1, what=f"the link to {self.name}")
        except WaitTimeout as exc:
            raise self.link.error(str(exc)) from None


def scaled(quantity: str, factor: int) -> str:
    """A Kubernetes quantity times ``factor``: ``scaled("256Gi", 4) == "1024Gi"``."""
    match = re.fullmatch(r"(\d+)(\D*)", quantity)
    if match is None:
        raise ValueError(f"not an integer quantity: {quantity!r}")
    return f"{int(match[1]) * factor}{match[2]}"


def pool_quota(pool: NodePool, copies: int = 1) -> dict[str, str]:
    """What ``copies`` of the pool's nodes hold, as ClusterQueue quota: cpu, memory and GPUs
    (the manager's quota is that of all its workers' pools)."""
    nodes = pool.nodes * copies
    return {
        "cpu": scaled(pool.cpu, nodes),
        "memory": scaled(pool.memory, nodes),
        GPU_RESOURCE: str(nodes * pool.gpus_per_node),
    }


def cluster_queue(
    quota: dict[str, str], admission_check: str | None = None, name: str = QUEUE
) -> dict[str, Any]:
    """The ClusterQueue ``name``: ``quota`` on the flavor of the same name, for every
    namespace, behind ``admission_check`` when one is given."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": sorted(quota),
                "flavors": [
                    {
                        "name": name,
                        "resources": [
                            {"name": name, "nominalQuota": value}
                            for name, value in sorted(quota.items())
                        ],
                    }
                ],
            }
        ],
    }
    if admission_check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def resource_flavor(pool: NodePool | None = None, name: str = QUEUE) -> dict[str, Any]:
    """The ResourceFlavor ``name``: on a worker it puts admitted pods onto ``pool`` (its
    node label and the KWOK toleration); on the manager, where nothing runs, it is bare."""
    spec: dict[str, Any] = {}
    if pool is not None:
        spec = {"nodeLabels": {POOL_LABEL: pool.name}, "tolerations": [kwok_toleration()]}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(name: str = QUEUE) -> dict[str, Any]:
    """The LocalQueue ``name`` over the ClusterQueue of the same name."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": name},
        "spec": {"clusterQueue": name},
    }


def manager_objects(workers: dict[str, bytes], quota: dict[str, str]) -> list[dict[str, Any]]:
    """What makes the manager dispatch, in creation order: per worker (name → kubeconfig) a
    Secret in Kueue's namespace (key ``kubeconfig``, as MultiKueue reads it) and a
    MultiKueueCluster naming it; the MultiKueueConfig listing them; the AdmissionCheck of
    MultiKueue's controller with that config; its flavor and ClusterQueue."""
    objects: list[dict[str, Any]] = []
    for name, kubeconfig in workers.items():
        objects += [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{QUEUE}-{name}", "namespace": KUEUE_NAMESPACE},
                "data": {"kubeconfig": base64.b64encode(kubeconfig).decode()},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "MultiKueueCluster",
                "metadata": {"name": name},
                "spec": {
                    "clusterSource": {
                        "kubeConfig": {"locationType": "Secret", "location": f"{QUEUE}-{name}"}
                    }
                },
            },
        ]
    objects += [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "MultiKueueConfig",
            "metadata": {"name": QUEUE},
            "spec": {"clusters": list(workers)},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": QUEUE},
            "spec": {
                "controllerName": CONTROLLER,
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "MultiKueueConfig",
                    "name": QUEUE,
                },
            },
        },
        resource_flavor(),
        cluster_queue(quota, admission_check=QUEUE),
    ]
    return objects


def create(api: Any, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create ``body`` (a Secret, or a Kueue object in ``namespace`` or cluster-wide); one
    that exists already is fine."""
    from kubernetes import client

    plural = body["kind"].lower() + "s"  # true of every kind the layout creates
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    try:
        if body["kind"] == "Secret":
            core.create_namespaced_secret(body["metadata"]["namespace"], body)
        elif namespace is not None:
            custom.create_namespaced_custom_object(*KUEUE_API, namespace, plural, body)
        else:
            custom.create_cluster_custom_object(*KUEUE_API, plural, body)
    except client.ApiException as error:
        if error.status != 409:
            raise ClusterError(
                "multikueue", f"creating {body['kind']} {body['metadata']['name']}: {error}"
            ) from None


def _create_namespace(api: Any, namespace: str, timeout: float) -> None:
    """The namespace, and its ``default`` ServiceAccount (pods are refused until it exists)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except client.ApiException as error:
        if error.status != 409:
            raise
    wait_for(
        lambda: any(
            sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account(namespace).items
        ),
        timeout,
        what=f"ServiceAccount {namespace}/default",
    )


def _active(obj: dict[str, Any]) -> tuple[bool, str]:
    """Whether the object's ``Active`` condition is True, and what it says."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == "Active":
            said = f"{condition['status']} {condition.get('reason', '')}: "
            return condition["status"] == "True", said + condition.get("message", "")
    return False, "no Active condition yet"


def start_worker(
    name: str, layout: MultiKueueLayout, report: Callable[[str], None] | None = None
) -> Worker:
    """Start one worker cluster with its Kueue, the TrainingJob CRD and its ClusterQueue; a
    :class:`ClusterError` names the worker and the component that did not come up."""
    pool = NodePool(
        name=f"{name}-gpu", nodes=layout.nodes_per_worker, gpus_per_node=layout.gpus_per_node
    )
    config = ClusterConfig(
        pools=[pool],
        start_timeout_s=layout.timeout_s,
        workdir=layout.workdir / name if layout.workdir else None,
    )
    cluster = Cluster(config, report=report)
    link: Process | None = None
    try:
        cluster.start()
        api = cluster.api_client()
        install_crd(api)
        kueue = Kueue(cluster, timeout=layout.timeout_s).start()
        create(api, resource_flavor(pool))
        create(api, cluster_queue(pool_quota(pool)))
        port = free_port()
        target = ["127.0.0.1", str(cluster.ports["kube-apiserver"])]
        link = Process(
            "manager-link",
            [sys.executable, "-m", "testbed.apiproxy", "127.0.0.1", str(port), *target],
            cluster.log_dir / "manager-link.log",
            cwd=repo_root(),
        )
        worker = Worker(name, cluster, kueue, pool, link, port)
        worker.start_link(layout.timeout_s)
    except BaseException as exc:
        if link is not None:
            link.stop()
        cluster.stop(failed=True)
        if isinstance(exc, Exception):
            raise ClusterError(f"multikueue worker {name}", str(exc)) from exc
        raise
    return worker


class _WorkerThread(threading.Thread):
    """Starts a worker, then lives until the worker is stopped.

    Each component is asked to die with the *thread* that started it (``PR_SET_PDEATHSIG`` in
    :mod:`testbed.process`): a thread that ended once its worker was up would take it along.
    """

    def __init__(
        self, name: str, layout: MultiKueueLayout, report: Callable[[str], None] | None
    ) -> None:
        super().__init__(name=f"multikueue-{name}", daemon=True)
        self._start_worker = lambda: start_worker(name, layout, report)
        self.worker: Worker | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        """Set once the worker is up or has failed to start."""
        self.release = threading.Event()

    def run(self) -> None:
        try:
            self.worker = self._start_worker()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()
        self.release.wait()


@dataclass
class MultiKueue:
    """A running manager and its workers (see :func:`start_multikueue`)."""

    manager: Cluster
    manager_kueue: Kueue
    workers: dict[str, Worker]
    started_in_s: float
    """Bring-up time: from starting the workers to every MultiKueueCluster Active."""
    timeout_s: float = 120.0
    queue: str = QUEUE
    """The LocalQueue a job names in its ``kueue.x-k8s.io/queue-name`` label."""
    _threads: list[_WorkerThread] = field(default_factory=list, repr=False)

    @property
    def worker_lost_timeout_s(self) -> int:
        """How long the manager waits for a lost worker before it requeues its jobs."""
        return self.manager_kueue.worker_lost_timeout_s

    def add_namespace(self, namespace: str) -> None:
        """Make ``namespace`` usable for dispatched jobs: it exists on every cluster and holds
        the LocalQueue :data:`QUEUE` on each (the manager's namespace may exist already)."""
        for api in (self.manager.api_client(), *(w.api_client() for w in self.workers.values())):
            _create_namespace(api, namespace, self.timeout_s)
            create(api, local_queue(), namespace)

    def remove_namespace(self, namespace: str) -> None:
        """Delete ``namespace`` on the workers (the copies of jobs with it) and the manager's
        LocalQueue in it; the manager's namespace stays its creator's to delete."""
        from kubernetes import client

        try:
            client.CustomObjectsApi(self.manager.api_client()).delete_namespaced_custom_object(
                *KUEUE_API, namespace, "localqueues", QUEUE
            )
        except client.ApiException as error:
            if error.status != 404:
                raise
        for worker in self.workers.values():
            try:
                client.CoreV1Api(worker.api_client()).delete_namespace(namespace)
            except client.ApiException as error:
                if error.status != 404:
                    raise

    def workload(self, namespace: str, job_uid: str) -> dict[str, Any] | None:
        """The manager's Workload of the job with ``job_uid`` (Kueue labels a Workload with
        its job's uid), or None. Its copy on a worker has the same name."""
        from kubernetes import client

        custom: Any = client.CustomObjectsApi(self.manager.api_client())
        found = custom.list_namespaced_custom_object(
            *KUEUE_API, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={job_uid}"
        )["items"]
        return found[0] if found else None

    def wait_dispatched(self, namespace: str, job_uid: str, timeout: float = 60) -> str:
        """Wait until the job's Workload on the manager names the worker that admitted it
        (``status.clusterName``); return that worker's name."""
        last: list[dict[str, Any] | None] = [None]

        def dispatched() -> str | None:
            last[0] = self.workload(namespace, job_uid)
            return ((last[0] or {}).get("status") or {}).get("clusterName")

        name: str = wait_for(
            dispatched,
            timeout,
            what=f"the Workload of job {job_uid} to be dispatched to a worker",
            describe_last=lambda: str(last[0] and last[0].get("status")),
        )
        return name

    def cluster_status(self, name: str) -> tuple[bool, str]:
        """Whether the manager's MultiKueueCluster ``name`` is Active, and what it says."""
        from kubernetes import client

        custom: Any = client.CustomObjectsApi(self.manager.api_client())
        return _active(custom.get_cluster_custom_object(*KUEUE_API, "multikueueclusters", name))

    def stop_worker(self, name: str) -> None:
        """Lose the worker: cut the manager's link to it (SIGKILL; open connections break as
        in a network partition), and return once the manager's MultiKueueCluster says it is
        not Active. The worker goes on running what it holds; the manager requeues its jobs
        there for another worker after :attr:`worker_lost_timeout_s`."""
        self.workers[name].link.kill()
        wait_for(
            lambda: not self.cluster_status(name)[0],
            self.timeout_s,
            what=f"MultiKueueCluster {name} to be inactive",
            describe_last=lambda: self.cluster_status(name)[1],
        )

    def restart_worker(self, name: str) -> None:
        """Heal the partition of :meth:`stop_worker` and return once the manager is connected
        to the worker again.

        A job moved away meanwhile then has two admitted copies, and Kueue v0.17 keeps the one
        admitted first (``bestMatchByCondition`` in its multikueue/workload.go): the stale copy
        here, deleting the running one elsewhere. Delete such jobs' copies on this worker
        (:meth:`remove_namespace`) before healing, unless that is what a test looks at."""
        from kubernetes import client

        worker = self.workers[name]
        worker.start_link(self.timeout_s)
        core: Any = client.CoreV1Api(self.manager.api_client())
        annotation = {RECONNECT_ANNOTATION: str(time.time())}
        core.patch_namespaced_secret(
            f"{QUEUE}-{name}", KUEUE_NAMESPACE, {"metadata": {"annotations": annotation}}
        )
        self._wait_active([name])

    def _wait_active(self, names: Sequence[str]) -> None:
        """Wait until the MultiKueueClusters ``names``, the AdmissionCheck and the ClusterQueue
        are Active on the manager; the error names what is not, and why."""
        from kubernetes import client

        custom: Any = client.CustomObjectsApi(self.manager.api_client())
        last: dict[str, str] = {}

        def active() -> bool:
            assert self.manager_kueue.process is not None
            self.manager_kueue.process.check_alive()
            objects = [("MultiKueueCluster", "multikueueclusters", name) for name in names]
            objects += [
                ("AdmissionCheck", "admissionchecks", QUEUE),
                ("ClusterQueue", "clusterqueues", QUEUE),
            ]
            last.clear()
            for kind, plural, name in objects:
                ok, said = _active(custom.get_cluster_custom_object(*KUEUE_API, plural, name))
                if not ok:
                    last[f"{kind} {name}"] = said
            return not last

        try:
            wait_for(
                active,
                self.timeout_s,
                interval=0.3,
                what="MultiKueue to connect to its workers",
                describe_last=lambda: "; ".join(f"{k}: {v}" for k, v in last.items()),
            )
        except WaitTimeout as exc:
            raise ClusterError("multikueue", str(exc)) from None

    def stop(self, failed: bool = False) -> None:
        """Stop every worker cluster (their logs are kept when ``failed``). The manager and
        its Kueue belong to the caller."""
        for worker in self.workers.values():
            worker.link.stop()
            worker.cluster.stop(failed=failed)
        for thread in self._threads:
            thread.release.set()
            thread.join()


def start_multikueue(
    manager: Cluster,
    manager_kueue: Kueue,
    layout: MultiKueueLayout | None = None,
    report: Callable[[str], None] | None = None,
) -> MultiKueue:
    """Start the workers (concurrently), connect the manager to them, and return once
    MultiKueue reports every worker Active; a :class:`ClusterError` names what did not come up.

    ``manager_kueue`` must run on ``manager``; every :class:`~testbed.kueue.Kueue` is configured
    to be a MultiKueue manager, so the session's will do.
    """
    layout = layout or MultiKueueLayout()
    started = time.monotonic()
    threads = [_WorkerThread(name, layout, report) for name in layout.workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.done.wait()
    workers = {t.worker.name: t.worker for t in threads if t.worker is not None}
    bed = MultiKueue(manager, manager_kueue, workers, 0.0, layout.timeout_s, _threads=threads)
    errors = [t.error for t in threads if t.error is not None]
    if errors:
        bed.stop(failed=True)
        raise errors[0]
    try:
        api = manager.api_client()
        kubeconfigs = {name: w.manager_kubeconfig() for name, w in workers.items()}
        quota = pool_quota(next(iter(workers.values())).pool, copies=len(workers))
        for body in manager_objects(kubeconfigs, quota):
            create(api, body)
        bed._wait_active(list(workers))
    except BaseException:
        bed.stop(failed=True)
        raise
    bed.started_in_s = time.monotonic() - started
    return bed
