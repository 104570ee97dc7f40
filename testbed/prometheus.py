"""A real Prometheus for tests: Debian's ``prometheus`` on 127.0.0.1.

The server gets a random loopback port, a config file and a data dir in a folder of its own,
and a 1 s scrape interval, so a test sees a metric within seconds of it being exposed. Static
targets are addresses on 127.0.0.1 given by the test (KWOK's made-up pod IPs are never
scraped); on real nodes, :func:`pod_monitor_job` discovers pods through Kubernetes as
prometheus-operator does from the chart's PodMonitors. ``honor_labels`` is on, as it must be
for torchkube's metrics (their ``namespace`` and ``job`` labels name the TrainingJob, not the
scrape target; see docs/metrics.md).

A missing binary or a server that does not start raises :class:`ClusterError` with the log
tail: tests that need Prometheus fail loudly instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import ClusterError
from testbed.ports import free_port
from testbed.process import Process
from testbed.wait import wait_for

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


def pod_monitor_job(monitor: Mapping[str, Any], kubeconfig: Path, interval: str) -> dict[str, Any]:
    """A prometheus-operator PodMonitor (as the chart renders it) as the scrape config the
    operator would generate from it: pods discovered through ``kubernetes_sd_configs`` (role
    pod) in its namespaces, kept by its label selector and port name, with the ``namespace``,
    ``pod`` and ``container`` target labels. Prometheus runs on this machine, so it reaches the
    API with ``kubeconfig`` and the pods at their IPs through the real nodes' bridges."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    sd: dict[str, Any] = {"role": "pod", "kubeconfig_file": str(kubeconfig)}
    names = spec.get("namespaceSelector", {}).get("matchNames")
    if names:
        sd["namespaces"] = {"names": list(names)}
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
    return {
        "job_name": f"podMonitor/{metadata['namespace']}/{metadata['name']}",
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels")),
        "kubernetes_sd_configs": [sd],
        "relabel_configs": relabel,
    }


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
        discovered: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """``jobs`` are static loopback targets; ``discovered`` are ready scrape configs
        (:func:`pod_monitor_job`) that find their targets through Kubernetes."""
        self.workdir = workdir
        self.jobs = list(jobs)
        self.discovered = [dict(job) for job in discovered]
        self.scrape_interval = scrape_interval
        self.port = 0
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ life cycle
    def write_config(self) -> Path:
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [job.config(self.scrape_interval) for job in self.jobs]
            + self.discovered,
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self, attempts: int = 3) -> Prometheus:
        """Start and wait for ``/-/ready``; a port lost to a race is retried with another."""
        binary = find_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.write_config()
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
