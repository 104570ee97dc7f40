"""A real Kubernetes control plane on 127.0.0.1 for tests and demos: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and KWOK-managed fake GPU nodes.

Operators break on exactly what fakes leave out (schema and CEL validation, subresources, watches,
``resourceVersion`` conflicts, owner-reference garbage collection, RBAC, scheduling, node
lifecycle), so the harness runs the real components, built from source by
``hack/build-cluster.sh``. Every port is drawn at random so runs never collide; every component
logs to its own file in the work dir; a component that fails to start raises
:class:`~testbed.errors.ClusterError` naming it with the tail of its log, and the work
dir is then kept for inspection.

The nodes are KWOK's today. Real kubelet nodes will join the same way: a node is "something that
runs beside the control plane and registers a Node"; see :meth:`Cluster.add_pool` and
``_domains``, the per-domain process table that a kubelet-backed domain can share.
"""

from __future__ import annotations

import atexit
import json
import shutil
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import kwok
from testbed.binaries import Binaries, find_binaries
from testbed.certs import DEFAULT_SERVICE_CIDR, ClusterPki, generate_cluster_pki
from testbed.errors import ClusterError
from testbed.kubeconfig import render_kubeconfig, write_kubeconfig
from testbed.process import Process, stop_all
from testbed.realnodes import RealNodes
from testbed.wait import WaitTimeout, wait_for
from torchkube.local.ports import free_port

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass
class ClusterConfig:
    """How to start a test cluster. The defaults suit the test suite; the dev CLI overrides some."""

    pools: list[kwok.NodePool] = field(default_factory=kwok.default_pools)
    """Fake node pools created at start (more can be added later with ``add_pool``)."""
    node_monitor_grace_period_s: int = 20
    """How long without a lease renewal before the node-lifecycle controller marks a node
    ``Ready=Unknown``. Production default is 40 s; shorter keeps node-loss tests quick."""
    node_lease_duration_s: int = 20
    """KWOK node lease duration; leases renew every quarter of it (4 renewals per grace period,
    as a kubelet's 40 s lease has with the default grace period)."""
    service_cidr: str = DEFAULT_SERVICE_CIDR
    """Service ClusterIP range; its first address is in the apiserver certificate. With real
    nodes the cluster uses a range inside their network instead (``Cluster.service_cidr``)."""
    start_timeout_s: float = 120.0
    """Per-component readiness deadline; generous because CI machines are shared and slow."""
    workdir: Path | None = None
    """Where certificates, data and logs go; a fresh temporary folder when None."""
    keep_workdir: bool = False
    """Keep the work dir after a successful stop (it is always kept after a failure)."""
    extra_sans: list[str] = field(default_factory=list)
    """More names/IPs for the apiserver certificate (e.g. an address real nodes will dial)."""
    apiserver_args: list[str] = field(default_factory=list)
    """Extra kube-apiserver flags (feature gates, admission plugins) for a test that needs them."""
    scheduler_client_qps: int | None = None
    """kube-scheduler's API client rate (its burst is twice this). None keeps the defaults,
    50 requests/s with a burst of 100, which bind at most 50 pods a second; production clusters
    of thousands of nodes raise it (the scale benchmark shows both)."""
    real_nodes: int = 0
    """Real kubelet nodes (containerd, CNI bridge, CoreDNS) started beside the KWOK pools; see
    :mod:`testbed.realnodes`. Needs root and ``hack/install-system-deps.sh``."""


def scheduler_configuration(kubeconfig: Path, client_qps: int | None) -> str:
    """A KubeSchedulerConfiguration: its kubeconfig, no leader election, and the client rate
    when one is given (the flags for these are ignored once a configuration file is used)."""
    connection: dict[str, object] = {"kubeconfig": str(kubeconfig)}
    if client_qps is not None:
        connection |= {"qps": client_qps, "burst": 2 * client_qps}
    return json.dumps(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": connection,
            "leaderElection": {"leaderElect": False},
        }
    )


def _report_to_stderr(message: str) -> None:
    print(f"[testbed] {message}", file=sys.stderr, flush=True)


_live_clusters: set[Cluster] = set()


@atexit.register
def _stop_leftovers() -> None:
    # A last resort for interpreters that exit without teardown (an uncaught error in a script).
    for cluster in list(_live_clusters):
        cluster.stop()


class Cluster:
    """A running (or startable) test cluster; use as a context manager or call start/stop.

    >>> with Cluster() as cluster:                       # doctest: +SKIP
    ...     api = cluster.api_client()
    """

    def __init__(
        self,
        config: ClusterConfig | None = None,
        binaries: Binaries | None = None,
        report: Callable[[str], None] | None = None,
    ):
        self.config = config or ClusterConfig()
        self._binaries = binaries
        self.report = report or _report_to_stderr
        """Where the cluster says what people should know (e.g. where its logs were kept);
        standard error by default."""
        self._workdir: Path | None = None
        self._core_api: Any = None
        self.pki: ClusterPki | None = None
        self.ports: dict[str, int] = {}
        self.processes: dict[str, Process] = {}
        self._domains: dict[str, Process | None] = {}
        """Failure domain -> its kwok process (None while the domain is killed)."""
        self._pools: dict[str, kwok.NodePool] = {}
        self._node_slots = 0
        self._failed = False
        self._lock = threading.Lock()
        self.started_in_s: float | None = None
        self.real_nodes: RealNodes | None = None
        """The real kubelet nodes (``config.real_nodes`` > 0), once started."""

    # ----------------------------------------------------------------------------- properties
    @property
    def workdir(self) -> Path:
        """Folder with certificates, etcd data, kubeconfigs and logs of this run."""
        if self._workdir is None:
            raise ClusterError("cluster", "not started")
        return self._workdir

    @property
    def server(self) -> str:
        """The apiserver URL, ``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def service_cidr(self) -> str:
        """The Service range: the config's, or with real nodes one inside their network, so
        pods reach the ``kubernetes`` Service's ClusterIP (:mod:`testbed.apiproxy`)."""
        if self.real_nodes is not None:
            return self.real_nodes.service_cidr
        return self.config.service_cidr

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (user ``kubernetes-admin`` in ``system:masters``)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def log_dir(self) -> Path:
        """Folder with one log file per component."""
        return self.workdir / "logs"

    @property
    def domains(self) -> list[str]:
        """Failure domains, killed ones included."""
        return sorted(self._domains)

    @property
    def pools(self) -> dict[str, kwok.NodePool]:
        """Node pools by name."""
        return dict(self._pools)

    def binaries(self) -> Binaries:
        """The binaries this cluster runs (located or built on first use)."""
        if self._binaries is None:
            self._binaries = find_binaries()
        return self._binaries

    def _pki(self) -> ClusterPki:
        if self.pki is None:
            raise ClusterError("cluster", "not started")
        return self.pki

    # ----------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(failed=exc_type is not None)

    def start(self) -> Cluster:
        """Start every component and wait until the cluster schedules and runs pods.

        On any failure, everything already started is stopped, the work dir is kept, and a
        :class:`ClusterError` naming the component is raised.
        """
        started = time.monotonic()
        binaries = self.binaries()
        binaries.require()
        if self.config.workdir is not None:
            workdir = Path(self.config.workdir)
            # stop() deletes the work dir: never adopt a folder that holds anything already.
            if workdir.exists() and any(workdir.iterdir()):
                raise ClusterError("cluster", f"work dir {workdir} is not empty")
            workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="torchkube-cluster-"))
        _live_clusters.add(self)
        try:
            if self.config.real_nodes:  # their network decides the Service range
                self.real_nodes = RealNodes(self, self.config.real_nodes)
            self.pki = generate_cluster_pki(
                self.workdir / "pki", self.service_cidr, self.config.extra_sans
            )
            self._start_etcd(binaries)
            self._start_apiserver(binaries)
            self._write_kubeconfigs()
            self._start_controller_manager(binaries)
            self._start_scheduler(binaries)
            for pool in self.config.pools:
                self.add_pool(pool, wait=False)
            self._wait_controller_manager()
            self._wait_scheduler()
            for pool in self.config.pools:
                self.wait_pool_ready(pool.name)
            if self.real_nodes is not None:
                self.real_nodes.start(self.config.start_timeout_s)
        except BaseException:
            self.stop(failed=True)
            raise
        self.started_in_s = time.monotonic() - started
        self._write_state()
        return self

    def stop(self, failed: bool = False) -> None:
        """Stop every component (all at once), then delete the work dir unless a run failed.

        ``failed`` marks the run as failed (e.g. a test failed): logs are kept and their path is
        reported.
        """
        with self._lock:
            self._failed = self._failed or failed
            if self.real_nodes is not None:  # before the apiserver: kubelets talk to it
                self.real_nodes.stop()
                self.real_nodes = None
            # Clients first, all at once; etcd last so the apiserver does not log its loss.
            processes = [p for p in self._domain_processes() if p is not None]
            processes += [p for name, p in self.processes.items() if name != "etcd"]
            stop_all(processes)
            stop_all([p for name, p in self.processes.items() if name == "etcd"])
            self.processes.clear()
            self._domains.clear()
            self._core_api = None
            _live_clusters.discard(self)
            if self._workdir is None or not self._workdir.exists():
                return
            if self._failed or self.config.keep_workdir:
                self.report(f"cluster logs kept in {self.log_dir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def mark_failed(self) -> None:
        """Keep the work dir at stop (a test that used the cluster failed)."""
        self._failed = True

    def check(self) -> None:
        """Raise :class:`ClusterError` if a control-plane component died (killed domains aside)."""
        for proc in self.processes.values():
            proc.check_alive()
        if self.real_nodes is not None:
            self.real_nodes.check()

    # ----------------------------------------------------------------------------- clients
    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` authenticated as the cluster admin."""
        from kubernetes import config as k8s_config

        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    def _core(self) -> Any:
        if self._core_api is None:
            from kubernetes import client

            self._core_api = client.CoreV1Api(self.api_client())
        return self._core_api

    # ----------------------------------------------------------------------------- components
    def component_pids(self) -> dict[str, int]:
        """The running components' process ids by name, KWOK's as ``kwok-<domain>``: what a
        benchmark charges the cluster's CPU time to."""
        procs = {**self.processes, **{f"kwok-{d}": p for d, p in self._domains.items() if p}}
        return {name: proc.pid for name, proc in procs.items() if proc.pid is not None}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        proc = Process(name, argv, self.log_dir / f"{name}.log", env=env).start()
        self.processes[name] = proc
        return proc

    def _wait_http(
        self, proc: Process, url: str, context: ssl.SSLContext | None, what: str
    ) -> None:
        def healthy() -> bool:
            proc.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            wait_for(healthy, self.config.start_timeout_s, interval=0.2, what=what)
        except WaitTimeout as exc:
            raise proc.error(str(exc)) from None

    def _admin_tls(self) -> ssl.SSLContext:
        pki = self._pki()
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
        return context

    @staticmethod
    def _self_signed_tls() -> ssl.SSLContext:
        # kube-controller-manager and kube-scheduler serve /healthz with a self-signed cert.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context

    def _start_etcd(self, binaries: Binaries) -> None:
        client_port, peer_port = free_port(), free_port()
        self.ports["etcd"] = client_port
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        proc = self._spawn(
            "etcd",
            [
                str(binaries.path("etcd")),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                # Test data is disposable: skipping fsync keeps a shared CI disk from slowing
                # every write the apiserver makes.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait_http(proc, f"{client_url}/health", None, "etcd /health")

    def _start_apiserver(self, binaries: Binaries) -> None:
        pki = self._pki()
        port = free_port()
        self.ports["kube-apiserver"] = port
        argv = [
            str(binaries.path("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki.apiserver.cert}",
            f"--tls-private-key-file={pki.apiserver.key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-key-file={pki.service_account.cert}",
            f"--service-account-signing-key-file={pki.service_account.key}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={self.service_cidr}",
            # A loopback advertise address is not a valid Endpoints address.
            "--endpoint-reconciler-type=none",
            # For real nodes later: reach kubelets by InternalIP, authenticate as a client.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
            f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
            "--allow-privileged=true",
            # Aggregation layer, as kubeadm sets it up; delegated authentication in the
            # controller-manager and scheduler reads these from the apiserver.
            f"--requestheader-client-ca-file={pki.front_proxy_ca.paths.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
            f"--proxy-client-key-file={pki.front_proxy_client.key}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--profiling=false",
            # Its log then names each watch it closes as not drained in time (key, selectors):
            # whose watch fell behind a burst of pods (bench.watchers).
            "--v=1",
            *self.config.apiserver_args,
        ]
        proc = self._spawn("kube-apiserver", argv)
        self._wait_http(proc, f"{self.server}/readyz", self._admin_tls(), "kube-apiserver /readyz")

    def _write_kubeconfigs(self) -> None:
        pki = self._pki()
        write_kubeconfig(self.kubeconfig, render_kubeconfig(self.server, pki.ca_cert, pki.admin))
        write_kubeconfig(
            self.workdir / "controller-manager.kubeconfig",
            render_kubeconfig(
                self.server, pki.ca_cert, pki.controller_manager, user="controller-manager"
            ),
        )
        write_kubeconfig(
            self.workdir / "scheduler.kubeconfig",
            render_kubeconfig(self.server, pki.ca_cert, pki.scheduler, user="scheduler"),
        )

    def _start_controller_manager(self, binaries: Binaries) -> None:
        pki = self._pki()
        port = free_port()
        self.ports["kube-controller-manager"] = port
        kubeconfig = self.workdir / "controller-manager.kubeconfig"
        self._spawn(
            "kube-controller-manager",
            [
                str(binaries.path("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                f"--service-account-private-key-file={pki.service_account.key}",
                f"--root-ca-file={pki.ca_cert}",
                # Each controller acts under its own ServiceAccount, so RBAC gaps show up here
                # exactly as in production.
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={pki.ca.paths.cert}",
                f"--cluster-signing-key-file={pki.ca.paths.key}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--leader-elect=false",
                f"--node-monitor-grace-period={self.config.node_monitor_grace_period_s}s",
                "--node-monitor-period=2s",
            ],
        )

    def _wait_controller_manager(self) -> None:
        proc = self.processes["kube-controller-manager"]
        port = self.ports["kube-controller-manager"]
        self._wait_http(
            proc,
            f"https://127.0.0.1:{port}/healthz",
            self._self_signed_tls(),
            "kube-controller-manager /healthz",
        )
        # Healthy is not working: wait until the serviceaccount controller has done its job.
        core = self._core()

        def default_service_account() -> bool:
            proc.check_alive()
            try:
                core.read_namespaced_service_account("default", "default")
            except Exception:
                return False
            return True

        try:
            wait_for(
                default_service_account,
                self.config.start_timeout_s,
                what="the 'default' ServiceAccount (serviceaccount controller)",
            )
        except WaitTimeout as exc:
            raise proc.error(str(exc)) from None

    def _start_scheduler(self, binaries: Binaries) -> None:
        port = free_port()
        self.ports["kube-scheduler"] = port
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        config = self.workdir / "scheduler-config.yaml"
        config.write_text(scheduler_configuration(kubeconfig, self.config.scheduler_client_qps))
        self._spawn(
            "kube-scheduler",
            [
                str(binaries.path("kube-scheduler")),
                f"--config={config}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-certs'}",
            ],
        )

    def _wait_scheduler(self) -> None:
        # /readyz includes the informer-sync check, so a ready scheduler schedules at once.
        self._wait_http(
            self.processes["kube-scheduler"],
            f"https://127.0.0.1:{self.ports['kube-scheduler']}/readyz",
            self._self_signed_tls(),
            "kube-scheduler /readyz",
        )

    # ----------------------------------------------------------------------------- nodes
    def _domain_processes(self) -> list[Process | None]:
        return list(self._domains.values())

    def _start_domain(self, domain: str) -> Process:
        home = self.workdir / "kwok-home" / domain
        (home / ".kwok").mkdir(parents=True, exist_ok=True)
        (home / ".kwok" / "kwok.yaml").write_text(kwok.kubelet_stages_config())
        name = f"kwok-{domain}"
        argv = kwok.kwok_argv(
            self.binaries().path("kwok"), self.kubeconfig, domain, self.config.node_lease_duration_s
        )
        proc = Process(name, argv, self.log_dir / f"{name}.log", env={"HOME": str(home)}).start()
        self._domains[domain] = proc
        return proc

    def domain_process(self, domain: str) -> Process | None:
        """The kwok process of ``domain`` (None while killed); KeyError for unknown domains."""
        return self._domains[domain]

    def add_pool(self, pool: kwok.NodePool, wait: bool = True) -> list[str]:
        """Create ``pool``'s nodes (starting its domain's kwok if needed); return their names.

        With ``wait``, return only when every node is Ready. Tests that break nodes should add a
        pool of their own in a domain of their own, so the session's shared nodes stay intact.
        """
        from kubernetes.client.exceptions import ApiException

        if pool.name in self._pools:
            raise ValueError(f"node pool {pool.name!r} already exists")
        if pool.failure_domain not in self._domains:
            self._start_domain(pool.failure_domain)
        self._pools[pool.name] = pool
        core = self._core()
        for name in pool.node_names():
            manifest = kwok.node_manifest(pool, name, self._node_slots)
            self._node_slots += 1
            try:
                core.create_node(manifest)
            except ApiException as exc:
                if exc.status != 409:
                    raise ClusterError(f"node {name}", f"create failed: {exc.reason}") from exc
        if wait:
            self.wait_pool_ready(pool.name)
        return pool.node_names()

    def ensure_pool_nodes(self, pool_name: str) -> list[str]:
        """Re-create any of the pool's nodes that were deleted; return the names re-created."""
        from kubernetes.client.exceptions import ApiException

        pool = self._pools[pool_name]
        core = self._core()
        created = []
        for name in pool.node_names():
            try:
                core.read_node(name)
                continue
            except ApiException as exc:
                if exc.status != 404:
                    raise
            core.create_node(kwok.node_manifest(pool, name, self._node_slots))
            self._node_slots += 1
            created.append(name)
        return created

    def remove_pool(self, pool_name: str) -> None:
        """Delete a pool's nodes; stop its domain's kwok when no other pool uses the domain."""
        from kubernetes.client.exceptions import ApiException

        pool = self._pools.pop(pool_name)
        core = self._core()
        for name in pool.node_names():
            try:
                core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        domain = pool.failure_domain
        if not any(p.failure_domain == domain for p in self._pools.values()):
            proc = self._domains.pop(domain, None)
            if proc is not None:
                proc.stop()

    def node_ready_status(self, node: str) -> str:
        """The node's ``Ready`` condition status: "True", "False", "Unknown" or "" if absent."""
        status = self._core().read_node_status(node).status
        for condition in status.conditions or []:
            if condition.type == "Ready":
                return str(condition.status)
        return ""

    def wait_pool_ready(self, pool_name: str, timeout: float | None = None) -> None:
        """Wait until every node of the pool is Ready (kwok's process must be alive)."""
        pool = self._pools[pool_name]
        proc = self._domains.get(pool.failure_domain)
        pending = set(pool.node_names())
        last: dict[str, str] = {}

        def all_ready() -> bool:
            if proc is not None:
                proc.check_alive()
            for name in sorted(pending):
                try:
                    last[name] = self.node_ready_status(name)
                except Exception as exc:  # not yet visible, or a transient API error
                    last[name] = f"error: {exc}"
                if last[name] == "True":
                    pending.discard(name)
            return not pending

        try:
            wait_for(
                all_ready,
                timeout or self.config.start_timeout_s,
                interval=0.3,
                what=f"nodes of pool {pool_name!r} to be Ready",
                describe_last=lambda: json.dumps({n: last.get(n) for n in sorted(pending)}),
            )
        except WaitTimeout as exc:
            if proc is None:
                raise ClusterError(
                    f"kwok-{pool.failure_domain}", f"{exc} (domain is killed)"
                ) from None
            raise proc.error(str(exc)) from None

    def kill_domain(self, domain: str) -> None:
        """SIGKILL the domain's kwok process: its nodes stop heartbeating, as in a node loss.

        The real node-lifecycle controller then marks them ``Ready=Unknown`` after the grace
        period and taints them ``node.kubernetes.io/unreachable``. Pods stay bound (and, once
        deleted, stay Terminating) until the Node is deleted, exactly as with a dead kubelet.
        """
        proc = self._domains[domain]
        if proc is not None:
            proc.kill()
        self._domains[domain] = None

    def restart_domain(self, domain: str, wait: bool = True) -> None:
        """Bring a killed domain back: re-create deleted nodes, restart kwok, wait for Ready."""
        if domain not in self._domains:
            raise KeyError(f"unknown failure domain {domain!r}")
        if self._domains[domain] is None:
            self._start_domain(domain)
        pools = [p for p in self._pools.values() if p.failure_domain == domain]
        for pool in pools:
            self.ensure_pool_nodes(pool.name)
        if wait:
            for pool in pools:
                self.wait_pool_ready(pool.name)

    def domain_of(self, node: str) -> str:
        """The failure domain a node of this cluster belongs to."""
        for pool in self._pools.values():
            if node in pool.node_names():
                return pool.failure_domain
        raise KeyError(f"{node!r} is not a node of this cluster's pools")

    # ----------------------------------------------------------------------------- state
    def describe(self) -> dict[str, Any]:
        """Where everything is: for people (``dev-cluster up``) and for ``dev-cluster down``."""
        return {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "workdir": str(self.workdir),
            "logs": str(self.log_dir),
            "bin": str(self.binaries().bin_dir),
            "ports": dict(self.ports),
            "pids": {name: proc.pid for name, proc in self.processes.items()},
            "domains": {d: (p.pid if p else None) for d, p in self._domains.items()},
            "pools": {name: pool.node_names() for name, pool in self._pools.items()},
            "started_in_s": self.started_in_s,
            "real_nodes": self.real_nodes.describe() if self.real_nodes else None,
        }

    def _write_state(self) -> None:
        (self.workdir / "cluster.json").write_text(json.dumps(self.describe(), indent=2))
