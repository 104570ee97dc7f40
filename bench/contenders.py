"""The operators a benchmark puts side by side on one cluster: torchkube and Kubeflow's
training-operator (in one or more configurations). Each knows how to submit a job of N worker
pods, which pods are its workers, and what it has cost so far (API requests, reconciles, CPU
seconds, peak memory), so a scenario is written once and run for all, alternating job by job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench import kubeflow
from bench.kube import PodTimes, Stack, job_body, metric_delta, parse_metrics
from torchkube.api import labels as lbl
from torchkube.policy.queue import QUEUE_LABEL

PEER = "Kubeflow"


class Contender(Protocol):
    name: str
    selector: str
    """Label selector of its worker pods."""
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

    def restart(self, bench: Stack) -> None:
        bench.restart_operator()

    def _samples(self) -> Any:
        return self.bench.metrics()

    def requests(self) -> float:
        return sum(metric_delta({}, self._samples(), "torchkube_api_requests_total").values())

    def reconciles(self) -> float:
        return sum(
            metric_delta({}, self._samples(), "torchkube_reconcile_duration_seconds_count").values()
        )

    def cpu_seconds(self) -> float:
        return self.bench.operator_cpu_seconds()

    def peak_rss(self) -> int:
        return self.bench.operator_peak_rss()


@dataclass
class Kubeflow:
    operator: kubeflow.KubeflowOperator
    name: str = PEER
    selector: str = kubeflow.JOB_LABEL
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


@contextlib.contextmanager
def contenders(
    bench: Stack, peers: bool, configs: Sequence[kubeflow.PeerConfig] = (kubeflow.DEFAULT,)
) -> Iterator[list[Contender]]:
    """torchkube, and with ``peers`` Kubeflow's operator in each of ``configs`` started beside
    it on the same cluster (built by pin, installed, its start not timed); stops the peers
    afterwards. Two configurations would both reconcile every PyTorchJob, so with more than
    one each is confined to a namespace of its own (its ``home``)."""
    players: list[Contender] = [Torchkube(bench)]
    if not peers:
        yield players
        return
    build = kubeflow.build()
    kubeflow.install(bench.api, build)
    started: list[Kubeflow] = []
    try:
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
