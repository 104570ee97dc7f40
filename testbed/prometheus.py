"""A real Prometheus for tests: Debian's ``prometheus`` on 127.0.0.1.

The server gets a random loopback port, a config file and a data dir in a folder of its own,
and a 1 s scrape interval, so a test sees a metric within seconds of it being exposed. Static
targets are addresses on 127.0.0.1 given by the test (KWOK's made-up pod IPs are never
scraped); on real nodes, :func:`pod_monitor_job` turns the chart's PodMonitors into the scrape
configs prometheus-operator generates from them. ``honor_labels`` is on, as it must be for
torchkube's metrics (their ``namespace`` and ``job`` labels name the TrainingJob, not the
scrape target; see docs/metrics.md).

Debian builds Prometheus without its Kubernetes service discovery (``kubernetes_sd_configs``
is not a known field there), so :class:`PodDiscovery` does that part: it lists the pods
through the API every second and writes them, one target per named container port with the
``__meta_kubernetes_pod_*`` labels Kubernetes SD gives (role pod), to a file Prometheus reads
through ``file_sd_configs``. The PodMonitor's relabeling rules then apply unchanged.

A missing binary or a server that does not start raises :class:`ClusterError` with the log
tail: tests that need Prometheus fail loudly instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import ClusterError
from testbed.process import Process
from testbed.wait import wait_for
from torchkube.local.ports import free_port

BINARY_ENV = "TORCHKUBE_PROMETHEUS"
"""Path of a ``prometheus`` binary to use instead of the one on PATH."""
INSTALL_HINT = "install Debian's prometheus package (hack/install-system-deps.sh does)"
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: loopback addresses and the target labels Kubernetes SD would add."""

    name: str
    targets: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict)

    def config(self, interval: str) -> dict[str, Any]:
        for target in self.targets:
            if not target.startswith("127.0.0.1:"):
                raise ValueError(f"scrape target {target} is not on 127.0.0.1")
        return {
            "job_name": self.name,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "honor_labels": True,
            "static_configs": [{"targets": list(self.targets), "labels": dict(self.labels)}],
        }


def _label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus' service discovery names it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


@dataclass(frozen=True)
class PodMonitorJob:
    """A PodMonitor's scrape job: its scrape config, and the namespaces whose pods are
    discovered for it (None: every namespace)."""

    name: str
    namespaces: Sequence[str] | None
    kubeconfig: Path
    config: Mapping[str, Any]

    def scrape_config(self, targets_file: Path) -> dict[str, Any]:
        sd = {"files": [str(targets_file)], "refresh_interval": "1s"}
        return {**self.config, "file_sd_configs": [sd]}


def pod_monitor_job(monitor: Mapping[str, Any], kubeconfig: Path, interval: str) -> PodMonitorJob:
    """A prometheus-operator PodMonitor (as the chart renders it) as the scrape config the
    operator would generate from it: pods of its namespaces (role pod discovery, see
    :class:`PodDiscovery`), kept by its label selector and port name, with the ``namespace``,
    ``pod`` and ``container`` target labels. Prometheus runs on this machine, so it reaches
    the pods at their IPs through the real nodes' bridges."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    names = spec.get("namespaceSelector", {}).get("matchNames")
    relabel: list[dict[str, Any]] = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_pod_label_{_label_name(key)}",
                f"__meta_kubernetes_pod_labelpresent_{_label_name(key)}",
            ],
            "regex": f"({re.escape(value)});true",
        }
        for key, value in spec["selector"]["matchLabels"].items()
    ]
    relabel += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
        },
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    metadata = monitor["metadata"]
    name = f"podMonitor/{metadata['namespace']}/{metadata['name']}"
    config = {
        "job_name": name,
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels")),
        "relabel_configs": relabel,
    }
    return PodMonitorJob(name, list(names) if names else None, kubeconfig, config)


def pod_targets(pods: Sequence[Any]) -> list[dict[str, Any]]:
    """Target groups as Prometheus' Kubernetes SD (role pod) makes them: one per named
    container port of a pod with an IP, with its ``__meta_kubernetes_*`` labels."""
    groups = []
    for pod in pods:
        ip = pod.status.pod_ip
        if not ip:
            continue
        meta: dict[str, str] = {
            "__meta_kubernetes_namespace": pod.metadata.namespace,
            "__meta_kubernetes_pod_name": pod.metadata.name,
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": pod.status.phase or "",
            "__meta_kubernetes_pod_node_name": pod.spec.node_name or "",
        }
        for key, value in (pod.metadata.labels or {}).items():
            meta[f"__meta_kubernetes_pod_label_{_label_name(key)}"] = value
            meta[f"__meta_kubernetes_pod_labelpresent_{_label_name(key)}"] = "true"
        for container in pod.spec.containers:
            for port in container.ports or []:
                if not port.name:
                    continue
                labels = meta | {
                    "__meta_kubernetes_pod_container_name": container.name,
                    "__meta_kubernetes_pod_container_port_name": port.name,
                    "__meta_kubernetes_pod_container_port_number": str(port.container_port),
                }
                groups.append({"targets": [f"{ip}:{port.container_port}"], "labels": labels})
    return groups


class PodDiscovery:
    """Kubernetes pod discovery for one :class:`PodMonitorJob`, written for ``file_sd``:
    every second, the pods of its namespaces as :func:`pod_targets` (see the module
    docstring for why)."""

    INTERVAL = 1.0

    def __init__(self, job: PodMonitorJob, targets_file: Path) -> None:
        self.job, self.targets_file = job, targets_file
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pod-discovery", daemon=True)
        self.error: Exception | None = None

    def _list(self, core: Any) -> list[Any]:
        if self.job.namespaces is None:
            return list(core.list_pod_for_all_namespaces().items)
        return [p for ns in self.job.namespaces for p in core.list_namespaced_pod(ns).items]

    def write(self, groups: list[dict[str, Any]]) -> None:
        """Replace the targets file at once (a rename), so Prometheus never reads half."""
        partial = self.targets_file.with_suffix(".tmp")
        partial.write_text(json.dumps(groups))
        partial.replace(self.targets_file)

    def _run(self) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(self.job.kubeconfig))
        core = client.CoreV1Api(api)
        try:
            while not self.stopped.wait(self.INTERVAL):
                try:
                    self.write(pod_targets(self._list(core)))
                    self.error = None
                except Exception as error:  # an apiserver restart: keep the last targets
                    self.error = error
        finally:
            api.close()

    def start(self) -> PodDiscovery:
        self.write([])
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)


class PrometheusError(RuntimeError):
    """The HTTP API answered with an error (a bad query, usually); the message is Prometheus'."""


def find_binary() -> Path:
    """The ``prometheus`` binary: ``$TORCHKUBE_PROMETHEUS`` or PATH; ClusterError if neither."""
    configured = os.environ.get(BINARY_ENV)
    found = configured or shutil.which("prometheus")
    if not found or not os.access(found, os.X_OK):
        where = f"{BINARY_ENV}={configured}" if configured else "PATH"
        raise ClusterError("prometheus", f"no prometheus binary on {where}: {INSTALL_HINT}")
    return Path(found)


class Prometheus:
    """``with Prometheus(workdir, [ScrapeJob(...)]) as prom: prom.query(...)``."""

    def __init__(
        self,
        workdir: Path,
        jobs: Sequence[ScrapeJob],
        scrape_interval: str = "1s",
        discovered: Sequence[PodMonitorJob] = (),
    ) -> None:
        """``jobs`` are static loopback targets; ``discovered`` PodMonitor jobs
        (:func:`pod_monitor_job`) whose targets are the cluster's pods."""
        self.workdir = workdir
        self.jobs = list(jobs)
        self.discovered = list(discovered)
        self.discoveries: list[PodDiscovery] = []
        self.scrape_interval = scrape_interval
        self.port = 0
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ life cycle
    def _targets_file(self, index: int) -> Path:
        return self.workdir / f"pods-{index}.json"

    def write_config(self) -> Path:
        discovered = [
            job.scrape_config(self._targets_file(index))
            for index, job in enumerate(self.discovered)
        ]
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [job.config(self.scrape_interval) for job in self.jobs] + discovered,
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self, attempts: int = 3) -> Prometheus:
        """Start and wait for ``/-/ready``; a port lost to a race is retried with another."""
        binary = find_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
        self.discoveries = [
            PodDiscovery(job, self._targets_file(index)).start()
            for index, job in enumerate(self.discovered)
        ]
        for attempt in range(attempts):
            self.port = free_port()
            data = self.workdir / "data"
            shutil.rmtree(data, ignore_errors=True)
            self.process = Process(
                "prometheus",
                [
                    str(binary),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--log.level=info",
                ],
                self.workdir / "prometheus.log",
            ).start()
            try:
                wait_for(self._ready, START_TIMEOUT, interval=0.1, what="Prometheus /-/ready")
                return self
            except ClusterError as error:
                if "address already in use" in error.log_tail and attempt + 1 < attempts:
                    continue
                raise
            except TimeoutError as error:
                self.stop()
                raise self.process.error(f"not ready after {START_TIMEOUT:.0f}s") from error
        raise AssertionError("unreachable")

    def _ready(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        for discovery in self.discoveries:
            discovery.stop()
        if self.process is not None:
            self.process.stop(timeout=10)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        return self.process.tail(lines) if self.process else ""

    # ------------------------------------------------------------------ HTTP API
    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, PrometheusError otherwise."""
        pairs: list[tuple[str, str]] = []
        for key, value in params.items():
            for item in value if isinstance(value, list | tuple) else [value]:
                pairs.append((key, str(item)))
        query = urllib.parse.urlencode(pairs)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            try:
                body = json.loads(error.read())
            except ValueError:
                raise PrometheusError(f"{url}: HTTP {error.code}") from error
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: the result vector (or scalar as a one-element list)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result = data["result"]
        return [{"metric": {}, "value": result}] if data["resultType"] == "scalar" else result

    def query_range(
        self, expr: str, start: float, end: float, step: float = 1.0
    ) -> list[dict[str, Any]]:
        """A range query, as a Grafana time-series panel sends it: the result matrix."""
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step}"
        )
        return list(data["result"])

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params: dict[str, Any] = {"match[]": match} if match else {}
        return list(self.api(f"label/{label}/values", **params))

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def wait_scraped(self, timeout: float = 30) -> None:
        """Until every target has been scraped successfully at least once."""

        def all_up() -> bool:
            found = self.targets()
            return bool(found) and all(t.get("health") == "up" for t in found)

        wait_for(
            all_up,
            timeout,
            interval=0.25,
            what="every Prometheus target to be scraped",
            describe_last=lambda: json.dumps(
                [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in self.targets()]
            ),
        )

    def wait_for_series(self, expr: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Until the instant query ``expr`` returns something; returns it."""
        result: list[dict[str, Any]] = wait_for(
            lambda: self.query(expr), timeout, interval=0.25, what=f"Prometheus to have {expr}"
        )
        return result
