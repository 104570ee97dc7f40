"""The real control plane for the operator benchmarks: cluster, operator, jobs, and a stopwatch
that is a watch.

Times are taken by watching the API, as a user's ``kubectl get pods -w`` would see them: a
thread holds a raw watch (JSON lines, no model objects, so the watcher costs little CPU on a
2-core machine) and records, per pod, when it was first seen, first seen ``Running`` and
deleted; per node, when its ``Ready`` condition was first seen not ``True``. Every instant is
``time.monotonic()`` in this process, so differences are exact to the watch's latency.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines
from prometheus_client.parser import text_string_to_metric_families

from bench.common import log, proc_cpu_seconds, proc_peak_rss_bytes
from testbed import kwok
from testbed.cluster import Cluster, ClusterConfig
from testbed.crds import install_crd
from testbed.kwok import POOL_LABEL, NodePool, kwok_toleration
from testbed.operator import OperatorProcess
from testbed.volumes import delete_volume, prebound_volume
from testbed.wait import wait_for
from torchkube.api import GROUP, PLURAL, VERSION
from torchkube.api import labels as lbl
from torchkube.operator import workloads

ROOT = Path(__file__).resolve().parents[1]
BENCH_LABEL = "bench.torchkube.dev/group"
CLAIM = "bench-checkpoints"
JOB_KINDS = [(GROUP, VERSION, PLURAL), ("kubeflow.org", "v1", "pytorchjobs")]
"""(group, version, plural) of every operator's jobs a benchmark may create."""
WATCH_SECONDS = 20
QUIET_MARGIN_CORES = 0.25
"""A cluster is quiet while its processes (control plane, KWOK, operators) use no more CPU
together than this above its own idle rate (:attr:`Stack.idle_cores`): node leases and status
reports keep a KWOK cluster busy in proportion to its nodes even with nothing to do, and the
teardown of the last trial (its namespace's deletion, the garbage collector, an operator
letting go of its job) runs at several cores."""
QUIET_WINDOW_S = 1.0
"""The span each rate is measured over: longer than the bursts of the nodes' reports."""
QUIET_LIMIT_S = 60.0
"""A cluster still busy after this long is started on anyway, and the log says so."""
IDLE_WINDOWS = 5
"""The idle rate is the lowest of this many windows right after the stack starts: the CRD's
installation and the operator's first lists still run in the first ones."""

# The harness carves one /24 per node out of 10.244.0.0/16, which caps a cluster at 256 nodes.
# The 400-node scenario needs more: a /12 of its own (no overlap with the service range
# 10.96.0.0/16, node IPs 10.243.0.0/16 or the default pod range) gives 4096 node slots.
WIDE_POD_CIDR = ipaddress.ip_network("10.128.0.0/12")


def widen_pod_cidr() -> None:
    """Let :class:`Cluster` create more than 256 KWOK nodes (see ``WIDE_POD_CIDR``)."""
    kwok.POD_CIDR = WIDE_POD_CIDR


def gpu_pools(
    nodes: int, domains: int, prefix: str = "gpu", group: str = "scale"
) -> list[NodePool]:
    """``nodes`` 8-GPU nodes over ``domains`` kwok processes, all labelled with ``group``."""
    pools = []
    for index in range(domains):
        count = nodes // domains + (1 if index < nodes % domains else 0)
        name = f"{prefix}-{index}"
        pools.append(NodePool(name=name, nodes=count, labels={BENCH_LABEL: group}))
    return pools


# ----------------------------------------------------------------------------- metrics
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Samples:
    """Prometheus text → {(sample name, sorted labels): value}."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return samples


def metric_delta(
    before: Samples, after: Samples, name: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """How much each labelled series of ``name`` grew between two scrapes."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for (sample, labels), value in after.items():
        if sample == name:
            grown = value - before.get((sample, labels), 0.0)
            if grown:
                out[labels] = grown
    return out


CLOSED_WATCHES = "apiserver_terminated_watchers_total"
"""Watches the API server closed because their client did not drain them in time: each
watcher has a small buffer, and once the server's budget for waiting on full buffers is
spent every blocked watcher is closed at once. A client then watches again, and KWOK's from
resourceVersion 0: the server replays every pod to it."""


METRICS_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds for the API server's /metrics: a benchmark waits on no hung read."""


def apiserver_exposition(api: Any) -> str:
    """The API server's /metrics as text."""
    method, url, headers, _body, _form = api.param_serialize(
        method="GET",
        resource_path="/metrics",
        header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, headers, _request_timeout=METRICS_TIMEOUT)
    response.read()
    text: str = response.data.decode()
    return text


def apiserver_samples(api: Any, names: Sequence[str]) -> Samples:
    """The API server's samples named ``names`` exactly (a histogram's by their ``_bucket``,
    ``_sum`` or ``_count`` names): its whole exposition is read, a few megabytes, and only
    their lines parsed."""
    wanted = set(names)
    lines = [
        line
        for line in apiserver_exposition(api).splitlines()
        if line.split("{", 1)[0].split(" ", 1)[0] in wanted
    ]
    return parse_metrics("".join(f"{line}\n" for line in lines))


# ----------------------------------------------------------------------------- watching
@dataclass
class PodTimes:
    """One pod object (a replacement under the same name is another: its uid differs)."""

    uid: str
    name: str
    labels: dict[str, str]
    seen: float
    node: str = ""
    bound: float | None = None
    """When the watch first saw it bound to a node (the scheduler's part ends)."""
    phase: str = ""
    running: float | None = None
    terminated: float | None = None
    deleted: float | None = None


@dataclass
class NodeTimes:
    name: str
    ready: bool | None = None
    not_ready: float | None = None
    not_ready_wall: float | None = None
    transition: str = ""


class _RawWatch(threading.Thread):
    """A watch that resumes where it stopped and hands each event's object to ``handle``."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        handle: Callable[[str, dict[str, Any]], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(daemon=True)
        self.list_fn, self.handle, self.kwargs = list_fn, handle, kwargs
        self.stopped = threading.Event()
        self.synced = threading.Event()
        self._response: Any = None

    def run(self) -> None:
        version = ""
        while not self.stopped.is_set():
            try:
                if not version:
                    listing = self.list_fn(**self.kwargs, _preload_content=False)
                    body = json.loads(listing.data)
                    for item in body.get("items", []):
                        self.handle("ADDED", item)
                    version = body["metadata"]["resourceVersion"]
                    self.synced.set()
                self._response = self.list_fn(
                    **self.kwargs,
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    # Short, so a stopped watch notices within this time: closing the response
                    # from another thread can block until the next event arrives.
                    timeout_seconds=WATCH_SECONDS,
                    _preload_content=False,
                )
                for line in iter_resp_lines(self._response):
                    if self.stopped.is_set():
                        break
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object", {})
                    if event.get("type") == "ERROR":
                        version = ""  # 410 Gone: list again
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.get("type") != "BOOKMARK":
                        self.handle(event["type"], obj)
            except Exception:
                if self.stopped.is_set():
                    return
                time.sleep(0.2)

    def stop(self) -> None:
        """Ask the thread to end (at its next event or watch timeout); never blocks."""
        self.stopped.set()


class PodWatch:
    """Every pod of a namespace matching ``selector``, with the instants that matter, by uid."""

    def __init__(self, api: Any, namespace: str, selector: str = "") -> None:
        self.pods: dict[str, PodTimes] = {}
        self.cond = threading.Condition()
        core = client.CoreV1Api(api)
        kwargs: dict[str, Any] = {"namespace": namespace}
        if selector:
            kwargs["label_selector"] = selector
        self._watch = _RawWatch(core.list_namespaced_pod, self._handle, **kwargs)

    def __enter__(self) -> PodWatch:
        self._watch.start()
        if not self._watch.synced.wait(30):
            raise RuntimeError("pod watch did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.stop()

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        meta, status = obj["metadata"], obj.get("status") or {}
        uid, name = meta["uid"], meta["name"]
        with self.cond:
            pod = self.pods.get(uid)
            if pod is None:
                pod = self.pods[uid] = PodTimes(uid, name, dict(meta.get("labels") or {}), now)
            pod.labels = dict(meta.get("labels") or {})
            pod.node = (obj.get("spec") or {}).get("nodeName") or pod.node
            if pod.node and pod.bound is None:
                pod.bound = now
            pod.phase = status.get("phase", "")
            if pod.phase == "Running" and pod.running is None:
                pod.running = now
            if pod.phase in ("Failed", "Succeeded") and pod.terminated is None:
                pod.terminated = now
            if (kind == "DELETED" or meta.get("deletionTimestamp")) and pod.deleted is None:
                pod.deleted = now
            self.cond.notify_all()

    def wait(
        self, predicate: Callable[[dict[str, PodTimes]], Any], timeout: float, what: str
    ) -> Any:
        """Block until ``predicate(pods)`` is truthy (checked on every event); return it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                result = predicate(self.pods)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    states = [
                        f"{p.name}:{p.phase}{':deleted' if p.deleted else ''}"
                        f"{':terminated' if p.terminated else ''}"
                        for p in self.pods.values()
                    ]
                    raise TimeoutError(
                        f"timed out after {timeout:.0f}s waiting for {what}; pods: {states}"
                    )
                self.cond.wait(min(left, 1.0))

    def alive(self) -> list[PodTimes]:
        """The pods neither deleted nor terminated."""
        return [p for p in self.pods.values() if p.deleted is None and p.terminated is None]

    def live(self, role: str = lbl.ROLE_WORKER, job: str | None = None) -> list[PodTimes]:
        return [
            p
            for p in self.alive()
            if p.labels.get(lbl.ROLE) == role and (job is None or p.labels.get(lbl.JOB_NAME) == job)
        ]


class WorkloadWatch:
    """The namespace's Workloads made after the watch started, with when each was first seen
    admitted (``workloads.read``: the operator's own reading of a Workload)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.cond = threading.Condition()
        self.existing: set[str] = set()
        self.admitted: dict[str, float] = {}
        self._started = False
        custom = client.CustomObjectsApi(api)
        self._watch = _RawWatch(
            custom.list_namespaced_custom_object,
            self._handle,
            group=workloads.API_GROUP,
            version=workloads.API_VERSION,
            namespace=namespace,
            plural=workloads.PLURAL,
        )

    def __enter__(self) -> WorkloadWatch:
        self._watch.start()
        if not self._watch.synced.wait(30):
            raise RuntimeError("workload watch did not start")
        with self.cond:
            self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.stop()

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        uid = obj["metadata"]["uid"]
        with self.cond:
            if not self._started:
                self.existing.add(uid)  # an earlier trial's, still being deleted
                return
            fresh = uid not in self.existing and uid not in self.admitted
            if fresh and workloads.read(obj).admitted:
                self.admitted[uid] = now
                self.cond.notify_all()

    def wait_admitted(self, timeout: float, what: str) -> float:
        """When the first new Workload was seen admitted."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.admitted:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: no Workload admitted after {timeout:.0f}s")
                self.cond.wait(min(left, 1.0))
            return min(self.admitted.values())


class NodeWatch:
    """Nodes' readiness, with the instant each was first seen not Ready."""

    def __init__(self, api: Any) -> None:
        self.nodes: dict[str, NodeTimes] = {}
        self.cond = threading.Condition()
        self._watch = _RawWatch(client.CoreV1Api(api).list_node, self._handle)

    def __enter__(self) -> NodeWatch:
        self._watch.start()
        if not self._watch.synced.wait(30):
            raise RuntimeError("node watch did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.stop()

    def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        now, wall = time.monotonic(), time.time()
        name = obj["metadata"]["name"]
        ready, transition = None, ""
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready":
                ready = condition.get("status") == "True"
                transition = condition.get("lastTransitionTime", "")
        with self.cond:
            node = self.nodes.setdefault(name, NodeTimes(name))
            if ready is False and node.ready is not False:
                node.not_ready, node.not_ready_wall, node.transition = now, wall, transition
            if ready:
                node.not_ready = node.not_ready_wall = None
            node.ready = ready
            self.cond.notify_all()

    def wait_not_ready(self, names: list[str], timeout: float) -> list[NodeTimes]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [self.nodes.get(n) for n in names]
                if all(n is not None and n.not_ready is not None for n in found):
                    return [n for n in found if n is not None]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"nodes {names} not NotReady after {timeout:.0f}s")
                self.cond.wait(min(left, 1.0))


# ----------------------------------------------------------------------------- the stack
@dataclass
class Stack:
    """A running cluster plus the operator under test."""

    cluster: Cluster
    operator: OperatorProcess
    api: Any
    volumes: list[str] = field(default_factory=list)
    scratch: Path = field(default_factory=Path)
    idle_cores: float = 0.0
    """What the cluster's processes use with nothing asked of them (:func:`idle_rate`)."""

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    def metrics(self, names: Sequence[str] = ()) -> Samples:
        """The operator's samples (only ``names``, when given: see ``OperatorProcess.metrics``)."""
        return parse_metrics(self.operator.metrics(names))

    def closed_pod_watches(self) -> float:
        """Pod watches the API server has closed as not drained in time (:data:`CLOSED_WATCHES`)
        since it started."""
        samples = apiserver_samples(self.api, [CLOSED_WATCHES])
        return sum(
            value
            for (name, labels), value in samples.items()
            if name == CLOSED_WATCHES and ("resource", "pods") in labels
        )

    @property
    def apiserver_log(self) -> Path:
        """The API server's log: whose pod watches it closed (``bench.watchers``)."""
        return self.cluster.log_dir / "kube-apiserver.log"

    def operator_cpu_seconds(self) -> float:
        assert self.operator.proc is not None
        return proc_cpu_seconds(self.operator.proc.pid)

    def component_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each control-plane component has used so far, the KWOK processes
        summed as ``kwok`` (they stand in for the nodes' kubelets)."""
        used: dict[str, float] = {}
        for name, pid in self.cluster.component_pids().items():
            component = "kwok" if name.startswith("kwok-") else name
            used[component] = used.get(component, 0.0) + proc_cpu_seconds(pid)
        return used

    def measure_idle(self) -> None:
        """Set :attr:`idle_cores`, again whenever a component joins (Kueue)."""
        self.idle_cores = idle_rate(lambda: sum(self.component_cpu_seconds().values()))
        log(f"the cluster idles at {self.idle_cores:.2f} cores")

    def operator_peak_rss(self) -> int:
        assert self.operator.proc is not None
        return proc_peak_rss_bytes(self.operator.proc.pid)

    def restart_operator(self) -> None:
        """A fresh operator process (so its peak RSS belongs to the next scenario only)."""
        self.operator.stop()
        self.operator = start_operator(self.cluster)

    def namespace(self, prefix: str) -> str:
        """A new namespace with a bound ReadWriteMany checkpoint claim every job can share.

        The claim exists and is bound before any job: the figures are the operator's and the
        scheduler's, not the PV controller's (Kubeflow's reference jobs had no volume).
        """
        name = f"{prefix}-{secrets.token_hex(3)}"
        core = self.core
        core.create_namespace({"metadata": {"name": name}})
        wait_for(
            lambda: any(
                sa.metadata.name == "default"
                for sa in core.list_namespaced_service_account(name).items
            ),
            60,
            what=f"ServiceAccount {name}/default",
        )
        path = self.scratch / name
        self.volumes.append(prebound_volume(self.api, name, CLAIM, str(path)))
        core.create_namespaced_persistent_volume_claim(
            name,
            {
                "metadata": {"name": CLAIM},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "resources": {"requests": {"storage": "10Gi"}},
                },
            },
        )
        wait_for(
            lambda: (
                core.read_namespaced_persistent_volume_claim(CLAIM, name).status.phase == "Bound"
            ),
            60,
            what=f"claim {name}/{CLAIM} to be bound",
        )
        return name

    def create_job(self, namespace: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def delete_namespace(
        self, namespace: str, wait: float = 300, force: bool = False, keep: bool = False
    ) -> None:
        """Delete the jobs (torchkube's and the peer's), wait until their pods are gone
        (capacity back), drop the namespace; with ``keep`` leave it, empty of jobs, for the
        next (an operator confined to it watches only it).

        ``force`` also deletes the pods with grace 0: pods of a killed node would otherwise
        stay Terminating until pod garbage collection (about a minute) removes them.
        """
        for group, version, plural in JOB_KINDS:
            # 404: that operator's CRD is not installed in this benchmark
            with contextlib.suppress(client.ApiException):
                self.custom.delete_collection_namespaced_custom_object(
                    group, version, namespace, plural, propagation_policy="Background"
                )
        core = self.core
        if force:
            for pod in core.list_namespaced_pod(namespace).items:
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)

        def no_pods() -> bool:
            return not core.list_namespaced_pod(namespace, limit=1).items

        def no_jobs() -> bool:
            return not any(
                self.custom.list_namespaced_custom_object(group, version, namespace, plural)[
                    "items"
                ]
                for group, version, plural in JOB_KINDS
            )

        if keep:
            wait_for(no_pods, wait, interval=1.0, what=f"the pods of {namespace} to be deleted")
            wait_for(no_jobs, wait, interval=0.5, what=f"the jobs of {namespace} to be deleted")
            return
        try:
            wait_for(no_pods, wait, interval=1.0, what=f"the pods of {namespace} to be deleted")
        finally:
            core.delete_namespace(namespace)


def _rate(
    cpu_seconds: Callable[[], float],
    window: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> float:
    """The cores ``cpu_seconds`` grows by per second over one ``window`` from now."""
    before, at = cpu_seconds(), clock()
    sleep(window)
    return (cpu_seconds() - before) / max(clock() - at, 1e-9)


def idle_rate(
    cpu_seconds: Callable[[], float],
    windows: int = IDLE_WINDOWS,
    window: float = QUIET_WINDOW_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """The cores ``cpu_seconds`` grows by per second while nothing is asked of the cluster:
    the lowest of ``windows`` windows, so what the stack's own start still runs is left out."""
    return min(_rate(cpu_seconds, window, clock, sleep) for _ in range(windows))


def wait_quiet(
    cpu_seconds: Callable[[], float],
    cores: float,
    window: float = QUIET_WINDOW_S,
    limit: float = QUIET_LIMIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait until ``cpu_seconds`` (the cluster's processes together) grew by at most ``cores``
    per second over a whole ``window``; the seconds waited (a window past ``limit`` at most;
    a wait that reaches it is said in the log).

    A start measured while the last trial's teardown still runs is charged with that
    teardown's CPU on the same cores, whichever contender's it was: trials in rotated order
    then measure who follows whom. Each trial starts on a quiet cluster instead (beside the
    condition's own load, which is not the cluster's)."""
    began = clock()
    while True:
        rate = _rate(cpu_seconds, window, clock, sleep)
        waited = clock() - began
        if rate <= cores:
            return waited
        if waited >= limit:
            log(f"the cluster is not quiet after {waited:.0f}s ({rate:.2f} cores); starting anyway")
            return waited


def start_operator(cluster: Cluster, **env: str) -> OperatorProcess:
    """The operator as shipped (defaults of torchkube/operator/config.py), no progress polls.

    The harness sets a 5 s resync for tests; a benchmark runs the production default (30 s), so
    idle reconciles do not inflate the request counts.
    """
    settings = {"TORCHKUBE_RESYNC_SECONDS": "30", **env}
    return OperatorProcess(cluster.kubeconfig, cluster.log_dir / "operator.log", settings).start()


@contextlib.contextmanager
def stack(
    pools: list[NodePool],
    scratch: Path,
    scheduler_client_qps: int | None = None,
    **operator_env: str,
) -> Iterator[Stack]:
    """Start the cluster with ``pools`` (not timed), the CRD and the operator; stop them all.

    ``scheduler_client_qps`` raises kube-scheduler's client rate (default 50 requests/s).
    A benchmark stopped with SIGTERM stops them too: Python's default would end the process
    without this ``finally``, and the operator, a process of its own, would run on against a
    cluster that is gone, taking CPU from the next run."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    widen_pod_cidr()
    started = time.monotonic()
    config = ClusterConfig(
        pools=pools, start_timeout_s=600, scheduler_client_qps=scheduler_client_qps
    )
    cluster = Cluster(config)
    cluster.start()
    log(f"cluster with {sum(p.nodes for p in pools)} nodes up in {time.monotonic() - started:.0f}s")
    operator: OperatorProcess | None = None
    bench: Stack | None = None
    try:
        api = cluster.api_client()
        install_crd(api)
        operator = start_operator(cluster, **operator_env)
        bench = Stack(cluster, operator, api, scratch=scratch)
        bench.measure_idle()
        yield bench
        for volume in bench.volumes:
            with contextlib.suppress(Exception):
                delete_volume(api, volume)
    except BaseException:
        cluster.mark_failed()
        raise
    finally:
        # the operator running now: a scenario may have restarted it (restart_operator), and
        # one left behind by a stopped benchmark goes on taking CPU from the next
        if bench is not None:
            operator = bench.operator
        if operator is not None:
            operator.stop()
        cluster.stop()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def job_body(
    name: str,
    workers: int,
    *,
    gpus: int = 1,
    group: str = "scale",
    min_workers: int | None = None,
    failure_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A TrainingJob of ``workers`` pods, ``gpus`` each, on the nodes labelled ``group``.

    Everything else is the API's default, which is what a user's job gets.
    """
    spec: dict[str, Any] = {
        "replicas": {"min": min_workers or workers, "max": workers},
        "nprocPerNode": 1,
        "resources": {"gpus": gpus},
        "checkpoint": {"claimName": CLAIM},
        "scheduling": {
            "tolerations": [kwok_toleration()],
            "nodeSelector": {BENCH_LABEL: group},
        },
        "rendezvous": {"store": {"nodeSelector": {BENCH_LABEL: group}}},
    }
    if failure_policy:
        spec["failurePolicy"] = failure_policy
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


__all__ = [
    "POOL_LABEL",
    "NodeWatch",
    "PodWatch",
    "Stack",
    "WorkloadWatch",
    "gpu_pools",
    "job_body",
    "stack",
]
