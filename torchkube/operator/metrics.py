"""The operator's Prometheus metrics (every one is documented in docs/metrics.md).

With several replicas only the leader exports what describes jobs (the fleet gauge and every
series with a namespace label): a follower exports only its own health (its watch, its
requests, whether it leads), so sums over replicas count each job once, and a replica that
stops leading removes its job series at once (:func:`forget_jobs`) instead of leaving them
at their last values beside the new leader's.

Labels stay low-cardinality: namespace, job, phase, reason, cause, verb, resource — never a
pod, a node or a step — and a job's topology level and domains, at most
``MAX_TOPOLOGY_DOMAINS`` per job (a job spread wider is counted, not listed). Per-job and
per-namespace series are created at zero when the operator first sees the job, so
``increase()`` sees the first failure too (a series born at 1 shows no increase), and per-job
ones are removed when the job is deleted. The start-up histogram has no namespace label for the
same reason: its one observation per job comes right after the job is first seen, before
Prometheus could have scraped a new zero series.

The ``namespace`` and ``job`` labels name the TrainingJob, not the scrape target: scrape the
operator with ``honor_labels: true`` (a ServiceMonitor's/PodMonitor's ``honorLabels``), as for
kube-state-metrics, or Prometheus renames them ``exported_namespace`` / ``exported_job``.
"""

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, get_args

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchkube.api import TrainingJob
from torchkube.api import labels as lbl
from torchkube.api.reasons import FailureReason
from torchkube.api.status import TopologyStatus
from torchkube.api.times import parse_time
from torchkube.operator import conditions as cond
from torchkube.operator.goodput import CAUSES, Goodput

if TYPE_CHECKING:  # a plan and what the job's metrics carry over are read, never built here
    from torchkube.operator.decision import Plan
    from torchkube.operator.memory import Accounting

State = TypeVar("State")

FAILURE_REASONS: tuple[str, ...] = get_args(FailureReason)
JOB_FAILURE_REASONS = (
    "PermanentFailure",
    "MaxRestartsExceeded",
    "DeadlineExceeded",
    "StartDeadlineExceeded",
    "PodCreateRefused",
    "InvalidImageName",
)
"""Condition reasons of a job that ended Failed (the operator's policies)."""

JOBS = Gauge("torchkube_jobs", "TrainingJobs by namespace and phase.", ["namespace", "phase"])
RESTARTS = Counter(
    "torchkube_job_restarts_total",
    "Worker failures the operator replaced, by job and failure reason.",
    ["namespace", "job", "reason"],
)
POD_REPLACEMENTS = Counter(
    "torchkube_pod_replacements_total",
    "Worker pods created to replace a failed, lost or evicted one.",
    ["namespace"],
)
NODE_LOSS = Counter(
    "torchkube_node_loss_detections_total",
    "Workers declared lost because their node stopped being Ready beyond the grace or was deleted.",
    ["namespace"],
)
JOB_FAILURES = Counter(
    "torchkube_job_failures_total", "Jobs that ended Failed, by reason.", ["namespace", "reason"]
)
STARTUP = Histogram(
    "torchkube_job_startup_seconds",
    "From job creation to all desired workers Running (first start only).",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
RECOVERY = Histogram(
    "torchkube_recovery_seconds",
    "From a worker failure to all desired workers Running again.",
    ["namespace"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
SPARES = Gauge(
    "torchkube_job_spares",
    "Hot spares standing by warm: Running worker pods beyond the desired count whose launcher "
    "imported torch (status.spares).",
    ["namespace", "job"],
)
SLOWEST_SLOWDOWN = Gauge(
    "torchkube_job_slowest_rank_slowdown",
    "The slowest rank's compute time per step over the other ranks' median "
    "(status.slowestRank.slowdown); absent while not measured.",
    ["namespace", "job"],
)
REMAINING = Gauge(
    "torchkube_job_estimated_remaining_seconds",
    "Time left until the job's last step at its recent step pace "
    "(status.progress.estimatedRemainingSeconds); 0 once it succeeded, absent while not known "
    "or not Running.",
    ["namespace", "job"],
)
RECONCILE = Histogram(
    "torchkube_reconcile_duration_seconds",
    "Time to reconcile one job, API calls included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter(
    "torchkube_reconcile_errors_total", "Reconciles that raised; the job is retried.", []
)
POD_WATCH_SYNCED = Gauge(
    "torchkube_pod_watch_synced",
    "1 once the operator's pod watch holds every watched namespace's full list; until then "
    "no job is reconciled.",
)
POD_WATCH_ERRORS = Counter(
    "torchkube_pod_watch_errors_total",
    "Pod lists and watches that failed (refused, broken, ended by an error); each is retried.",
)
LEADING = Gauge(
    "torchkube_leader",
    "1 while this replica acts: it holds the Lease (always, without leader election).",
)
API_REQUESTS = Counter(
    "torchkube_api_requests_total",
    "Requests the operator sent to the Kubernetes API.",
    ["verb", "resource"],
)


class PerJobCollector(Collector, Generic[State]):
    """What the operator last knew of each job, exported at scrape time: a job's series go
    away with its entry (deleted, or its state set to None), with no record of past labels."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], State] = {}
        self._lock = threading.Lock()

    def set(self, namespace: str, job: str, state: State | None) -> None:
        with self._lock:
            if state is None:
                self._jobs.pop((namespace, job), None)
            else:
                self._jobs[(namespace, job)] = state

    def remove(self, namespace: str, job: str) -> None:
        self.set(namespace, job, None)

    def clear(self) -> None:
        with self._lock:
            self._jobs.clear()

    def jobs(self) -> list[tuple[tuple[str, str], State]]:
        """((namespace, job), state) of every job, sorted: a copy taken under the lock."""
        with self._lock:
            return sorted(self._jobs.items(), key=lambda item: item[0])


class GoodputCollector(PerJobCollector[Goodput]):
    """Exports the operator's per-job goodput accumulators at scrape time.

    A collector rather than counters incremented by deltas: the accumulators already hold
    the totals, and a deleted job's series go away with its accumulator.
    """

    def collect(self) -> Iterator[Metric]:
        jobs = self.jobs()
        ratio = GaugeMetricFamily(
            "torchkube_job_goodput_ratio",
            "Share of the job's wall time spent on training progress it kept (status.goodput).",
            labels=["namespace", "job"],
        )
        productive = CounterMetricFamily(
            "torchkube_job_productive_seconds",
            "Wall time of the job that made training progress it kept.",
            labels=["namespace", "job"],
        )
        badput = CounterMetricFamily(
            "torchkube_job_badput_seconds",
            "Wall time of the job lost, by cause (scheduling, startup, recovery, redo, "
            "checkpoint, data_loading, stall).",
            labels=["namespace", "job", "cause"],
        )
        for (namespace, job), state in jobs:
            value = state.ratio
            if value is not None:
                ratio.add_metric([namespace, job], value)
            productive.add_metric([namespace, job], state.productive)
            for cause in CAUSES:
                badput.add_metric([namespace, job, cause], state.badput.get(cause, 0.0))
        yield ratio
        yield productive
        yield badput

    def describe(self) -> Iterator[Metric]:
        return iter(())


GOODPUT = GoodputCollector()
REGISTRY.register(GOODPUT)


class TopologyCollector(PerJobCollector[TopologyStatus]):
    """Exports each job's ``status.topology`` at scrape time: how many domains its workers
    occupy, and one series per domain listed. A collector, so a domain the job leaves goes
    away with the status that no longer lists it, with no record of past label values."""

    def collect(self) -> Iterator[Metric]:
        jobs = self.jobs()
        count = GaugeMetricFamily(
            "torchkube_job_topology_domains",
            "Topology domains the job's workers occupy (status.topology.domainCount); more "
            "than one: spread over them.",
            labels=["namespace", "job"],
        )
        listed = GaugeMetricFamily(
            "torchkube_job_topology_domain_info",
            "1 for each topology domain the job's workers occupy (status.topology.domains).",
            labels=["namespace", "job", "level", "domain"],
        )
        for (namespace, job), topology in jobs:
            count.add_metric([namespace, job], topology.domain_count)
            for domain in topology.domains:
                listed.add_metric([namespace, job, topology.level, domain], 1)
        yield count
        yield listed

    def describe(self) -> Iterator[Metric]:
        return iter(())


TOPOLOGY = TopologyCollector()
REGISTRY.register(TOPOLOGY)


def job_seen(namespace: str, job: str) -> None:
    """Create the job's and its namespace's counters at zero (idempotent)."""
    for reason in FAILURE_REASONS:
        RESTARTS.labels(namespace, job, reason)
    for reason in JOB_FAILURE_REASONS:
        JOB_FAILURES.labels(namespace, reason)
    POD_REPLACEMENTS.labels(namespace)
    NODE_LOSS.labels(namespace)
    RECOVERY.labels(namespace)
    SPARES.labels(namespace, job)


def job_observed(
    namespace: str,
    job: str,
    spares: int,
    slowdown: float | None,
    *,
    remaining: float | None,
) -> None:
    """The job's spares, slowest rank and time left, as its status says (a value it does not
    know leaves its series absent)."""
    SPARES.labels(namespace, job).set(spares)
    for gauge, value in ((SLOWEST_SLOWDOWN, slowdown), (REMAINING, remaining)):
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job)
        else:
            gauge.labels(namespace, job).set(value)


def job_planned(job: TrainingJob, decided: "Plan", books: "Accounting") -> None:
    """Feed the job's metrics from one reconcile's plan, with what they carry over between
    reconciles in ``books``: the series created at zero when the job is first seen, restarts
    and node losses as the plan records them, start-up timed to the first moment every
    desired worker runs (only for a job first seen before it started), recovery from the
    first failure recorded to the next such moment — the moment the watch showed the last
    of them Running (``Plan.all_running_at``), not the later one of the reconcile."""
    ns = job.namespace
    if not books.seen:
        books.seen = True
        job_seen(ns, job.name)
        books.startup_observed = bool(job.status and job.status.start_time)
    if books.goodput is not None:
        GOODPUT.set(ns, job.name, books.goodput.state)
    status = decided.status
    slowest, progress = status.slowest_rank, status.progress
    job_observed(
        ns,
        job.name,
        status.spares,
        slowest.slowdown if slowest else None,
        remaining=progress.estimated_remaining_seconds if progress else None,
    )
    TOPOLOGY.set(ns, job.name, status.topology)
    for failure in decided.failures:
        RESTARTS.labels(ns, job.name, failure.reason).inc()
        if failure.reason == "NodeLost":
            NODE_LOSS.labels(ns).inc()
        books.failure_at = books.failure_at or time.time()
    replacements = sum(
        1 for pod in decided.create_pods if pod["metadata"]["labels"].get(lbl.ROLE) == "worker"
    )
    if replacements and job.status and job.status.start_time:
        POD_REPLACEMENTS.labels(ns).inc(replacements)
    if status.phase == "Failed" and (job.status is None or job.status.phase != "Failed"):
        failed = cond.get(status.conditions, cond.FAILED)
        JOB_FAILURES.labels(ns, failed.reason if failed else "Unknown").inc()
    if not decided.all_running:
        return
    at = time.time() if decided.all_running_at is None else decided.all_running_at
    if not books.startup_observed:
        books.startup_observed = True
        created = parse_time(job.metadata.get("creationTimestamp"))
        if created is not None:
            STARTUP.observe(max(0.0, at - created.timestamp()))
    if books.failure_at is not None:
        RECOVERY.labels(ns).observe(max(0.0, at - books.failure_at))
        books.failure_at = None


def job_gone(namespace: str, job: str) -> None:
    """Drop a deleted job's series (namespace-wide ones stay: other jobs add to them)."""
    for reason in FAILURE_REASONS:
        with contextlib.suppress(KeyError):
            RESTARTS.remove(namespace, job, reason)
    for gauge in (SPARES, SLOWEST_SLOWDOWN, REMAINING):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, job)
    GOODPUT.remove(namespace, job)
    TOPOLOGY.set(namespace, job, None)


def forget_jobs() -> None:
    """Drop every job and namespace series: this replica stopped leading, and the new leader
    exports them from now on (a counter restarts from zero if the lead comes back, which
    ``increase()`` reads as a reset)."""
    for family in (
        JOBS,
        RESTARTS,
        POD_REPLACEMENTS,
        NODE_LOSS,
        JOB_FAILURES,
        RECOVERY,
        SPARES,
        SLOWEST_SLOWDOWN,
        REMAINING,
    ):
        family.clear()
    GOODPUT.clear()
    TOPOLOGY.clear()
