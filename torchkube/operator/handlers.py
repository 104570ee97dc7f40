"""kopf registrations: watch caches (indexes) and wake-ups. No decisions are made here.

Only indexes and event handlers are registered, so kopf puts no finalizer on TrainingJobs:
a job can be deleted while the operator is down (garbage collection removes its pods), and
uninstalling the operator never leaves jobs stuck Terminating.

The job pods are not kopf's: they are the bulk of all events, and the operator follows them
with its own lean watch (:mod:`torchkube.operator.informer`), which the controller waits for as
it waits for kopf's indexes. Pods, Services and claims are watched with a server-side label
selector (the job-name label): the operator never receives the events of the rest of the
cluster's pods. Every handler is a coroutine: the event handlers feed the controller's queue,
which is only safe on the event loop, and the index functions are quick enough to run there
too — kopf runs plain functions in a thread pool, and a hop there and back per event cost
more than the indexing.
"""

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import start_http_server

from torchkube.api import labels as lbl
from torchkube.api.trainingjob import GROUP, PLURAL, VERSION
from torchkube.operator import metrics, workloads
from torchkube.operator.api_client import make_api_client
from torchkube.operator.config import OperatorSettings
from torchkube.operator.controller import Controller
from torchkube.operator.informer import PodInformer
from torchkube.operator.kube import Kube
from torchkube.operator.leader import LeaderElection, own_namespace
from torchkube.operator.pods import node_health, slim_child
from torchkube.operator.queue_client import QueueClient

JOB_PODS = {lbl.JOB_NAME: kopf.PRESENT}
CHILD_RESOURCES = ("services", "persistentvolumeclaims")
log = logging.getLogger(__name__)
PHASE_GAUGE_PERIOD = 5.0
STOP_WAIT_SECONDS = 2.0
"""How long a stopping operator waits for its write batches in flight (see ``stop``)."""


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's change detection, switched off: it serves on.create/on.update handlers, of which
    there are none here, yet kopf deep-copies every object on every event to build it — a tenth
    of the operator's CPU while a 512-worker job starts. Nothing is stored on the objects."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config: OperatorSettings = memo.config
    settings.posting.enabled = False
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=lbl.PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    for resource in CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = lbl.JOB_NAME
    if config.metrics_port:
        start_http_server(config.metrics_port)
    api_client = make_api_client(config)
    leader = None
    metrics.LEADING.set(0 if config.leader_election else 1)
    if config.leader_election:
        namespace = config.leader_election_namespace or own_namespace()
        leader = LeaderElection(api_client, namespace, config.leader_election_name)
    kube = Kube(api_client, config.api_concurrency)
    queues = QueueClient(api_client) if config.kueue_enabled else None
    memo.controller = Controller(config, kube, leader, queues)
    # A client of its own: each watch holds a connection for minutes, outside the write pool.
    memo.pods = PodInformer(
        make_api_client(config), config.namespaces, memo.controller.pods_changed
    )
    memo.node_ready = {}
    memo.leader = leader
    memo.tasks = [
        asyncio.create_task(memo.pods.run()),
        asyncio.create_task(memo.controller.run(memo.pods.synced)),
        asyncio.create_task(_publish_phases(memo.controller)),
    ]
    if leader is not None:
        memo.tasks.append(asyncio.create_task(leader.run()))


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """On SIGTERM, after kopf has closed its watches: stop reconciling, give the write
    batches in flight and their events ``STOP_WAIT_SECONDS`` in all to end, then release the
    Lease, so the standby leads at once without racing our last writes. Nothing else is
    waited for (the pod watch threads are woken and end; see docs/operator.md "Stopping")."""
    for task in memo.get("tasks", []):
        task.cancel()
    if memo.get("controller") is not None:
        await memo.controller.stop(STOP_WAIT_SECONDS)
    if memo.get("leader") is not None:
        await asyncio.to_thread(memo.leader.release)


async def _publish_phases(controller: Controller) -> None:
    await controller.snapshot.attached.wait()
    while True:
        controller.publish_phases()
        await asyncio.sleep(PHASE_GAUGE_PERIOD)


@kopf.index(GROUP, VERSION, PLURAL)
async def trainingjobs(
    namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    return {(namespace, name): copy.deepcopy(dict(body))}


@kopf.index("services", labels=JOB_PODS)
async def job_services(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    return {(namespace, labels[lbl.JOB_NAME]): slim_child(dict(body))}


@kopf.index("persistentvolumeclaims", labels=JOB_PODS)
async def job_claims(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    return {(namespace, labels[lbl.JOB_NAME]): slim_child(dict(body))}


@kopf.index("nodes")
async def nodes(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: node_health(dict(body))}


class _Children(Mapping[Any, list[Any]]):
    """The job's Services and claims, both indexes read as one."""

    def __init__(self, *indexes: Mapping[Any, Any]) -> None:
        self.indexes = indexes

    def __getitem__(self, key: Any) -> list[Any]:
        found = [body for index in self.indexes for body in index.get(key, [])]
        if not found:
            raise KeyError(key)
        return found

    def __iter__(self) -> Any:
        return iter({key for index in self.indexes for key in index})

    def __len__(self) -> int:
        return len({key for index in self.indexes for key in index})


def _controller(memo: Any, indexes: dict[str, Any]) -> Controller:
    """The controller, handed kopf's indexes (they come as handler kwargs named like the
    index functions above) and the pod informer's."""
    controller: Controller = memo.controller
    controller.attach(
        indexes["trainingjobs"],
        memo.pods.index,
        indexes["nodes"],
        _Children(indexes["job_services"], indexes["job_claims"]),
    )
    return controller


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    namespace: str | None, name: str, body: kopf.Body, memo: Any, **kwargs: Any
) -> None:
    _controller(memo, kwargs).job_changed((str(namespace), name), body)


@kopf.on.event("services", labels=JOB_PODS)
async def service_changed(
    namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any
) -> None:
    _controller(memo, kwargs).enqueue((str(namespace), labels[lbl.JOB_NAME]))


@kopf.on.event("persistentvolumeclaims", labels=JOB_PODS)
async def claim_changed(
    namespace: str | None, labels: Mapping[str, str], memo: Any, **kwargs: Any
) -> None:
    _controller(memo, kwargs).enqueue((str(namespace), labels[lbl.JOB_NAME]))


async def workload_changed(body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """Kueue admitted or evicted a job's Workload (only ours carry the job-name label). Where
    Kueue is not installed kopf watches nothing here, and starts once its CRD appears."""
    _controller(memo, kwargs).workload_changed(dict(body))


def watch_workloads(registry: kopf.OperatorRegistry) -> None:
    """Follow Kueue's Workloads: registered only with the Kueue integration on
    (``kueue_enabled``), so an operator with it off never lists or watches them, and needs
    no right to."""
    kopf.on.event(
        workloads.API_GROUP,
        workloads.API_VERSION,
        workloads.PLURAL,
        labels=JOB_PODS,
        registry=registry,
    )(workload_changed)


@kopf.on.event("nodes")
async def node_changed(name: str, type: str, body: kopf.Body, memo: Any, **kwargs: Any) -> None:
    """Wake the jobs with pods on a node whose readiness flipped or that was deleted.

    Node status heartbeats arrive all the time; only a change of readiness matters, so the
    previous value is remembered and everything else is ignored.
    """
    controller = _controller(memo, kwargs)
    ready = None if type == "DELETED" else node_health(dict(body)).ready
    if memo.node_ready.get(name, ready) == ready and type != "DELETED":
        memo.node_ready[name] = ready
        return
    memo.node_ready[name] = ready
    log.info("node %s is %s", name, {True: "Ready", False: "NotReady", None: "deleted"}[ready])
    for key in set(controller.snapshot.jobs_on_node(name)):
        controller.enqueue(key)
