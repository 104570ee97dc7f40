"""The operators a benchmark puts side by side on one cluster: torchkube and Kubeflow's
training-operator (in one or more configurations). Each knows how to submit a job of N worker
pods, which pods are its workers, and what it has cost so far (API requests, reconciles, CPU
seconds, peak memory), so a scenario is written once and run for all, alternating job by job.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from bench import kubeflow
from bench.common import LIMIT, log
from bench.kube import (
    QUIET_MARGIN_CORES,
    NodeTimes,
    NodeWatch,
    PodTimes,
    PodWatch,
    Stack,
    job_body,
    metric_delta,
    parse_metrics,
    wait_quiet,
)
from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.operator import workloads
from torchkube.operator.builders import worker_pod
from torchkube.operator.config import OperatorSettings
from torchkube.operator.kube import Kube
from torchkube.policy.queue import QUEUE_LABEL

PEER = "Kubeflow"
BARE_LABEL = "bench.torchkube.io/bare-job"
BARE_THREADS = OperatorSettings().api_concurrency
"""The bare client creates from as many threads as the operator's API pool has, through the
operator's own request (``Kube.create``: the body sent as the JSON it is, the answer parsed
as JSON): the same requests at the same parallelism, with no operator around them."""
BARE_HOW = f"through the operator's own create request from {BARE_THREADS} threads (its API pool)"
"""How the bare client sends its creates, as the records' notes say it."""


class Contender(Protocol):
    name: str
    selector: str
    """Label selector of the pods the recovery and fleet benchmarks count as its workers
    (Kubeflow's: its Master and Workers alike)."""
    pod_selector: str
    """Label selector of every pod of its jobs: the workers and what else a job runs
    (torchkube's rendezvous store, Kubeflow's Master)."""
    home: str | None
    """The one namespace its operator watches, where all its jobs go; ``None``: it watches
    every namespace and each job may have a fresh one."""

    def submit(
        self,
        bench: Stack,
        namespace: str,
        job: str,
        workers: int,
        *,
        gpus: int = 1,
        group: str = "scale",
        resilient: Resilience | None = None,
        queue: str | None = None,
    ) -> None:
        """A job of ``workers`` pods with ``gpus`` each on the KWOK nodes labelled ``group``;
        ``resilient`` asks for the operator's own recovery settings; ``queue`` names the Kueue
        LocalQueue it waits in."""
        ...

    def slot(self, pod: PodTimes) -> str:
        """Which replica a pod is: its replacement has the same slot."""
        ...

    def is_worker(self, pod: PodTimes) -> bool:
        """Whether ``pod`` (one of :attr:`pod_selector`'s) is a worker."""
        ...

    def pod_counts(self, workers: int) -> tuple[int, int]:
        """A job of ``workers``: how many of its pods are workers, and how many pods in all."""
        ...

    def restart(self, bench: Stack) -> None:
        """A fresh operator process, so its CPU and peak memory belong to what follows."""
        ...

    def requests(self) -> float:
        """API requests sent so far (cumulative)."""
        ...

    def reconciles(self) -> float:
        """Reconciles done so far (cumulative)."""
        ...

    def cpu_seconds(self) -> float: ...

    def peak_rss(self) -> int: ...


@dataclass(frozen=True)
class Resilience:
    """What a recovery benchmark asks of a job: outlive every injected failure, and replace
    the workers of a lost node after ``node_grace`` seconds where the operator can."""

    node_grace: int = 30
    restarts: int = 1000


@dataclass
class Torchkube:
    bench: Stack
    name: str = "torchkube"
    selector: str = f"{lbl.ROLE}={lbl.ROLE_WORKER}"
    pod_selector: str = lbl.JOB_NAME
    home: str | None = None

    def submit(
        self,
        bench: Stack,
        namespace: str,
        job: str,
        workers: int,
        *,
        gpus: int = 1,
        group: str = "scale",
        resilient: Resilience | None = None,
        queue: str | None = None,
    ) -> None:
        policy = (
            {"maxRestarts": resilient.restarts, "nodeLostGraceSeconds": resilient.node_grace}
            if resilient
            else None
        )
        body = job_body(job, workers, gpus=gpus, group=group, failure_policy=policy)
        if queue:
            body["metadata"]["labels"] = {QUEUE_LABEL: queue}
        bench.create_job(namespace, body)

    def slot(self, pod: PodTimes) -> str:
        return pod.labels.get(lbl.REPLICA_INDEX, "")

    def is_worker(self, pod: PodTimes) -> bool:
        return pod.labels.get(lbl.ROLE) == lbl.ROLE_WORKER

    def pod_counts(self, workers: int) -> tuple[int, int]:
        return workers, workers + 1  # and its rendezvous store

    def restart(self, bench: Stack) -> None:
        bench.restart_operator()

    def _total(self, sample: str) -> float:
        """One counter's sum over its series, read alone: :func:`settle` polls it twice a
        second while the operator's CPU is counted, and formatting every family costs the
        operator milliseconds each time."""
        return sum(metric_delta({}, self.bench.metrics([sample]), sample).values())

    def requests(self) -> float:
        return self._total("torchkube_api_requests_total")

    def reconciles(self) -> float:
        return self._total("torchkube_reconcile_duration_seconds_count")

    def cpu_seconds(self) -> float:
        return self.bench.operator_cpu_seconds()

    def peak_rss(self) -> int:
        return self.bench.operator_peak_rss()


@dataclass
class Kubeflow:
    operator: kubeflow.KubeflowOperator
    name: str = PEER
    selector: str = kubeflow.JOB_LABEL
    pod_selector: str = kubeflow.JOB_LABEL
    home: str | None = None

    def submit(
        self,
        bench: Stack,
        namespace: str,
        job: str,
        workers: int,
        *,
        gpus: int = 1,
        group: str = "scale",
        resilient: Resilience | None = None,
        queue: str | None = None,
    ) -> None:
        # ExitCode: a pod that exits with a retryable code (137, 143, ...) is deleted and made
        # again, the peer's counterpart of a failure policy. It has none for lost nodes.
        policy = "ExitCode" if resilient else "OnFailure"
        body = kubeflow.pytorchjob_body(
            job, workers, gpus=gpus, group=group, restart=policy, queue=queue
        )
        kubeflow.create_pytorchjob(bench.api, namespace, body)

    def slot(self, pod: PodTimes) -> str:
        labels = pod.labels
        return (
            f"{labels.get(kubeflow.REPLICA_TYPE_LABEL)}-{labels.get(kubeflow.REPLICA_INDEX_LABEL)}"
        )

    def is_worker(self, pod: PodTimes) -> bool:
        return pod.labels.get(kubeflow.REPLICA_TYPE_LABEL, "").lower() == "worker"

    def pod_counts(self, workers: int) -> tuple[int, int]:
        return workers - 1, workers  # a Master and workers-1 Workers

    def restart(self, bench: Stack) -> None:
        self.operator = self.operator.restarted(bench.api)

    def requests(self) -> float:
        return kubeflow.requests_total(self.operator.metrics())

    def reconciles(self) -> float:
        samples = parse_metrics(self.operator.metrics())
        return sum(metric_delta({}, samples, "controller_runtime_reconcile_total").values())

    def cpu_seconds(self) -> float:
        return self.operator.cpu_seconds()

    def peak_rss(self) -> int:
        return self.operator.peak_rss()


def bare_pods(namespace: str, job: str, workers: int, gpus: int, group: str) -> list[dict]:
    """torchkube's own worker pods for a job of ``workers`` (its builder, the job's defaults:
    same containers, resources, claim, scheduling), with no owner and only the bench's label,
    so neither torchkube nor the garbage collector takes them for a job's."""
    body = job_body(job, workers, gpus=gpus, group=group)
    body["metadata"] |= {"namespace": namespace, "uid": "00000000-0000-0000-0000-000000000000"}
    trainingjob = TrainingJob.model_validate(body)
    pods = []
    for index in range(workers):
        pod = worker_pod(trainingjob, index, "bare")
        pod["metadata"] = {
            "name": pod["metadata"]["name"],
            "namespace": namespace,
            "labels": {BARE_LABEL: job, lbl.REPLICA_INDEX: str(index)},
        }
        pods.append(pod)
    return pods


def bare_workload(
    namespace: str, job: str, workers: int, gpus: int, group: str, queue: str
) -> dict[str, Any]:
    """The Workload torchkube makes for such a job, its workers' pod set alone (the bare
    client makes no store) and no owner. The pods need nothing from the admission: the
    benchmark's ResourceFlavor asks for the node label and toleration they already carry."""
    body = job_body(job, workers, gpus=gpus, group=group)
    body["metadata"] |= {
        "namespace": namespace,
        "uid": "00000000-0000-0000-0000-000000000000",
        "labels": {QUEUE_LABEL: queue},
    }
    made = workloads.workload(TrainingJob.model_validate(body), workloads.Priority())
    made["metadata"] = {"name": f"bare-{job}", "namespace": namespace}
    made["spec"]["podSets"] = [
        pod_set for pod_set in made["spec"]["podSets"] if pod_set["name"] == workloads.WORKERS
    ]
    return made


def not_ready_since(node: NodeTimes) -> float:
    """When ``node`` turned NotReady (wall clock): its Ready condition's lastTransitionTime,
    the clock an operator's grace runs on (torchkube's does), else when the watch saw it."""
    if node.transition:
        return dt.datetime.fromisoformat(node.transition.replace("Z", "+00:00")).timestamp()
    return node.not_ready_wall or time.time()


class Replacer:
    """The least a recovery can do, for one bare job: a pod that failed or was deleted gets a
    new pod in its slot the moment a watch shows it; the pods of a node NotReady for ``grace``
    seconds are force-deleted and replaced then. No accounting, no status, no backoff, one
    request per replacement: what an operator adds is beyond it. The grace runs from the
    node's lastTransitionTime, as an operator's does. Stopped with the bench."""

    def __init__(
        self, bench: Stack, core: Any, namespace: str, templates: list[dict[str, Any]],
        grace: float, count: Callable[[int], None],
    ) -> None:  # fmt: skip
        self.core, self.namespace, self.grace, self.count = core, namespace, grace, count
        self.templates = {pod["metadata"]["labels"][lbl.REPLICA_INDEX]: pod for pod in templates}
        self.handled: set[str] = set()
        self.made = 0
        job = templates[0]["metadata"]["labels"][BARE_LABEL]
        self.pods = PodWatch(bench.api, namespace, f"{BARE_LABEL}={job}").__enter__()
        self.nodes = NodeWatch(bench.api).__enter__()
        self.stopped = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            with self.pods.cond:
                due = self._due()
                if not due:
                    self.pods.cond.wait(0.05)
                    continue
            for pod, force in due:
                try:
                    self._replace(pod, force)
                except ApiException as error:  # its namespace going away at the scenario's end
                    log(f"{LIMIT}: {pod.name} not replaced: {error.status} {error.reason}")

    def _due(self) -> list[tuple[PodTimes, bool]]:
        """The pods to replace now, each once: (pod, whether to force-delete it first)."""
        now = time.time()
        lost_nodes = {
            n.name
            for n in list(self.nodes.nodes.values())
            if n.not_ready is not None and now - not_ready_since(n) >= self.grace
        }
        due = []
        for pod in self.pods.pods.values():
            if pod.uid in self.handled:
                continue
            gone = pod.deleted is not None or pod.phase == "Failed"
            if gone or pod.node in lost_nodes:
                self.handled.add(pod.uid)
                due.append((pod, not gone))
        return due

    def _replace(self, pod: PodTimes, force: bool) -> None:
        if force:
            self.core.delete_namespaced_pod(
                pod.name, self.namespace, grace_period_seconds=0, _preload_content=False
            )
        self.made += 1
        slot = pod.labels.get(lbl.REPLICA_INDEX, "")
        body = copy.deepcopy(self.templates[slot])
        body["metadata"]["name"] = f"{body['metadata']['name']}-r{self.made}"
        self.core.create_namespaced_pod(self.namespace, body, _preload_content=False)
        self.count(2 if force else 1)

    def stop(self) -> None:
        self.stopped.set()
        self.pods.__exit__()
        self.nodes.__exit__()


@dataclass
class BareClient:
    """The physical limit: the pods torchkube would create for the job, created by a client
    with no operator, from :data:`BARE_THREADS` threads at once, with no client-side rate
    limit. What it takes to bring them to Running is the cluster's part alone (API server,
    scheduler, nodes); an operator's time beyond it is the operator's. Asked for recovery
    (``resilient``), a :class:`Replacer` replaces the job's lost pods as fast as a watch sees
    them."""

    bench: Stack
    name: str = LIMIT
    selector: str = BARE_LABEL
    pod_selector: str = BARE_LABEL
    home: str | None = None
    _sent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _core: Any = None
    _creates: Kube | None = None
    _replacers: list[Replacer] = field(default_factory=list)

    def _client(self) -> Any:
        """A client of its own whose connection pool serves every thread at once."""
        if self._core is None:
            from kubernetes import client
            from kubernetes import config as k8s_config

            configuration = client.Configuration()
            k8s_config.load_kube_config(
                config_file=str(self.bench.cluster.kubeconfig),
                client_configuration=configuration,
            )
            configuration.connection_pool_maxsize = BARE_THREADS
            api_client = client.ApiClient(configuration)
            self._core = client.CoreV1Api(api_client)
            self._creates = Kube(api_client, BARE_THREADS)
        return self._core

    def submit(
        self,
        bench: Stack,
        namespace: str,
        job: str,
        workers: int,
        *,
        gpus: int = 1,
        group: str = "scale",
        resilient: Resilience | None = None,
        queue: str | None = None,
    ) -> None:
        """Create the job's pods; with ``queue``, once a Workload of theirs made first is
        admitted there (see :meth:`_admitted`)."""
        core = self._client()
        if queue:
            self._admitted(namespace, bare_workload(namespace, job, workers, gpus, group, queue))

        templates = bare_pods(namespace, job, workers, gpus, group)
        if resilient:
            self._replacers.append(
                Replacer(self.bench, core, namespace, templates, resilient.node_grace, self._count)
            )
        assert self._creates is not None
        results = self._creates.create_all(templates)
        self._count(len(results))
        refused = [result.refused for result in results if result.refused is not None]
        if refused:
            raise RuntimeError(f"{LIMIT}: {len(refused)} creates refused: {refused[0]}")

    def _admitted(self, namespace: str, body: dict[str, Any]) -> None:
        """Create ``body`` and return once Kueue has admitted it: what any integration must
        do before its pods, and no more — one create, one watch from that create's version
        (no event between them is missed). Owned by nothing, so Kueue itself lifts its
        finalizer when the namespace goes."""
        custom = k8s.CustomObjectsApi(self._client().api_client)
        where = (workloads.API_GROUP, workloads.API_VERSION, namespace, "workloads")
        created = cast(dict[str, Any], custom.create_namespaced_custom_object(*where, body))
        self._count(1)
        if workloads.read(created).admitted:
            return
        name = body["metadata"]["name"]
        stream = k8s_watch.Watch()
        events = stream.stream(
            custom.list_namespaced_custom_object,
            *where,
            field_selector=f"metadata.name={name}",
            resource_version=created["metadata"]["resourceVersion"],
            timeout_seconds=600,
        )
        self._count(1)
        for event in events:
            if workloads.read(cast(dict[str, Any], event["object"])).admitted:
                stream.stop()
                return
        raise RuntimeError(f"the bare client's Workload {namespace}/{name} was not admitted")

    def _count(self, requests: int) -> None:
        with self._lock:
            self._sent += requests

    def stop(self) -> None:
        """Its replacers' watches ended."""
        for replacer in self._replacers:
            replacer.stop()
        self._replacers.clear()

    def slot(self, pod: PodTimes) -> str:
        return pod.labels.get(lbl.REPLICA_INDEX, "")

    def is_worker(self, pod: PodTimes) -> bool:
        return True

    def pod_counts(self, workers: int) -> tuple[int, int]:
        return workers, workers  # no store: the limit of the workers alone

    def restart(self, bench: Stack) -> None:
        """Nothing runs between its jobs."""

    def requests(self) -> float:
        return float(self._sent)

    def reconciles(self) -> float:
        return 0.0

    def cpu_seconds(self) -> float:
        return 0.0

    def peak_rss(self) -> int:
        return 0


@contextlib.contextmanager
def contenders(
    bench: Stack,
    peers: bool,
    configs: Sequence[kubeflow.PeerConfig] = (kubeflow.DEFAULT,),
    limit: bool = False,
) -> Iterator[list[Contender]]:
    """torchkube, with ``limit`` the bare client beside it, and with ``peers`` Kubeflow's
    operator in each of ``configs`` started beside it on the same cluster (built by pin,
    installed, its start not timed); stops the peers afterwards. Two configurations would both
    reconcile every PyTorchJob, so with more than one each is confined to a namespace of its
    own (its ``home``). The bare client's replacers stop with it."""
    bare = [BareClient(bench)] if limit else []
    players: list[Contender] = [Torchkube(bench), *bare]
    started: list[Kubeflow] = []
    try:
        if peers:
            build = kubeflow.build()
            kubeflow.install(bench.api, build)
            for config in configs:
                home = bench.namespace("kubeflow") if len(configs) > 1 else None
                log_name = "kubeflow-operator" + ("" if config == kubeflow.DEFAULT else "-raised")
                operator = kubeflow.KubeflowOperator(
                    build,
                    bench.cluster.kubeconfig,
                    bench.cluster.log_dir / f"{log_name}.log",
                    config=config,
                    namespace=home,
                ).start(bench.api)
                started.append(Kubeflow(operator, name=config.name, home=home))
        yield [*players, *started]
    finally:
        for peer in started:
            peer.operator.stop()
        for client_ in bare:
            client_.stop()


def quiet(bench: Stack, players: Sequence[Contender]) -> float:
    """Wait until the cluster and every contender's operator run within
    :data:`~bench.kube.QUIET_MARGIN_CORES` of the cluster's idle rate
    (:func:`bench.kube.wait_quiet`); the seconds waited. The operators count too: a peer
    letting go of its last job is load on the same cores as the cluster's own processes."""
    return wait_quiet(
        lambda: (
            sum(bench.component_cpu_seconds().values())
            + sum(player.cpu_seconds() for player in players)
        ),
        bench.idle_cores + QUIET_MARGIN_CORES,
    )


def settle(contender: Contender, quiet: float = 3.0, limit: float = 60.0) -> None:
    """Wait until the operator stops sending requests (status writes trail the pods)."""
    deadline = time.monotonic() + limit
    last = contender.requests()
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = contender.requests()
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            return
